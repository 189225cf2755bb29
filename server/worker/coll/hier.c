/* Hierarchical all-reduce (2D, as NCCL's and Horovod's hierarchical modes):
 * the cores of each host reduce-scatter among themselves (cheap: same-host
 * links, shared memory when available), core j of every host all-reduces its
 * 1/L share with core j of the other hosts (L parallel rings or hd across
 * hosts, so every core's inter-host link carries 1/L of the data), then each
 * host all-gathers. Needs the same number of cores L on every host. */
#include "algo.h"
#include "coll_int.h"

#include <stdlib.h>

int gen_hier_allreduce(struct gen *g, const int *host, uint64_t count, int cross_hd, struct direct *d)
{
    struct sched *s = g->s;
    int m = g->m, H = 0, L = -1, myhost = host[g->me], j = -1;
    int *local = NULL, *cross = NULL, *hidx = NULL;
    uint64_t *bo = NULL;
    uint32_t since = s->nops;
    int rc = -2;

    hidx = calloc((size_t)m, sizeof *hidx); /* hosts by first appearance */
    local = malloc(sizeof(int) * (size_t)m);
    cross = malloc(sizeof(int) * (size_t)m);
    bo = malloc(sizeof(uint64_t) * (size_t)(m + 1));
    if (!hidx || !local || !cross || !bo) {
        s->failed = 1;
        rc = -1;
        goto out;
    }
    for (int h = 0; h < m; h++) {
        int n = 0;
        for (int i = 0; i < m; i++)
            n += host[i] == h;
        if (n == 0)
            continue;
        if (L >= 0 && n != L)
            goto out; /* uneven hosts */
        L = n;
        H++;
    }
    if (H < 2 || L < 2)
        goto out;
    int nl = 0;
    for (int i = 0; i < m; i++)
        if (host[i] == myhost) {
            if (i == g->me)
                j = nl;
            local[nl++] = g->mem[i];
        }
    /* core j of each host, hosts in order of their first core */
    int nc = 0;
    for (int h = 0; h < m; h++) {
        int k = 0;
        for (int i = 0; i < m; i++)
            if (host[i] == h && k++ == j)
                cross[nc++] = g->mem[i];
    }
    int mecross = -1;
    for (int i = 0; i < nc; i++)
        if (cross[i] == g->mem[g->me])
            mecross = i;
    for (int b = 0; b <= L; b++)
        bo[b] = (uint64_t)b * count / (uint64_t)L;

    struct gen in = *g;
    in.mem = local;
    in.m = L;
    in.me = j;
    int bar = d ? gen_direct(&in, d, RING_RS) : gen_ring(&in, bo, RING_RS);

    struct gen cr = *g;
    cr.mem = cross;
    cr.m = nc;
    cr.me = mecross;
    cr.dep = bar;
    cr.step = in.step;
    if (cross_hd) {
        bar = gen_hd_allreduce(&cr, bo[j], bo[j + 1] - bo[j]);
    } else {
        uint64_t *cb = malloc(sizeof(uint64_t) * (size_t)(nc + 1));
        if (!cb) {
            s->failed = 1;
            rc = -1;
            goto out;
        }
        for (int b = 0; b <= nc; b++)
            cb[b] = bo[j] + (uint64_t)b * (bo[j + 1] - bo[j]) / (uint64_t)nc;
        bar = gen_ring(&cr, cb, RING_RS | RING_AG | (g->x.fin ? RING_FIN : 0));
        free(cb);
    }
    /* all-gather inside the host: the step numbers continue past the cross
     * phase's largest (the cores of one host ran the same cross algorithm) */
    in.dep = bar;
    in.step = cr.step;
    if (d)
        gen_direct(&in, d, RING_AG);
    else
        gen_ring(&in, bo, RING_AG);
    g->step = in.step;
    rc = sched_barrier(s, since, g->dep);
out:
    free(hidx);
    free(local);
    free(cross);
    free(bo);
    return rc;
}
