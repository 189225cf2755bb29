/* Turns a validated request into this core's schedule: picks the algorithm
 * (auto: by size and topology, thresholds below), lays out the buffers
 * (input, float32 work buffer for bf16, fixed-point buffer for reproducible
 * mode, output), and runs the LOCAL kernels the schedule asks for.
 *
 * Automatic choice, measured with `tpuctl bench allreduce --algo hd|ring
 * --iters 30` on 4 workers (distinct host ids, TCP) sharing a 2-core VM:
 * hd 489/516/519/581/555/674/827 us at 4K..256K against ring 621/533/1674/
 * 1499/1781/1382/1949 us; at 512K-1M they meet (1.4-2.6 ms, noisy). Later,
 * with the loop polling while it waits (net/peers.c) and shared-memory
 * receives reducing from the ring, medians of 6 alternating runs on the same
 * (busy) VM: TCP n = 4 hd/ring 1575/1649 us at 512K, 2558/3522 at 1M,
 * 11049/11240 at 2M (three earlier sweeps also had hd ahead at 1M); shared
 * memory n = 4 643/795 at 512K, 1058/1079 at 1M, 2057/2184 at 2M. For groups
 * that are not a power of two hd first folds whole buffers into partners,
 * which costs more the larger they are. So:
 *   all-reduce: hd below COLL_HD_MAX (512 KiB), and for a power-of-two group
 *   below COLL_HD_POW2_MAX (2 MiB), ring above; hier when the
 *   group spans several hosts with several cores each and the buffer is at
 *   least COLL_HIER_MIN bytes (2 hosts x 3 cores, 1 MiB: hier 0.78 GB/s busbw
 *   vs ring 0.68, hd 0.69; above 2 MiB all three are within noise here);
 *   broadcast: binomial tree below COLL_HD_MAX, chain above; all-gather /
 *   reduce-scatter: hd (powers of two) below COLL_HD_MAX.
 * Below COLL_RD_MAX bytes the hd generator does recursive doubling of the
 * whole buffer (log2 p steps instead of 2 log2 p): 4 workers over TCP, 4-16
 * KiB: 206-228 us against 362-479 us with halving-doubling, measured side by
 * side (TPUEMU_COLL_RD_MAX=0 vs default); at 32 KiB they are even.
 * tpu-worker's --coll-hd-max (both hd bounds), --coll-rd-max, --coll-hier-min,
 * --coll-chunk and --coll-depth (or their TPUEMU_COLL_* variables; defaults
 * in core/tuning.c) override them for measuring.
 * Chunks: COLL_CHUNK bytes (at least 1/COLL_MAX_CHUNKS of the buffer), with
 * COLL_DEPTH receive slots in flight per collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "coll_int.h"
#include "reduce.h"
#include "tuning.h"

#define COLL_HD_MAX (512u * 1024u)
#define COLL_HD_POW2_MAX (2u * 1024u * 1024u)
#define COLL_MAX_CHUNKS 16384u
#define ALGO_DIRECT (-1) /* not a wire value: the direct intra-host path (direct.c) */

static void run_local(struct sched *s, const struct sop *o)
{
    struct cop *op = s->owner;
    uint8_t *d = s->buf[o->dbuf] + o->doff, *src = s->buf[o->sbuf] + o->soff;
    float div = op->op == TPUEMU__REDUCE_OP__REDUCE_MEAN ? (float)op->g : 1.0f;

    switch (o->kern) {
    case K_F32_SUM:
        reduce_f32_sum((float *)d, (const float *)src, o->len / 4);
        break;
    case K_F32_MAX:
        reduce_f32_max((float *)d, (const float *)src, o->len / 4);
        break;
    case K_F32_MIN:
        reduce_f32_min((float *)d, (const float *)src, o->len / 4);
        break;
    case K_I64_SUM:
        repro_sum_i64((int64_t *)(void *)d, (const int64_t *)(const void *)src, o->len / 8);
        break;
    case K_COPY:
        if (o->len) /* src may be NULL for an empty block */
            memcpy(d, src, o->len);
        break;
    case K_PRO:
        bf16_to_f32_n((float *)(void *)s->buf[SB_W], (const uint16_t *)(void *)s->buf[SB_I], op->count);
        break;
    case K_EXP:
        if (op->bf16)
            repro_exponents_bf16((float *)(void *)s->buf[SB_X], (const uint16_t *)(void *)s->buf[SB_I],
                                 op->count);
        else
            repro_exponents((float *)(void *)s->buf[SB_X], (const float *)(void *)s->buf[SB_I], op->count);
        break;
    case K_FIX:
        if (op->bf16)
            repro_to_fixed_bf16((int64_t *)(void *)s->buf[SB_Q], (const uint16_t *)(void *)s->buf[SB_I], 0,
                                op->count, (const float *)(void *)s->buf[SB_X]);
        else
            repro_to_fixed((int64_t *)(void *)s->buf[SB_Q], (const float *)(void *)s->buf[SB_I], 0,
                           op->count, (const float *)(void *)s->buf[SB_X]);
        break;
    case K_DIN:
    case K_DRED:
    case K_DPUB:
    case K_DOUT:
    case K_DALL:
    case K_HS:
        direct_run_local(s, o);
        break;
    case K_FIN:
        if (op->repro && op->bf16)
            repro_from_fixed_bf16((uint16_t *)(void *)d, (const int64_t *)(void *)src, o->aux, o->len,
                                  (const float *)(void *)s->buf[SB_X], div);
        else if (op->repro)
            repro_from_fixed((float *)(void *)d, (const int64_t *)(void *)src, o->aux, o->len,
                             (const float *)(void *)s->buf[SB_X], div);
        else {
            if (div > 1.0f)
                reduce_f32_div((float *)(void *)src, o->len, div);
            if (op->bf16)
                bf16_from_f32_n((uint16_t *)(void *)d, (const float *)(void *)src, o->len);
        }
        break;
    default:
        break;
    }
}

