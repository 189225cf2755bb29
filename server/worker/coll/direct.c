/* The direct intra-host all-reduce (algo.h: gen_direct), its kernels and the
 * hand-shake by which the cores of a host agree to use it.
 *
 * Every core has a host segment (net/: a sealed memfd made per epoch and
 * passed to each same-host peer with its shared-memory link, xport seg): an
 * input area and a result area. For an all-reduce over the L cores of one
 * host, core j copies its input (as float32) into its input area once;
 * barrier A; it reduces elements [bo[j], bo[j+1]) of the L input areas, read
 * in place from the peers' segments in core order 0..L-1 (so every element
 * gets the same bits whichever core reduces it, run after run), finishes them
 * (MEAN, bfloat16) into its result area; barrier B; it copies the L result
 * slices out. One copy in, one copy out, L reads per element in all, two
 * barriers: against halving-doubling's log2 L steps each moving and reducing
 * half the buffer through the rings.
 *
 * Reuse without a third barrier: a core writes its input area again only in
 * the next collective, after barrier B, when every peer has finished reading
 * it (their reduce precedes their B message); it writes its result area
 * again only after the next barrier A, when every peer has finished copying
 * out (their copy-out precedes the next A message).
 *
 * The barriers are 8-byte messages to every other core of the host over the
 * links (the shared-memory rings: a release store of the ring's head counter,
 * the receiver polling it with sched_yield for TPUEMU_SPIN_US and then
 * sleeping on the ring's eventfd). They are ordinary link operations: a core
 * that dies, stops or is cut off (tpuctl chaos partition) fails the collective
 * on every survivor with the same message naming it, within the same bound.
 *
 * The hand-shake: whether a core has every peer's segment mapped is its own
 * knowledge (a link may fall back to TCP, a worker may run with
 * TPUEMU_COLL_SHM_DIRECT=0 or --transport tcp), so before the first
 * all-reduce of an epoch over a given set of same-host cores they exchange
 * two words (the first round brings the links up, the second carries each
 * core's verdict) and use the direct path only when every verdict is yes.
 * coll.c runs it, and caches the answer until the set or the epoch changes. */
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "coll_int.h"
#include "reduce.h"
#include "tuning.h"

#define HS_STEP 0xfff0u      /* the hand-shake's steps: above any algorithm's */
/* Below this many float32 bytes one barrier (gen_direct_one), at and above
 * two (gen_direct): --coll-shm-one-max of tpu-worker (64 KiB by default), the
 * smallest of the host's cores' values is used (build.c has the numbers). */
#define DRED_BLOCK 2048u     /* floats reduced per pass (8 KiB: stays in L1) */

static uint8_t *seg_of(struct sched *s, int rank, size_t *len)
{
    return s->x.ops->seg ? s->x.ops->seg(s->x.self, s->replica[rank], len) : NULL;
}

int direct_candidate(const struct cop *op, struct xport x)
{
    return op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE && !op->repro && op->g >= 2 && x.ops->seg != NULL;
}

int direct_local_set(struct cop *op, const int *host)
{
    struct direct *d = &op->dir;
    int L = 0;
    d->j = -1;
    for (int i = 0; i < op->g; i++)
        if (host[i] == host[op->me]) {
            if (L == DIRECT_MAX_L)
                return d->L = 0;
            if (i == op->me)
                d->j = L;
            d->loc[L++] = i;
        }
    return d->L = L;
}

/* ---- the hand-shake ---- */

struct sched *direct_handshake(struct cop *op, struct xport x, err *e)
{
    const struct direct *d = &op->dir;
    struct sched *s = sched_new(op->seq, op->what, op->g, op->me, op->members, x, 8, 1);
    uint8_t *b = calloc(16 + 8 * (size_t)d->L, 1);
    if (!s || !b || sched_own(s, b) != 0) {
        free(b);
        sched_free(s);
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the hand-shake of %s #%llu", op->what,
                (unsigned long long)op->seq);
        return NULL;
    }
    s->buf[SB_B] = b;
    s->local = direct_run_local;
    s->owner = (void *)op;
    for (int k = 0; k < d->L; k++)
        if (k != d->j) {
            sched_send(s, d->loc[k], SB_B, 0, 8, HS_STEP, 0, 0, -1);
            sched_recv(s, d->loc[k], SB_B, 16 + 8 * (uint64_t)k, 8, HS_STEP, 0, 0, -1);
        }
    int v = sched_local(s, K_HS, SB_B, 8, SB_B, 8, 8, 0, sched_barrier(s, 0, -1));
    for (int k = 0; k < d->L; k++)
        if (k != d->j) {
            sched_send(s, d->loc[k], SB_B, 8, 8, HS_STEP + 1, 0, 0, v);
            sched_recv(s, d->loc[k], SB_B, 16 + 8 * (uint64_t)k, 8, HS_STEP + 1, 0, 0, v);
        }
    if (sched_finish(s, e) != CODE_OK) {
        sched_free(s);
        return NULL;
    }
    return s;
}

