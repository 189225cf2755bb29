/* Duplicate-request cache: a ring of entries in arrival order, indexed by
 * digest in an open-addressing table (linear probing, backward-shift
 * deletion), so a lookup costs the same with 16 entries as with 16384: every
 * heartbeat of a 1,024-core cluster is looked up. */
#include "drc.h"
#include "memtrim.h"

#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define DIGEST_BYTES 32

struct dentry {
    unsigned char digest[DIGEST_BYTES];
    uint64_t id;
    uint64_t t_ms;   /* entered */
    int done;
    uint8_t *reply;  /* done: the answer sent; NULL if it was too large to keep */
    size_t rlen;
    void *waiting;   /* a resend's routing header, waiting for the answer */
};

struct drc {
    struct dentry *ring;
    size_t cap, head, len;
    size_t *idx;     /* ring slot + 1 by digest; 0: empty */
    size_t mask;     /* idx has mask + 1 (a power of two >= 2 x cap) slots */
    size_t bytes, max_bytes;
    uint32_t keep_ms;
    void (*ctl_free)(void *ctl);
};

drc *drc_new(size_t max_entries, size_t max_bytes, uint32_t keep_ms, void (*ctl_free)(void *ctl))
{
    drc *d = calloc(1, sizeof *d);
    if (!d || max_entries == 0) {
        free(d);
        return NULL;
    }
    for (d->mask = 1; d->mask < 2 * max_entries; d->mask <<= 1)
        ;
    if (!(d->ring = calloc(max_entries, sizeof *d->ring)) || !(d->idx = calloc(d->mask, sizeof *d->idx))) {
        free(d->ring);
        free(d);
        return NULL;
    }
    mem_resident(d->ring, max_entries * sizeof *d->ring);
    mem_resident(d->idx, d->mask * sizeof *d->idx);
    d->mask--;
    d->cap = max_entries;
    d->max_bytes = max_bytes;
    d->keep_ms = keep_ms;
    d->ctl_free = ctl_free;
    return d;
}

static struct dentry *at(drc *d, size_t i)
{
    return &d->ring[(d->head + i) % d->cap];
}

static size_t home(const drc *d, const unsigned char *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof h);
    return (size_t)h & d->mask;
}

static void idx_insert(drc *d, size_t slot)
{
    size_t i = home(d, d->ring[slot].digest);
    while (d->idx[i])
        i = (i + 1) & d->mask;
    d->idx[i] = slot + 1;
}

static void idx_remove(drc *d, size_t slot)
{
    size_t i = home(d, d->ring[slot].digest), j;
    while (d->idx[i] && d->idx[i] != slot + 1)
        i = (i + 1) & d->mask;
    if (!d->idx[i])
        return;
    /* backward shift: move up every later entry of the run whose home is
     * not between the hole and it */
    for (j = i;;) {
        j = (j + 1) & d->mask;
        if (!d->idx[j])
            break;
        size_t k = home(d, d->ring[d->idx[j] - 1].digest);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        d->idx[i] = d->idx[j];
        i = j;
    }
    d->idx[i] = 0;
}

/* The newest entry with this digest, or NULL. */
static struct dentry *idx_find(drc *d, const unsigned char *digest)
{
    struct dentry *best = NULL;
    size_t best_age = 0;
    for (size_t i = home(d, digest); d->idx[i]; i = (i + 1) & d->mask) {
        size_t slot = d->idx[i] - 1, pos = (slot + d->cap - d->head) % d->cap;
        if (memcmp(d->ring[slot].digest, digest, DIGEST_BYTES) == 0 && (!best || pos > best_age)) {
            best = &d->ring[slot];
            best_age = pos;
        }
    }
    return best;
}

static void drop_oldest(drc *d)
{
    struct dentry *en = at(d, 0);
    idx_remove(d, d->head);
    if (en->waiting && d->ctl_free)
        d->ctl_free(en->waiting);
    d->bytes -= en->rlen;
    free(en->reply);
    memset(en, 0, sizeof *en);
    d->head = (d->head + 1) % d->cap;
    d->len--;
}

static void expire(drc *d, uint64_t now_ms)
{
    while (d->len > 0 && at(d, 0)->t_ms + d->keep_ms < now_ms)
        drop_oldest(d);
}

void drc_free(drc *d)
{
    if (!d)
        return;
    while (d->len > 0)
        drop_oldest(d);
    free(d->ring);
    free(d->idx);
    free(d);
}

static void digest(const uint8_t *req, size_t len, unsigned char out[DIGEST_BYTES])
{
    crypto_generichash(out, DIGEST_BYTES, req, len, NULL, 0);
}

int drc_lookup(drc *d, const uint8_t *req, size_t len, void *ctl, uint64_t now_ms,
               const uint8_t **reply, size_t *rlen)
{
    unsigned char h[DIGEST_BYTES];

    *reply = NULL;
    *rlen = 0;
    expire(d, now_ms);
    if (d->len == 0)
        return DRC_MISS;
    digest(req, len, h);
    struct dentry *en = idx_find(d, h);
    if (en) {
        if (en->done) {
            if (!en->reply)
                return DRC_MISS; /* answered, but not kept: refused as a replay */
            *reply = en->reply;
            *rlen = en->rlen;
            return DRC_DONE;
        }
        if (en->waiting && d->ctl_free) /* an earlier resend: its connection is gone too */
            d->ctl_free(en->waiting);
        en->waiting = ctl;
        return DRC_PENDING;
    }
    return DRC_MISS;
}

void drc_begin(drc *d, const uint8_t *req, size_t len, uint64_t id, uint64_t now_ms)
{
    struct dentry *en;

    expire(d, now_ms);
    if (d->len == d->cap)
        drop_oldest(d);
    en = at(d, d->len);
    memset(en, 0, sizeof *en);
    digest(req, len, en->digest);
    en->id = id;
    en->t_ms = now_ms;
    idx_insert(d, (size_t)(en - d->ring));
    d->len++;
}

void *drc_answer(drc *d, uint64_t id, const uint8_t *reply, size_t len)
{
    struct dentry *en = NULL;
    void *waiting;

    for (size_t i = d->len; i-- > 0;) {
        struct dentry *x = at(d, i);
        if (!x->done && x->id == id) {
            en = x;
            break;
        }
    }
    if (!en)
        return NULL;
    while (d->bytes + len > d->max_bytes && d->len > 0 && at(d, 0) != en)
        drop_oldest(d);
    en->done = 1;
    if (d->bytes + len <= d->max_bytes && (en->reply = malloc(len ? len : 1)) != NULL) {
        memcpy(en->reply, reply, len);
        en->rlen = len;
        d->bytes += len;
    }
    waiting = en->waiting;
    en->waiting = NULL;
    return waiting;
}

size_t drc_count(const drc *d)
{
    return d->len;
}
