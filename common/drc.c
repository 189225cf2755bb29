/* Duplicate-request cache: a ring of entries in arrival order, scanned whole
 * on lookup (a few thousand entries at control-plane rates). */
#include "drc.h"

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
    if (!(d->ring = calloc(max_entries, sizeof *d->ring))) {
        free(d);
        return NULL;
    }
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

static void drop_oldest(drc *d)
{
    struct dentry *en = at(d, 0);
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
    for (size_t i = d->len; i-- > 0;) {
        struct dentry *en = at(d, i);
        if (memcmp(en->digest, h, DIGEST_BYTES) != 0)
            continue;
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