static void run_reduce(struct sched *s, int kern, uint8_t *d, const uint8_t *src, size_t len)
{
    (void)s;
    switch (kern) {
    case K_F32_SUM:
        reduce_f32_sum((float *)(void *)d, (const float *)(const void *)src, len / 4);
        break;
    case K_F32_MAX:
        reduce_f32_max((float *)(void *)d, (const float *)(const void *)src, len / 4);
        break;
    case K_F32_MIN:
        reduce_f32_min((float *)(void *)d, (const float *)(const void *)src, len / 4);
        break;
    case K_I64_SUM:
        repro_sum_i64((int64_t *)(void *)d, (const int64_t *)(const void *)src, len / 8);
        break;
    default:
        break;
    }
}

static int is_pow2(int n)
{
    return n > 0 && (n & (n - 1)) == 0;
}

static void *own_alloc(struct sched *s, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p && sched_own(s, p) != 0) {
        free(p);
        p = NULL;
    }
    return p;
}

void coll_algo_name(struct cop *op)
{
    int shm = 0;
    if (op->s)
        for (int i = 0; i < op->s->g; i++)
            if (op->s->pp[i].ch && op->s->x.ops->is_shm(op->s->pp[i].ch))
                shm = 1;
    snprintf(op->algo_buf, sizeof op->algo_buf, "%s%s", op->algo_used, shm ? "+shm" : "");
    op->algo_used = op->algo_buf;
}

int coll_needs_hosts(const struct cop *op)
{
    /* hier needs them; hd keeps its largest halves inside hosts (hd.c) */
    if (op->kind != TPUEMU__COLL_KIND__COLL_ALL_REDUCE)
        return 0;
    return op->algo == TPUEMU__ALGO__ALGO_HIER ||
           (op->g >= 4 && (op->algo == TPUEMU__ALGO__ALGO_HD || op->algo == TPUEMU__ALGO__ALGO_AUTO));
}