/* This core's verdict: 0 unless its own segment and every peer's are
 * mapped, else 1 + its bound of the one-barrier variant. */
static uint64_t verdict(struct sched *s, const struct direct *d)
{
    for (int k = 0; k < d->L; k++) {
        size_t len;
        if (!seg_of(s, d->loc[k], &len) || len < 128)
            return 0;
    }
    return 1 + (uint64_t)tuning_get()->coll_shm_one_max;
}

size_t direct_agreed(struct sched *hs, const struct cop *op, size_t *one_max)
{
    const struct direct *d = &op->dir;
    const uint8_t *b = hs->buf[SB_B];
    size_t cap = SIZE_MAX;
    uint64_t w;

    memcpy(&w, b + 8, 8);
    *one_max = 0;
    if (!w)
        return 0;
    *one_max = (size_t)(w - 1);
    for (int k = 0; k < d->L; k++) {
        size_t len;
        if (k != d->j) {
            memcpy(&w, b + 16 + 8 * (size_t)k, 8);
            if (w == 0)
                return 0;
            if (w - 1 < *one_max)
                *one_max = (size_t)(w - 1);
        }
        if (!seg_of(hs, d->loc[k], &len))
            return 0;
        if (len / 2 < cap)
            cap = len / 2;
    }
    return cap & ~(size_t)63;
}

/* ---- the generator ---- */

/* An 8-byte message to every other core of the host (the word at SB_B 0:
 * the area its input went to), and one from each into its slot (second:
 * barrier B's), posted at once: the links keep them in order. */
static int barrier(struct gen *g, const struct direct *d, int dep, int second)
{
    struct sched *s = g->s;
    uint32_t since = s->nops;
    for (int k = 0; k < d->L; k++)
        if (k != d->j) {
            sched_send(s, d->loc[k], SB_B, 0, 8, g->step, 0, 0, dep);
            sched_recv(s, d->loc[k], SB_B, 16 + 8 * (uint64_t)(k + (second ? d->L : 0)), 8, g->step, 0, 0, g->dep);
        }
    return sched_barrier(s, since, dep);
}

/* The area peer k (local index) wrote its input to in this run: its word. */
static int area_of(struct sched *s, const struct direct *d, int k)
{
    uint64_t w;
    if (k == d->j)
        return d->q;
    memcpy(&w, s->buf[SB_B] + 16 + 8 * (size_t)k, 8);
    return (int)(w & 1);
}

int gen_direct_one(struct gen *g, struct direct *d)
{
    struct sched *s = g->s;
    uint32_t since = s->nops;
    int in = sched_local(s, K_DIN, SB_W, 0, d->bf16_in ? SB_I : g->x.wbuf, d->base * (d->bf16_in ? 2u : 4u),
                         d->count, 0, g->dep);
    sched_local(s, K_DALL, g->x.obuf, 0, SB_W, 0, 0, 0, barrier(g, d, in, 0));
    g->step++;
    return sched_barrier(s, since, g->dep);
}

int gen_direct(struct gen *g, struct direct *d, int flags)
{
    struct sched *s = g->s;
    uint32_t since = s->nops;
    int L = d->L, red = g->dep;

    for (int b = 0; b <= L; b++)
        d->bo[b] = (uint64_t)b * d->count / (uint64_t)L;
    if (flags & RING_RS) {
        unsigned isz = d->bf16_in ? 2 : 4;
        int in = sched_local(s, K_DIN, SB_W, 0, d->bf16_in ? SB_I : g->x.wbuf, d->base * isz, d->count, 0,
                             g->dep);
        d->fin = (flags & RING_FIN) != 0;
        red = sched_local(s, K_DRED, g->x.wbuf, 0, SB_W, 0, 0, 0, barrier(g, d, in, 0));
        g->step += (uint32_t)(L - 1);
    }
    if (flags & RING_AG) {
        int pub = (flags & RING_RS) && d->fin ? red
                                              : sched_local(s, K_DPUB, SB_O, 0, g->x.obuf, 0, 0, 0, red);
        sched_local(s, K_DOUT, g->x.obuf, 0, SB_O, 0, 0, 0, barrier(g, d, pub, 1));
        g->step += (uint32_t)(L - 1);
    }
    return sched_barrier(s, since, g->dep);
}

/* ---- the kernels ---- */

