/* peertab: the system's cores as columns and a string pool (peertab.h). */
#include "peertab.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpuemu.pb-c.h"

struct peertab {
    Tpuemu__PeerTable *pb;
    size_t n;
};

/* shm column: 0 none, 1 the usual name, k >= 2 strs[k - 2] */
enum { SHM_NONE = 0, SHM_USUAL = 1, SHM_POOL = 2 };

static void usual_shm_name(uint64_t incarnation, char *buf, size_t cap)
{
    snprintf(buf, cap, "@tpuemu-%016" PRIx64, incarnation);
}

/* ---- packing: a pool of distinct strings ---- */

struct pool {
    char **strs;       /* distinct strings, in order of first use (owned) */
    size_t n, cap;
    uint32_t *slot;    /* open addressing: index + 1, 0 empty */
    size_t nslot;      /* a power of two, at least twice the most strings */
};

static uint64_t hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The index of s[0..len) in the pool, added if new; -1 when out of memory. */
static long pool_add(struct pool *p, const char *s, size_t len)
{
    size_t i = (size_t)hash(s, len) & (p->nslot - 1);
    for (; p->slot[i]; i = (i + 1) & (p->nslot - 1)) {
        const char *o = p->strs[p->slot[i] - 1];
        if (strncmp(o, s, len) == 0 && o[len] == '\0')
            return (long)p->slot[i] - 1;
    }
    if (p->n == p->cap)
        return -1; /* cannot happen: cap is the most strings the rows can name */
    if (!(p->strs[p->n] = malloc(len + 1)))
        return -1;
    memcpy(p->strs[p->n], s, len);
    p->strs[p->n][len] = '\0';
    p->slot[i] = (uint32_t)++p->n;
    return (long)p->n - 1;
}

/* "ADDR:PORT" -> the length of ADDR and PORT, when PORT is 1..65535 written
 * without leading zeros (so the address formats back to the same bytes);
 * otherwise the whole string with port 0. */
static size_t split_addr(const char *a, uint32_t *port)
{
    const char *c = strrchr(a, ':');
    size_t len = strlen(a);
    uint32_t v = 0;

    *port = 0;
    if (!c || c[1] < '1' || c[1] > '9' || strlen(c + 1) > 5)
        return len;
    for (const char *d = c + 1; *d; d++) {
        if (*d < '0' || *d > '9')
            return len;
        v = v * 10 + (uint32_t)(*d - '0');
    }
    if (v > 65535)
        return len;
    *port = v;
    return (size_t)(c - a);
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

int peertab_pack(const struct peertab_row *rows, size_t n, uint8_t **out, size_t *outlen, err *e)
{
    Tpuemu__PeerTable t = TPUEMU__PEER_TABLE__INIT;
    struct pool pool = {0};
    uint32_t *col = NULL;
    uint64_t *inc = NULL;
    int32_t *core = NULL;
    int rc = CODE_RESOURCE_EXHAUSTED;

    *out = NULL;
    *outlen = 0;
    pool.cap = 4 * n;
    for (pool.nslot = 16; pool.nslot < 2 * pool.cap; pool.nslot *= 2)
        ;
    pool.strs = calloc(pool.cap ? pool.cap : 1, sizeof *pool.strs);
    pool.slot = calloc(pool.nslot, sizeof *pool.slot);
    col = calloc(n ? 6 * n : 1, sizeof *col);
    inc = calloc(n ? n : 1, sizeof *inc);
    core = calloc(n ? n : 1, sizeof *core);
    if (!pool.strs || !pool.slot || !col || !inc || !core) {
        err_set(e, rc, "out of memory packing the peer table of %zu cores", n);
        goto done;
    }
    t.n_host = t.n_core = t.n_data_host = t.n_data_port = t.n_control_host = t.n_control_port = t.n_incarnation =
        t.n_shm = n;
    t.host = col;
    t.data_host = col + n;
    t.data_port = col + 2 * n;
    t.control_host = col + 3 * n;
    t.control_port = col + 4 * n;
    t.shm = col + 5 * n;
    t.core = core;
    t.incarnation = inc;
    for (size_t i = 0; i < n; i++) {
        const struct peertab_row *w = &rows[i];
        const char *host = or_empty(w->host), *data = or_empty(w->data_addr), *ctl = or_empty(w->control_addr),
                   *shm = or_empty(w->shm_name);
        char usual[32];
        long k;
        size_t len;

        if (strlen(host) > PEERTAB_MAX_HOST || strlen(data) > PEERTAB_MAX_ADDR ||
            strlen(ctl) > PEERTAB_MAX_ADDR || strlen(shm) > PEERTAB_MAX_SHM) {
            rc = err_set(e, CODE_INVALID_ARGUMENT,
                         "replica %zu's host id, address or shared-memory name is too long for the peer table", i);
            goto done;
        }
        if ((k = pool_add(&pool, host, strlen(host))) < 0)
            goto oom;
        t.host[i] = (uint32_t)k;
        len = split_addr(data, &t.data_port[i]);
        if ((k = pool_add(&pool, data, len)) < 0)
            goto oom;
        t.data_host[i] = (uint32_t)k;
        len = split_addr(ctl, &t.control_port[i]);
        if ((k = pool_add(&pool, ctl, len)) < 0)
            goto oom;
        t.control_host[i] = (uint32_t)k;
        usual_shm_name(w->incarnation, usual, sizeof usual);
        if (!*shm)
            t.shm[i] = SHM_NONE;
        else if (strcmp(shm, usual) == 0)
            t.shm[i] = SHM_USUAL;
        else if ((k = pool_add(&pool, shm, strlen(shm))) < 0)
            goto oom;
        else
            t.shm[i] = SHM_POOL + (uint32_t)k;
        t.core[i] = w->core;
        t.incarnation[i] = w->incarnation;
    }
    t.n_strs = pool.n;
    t.strs = pool.strs;
    *outlen = tpuemu__peer_table__get_packed_size(&t);
    if (!(*out = malloc(*outlen ? *outlen : 1)))
        goto oom;
    tpuemu__peer_table__pack(&t, *out);
    rc = CODE_OK;
    goto done;
oom:
    err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory packing the peer table of %zu cores", n);
    *outlen = 0;
done:
    for (size_t i = 0; i < pool.n; i++)
        free(pool.strs[i]);
    free(pool.strs);
    free(pool.slot);
    free(col);
    free(inc);
    free(core);
    return rc;
}

/* ---- opening ---- */

/* Length of an address of pool string len and port, or 0 past the limit. */
static int addr_fits(const size_t *slen, size_t nstrs, uint32_t host, uint32_t port)
{
    return host < nstrs && port <= 65535 && slen[host] + (port ? 6 : 0) <= PEERTAB_MAX_ADDR;
}

int peertab_open(const uint8_t *buf, size_t len, size_t n, struct peertab **out, err *e)
{
    struct peertab *t = calloc(1, sizeof *t);
    Tpuemu__PeerTable *pb;
    size_t *slen = NULL;
    const char *bad = NULL;
    size_t at = 0;

    *out = NULL;
    if (!t)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory opening the peer table");
    if (!(pb = tpuemu__peer_table__unpack(NULL, len, buf))) {
        free(t);
        return err_set(e, CODE_INVALID_ARGUMENT, "the peer table (%zu bytes) is not a PeerTable message", len);
    }
    t->pb = pb;
    t->n = n;
    {
        static const char *names[] = {"host", "core", "data_host", "data_port", "control_host",
                                      "control_port", "incarnation", "shm"};
        size_t lens[] = {pb->n_host, pb->n_core, pb->n_data_host, pb->n_data_port,
                         pb->n_control_host, pb->n_control_port, pb->n_incarnation, pb->n_shm};
        for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++)
            if (lens[c] != n) {
                err_set(e, CODE_INVALID_ARGUMENT, "the peer table's column '%s' has %zu entries for %zu cores",
                        names[c], lens[c], n);
                goto fail;
            }
    }
    if (!(slen = malloc((pb->n_strs ? pb->n_strs : 1) * sizeof *slen))) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory opening the peer table");
        goto fail;
    }
    for (size_t i = 0; i < pb->n_strs; i++)
        slen[i] = strnlen(pb->strs[i], PEERTAB_MAX_ADDR + 1);
    for (at = 0; at < n && !bad; at++) {
        if (pb->host[at] >= pb->n_strs || slen[pb->host[at]] > PEERTAB_MAX_HOST)
            bad = "host id";
        else if (!addr_fits(slen, pb->n_strs, pb->data_host[at], pb->data_port[at]))
            bad = "data address";
        else if (!addr_fits(slen, pb->n_strs, pb->control_host[at], pb->control_port[at]))
            bad = "control address";
        else if (pb->shm[at] >= SHM_POOL &&
                 (pb->shm[at] - SHM_POOL >= pb->n_strs || slen[pb->shm[at] - SHM_POOL] > PEERTAB_MAX_SHM))
            bad = "shared-memory name";
    }
    free(slen);
    if (bad) {
        err_set(e, CODE_INVALID_ARGUMENT,
                "the peer table's %s of replica %zu is not one of its %zu strings, or too long", bad, at - 1,
                pb->n_strs);
        goto fail;
    }
    *out = t;
    return CODE_OK;
