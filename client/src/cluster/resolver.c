/* tpu_resolver: where the cluster is and which token to use. Reads $TPU_NAME
 * (when no tpu is given) as TensorFlow's TPUClusterResolver does: an address
 * or a comma list of every host's, or a TPU node name that the Cloud TPU API
 * (here: the resolver at $TPUEMU_TPU_API) resolves. Loads the token; it sends
 * nothing over the network. */
#include "cluster_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_TPU "127.0.0.1:8470"
#define DEFAULT_TPU_API "127.0.0.1:8470"

/* A Cloud TPU node name: a lowercase letter, then lowercase letters, digits
 * and hyphens, at most 63. */
static int node_name(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 63 && s[0] >= 'a' && s[0] <= 'z' &&
           strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

/* tpu without a scheme, a port or a comma: TensorFlow's TPU name. */
static int bare_word(const char *s)
{
    return !strchr(s, ',') && !strchr(s, ':') && !strchr(s, '[') && !strchr(s, '/');
}

/* A control byte in tpu (a \r from a file saved on Windows, an escape
 * sequence): refused, shown escaped so the terminal prints what it is. */
static int control_byte(const char *tpu, err *e)
{
    for (size_t i = 0; tpu[i]; i++) {
        unsigned char ch = (unsigned char)tpu[i];
        if (ch < 0x20 || ch == 0x7f) {
            char shown[200];
            size_t n = 0;
            for (size_t k = 0; tpu[k] && n + 5 < sizeof shown; k++) {
                unsigned char x = (unsigned char)tpu[k];
                if (x < 0x20 || x == 0x7f)
                    n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", x);
                else
                    shown[n++] = (char)x;
            }
            shown[n] = '\0';
            return err_set(e, CODE_INVALID_ARGUMENT, "the TPU '%s' holds a control byte (\\x%02x at position %zu): "
                           "a TPU name or address is printable text (a line ending copied from a file?)", shown, ch,
                           i + 1);
        }
    }
    return CODE_OK;
}

/* Which items of a comma list are bare words (a host without a port, taken
 * with the default port): a DNS failure on one of them says how it was read. */
static void mark_list_words(tpu_resolver *r, const char *list)
{
    const char *p = list;
    for (size_t i = 0; i < r->n && p; i++) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        char item[ADDR_HOST_MAX + 16];
        while (l && *p == ' ')
            p++, l--;
        while (l && p[l - 1] == ' ')
            l--;
        snprintf(item, sizeof item, "%.*s", (int)(l < sizeof item - 1 ? l : sizeof item - 1), p);
        r->list_word[i] = bare_word(item);
        p = c ? c + 1 : NULL;
    }
}

static int parse_name(tpu_resolver *r, const char *tpu, err *e)
{
    const char *api = getenv("TPUEMU_TPU_API");

    if (!node_name(tpu))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "'%s' is not a TPU name (1 to 63 characters of a-z, 0-9 and -, starting with a "
                       "letter) nor an address: an address has a port or a scheme, HOST:8470 or "
                       "grpc://HOST", tpu);
    if (!api || !*api)
        api = DEFAULT_TPU_API;
    if (addr_parse(api, ADDR_DEFAULT_PORT, &r->eps[0], e) != CODE_OK) {
        err_prefix(e, "$TPUEMU_TPU_API");
        return e->code;
    }
    r->n = 1;
    snprintf(r->tpu_name, sizeof r->tpu_name, "%s", tpu);
    return CODE_OK;
}

tpu_status tpu_resolver_new(const char *tpu, tpu_resolver **out)
{
    tpu_resolver *r;
    char host[256];
    err e;

    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_resolver_new: out is NULL");
    *out = NULL;
    if (!tpu || !*tpu)
        tpu = getenv("TPU_NAME");
    if (!tpu || !*tpu)
        tpu = DEFAULT_TPU;
    auth_global_init();
    r = calloc(1, sizeof *r);
    if (!r)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    if (control_byte(tpu, &e) != CODE_OK)
        goto fail;
    if (bare_word(tpu)) {
        if (parse_name(r, tpu, &e) != CODE_OK)
            goto fail;
    } else if (addr_parse_list(tpu, ADDR_DEFAULT_PORT, r->eps, CLI_MAX_ENDPOINTS, &r->n, &e) != CODE_OK) {
        goto fail;
    } else if (strchr(tpu, ',')) {
        mark_list_words(r, tpu);
    }
    for (size_t i = 0; i < r->n; i++) {
        if (r->eps[i].port == 0) {
            err_set(&e, CODE_INVALID_ARGUMENT, "address '%s': port 0 is not a resolver port",
                    r->eps[i].host);
            goto fail;
        }
        addr_format(r->eps[i].host, r->eps[i].port, r->ep_str[i], sizeof r->ep_str[i]);
    }
    snprintf(r->master, sizeof r->master, "grpc://%s", r->ep_str[0]);
    if (auth_load(&r->auth, getenv("TPUEMU_TOKEN_FILE"), &e) != CODE_OK)
        goto fail;
    if (r->auth.warning[0])
        cli_warn("%s", r->auth.warning);
    r->timeout_ms = CLI_DEFAULT_TIMEOUT_MS;
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    snprintf(r->client_id, sizeof r->client_id, "%ld@%s", (long)getpid(), host);
    snprintf(r->sender, sizeof r->sender, "client %s", r->client_id);
    r->magic = MAGIC_RESOLVER;
    *out = r;
    return TPU_OK;
fail:
    free(r);
    return cli_fail(&e);
}

void tpu_resolver_free(tpu_resolver *r)
{
    if (!r)
        return;
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    r->magic = MAGIC_DEAD;
    memset(&r->auth, 0, sizeof r->auth);
    free(r);
}

tpu_status tpu_resolver_set_token_file(tpu_resolver *r, const char *path)
{
    auth a;
    err e;

    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    if (!path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_resolver_set_token_file: empty path");
    if (auth_load(&a, path, &e) != CODE_OK)
        return cli_fail(&e);
    if (a.warning[0])
        cli_warn("%s", a.warning);
    r->auth = a;
    return TPU_OK;
}

tpu_status tpu_resolver_set_timeout_ms(tpu_resolver *r, uint32_t ms)
{
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    if (ms == 0 || ms > 600000)
        return cli_failf(TPU_INVALID_ARGUMENT, "timeout of %u ms is out of range (1..600000)", ms);
    r->timeout_ms = ms;
    return TPU_OK;
}

const char *tpu_resolver_master(const tpu_resolver *r)
{
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    return r->master;
}

size_t tpu_resolver_num_endpoints(const tpu_resolver *r)
{
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    return r->n;
}

const char *tpu_resolver_endpoint(const tpu_resolver *r, size_t i)
{
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    return i < r->n ? r->ep_str[i] : NULL;
}

const char *tpu_resolver_tpu_name(const tpu_resolver *r)
{
    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    return r->tpu_name[0] ? r->tpu_name : NULL;
}
