/* The request head parser of the metrics server (httphead.h). Pure: no
 * allocation, no I/O, so the fuzzer runs it alone. */
#include "httphead.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_HEADERS 64
#define MAX_TARGET 2048

size_t http_head_end(const char *buf, size_t len, size_t from)
{
    for (size_t i = from; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (i >= 1 && buf[i - 1] == '\n')
            return i + 1;
        if (i >= 2 && buf[i - 1] == '\r' && buf[i - 2] == '\n')
            return i + 1;
    }
    return 0;
}

static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Splits off the next line of [*p, end): returns its start with the line end
 * (LF or CRLF) replaced by NUL, or NULL if there is no line end. */
static char *next_line(char **p, char *end)
{
    char *s = *p, *lf = memchr(s, '\n', (size_t)(end - s));
    if (!lf)
        return NULL;
    *lf = '\0';
    if (lf > s && lf[-1] == '\r')
        lf[-1] = '\0';
    *p = lf + 1;
    return s;
}

int http_head_parse(char *buf, size_t hlen, struct http_head *q, const char **why)
{
    char *p = buf, *end = buf + hlen, *line, *sp1, *sp2;
    int nheaders = 0, bad_length = 0;

    memset(q, 0, sizeof q[0]);
    if (memchr(buf, '\0', hlen)) {
        *why = "NUL byte in the request";
        return 400;
    }
    if (!(line = next_line(&p, end))) {
        *why = "no request line";
        return 400;
    }
    if (!(sp1 = strchr(line, ' ')) || !(sp2 = strchr(sp1 + 1, ' ')) || strchr(sp2 + 1, ' ')) {
        *why = "the request line is not METHOD TARGET VERSION";
        return 400;
    }
    *sp1 = *sp2 = '\0';
    q->method = line;
    q->target = sp1 + 1;
    q->version = sp2 + 1;
    if (!*q->method || strlen(q->method) > 16) {
        *why = "bad method";
        return 400;
    }
    for (const char *s = q->method; *s; s++)
        if (!is_tchar((unsigned char)*s)) {
            *why = "bad method";
            return 400;
        }
    if (q->target[0] != '/' || strlen(q->target) > MAX_TARGET) {
        *why = "the target is not a path";
        return 400;
    }
    for (const unsigned char *s = (const unsigned char *)q->target; *s; s++)
        if (*s <= 0x20 || *s >= 0x7f) {
            *why = "bad character in the target";
            return 400;
        }
    if (strcmp(q->version, "HTTP/1.1") != 0 && strcmp(q->version, "HTTP/1.0") != 0) {
        const char *v = q->version;
        if (strncmp(v, "HTTP/", 5) == 0 && v[5] >= '0' && v[5] <= '9' && v[6] == '.' && v[7] >= '0' &&
            v[7] <= '9' && !v[8]) {
            *why = "only HTTP/1.0 and HTTP/1.1 are served";
            return 505;
        }
        *why = "bad protocol version";
        return 400;
    }
    while ((line = next_line(&p, end)) && *line) {
        char *colon = strchr(line, ':'), *v;
        if (++nheaders > MAX_HEADERS) {
            *why = "too many header fields";
            return 431;
        }
        if (line[0] == ' ' || line[0] == '\t') {
            *why = "folded header line";
            return 400;
        }
        if (!colon || colon == line) {
            *why = "header line without a name";
            return 400;
        }
        for (const char *s = line; s < colon; s++)
            if (!is_tchar((unsigned char)*s)) {
                *why = "bad header name";
                return 400;
            }
        *colon = '\0';
        for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
            ;
        for (const unsigned char *s = (const unsigned char *)v; *s; s++)
            if ((*s < 0x20 && *s != '\t') || *s == 0x7f) {
                *why = "control character in a header value";
                return 400;
            }
        if (!strcasecmp(line, "Host")) {
            q->hosts++;
        } else if (!strcasecmp(line, "Content-Length")) {
            char *e;
            unsigned long long n = strtoull(v, &e, 10);
            while (*e == ' ' || *e == '\t')
                e++;
            if (!*v || *v < '0' || *v > '9' || *e)
                bad_length = 1;
            else if (n > 0)
                q->has_body = 1;
        } else if (!strcasecmp(line, "Transfer-Encoding")) {
            q->has_body = 1;
        } else if (!strcasecmp(line, "Authorization")) {
            q->authorizations++;
            q->authorization = v;
        }
    }
    if (bad_length) {
        *why = "bad Content-Length";
        return 400;
    }
    if (q->authorizations > 1) {
        *why = "more than one Authorization header";
        return 400;
    }
    if (!strcmp(q->version, "HTTP/1.1") && q->hosts != 1) {
        *why = q->hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header";
        return 400;
    }
    return 0;
}
