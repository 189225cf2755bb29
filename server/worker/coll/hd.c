/* Latency-oriented generators: recursive halving-doubling all-reduce
 * (Rabenseifner; non-powers of two with the Thakur et al. fix-up: of the first
 * 2r ranks, r = n - 2^floor(log2 n), the evens hand their data to the odds and
 * get the result back at the end), recursive doubling for buffers smaller
 * than the number of cores, and the binomial-tree broadcast. Each step is
 * chunked too, so large buffers still pipeline within a step. */
#include "algo.h"

#include <stdlib.h>
#include <string.h>

/* chunked transfers of [lo, hi) elements */
static void send_range(struct gen *g, int peer, int buf, unsigned esz, uint64_t lo, uint64_t hi,
                       int dep, int *ids)
{
    uint64_t k = 0;
    for (uint64_t off = lo; off < hi; off += g->x.chunk, k++) {
        uint64_t n = hi - off < g->x.chunk ? hi - off : g->x.chunk;
        int id = sched_send(g->s, peer, buf, off * esz, n * esz, g->step, (uint32_t)k, off * esz, dep);
        if (ids)
            ids[k] = id;
    }
}

static void recv_range(struct gen *g, int peer, int buf, unsigned esz, uint64_t lo, uint64_t hi,
                       int dep)
{
    uint64_t k = 0;
    for (uint64_t off = lo; off < hi; off += g->x.chunk, k++) {
        uint64_t n = hi - off < g->x.chunk ? hi - off : g->x.chunk;
        sched_recv(g->s, peer, buf, off * esz, n * esz, g->step, (uint32_t)k, off * esz, dep);
    }
}

/* waits[k]: an extra dependency of chunk k's reduce (its send: same range).
 * Only the reduce waits for dep (the previous step): the receive into its
 * temporary slot is posted at once (the slot ring bounds how many), so a
 * partner's data finds its receive already posted instead of pausing the
 * connection (a read stop/start and an extra loop pass per step). */
static void recv_reduce_range(struct gen *g, int peer, uint64_t lo, uint64_t hi, int dep,
                              const int *waits)
{
    const struct xfer *x = &g->x;
    uint64_t k = 0;
    for (uint64_t off = lo; off < hi; off += x->chunk, k++) {
        uint64_t n = hi - off < x->chunk ? hi - off : x->chunk;
        int red = sched_recv_reduce(g->s, peer, x->rkern, x->wbuf, off * x->wesz, n * x->wesz, g->step,
                                    (uint32_t)k, off * x->wesz, g->dep, waits ? waits[k] : -1);
        sched_dep(g->s, dep, red);
    }
}

static void fin_range(struct gen *g, uint64_t lo, uint64_t hi, int dep)
{
    const struct xfer *x = &g->x;
    for (uint64_t off = lo; off < hi; off += x->chunk) {
        uint64_t n = hi - off < x->chunk ? hi - off : x->chunk;
        sched_local(g->s, K_FIN, x->obuf, off * x->oesz, x->wbuf, off * x->wesz, n, off, dep);
    }
}