fail:
    peertab_free(t);
    return e->code;
}

void peertab_free(struct peertab *t)
{
    if (!t)
        return;
    if (t->pb)
        tpuemu__peer_table__free_unpacked(t->pb, NULL);
    free(t);
}

size_t peertab_n(const struct peertab *t)
{
    return t ? t->n : 0;
}

const char *peertab_host(const struct peertab *t, size_t r)
{
    return t->pb->strs[t->pb->host[r]];
}

uint32_t peertab_host_index(const struct peertab *t, size_t r)
{
    return t->pb->host[r];
}

int peertab_core(const struct peertab *t, size_t r)
{
    return t->pb->core[r];
}

uint64_t peertab_incarnation(const struct peertab *t, size_t r)
{
    return t->pb->incarnation[r];
}

int peertab_has_shm(const struct peertab *t, size_t r)
{
    return t->pb->shm[r] != SHM_NONE;
}

static const char *fmt_addr(const struct peertab *t, uint32_t host, uint32_t port, char *buf, size_t cap)
{
    if (port)
        snprintf(buf, cap, "%s:%" PRIu32, t->pb->strs[host], port);
    else
        snprintf(buf, cap, "%s", t->pb->strs[host]);
    return buf;
}

const char *peertab_data_addr(const struct peertab *t, size_t r, char *buf, size_t cap)
{
    return fmt_addr(t, t->pb->data_host[r], t->pb->data_port[r], buf, cap);
}

const char *peertab_control_addr(const struct peertab *t, size_t r, char *buf, size_t cap)
{
    return fmt_addr(t, t->pb->control_host[r], t->pb->control_port[r], buf, cap);
}

const char *peertab_shm_name(const struct peertab *t, size_t r, char *buf, size_t cap)
{
    uint32_t s = t->pb->shm[r];
    if (s == SHM_NONE)
        snprintf(buf, cap, "%s", "");
    else if (s == SHM_USUAL)
        usual_shm_name(t->pb->incarnation[r], buf, cap);
    else
        snprintf(buf, cap, "%s", t->pb->strs[s - SHM_POOL]);
    return buf;
}
