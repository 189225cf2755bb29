/* Ring generators: the pipelined ring reduce-scatter / all-gather (the
 * bandwidth-optimal all-reduce is both, with the final conversion between
 * them, chunk by chunk) and the pipelined chain broadcast. */
#include "algo.h"

#include <stdlib.h>

static int mod(int a, int m)
{
    return ((a % m) + m) % m;
}

int gen_ring(struct gen *g, const uint64_t *bo, int flags)
{
    struct sched *s = g->s;
    const struct xfer *x = &g->x;
    int m = g->m, r = g->me, next = g->mem[(r + 1) % m], prev = g->mem[mod(r - 1, m)];
    uint32_t since = s->nops;
    uint64_t K = 0, c = x->chunk;

    for (int b = 0; b < m; b++) {
        uint64_t nk = gen_nchunks(bo[b], bo[b + 1], c);
        if (nk > K)
            K = nk;
    }
    int *last = malloc(sizeof(int) * (size_t)(m * K + 1)), *rsend = malloc(sizeof(int) * (size_t)(m * K + 1));
    if (!last || !rsend) {
        free(last), free(rsend);
        s->failed = 1;
        return -1;
    }
    for (uint64_t i = 0; i < m * K; i++)
        last[i] = g->dep, rsend[i] = -1;
#define CH(b, k) ((size_t)(b) * K + (k))
#define FOR_CHUNKS(b, k, off, n)                                                    \
    for (uint64_t k = 0, off = bo[b], n = 0; off < bo[b + 1] &&                     \
         ((n = bo[b + 1] - off < c ? bo[b + 1] - off : c), 1); k++, off += n)

    if (flags & RING_RS) {
        for (int st = 0; st < m - 1; st++, g->step++) {
            int sb = mod(r - st - 1, m), rb = mod(r - st - 2, m);
            FOR_CHUNKS(sb, k, off, n)
            rsend[CH(sb, k)] = sched_send(s, next, x->wbuf, off * x->wesz, n * x->wesz, g->step,
                                          (uint32_t)k, off * x->wesz, last[CH(sb, k)]);
            FOR_CHUNKS(rb, k, off, n)
            last[CH(rb, k)] = sched_recv_reduce(s, prev, x->rkern, x->wbuf, off * x->wesz, n * x->wesz,
                                                g->step, (uint32_t)k, off * x->wesz, g->dep,
                                                last[CH(rb, k)]);
        }
    }
    if (flags & RING_FIN) {
        FOR_CHUNKS(r, k, off, n)
        last[CH(r, k)] = sched_local(s, K_FIN, x->obuf, off * x->oesz, x->wbuf, off * x->wesz, n, off,
                                     last[CH(r, k)]);
    }
    if (flags & RING_AG) {
        for (int st = 0; st < m - 1; st++, g->step++) {
            int sb = mod(r - st, m), rb = mod(r - 1 - st, m);
            FOR_CHUNKS(sb, k, off, n)
            sched_send(s, next, x->obuf, off * x->oesz, n * x->oesz, g->step, (uint32_t)k,
                       off * x->oesz, last[CH(sb, k)]);
            FOR_CHUNKS(rb, k, off, n) {
                int id = sched_recv(s, prev, x->obuf, off * x->oesz, n * x->oesz, g->step, (uint32_t)k,
                                    off * x->oesz, last[CH(rb, k)]);
                sched_dep(s, rsend[CH(rb, k)], id);
                last[CH(rb, k)] = id;
            }
        }
    }
#undef CH
#undef FOR_CHUNKS
    free(last);
    free(rsend);
    return sched_barrier(s, since, g->dep);
}

int gen_bcast_chain(struct gen *g, int root, uint64_t base, uint64_t count)
{
    struct sched *s = g->s;
    const struct xfer *x = &g->x;
    int m = g->m, v = mod(g->me - root, m);
    int next = g->mem[(g->me + 1) % m], prev = g->mem[mod(g->me - 1, m)];
    uint32_t since = s->nops;
    uint64_t k = 0;

    for (uint64_t off = base; off < base + count; off += x->chunk, k++) {
        uint64_t n = base + count - off < x->chunk ? base + count - off : x->chunk;
        int r = g->dep;
        if (v > 0)
            r = sched_recv(s, prev, x->obuf, off * x->oesz, n * x->oesz, g->step, (uint32_t)k,
                           off * x->oesz, g->dep);
        if (v < m - 1)
            sched_send(s, next, x->obuf, off * x->oesz, n * x->oesz, g->step, (uint32_t)k,
                       off * x->oesz, r);
    }
    g->step++;
    return sched_barrier(s, since, g->dep);
}