static void reduce_block(int op, float *acc, const float *src, size_t n)
{
    if (op == TPUEMU__REDUCE_OP__REDUCE_MAX)
        reduce_f32_max(acc, src, n);
    else if (op == TPUEMU__REDUCE_OP__REDUCE_MIN)
        reduce_f32_min(acc, src, n);
    else
        reduce_f32_sum(acc, src, n);
}

/* Reduces elements [lo, hi) of the L input areas (in core order) into acc
 * blocks and hands each block to out(): the same bits on every core. */
static void reduce_range(struct sched *s, const struct cop *op, const struct direct *d, const uint8_t *const *in,
                         uint64_t lo, uint64_t hi, uint8_t *dst, unsigned dsz, int fin, uint64_t dbase)
{
    float acc[DRED_BLOCK];
    float div = op->op == TPUEMU__REDUCE_OP__REDUCE_MEAN ? (float)op->g : 1.0f;
    (void)s;
    for (uint64_t off = lo; off < hi; off += DRED_BLOCK) {
        size_t n = hi - off < DRED_BLOCK ? (size_t)(hi - off) : DRED_BLOCK;
        memcpy(acc, in[0] + off * 4, n * 4);
        for (int k = 1; k < d->L; k++)
            reduce_block(op->op, acc, (const float *)(const void *)(in[k] + off * 4), n);
        if (fin && div > 1.0f)
            reduce_f32_div(acc, n, div);
        if (fin && dsz == 2)
            bf16_from_f32_n((uint16_t *)(void *)(dst + (dbase + off) * 2), acc, n);
        else
            memcpy(dst + (dbase + off) * 4, acc, n * 4);
    }
}

void direct_run_local(struct sched *s, const struct sop *o)
{
    struct cop *op = s->owner;
    struct direct *d = &op->dir;
    unsigned oesz = op->bf16 ? 2 : 4;
    const uint8_t *in[DIRECT_MAX_L], *res[DIRECT_MAX_L];
    size_t len;
    uint8_t *mine;

    if (o->kern == K_HS) {
        uint64_t w = verdict(s, d);
        memcpy(s->buf[SB_B] + 8, &w, 8);
        return;
    }
    for (int k = 0; k < d->L; k++) {
        const uint8_t *b = seg_of(s, d->loc[k], &len);
        int q = area_of(s, d, k);
        if (!b || len / 2 < d->cap) {
            d->broken = 1;
            return;
        }
        in[k] = b + (size_t)q * (len / 2);
        res[k] = b + (size_t)(1 - q) * (len / 2);
    }
    mine = (uint8_t *)(uintptr_t)in[d->j];
    switch (o->kern) {
    case K_DIN: {
        uint64_t w;
        d->q = d->last ? 1 - *d->last : 0;
        w = (uint64_t)d->q;
        memcpy(s->buf[SB_B], &w, 8); /* the barrier word: which area */
        mine = (uint8_t *)(uintptr_t)seg_of(s, d->loc[d->j], &len) + (size_t)d->q * (len / 2);
        if (d->bf16_in)
            bf16_to_f32_n((float *)(void *)mine, (const uint16_t *)(const void *)(s->buf[o->sbuf] + o->soff),
                          d->count);
        else if (d->count)
            memcpy(mine, s->buf[o->sbuf] + o->soff, d->count * 4);
        return;
    }
    case K_DALL: /* one barrier: the whole buffer, straight into the output */
        reduce_range(s, op, d, in, 0, d->count, s->buf[o->dbuf], oesz, 1, d->base);
        if (d->last)
            *d->last = d->q;
        return;
    case K_DRED: /* my slice: into wbuf (hier), or finished into my result area */
        if (d->fin)
            reduce_range(s, op, d, in, d->bo[d->j], d->bo[d->j + 1], (uint8_t *)(uintptr_t)res[d->j], oesz, 1, 0);
        else
            reduce_range(s, op, d, in, d->bo[d->j], d->bo[d->j + 1], s->buf[o->dbuf], 4, 0, d->base);
        return;
    case K_DPUB: {
        uint64_t lo = d->bo[d->j], n = d->bo[d->j + 1] - lo;
        if (n)
            memcpy((uint8_t *)(uintptr_t)res[d->j] + lo * oesz, s->buf[o->sbuf] + (d->base + lo) * oesz, n * oesz);
        return;
    }
    case K_DOUT:
        for (int k = 0; k < d->L; k++) {
            uint64_t lo = d->bo[k], n = d->bo[k + 1] - lo;
            if (n)
                memcpy(s->buf[o->dbuf] + (d->base + lo) * oesz, res[k] + lo * oesz, n * oesz);
        }
        if (d->last)
            *d->last = 1 - d->q;
        return;
    default:
        return;
    }
}