/* v: my rank among p (a power of two); map: rank -> group rank. */
static int hd_core(struct gen *g, int v, int p, const int *map, const uint64_t *bo, int flags, int bar)
{
    struct sched *s = g->s;
    const struct xfer *x = &g->x;
    int lo = 0, hi = p;
    uint32_t since;

    if (flags & RING_RS) {
        for (int mask = p / 2; mask >= 1; mask /= 2, g->step++) {
            int peer = map[v ^ mask], mid = (lo + hi) / 2;
            since = s->nops;
            if (v & mask) {
                send_range(g, peer, x->wbuf, x->wesz, bo[lo], bo[mid], bar, NULL);
                recv_reduce_range(g, peer, bo[mid], bo[hi], bar, NULL);
                lo = mid;
            } else {
                send_range(g, peer, x->wbuf, x->wesz, bo[mid], bo[hi], bar, NULL);
                recv_reduce_range(g, peer, bo[lo], bo[mid], bar, NULL);
                hi = mid;
            }
            bar = sched_barrier(s, since, bar);
        }
    }
    if (flags & RING_FIN) {
        since = s->nops;
        fin_range(g, bo[v], bo[v + 1], bar);
        bar = sched_barrier(s, since, bar);
    }
    if (flags & RING_AG) {
        /* every step receives a range no earlier step touches: all the
         * receives are posted once the reduce-scatter is done */
        int agbar = bar;
        lo = v, hi = v + 1;
        for (int mask = 1; mask < p; mask *= 2, g->step++) {
            int peer = map[v ^ mask];
            since = s->nops;
            send_range(g, peer, x->obuf, x->oesz, bo[lo], bo[hi], bar, NULL);
            if (v & mask) {
                recv_range(g, peer, x->obuf, x->oesz, bo[lo - mask], bo[lo], agbar);
                lo -= mask;
            } else {
                recv_range(g, peer, x->obuf, x->oesz, bo[hi], bo[hi + mask], agbar);
                hi += mask;
            }
            bar = sched_barrier(s, since, bar);
        }
    }
    return bar;
}

int gen_hd_blocks(struct gen *g, const uint64_t *bo, int flags)
{
    uint32_t since = g->s->nops;
    hd_core(g, g->me, g->m, g->mem, bo, flags, g->dep);
    return sched_barrier(g->s, since, g->dep);
}

#define HD_MAX_STEPS 200 /* > 2 log2(any group) + 2: step numbers of the fix-up */

/* The reduce-scatter's first step exchanges half the buffer, each next one
 * half as much, and the all-gather mirrors it: the pairs of the first steps
 * should be cores of one host (shared memory), the last ones the pairs across
 * hosts (TCP). With hosts of L cores in replica order, partners at a distance
 * below L share a host, but the steps go from the largest distance down:
 * 2 hosts of 4 sent half the buffer each way over TCP, where a quarter of
 * that suffices. So when some distance that crosses hosts would come before
 * one that stays inside them, the virtual ranks' bits are permuted: the
 * distances whose pairs all share a host first (the largest of them
 * first), then the others (the same). map (virtual rank -> group rank) is
 * permuted in place; returns my new virtual rank. Every core computes the
 * same permutation from the same hosts, so they pair as before, only in
 * another order (the sums' order changes with it; replicas stay bitwise
 * equal). */
static int hd_host_order(const struct gen *g, int *map, int p, int v)
{
    int K = 0, order[31], no = 0, inside[31], cross_before = 0, seen_cross = 0;
    if (!g->host || p < 4)
        return v;
    while ((1 << K) < p)
        K++;
    for (int b = K - 1; b >= 0; b--) { /* the steps' current order */
        inside[b] = 1;
        for (int i = 0; i < p && inside[b]; i++)
            inside[b] = g->host[map[i]] == g->host[map[i ^ (1 << b)]];
        if (!inside[b])
            seen_cross = 1;
        else if (seen_cross)
            cross_before = 1;
    }
    if (!cross_before)
        return v;
    for (int b = K - 1; b >= 0; b--)
        if (inside[b])
            order[no++] = b;
    for (int b = K - 1; b >= 0; b--)
        if (!inside[b])
            order[no++] = b;
    /* virtual bit K-1-j is physical bit order[j] */
    int *old = malloc(sizeof(int) * (size_t)p);
    if (!old)
        return v; /* the order as it was: correct, only slower */
    memcpy(old, map, sizeof(int) * (size_t)p);
    int nv = v;
    for (int u = 0; u < p; u++) {
        int ph = 0;
        for (int j = 0; j < K; j++)
            if (u & (1 << (K - 1 - j)))
                ph |= 1 << order[j];
        map[u] = old[ph];
        if (ph == v)
            nv = u;
    }
    free(old);
    return nv;
}

