/* Address parsing. */
#include "addr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int addr_parse(const char *s, int default_port, addr *out, err *e)
{
    const char *p = s, *hend, *colon;
    size_t hl;

    if (!s || !*s)
        return err_set(e, CODE_INVALID_ARGUMENT, "empty address (expected HOST:PORT)");
    if (strncmp(p, "grpc://", 7) == 0 || strncmp(p, "tcp://", 6) == 0)
        p = strchr(p, '/') + 2;
    else if (strstr(p, "://"))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "address '%s' has an unsupported scheme (use HOST:PORT or grpc://HOST:PORT)", s);
    if (*p == '[') {
        hend = strchr(p, ']');
        if (!hend)
            return err_set(e, CODE_INVALID_ARGUMENT, "address '%s': missing ']'", s);
        p++;
        hl = (size_t)(hend - p);
        colon = hend[1] == ':' ? hend + 1 : NULL;
        if (hend[1] && !colon)
            return err_set(e, CODE_INVALID_ARGUMENT, "address '%s': junk after ']'", s);
    } else {
        colon = strrchr(p, ':');
        if (colon && strchr(p, ':') != colon)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "address '%s': write IPv6 addresses in brackets, as [::1]:8470", s);
        hl = colon ? (size_t)(colon - p) : strlen(p);
    }
    if (hl == 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "address '%s' has no host", s);
    if (hl >= sizeof out->host)
        return err_set(e, CODE_INVALID_ARGUMENT, "address '%.40s...': host name too long", s);
    for (size_t i = 0; i < hl; i++) {
        char c = p[i];
        if (!(c == '.' || c == '-' || c == '_' || c == ':' || c == '*' || (c >= '0' && c <= '9') ||
              (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return err_set(e, CODE_INVALID_ARGUMENT, "address '%s': invalid character in host", s);
    }
    memcpy(out->host, p, hl);
    out->host[hl] = '\0';
    out->port = default_port;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || v < 0 || v > 65535)
            return err_set(e, CODE_INVALID_ARGUMENT, "address '%s': port must be 0..65535", s);
        out->port = (int)v;
    }
    return CODE_OK;
}

int addr_parse_list(const char *s, int default_port, addr *out, size_t max, size_t *n, err *e)
{
    char item[512];
    const char *p = s;

    *n = 0;
    if (!s || !*s)
        return err_set(e, CODE_INVALID_ARGUMENT, "empty address list");
    for (;;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        while (l && (*p == ' ')) {
            p++;
            l--;
        }
        while (l && p[l - 1] == ' ')
            l--;
        if (l == 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "address list '%s' has an empty item", s);
        if (l >= sizeof item)
            return err_set(e, CODE_INVALID_ARGUMENT, "address list '%.40s...': item too long", s);
        if (*n == max)
            return err_set(e, CODE_INVALID_ARGUMENT, "address list '%.40s...' has more than %zu items", s, max);
        memcpy(item, p, l);
        item[l] = '\0';
        int rc = addr_parse(item, default_port, &out[*n], e);
        if (rc)
            return rc;
        (*n)++;
        if (!c)
            break;
        p = c + 1;
    }
    return CODE_OK;
}

void addr_format(const char *host, int port, char *out, size_t n)
{
    if (strchr(host, ':'))
        snprintf(out, n, "[%s]:%d", host, port);
    else
        snprintf(out, n, "%s:%d", host, port);
}

void addr_nn_url(const char *host, int port, char *out, size_t n)
{
    char hp[ADDR_HOST_MAX + 16];
    addr_format(host, port, hp, sizeof hp);
    snprintf(out, n, "tcp://%s", hp);
}

int addr_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(host, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0;
}