int coll_build(struct cop *op, struct xport x, const int *host, err *e)
{
    unsigned esz = op->bf16 ? 2 : 4;
    uint64_t bytes = op->count * esz, n = op->count;
    int g = op->g, me = op->me, algo = op->algo;
    int reduce = op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE ||
                 op->kind == TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER;
    int repro = op->repro && reduce &&
                (op->op == TPUEMU__REDUCE_OP__REDUCE_SUM || op->op == TPUEMU__REDUCE_OP__REDUCE_MEAN);
    unsigned wesz = repro ? 8 : (reduce ? 4 : esz);
    const struct tuning *tu = tuning_get();
    uint64_t chunk = op->chunk_bytes ? op->chunk_bytes : (uint64_t)tu->coll_chunk;
    uint64_t hd_max = tu->coll_hd_max >= 0 ? (uint64_t)tu->coll_hd_max : COLL_HD_MAX;
    uint64_t hd_pow2_max = tu->coll_hd_max >= 0 ? (uint64_t)tu->coll_hd_max : COLL_HD_POW2_MAX;
    uint64_t hier_min = (uint64_t)tu->coll_hier_min;
    int depth = (int)tu->coll_depth;
    int *mem;
    struct sched *s;

    op->repro = repro;
    if (chunk < bytes / COLL_MAX_CHUNKS)
        chunk = bytes / COLL_MAX_CHUNKS;
    uint64_t celems = chunk / wesz ? chunk / wesz : 1;
    if (celems > n && n > 0)
        celems = n;
    if (depth < 1 || depth > 64)
        depth = COLL_DEPTH;

    /* the algorithm */
    if (algo == TPUEMU__ALGO__ALGO_AUTO) {
        algo = bytes < hd_max ? TPUEMU__ALGO__ALGO_HD : TPUEMU__ALGO__ALGO_RING;
        if (op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE && is_pow2(g) && bytes < hd_pow2_max)
            algo = TPUEMU__ALGO__ALGO_HD;
        if (op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE && g >= 4 && bytes >= hier_min)
            algo = TPUEMU__ALGO__ALGO_HIER; /* if the topology fits, below */
    }
    if (algo == TPUEMU__ALGO__ALGO_HIER && op->kind != TPUEMU__COLL_KIND__COLL_ALL_REDUCE)
        algo = TPUEMU__ALGO__ALGO_RING;
    if (algo == TPUEMU__ALGO__ALGO_HD && !is_pow2(g) &&
        (op->kind == TPUEMU__COLL_KIND__COLL_ALL_GATHER || op->kind == TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER))
        algo = TPUEMU__ALGO__ALGO_RING;

    s = sched_new(op->seq, op->what, g, me, op->members, x, celems * wesz, depth);
    if (!s || !(mem = own_alloc(s, sizeof(int) * (size_t)g)) || (!op->borrowed && sched_own(s, op->payload) != 0)) {
        sched_free(s);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for %s #%llu", op->what,
                       (unsigned long long)op->seq);
    }
    op->s = s;
    s->owner = op;
    s->local = run_local;
    s->reduce = run_reduce;
    s->buf[SB_I] = op->payload;
    op->input = op->payload;
    op->input_len = op->len;
    op->payload = NULL;
    for (int i = 0; i < g; i++)
        mem[i] = i;
    if (!(s->buf[SB_T] = own_alloc(s, (size_t)depth * s->slot_bytes)))
        goto oom;

    struct gen G = {s, mem, g, me, -1, 0, {0}, 0, NULL};
    G.x.chunk = celems;
    G.rd_max = (uint64_t)tu->coll_rd_max / wesz;
    G.host = host;
    uint64_t *bo = own_alloc(s, sizeof(uint64_t) * (size_t)(g + 1));
    if (!bo)
        goto oom;
    int flags = 0;

    /* the cores of one host agreed on the direct path (coll.c), and the
     * buffer fits their segments: the whole group on this host with the
     * automatic choice (direct_flat), or the phases inside the host of hier */
    int direct = op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE && !repro && op->dir.cap && op->dir.L >= DIRECT_MIN_L &&
                 n * 4 <= op->dir.cap;
    int direct_flat = direct && op->dir.L == g && op->algo == TPUEMU__ALGO__ALGO_AUTO;
    if (reduce) {
        int rk = op->op == TPUEMU__REDUCE_OP__REDUCE_MAX ? K_F32_MAX
                 : op->op == TPUEMU__REDUCE_OP__REDUCE_MIN ? K_F32_MIN : K_F32_SUM;
        int mean = op->op == TPUEMU__REDUCE_OP__REDUCE_MEAN;
        s->buf[SB_O] = s->buf[SB_I];
        if (repro) {
            uint64_t nb = repro_nblocks(n);
            if (!(s->buf[SB_X] = own_alloc(s, nb * 4)) || !(s->buf[SB_Q] = own_alloc(s, n * 8)))
                goto oom;
            struct gen G1 = G;
            G1.dep = sched_local(s, K_EXP, SB_X, 0, SB_I, 0, 0, 0, -1);
            G1.x = (struct xfer){SB_X, K_F32_MAX, 4, SB_X, 4, 0, nb};
            if (nb * 4 < hd_max || g < 3) {
                G1.x.chunk = nb;
                sched_dep(s, -1, gen_hd_allreduce(&G1, 0, nb));
            } else {
                for (int b = 0; b <= g; b++)
                    bo[b] = (uint64_t)b * nb / (uint64_t)g;
                G1.x.chunk = celems * 2;
                gen_ring(&G1, bo, RING_RS | RING_AG);
            }
            int bar = sched_barrier(s, 0, -1);
            G.dep = sched_local(s, K_FIX, SB_Q, 0, SB_I, 0, 0, 0, bar);
            G.step = G1.step;
            G.x = (struct xfer){SB_Q, K_I64_SUM, 8, SB_O, esz, 1, celems};
        } else if (op->bf16) {
            if (!direct_flat && !(s->buf[SB_W] = own_alloc(s, n * 4)))
                goto oom;
            if (!direct_flat)
                G.dep = sched_local(s, K_PRO, SB_W, 0, SB_I, 0, 0, 0, -1);
            G.x = (struct xfer){SB_W, rk, 4, SB_O, 2, 1, celems};
        } else {
            s->buf[SB_W] = s->buf[SB_I];
            G.x = (struct xfer){SB_W, rk, 4, SB_O, 4, mean, celems};
        }
        flags = RING_RS | (G.x.fin ? RING_FIN : 0);
        for (int b = 0; b <= g; b++)
            bo[b] = (uint64_t)b * n / (uint64_t)g;
        if (op->kind == TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER) {
            if (algo == TPUEMU__ALGO__ALGO_HD)
                gen_hd_blocks(&G, bo, flags);
            else
                gen_ring(&G, bo, flags);
            op->out = s->buf[SB_O] + bo[me] * G.x.oesz;
            op->out_len = (bo[me + 1] - bo[me]) * G.x.oesz;
        } else {
            int done = 0;
            /* the cores of one host agreed on the direct path (coll.c), and
             * the buffer fits their segments */
            if (direct && !(s->buf[SB_B] = own_alloc(s, 16 + 16 * (size_t)op->dir.L)))
                goto oom;
            op->dir.base = 0;
            op->dir.count = n;
            if (direct_flat) {
                /* one host: no prologue, the bfloat16 input converts on its way in */
                op->dir.bf16_in = op->bf16;
                G.x.fin = 1;
                if (n * 4 < op->dir.one_max)
                    gen_direct_one(&G, &op->dir);
                else
                    gen_direct(&G, &op->dir, RING_RS | RING_FIN | RING_AG);
                algo = ALGO_DIRECT;
                done = 1;
            }
            if (!done && algo == TPUEMU__ALGO__ALGO_HIER) {
                if (!host)
                    goto oom; /* coll_needs_hosts said yes: its caller could not find them */
                int L = 0; /* cores of my host: the cross-host share is bytes / L */
                for (int i = 0; i < g; i++)
                    L += host[i] == host[me];
                int r = gen_hier_allreduce(&G, host, n, L > 0 && bytes / (uint64_t)L < hd_max,
                                           direct && op->dir.L == L ? &op->dir : NULL);
                done = r != -2;
                if (!done && op->algo == TPUEMU__ALGO__ALGO_AUTO)
                    algo = bytes < hd_max || (is_pow2(g) && bytes < hd_pow2_max) ? TPUEMU__ALGO__ALGO_HD
                                                                                : TPUEMU__ALGO__ALGO_RING;
                else if (!done)
                    algo = TPUEMU__ALGO__ALGO_RING;
            }
            if (!done && algo == TPUEMU__ALGO__ALGO_HD)
                gen_hd_allreduce(&G, 0, n);
            else if (!done)
                gen_ring(&G, bo, flags | RING_AG);
            op->out = s->buf[SB_O];
            op->out_len = n * G.x.oesz;
        }
    } else if (op->kind == TPUEMU__COLL_KIND__COLL_BROADCAST) {
        if (op->input_len == 0 && !(s->buf[SB_I] = own_alloc(s, bytes)))
            goto oom;
        s->buf[SB_O] = s->buf[SB_I];
        G.x = (struct xfer){SB_O, K_COPY, esz, SB_O, esz, 0, celems};
        if (algo == TPUEMU__ALGO__ALGO_HD)
            gen_bcast_tree(&G, op->root, 0, n);
        else
            gen_bcast_chain(&G, op->root, 0, n);
        op->out = s->buf[SB_O];
        op->out_len = bytes;
        op->input = NULL; /* nothing to restore between iterations */
        op->input_len = 0;
    } else { /* all-gather */
        if (!(s->buf[SB_O] = own_alloc(s, bytes * (uint64_t)g)))
            goto oom;
        G.x = (struct xfer){SB_O, K_COPY, esz, SB_O, esz, 0, celems};
        G.dep = sched_local(s, K_COPY, SB_O, (uint64_t)me * bytes, SB_I, 0, bytes, 0, -1);
        for (int b = 0; b <= g; b++)
            bo[b] = (uint64_t)b * n;
        if (algo == TPUEMU__ALGO__ALGO_HD)
            gen_hd_blocks(&G, bo, RING_AG);
        else
            gen_ring(&G, bo, RING_AG);
        op->out = s->buf[SB_O];
        op->out_len = bytes * (uint64_t)g;
        op->input = NULL;
        op->input_len = 0;
    }
    op->algo_used = algo == ALGO_DIRECT               ? "direct"
                    : algo == TPUEMU__ALGO__ALGO_HD   ? "hd"
                    : algo == TPUEMU__ALGO__ALGO_HIER ? "hier"
                                                      : "ring";
    return sched_finish(s, e);
oom:
    return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory building %s #%llu", op->what,
                   (unsigned long long)op->seq);
}