int gen_hd_allreduce(struct gen *g, uint64_t base, uint64_t count)
{
    struct sched *s = g->s;
    const struct xfer *x = &g->x;
    int m = g->m, me = g->me, p = 1, rem, v, bar = g->dep;
    uint32_t since0 = s->nops, since, step0 = g->step;

    while (p * 2 <= m)
        p *= 2;
    rem = m - p;
    since = s->nops;
    if (me < 2 * rem) {
        if (me % 2 == 0) {
            send_range(g, g->mem[me + 1], x->wbuf, x->wesz, base, base + count, bar, NULL);
            v = -1;
        } else {
            recv_reduce_range(g, g->mem[me - 1], base, base + count, bar, NULL);
            v = me / 2;
        }
    } else {
        v = me - rem;
    }
    g->step++;
    bar = sched_barrier(s, since, bar);
    if (v >= 0) {
        int *map = malloc(sizeof(int) * (size_t)p);
        uint64_t *bo = malloc(sizeof(uint64_t) * (size_t)(p + 1));
        int *ids = NULL;
        if (!map || !bo) {
            free(map), free(bo);
            s->failed = 1;
            return -1;
        }
        for (int i = 0; i < p; i++)
            map[i] = g->mem[i < rem ? 2 * i + 1 : i + rem];
        if (count >= (uint64_t)p && count >= g->rd_max) {
            v = hd_host_order(g, map, p, v);
            for (int j = 0; j <= p; j++)
                bo[j] = base + (uint64_t)j * count / (uint64_t)p;
            bar = hd_core(g, v, p, map, bo, RING_RS | RING_AG | (x->fin ? RING_FIN : 0), bar);
        } else {
            /* recursive doubling of the whole (tiny) range: both partners
             * compute the same commutative reduction */
            ids = malloc(sizeof(int) * (size_t)(gen_nchunks(base, base + count, x->chunk) + 1));
            if (!ids) {
                s->failed = 1;
            } else {
                for (int mask = 1; mask < p; mask *= 2, g->step++) {
                    int peer = map[v ^ mask];
                    since = s->nops;
                    send_range(g, peer, x->wbuf, x->wesz, base, base + count, bar, ids);
                    recv_reduce_range(g, peer, base, base + count, bar, ids);
                    bar = sched_barrier(s, since, bar);
                }
            }
            if (x->fin) {
                since = s->nops;
                fin_range(g, base, base + count, bar);
                bar = sched_barrier(s, since, bar);
            }
        }
        free(ids);
        free(map);
        free(bo);
    }
    g->step = step0 + HD_MAX_STEPS;
    if (me < 2 * rem) {
        if (me % 2 == 1)
            send_range(g, g->mem[me - 1], x->obuf, x->oesz, base, base + count, bar, NULL);
        else
            recv_range(g, g->mem[me + 1], x->obuf, x->oesz, base, base + count, bar);
    }
    g->step++;
    return sched_barrier(s, since0, g->dep);
}

int gen_bcast_tree(struct gen *g, int root, uint64_t base, uint64_t count)
{
    struct sched *s = g->s;
    const struct xfer *x = &g->x;
    int m = g->m, v = ((g->me - root) % m + m) % m, parent = -1, mask = 1;
    uint32_t since = s->nops;
    uint64_t k = 0;

    while (mask < m) {
        if (v & mask) {
            parent = v - mask;
            break;
        }
        mask <<= 1;
    }
    for (uint64_t off = base; off < base + count; off += x->chunk, k++) {
        uint64_t n = base + count - off < x->chunk ? base + count - off : x->chunk;
        int r = g->dep;
        if (parent >= 0)
            r = sched_recv(s, g->mem[(parent + root) % m], x->obuf, off * x->oesz, n * x->oesz, g->step,
                           (uint32_t)k, off * x->oesz, g->dep);
        for (int cm = mask >> 1; cm > 0; cm >>= 1)
            if (v + cm < m)
                sched_send(s, g->mem[(v + cm + root) % m], x->obuf, off * x->oesz, n * x->oesz, g->step,
                           (uint32_t)k, off * x->oesz, r);
    }
    g->step++;
    return sched_barrier(s, since, g->dep);
}
