/* Unit tests of the collectives engine (server/worker/coll/) without daemons:
 * every replica's engine runs in this one process on one event loop, over an
 * in-memory transport of this file's own behind the engine's transport ops
 * table (net/xport.h). It checks what the integration tests check over TCP
 * and shared memory, at the level of the schedules: every kind, op, dtype and
 * algorithm (ring, halving-doubling, hierarchical) against a reference on 1
 * to 8 replicas with awkward counts and small chunks (deep pipelines),
 * bitwise agreement across replicas, reproducible mode across algorithms and
 * chunk sizes, replica groups, broadcast from every root; and, from the
 * traffic the transport saw, that the hierarchical schedule only crosses
 * hosts between cores of the same index. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "bf16.h"
#include "coll.h"
#include "hbm.h"
#include "ident.h"
#include "xport.h"

#define MAXN 8

/* ---- the in-memory transport ---- */

struct mnet;

struct msg { /* a chunk sent and not yet received */
    struct msg *next;
    struct xport_chunk c;
    uint8_t *data;
    size_t len;
};

struct rcv { /* a posted receive */
    struct rcv *next;
    struct xport_chunk c;
    void *buf;
    size_t len;
    xport_cb cb;
    void *arg;
    xport_reduce_fn red; /* recv_reduce: combine instead of copying */
    void *red_arg;
};

struct done { /* a completion delivered from the loop, never from inside send/recv */
    struct done *next;
    xport_cb cb;
    void *arg;
    err e;
};

struct mchan { /* replica from's channel to replica to */
    struct mnet *net;
    int from, to;
    char name[32];
};

struct mself {
    struct mnet *net;
    int r;
};

struct mnet {
    uv_loop_t loop;
    uv_timer_t defer;
    int n, per_host;
    struct mself self[MAXN];
    struct mchan ch[MAXN][MAXN];
    struct msg *mq[MAXN][MAXN];  /* [from][to], in order */
    struct rcv *rq[MAXN][MAXN];  /* [from][to]: receives posted by to */
    struct done *dh, *dt;
    uint64_t traffic[MAXN][MAXN]; /* bytes sent [from][to] */
    int mismatches;
    uint64_t failed_seq[16];
    err failed_e[16];
    int nfailed;
    /* host segments (xport seg), as net/peers.c makes them: MSEG_AREA bytes of
     * input and of results per replica; seg_off: replicas without one (as a
     * worker with TPUEMU_COLL_SHM_DIRECT=0) */
    uint8_t *seg[MAXN];
    unsigned seg_off;
};

#define MSEG_AREA (512u * 1024u)

static void on_defer(uv_timer_t *t)
{
    struct mnet *net = t->data;
    struct done *d;
    while ((d = net->dh) != NULL) {
        net->dh = d->next;
        if (!net->dh)
            net->dt = NULL;
        d->cb(d->arg, &d->e);
        free(d);
    }
}

static void defer(struct mnet *net, xport_cb cb, void *arg, const err *e)
{
    struct done *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    d->cb = cb;
    d->arg = arg;
    if (e)
        d->e = *e;
    if (net->dt)
        net->dt->next = d;
    else
        net->dh = d;
    net->dt = d;
    if (!uv_is_active((uv_handle_t *)&net->defer))
        uv_timer_start(&net->defer, on_defer, 0, 0);
}

/* Pairs the chunks sent from a to b with b's receives, in order. */
static void match(struct mnet *net, int a, int b)
{
    while (net->mq[a][b] && net->rq[a][b]) {
        struct msg *m = net->mq[a][b];
        struct rcv *r = net->rq[a][b];
        err e = {CODE_OK, ""};
        net->mq[a][b] = m->next;
        net->rq[a][b] = r->next;
        if (m->c.seq != r->c.seq || m->c.step != r->c.step || m->c.chunk != r->c.chunk ||
            m->c.offset != r->c.offset || m->len != r->len) {
            net->mismatches++;
            err_set(&e, CODE_INTERNAL, "replica %d sent chunk %u (step %u, %zu bytes) where replica %d expected "
                    "chunk %u (step %u, %zu bytes)", a, m->c.chunk, m->c.step, m->len, b, r->c.chunk, r->c.step,
                    r->len);
        } else if (m->len && r->red) {
            /* in two pieces, as a ring hands a chunk over */
            size_t half = m->len / 2 / 8 * 8;
            r->red(r->red_arg, r->buf, m->data, half);
            r->red(r->red_arg, (uint8_t *)r->buf + half, m->data + half, m->len - half);
        } else if (m->len) {
            memcpy(r->buf, m->data, m->len);
        }
        defer(net, r->cb, r->arg, &e);
        free(m->data);
        free(m);
        free(r);
    }
}

static struct xport_chan *m_chan(void *self, int replica, err *e)
{
    struct mself *s = self;
    if (replica < 0 || replica >= s->net->n || replica == s->r) {
        err_set(e, CODE_INVALID_ARGUMENT, "replica %d is not a peer of replica %d", replica, s->r);
        return NULL;
    }
    return (struct xport_chan *)&s->net->ch[s->r][replica];
}

static int m_send(struct xport_chan *xc, const struct xport_chunk *c, const void *buf, size_t len, xport_cb cb,
                  void *arg)
{
    struct mchan *ch = (struct mchan *)xc;
    struct mnet *net = ch->net;
    struct msg *m = calloc(1, sizeof *m), **pp;

    if (!m || len > XPORT_MAX_CHUNK || (len && !(m->data = malloc(len)))) {
        free(m);
        return CODE_RESOURCE_EXHAUSTED;
    }
    m->c = *c;
    m->len = len;
    if (len)
        memcpy(m->data, buf, len);
    for (pp = &net->mq[ch->from][ch->to]; *pp; pp = &(*pp)->next)
        ;
    *pp = m;
    net->traffic[ch->from][ch->to] += len;
    defer(net, cb, arg, NULL); /* the bytes are copied: the buffer is free again */
    match(net, ch->from, ch->to);
    return CODE_OK;
}

static int m_post(struct xport_chan *xc, const struct xport_chunk *c, void *buf, size_t len, xport_reduce_fn red,
                  void *red_arg, xport_cb cb, void *arg)
{
    struct mchan *ch = (struct mchan *)xc;
    struct mnet *net = ch->net;
    struct rcv *r = calloc(1, sizeof *r), **pp;

    if (!r)
        return CODE_RESOURCE_EXHAUSTED;
    r->red = red;
    r->red_arg = red_arg;
    r->c = *c;
    r->buf = buf;
    r->len = len;
    r->cb = cb;
    r->arg = arg;
    /* ch is the receiver's channel to its peer: the chunks flow peer -> receiver */
    for (pp = &net->rq[ch->to][ch->from]; *pp; pp = &(*pp)->next)
        ;
    *pp = r;
    match(net, ch->to, ch->from);
    return CODE_OK;
}

static int m_recv(struct xport_chan *xc, const struct xport_chunk *c, void *buf, size_t len, xport_cb cb,
                  void *arg)
{
    return m_post(xc, c, buf, len, NULL, NULL, cb, arg);
}

static int m_recv_reduce(struct xport_chan *xc, const struct xport_chunk *c, void *buf, size_t len,
                         xport_reduce_fn red, void *red_arg, xport_cb cb, void *arg)
{
    return m_post(xc, c, buf, len, red, red_arg, cb, arg);
}

/* Fused receives between cores of one host, as over shared memory. */
static int m_fuse(void *self, int replica, size_t len)
{
    const struct mself *s = self;
    (void)len;
    return replica / s->net->per_host == s->r / s->net->per_host;
}

static const char *m_peer_name(const struct xport_chan *xc)
{
    return ((const struct mchan *)xc)->name;
}

static int m_is_shm(const struct xport_chan *xc)
{
    (void)xc;
    return 0;
}

static void m_abort(void *self, uint64_t seq, const err *e)
{
    struct mnet *net = ((struct mself *)self)->net;
    if (net->nfailed < 16) {
        net->failed_seq[net->nfailed] = seq;
        net->failed_e[net->nfailed++] = *e;
    }
}

static int m_failed(const void *self, uint64_t seq, err *e)
{
    const struct mnet *net = ((const struct mself *)self)->net;
    for (int i = 0; i < net->nfailed; i++)
        if (net->failed_seq[i] == seq) {
            if (e)
                *e = net->failed_e[i];
            return net->failed_e[i].code;
        }
    return CODE_OK;
}

static int m_host(void *self, int replica)
{
    const struct mself *s = self;
    return replica < 0 || replica >= s->net->n ? -1 : replica / s->net->per_host;
}

/* A replica's own segment, or a peer's on the same host; none across hosts. */
static uint8_t *m_seg(void *self, int replica, size_t *len)
{
    const struct mself *s = self;
    struct mnet *net = s->net;
    *len = 0;
    if (replica < 0 || replica >= net->n || replica / net->per_host != s->r / net->per_host ||
        (net->seg_off >> replica & 1u))
        return NULL;
    if (!net->seg[replica]) {
        net->seg[replica] = malloc(2 * MSEG_AREA);
        cr_assert_not_null(net->seg[replica]);
        memset(net->seg[replica], 0xa5, 2 * MSEG_AREA); /* garbage: the engine must overwrite what it reads */
    }
    *len = 2 * MSEG_AREA;
    return net->seg[replica];
}

static const struct xport_ops mem_ops = {m_chan,   m_send,   m_recv, m_peer_name,   m_is_shm,
                                         m_abort,  m_failed, m_fuse, m_recv_reduce, m_host, m_seg};

/* n replicas, per_host cores on each host (host of replica r: r / per_host). */
static void mnet_init(struct mnet *net, int n, int per_host)
{
    memset(net, 0, sizeof *net);
    cr_assert_eq(uv_loop_init(&net->loop), 0);
    uv_timer_init(&net->loop, &net->defer);
    net->defer.data = net;
    net->n = n;
    net->per_host = per_host;
    for (int a = 0; a < n; a++) {
        net->self[a] = (struct mself){net, a};
        for (int b = 0; b < n; b++) {
            struct mchan *ch = &net->ch[a][b];
            ch->net = net;
            ch->from = a;
            ch->to = b;
            snprintf(ch->name, sizeof ch->name, "host%d/%d", b / per_host, b % per_host);
        }
    }
}

static void mnet_close(struct mnet *net)
{
    uv_close((uv_handle_t *)&net->defer, NULL);
    uv_run(&net->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&net->loop), 0, "handles left open");
    for (int r = 0; r < MAXN; r++)
        free(net->seg[r]);
    for (int a = 0; a < MAXN; a++)
        for (int b = 0; b < MAXN; b++) {
            cr_assert_null(net->mq[a][b], "a chunk from %d to %d was never received", a, b);
            cr_assert_null(net->rq[a][b], "a receive of %d from %d never completed", b, a);
        }
}

/* ---- running one collective on every replica ---- */

struct spec {
    int n, per_host;
    int kind, op, bf16, algo, root, repro;
    uint64_t count, chunk;
    const uint32_t *groups; /* n entries, or NULL */
};

/* Iterations of the next run_on (0: once); the direct tests set it. */
static uint32_t run_iters;

struct result {
    int done;
    err e;
    uint8_t *out;
    size_t len;
};

static void on_done(void *arg, const err *e, const uint8_t *out, size_t out_len)
{
    struct result *r = arg;
    r->done++;
    r->e = *e;
    r->len = out_len;
    r->out = malloc(out_len ? out_len : 1);
    if (out_len)
        memcpy(r->out, out, out_len);
}

static size_t esz(const struct spec *s)
{
    return s->bf16 ? 2 : 4;
}

static int group_of(const struct spec *s, int r, int *mem);

/* Runs s with input in[r] on replica r (borrowed: an f32 all-reduce works in
 * it); res[r] gets the answer. net (initialized by the caller) records the
 * traffic. */
static void run_on(struct mnet *net, const struct spec *s, uint8_t *const *in, struct result *res)
{
    struct core_ident id[MAXN];
    hbm mem[MAXN];
    struct coll_stats stats[MAXN];
    struct coll *c[MAXN];
    Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;

    cs.kind = (Tpuemu__CollKind)s->kind;
    cs.op = (Tpuemu__ReduceOp)s->op;
    cs.dtype = s->bf16 ? TPUEMU__DTYPE__DTYPE_BF16 : TPUEMU__DTYPE__DTYPE_F32;
    cs.algo = (Tpuemu__Algo)s->algo;
    cs.count = s->count;
    cs.root = s->root;
    cs.reproducible = s->repro;
    cs.chunk_bytes = s->chunk;
    cs.iters = run_iters;
    if (s->groups) {
        cs.n_group_of_replica = (size_t)s->n;
        cs.group_of_replica = (uint32_t *)s->groups;
    }
    h.kind = TPUEMU__FRAME_KIND__FRAME_COLL;
    h.epoch = 7;
    h.seq = 1;
    h.coll = &cs;
    for (int r = 0; r < s->n; r++) {
        char host[16];
        snprintf(host, sizeof host, "host%d", r / s->per_host);
        ident_init(&id[r], host, r % s->per_host);
        id[r].epoch = 7;
        id[r].replica_id = r;
        id[r].num_replicas = (uint32_t)s->n;
        hbm_init(&mem[r], 1ull << 34);
        coll_stats_init(&stats[r]);
        struct coll_env env = {&id[r], &mem[r], {&mem_ops, &net->self[r]}, &stats[r]};
        cr_assert_not_null(c[r] = coll_new(&env));
        memset(&res[r], 0, sizeof res[r]);
    }
    for (int r = 0; r < s->n; r++) {
        size_t len = (size_t)s->count * esz(s);
        int grp[MAXN], g = group_of(s, r, grp);
        if (s->kind == TPUEMU__COLL_KIND__COLL_BROADCAST && s->root < g && grp[s->root] != r)
            len = 0; /* only the root of each group sends its buffer */
        coll_submit(c[r], &h, in[r], len, on_done, &res[r]);
    }
    uv_run(&net->loop, UV_RUN_DEFAULT);
    for (int r = 0; r < s->n; r++) {
        cr_assert_eq(res[r].done, 1, "replica %d of %d: answered %d times", r, s->n, res[r].done);
        cr_assert_eq(res[r].e.code, CODE_OK, "replica %d of %d: %s", r, s->n, res[r].e.msg);
        cr_assert_eq(mem[r].used, 0, "replica %d: the collective's HBM was not released", r);
        coll_free(c[r]);
        hbm_destroy(&mem[r]);
    }
    cr_assert_eq(net->mismatches, 0, "the schedules of the replicas disagree");
}

static void free_results(struct result *res, int n)
{
    for (int r = 0; r < n; r++)
        free(res[r].out);
}

/* Deterministic inputs: small integers (sums are exact in f32 and in any
 * order), or with `frac` values with fraction bits (sums depend on the order). */
static float value(uint64_t seed, int r, uint64_t i, int frac)
{
    uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)r << 40) ^ (i * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    int v = (int)(x % 201) - 100;
    return frac ? (float)v * 0.37f + (float)(x % 1000) * 1e-4f : (float)v;
}

static uint8_t *make_input(const struct spec *s, int r, uint64_t seed, int frac)
{
    uint8_t *b = malloc(s->count * esz(s) + 1);
    cr_assert_not_null(b);
    for (uint64_t i = 0; i < s->count; i++) {
        float v = value(seed, r, i, frac);
        if (s->bf16) {
            uint16_t u = bf16_from_f32(v);
            memcpy(b + i * 2, &u, 2);
        } else {
            memcpy(b + i * 4, &v, 4);
        }
    }
    return b;
}

static float elem(const struct spec *s, const uint8_t *b, uint64_t i)
{
    if (s->bf16) {
        uint16_t u;
        memcpy(&u, b + i * 2, 2);
        return bf16_to_f32(u);
    }
    float f;
    memcpy(&f, b + i * 4, 4);
    return f;
}

/* The group of replica r: its members in order. */
static int group_of(const struct spec *s, int r, int *mem)
{
    int g = 0;
    for (int q = 0; q < s->n; q++)
        if (!s->groups || s->groups[q] == s->groups[r])
            mem[g++] = q;
    return g;
}

/* Reduction of element i over the group of r, in float32 from exact inputs
 * (integer values: exact in any order), then as the engine finishes it. */
static float reduce_ref(const struct spec *s, uint8_t *const *in, int r, uint64_t i)
{
    int mem[MAXN], g = group_of(s, r, mem);
    float acc = elem(s, in[mem[0]], i);
    for (int k = 1; k < g; k++) {
        float v = elem(s, in[mem[k]], i);
        if (s->op == TPUEMU__REDUCE_OP__REDUCE_MAX)
            acc = v > acc ? v : acc;
        else if (s->op == TPUEMU__REDUCE_OP__REDUCE_MIN)
            acc = v < acc ? v : acc;
        else
            acc += v;
    }
    if (s->op == TPUEMU__REDUCE_OP__REDUCE_MEAN)
        acc /= (float)g;
    return s->bf16 ? bf16_to_f32(bf16_from_f32(acc)) : acc;
}

/* Runs s on integer inputs and checks every replica's output exactly. */
static void check_exact(const struct spec *s)
{
    struct mnet net;
    uint8_t *in[MAXN], *orig[MAXN];
    struct result res[MAXN];

    mnet_init(&net, s->n, s->per_host);
    for (int r = 0; r < s->n; r++) {
        in[r] = make_input(s, r, s->count, 0);
        orig[r] = make_input(s, r, s->count, 0);
    }
    run_on(&net, s, in, res);
    for (int r = 0; r < s->n; r++) {
        int mem[MAXN], g = group_of(s, r, mem), me = 0;
        for (int k = 0; k < g; k++)
            if (mem[k] == r)
                me = k;
        switch (s->kind) {
        case TPUEMU__COLL_KIND__COLL_ALL_REDUCE:
            cr_assert_eq(res[r].len, s->count * esz(s));
            for (uint64_t i = 0; i < s->count; i++)
                cr_assert_eq(elem(s, res[r].out, i), reduce_ref(s, orig, r, i),
                             "n %d algo %d op %d bf16 %d count %llu: replica %d element %llu is %g, not %g", s->n,
                             s->algo, s->op, s->bf16, (unsigned long long)s->count, r, (unsigned long long)i,
                             (double)elem(s, res[r].out, i), (double)reduce_ref(s, orig, r, i));
            break;
        case TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER: {
            uint64_t lo = (uint64_t)me * s->count / (uint64_t)g, hi = (uint64_t)(me + 1) * s->count / (uint64_t)g;
            cr_assert_eq(res[r].len, (hi - lo) * esz(s), "replica %d: %zu bytes", r, res[r].len);
            for (uint64_t i = lo; i < hi; i++)
                cr_assert_eq(elem(s, res[r].out, i - lo), reduce_ref(s, orig, r, i),
                             "n %d algo %d: replica %d element %llu", s->n, s->algo, r, (unsigned long long)i);
            break;
        }
        case TPUEMU__COLL_KIND__COLL_ALL_GATHER:
            cr_assert_eq(res[r].len, s->count * esz(s) * (size_t)g);
            for (int k = 0; k < g; k++)
                cr_assert_eq(memcmp(res[r].out + (size_t)k * s->count * esz(s), orig[mem[k]], s->count * esz(s)),
                             0, "n %d algo %d: replica %d's block %d", s->n, s->algo, r, k);
            break;
        case TPUEMU__COLL_KIND__COLL_BROADCAST:
            cr_assert_eq(res[r].len, s->count * esz(s));
            cr_assert_eq(memcmp(res[r].out, orig[mem[s->root]], s->count * esz(s)), 0,
                         "n %d algo %d root %d: replica %d", s->n, s->algo, s->root, r);
            break;
        }
    }
    for (int r = 0; r < s->n; r++) {
        free(in[r]);
        free(orig[r]);
    }
    free_results(res, s->n);
    mnet_close(&net);
}

static const int algos[] = {TPUEMU__ALGO__ALGO_RING, TPUEMU__ALGO__ALGO_HD, TPUEMU__ALGO__ALGO_AUTO};
static const int ops[] = {TPUEMU__REDUCE_OP__REDUCE_SUM, TPUEMU__REDUCE_OP__REDUCE_MEAN, TPUEMU__REDUCE_OP__REDUCE_MAX,
                          TPUEMU__REDUCE_OP__REDUCE_MIN};
static const int sizes[] = {1, 2, 3, 4, 5, 8};

static uint64_t counts_for(int n, int k)
{
    const uint64_t c[] = {0, 1, (uint64_t)(n > 1 ? n - 1 : 1), 1001, 70001};
    return c[k];
}

/* one_host: every core on one host, where the transport fuses receives that
 * reduce (m_fuse), as shared memory does; else one core per host. */
Test(coll, all_reduce_every_algo_op_dtype_and_size, .timeout = 120)
{
    for (int one_host = 0; one_host < 2; one_host++)
        for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
            for (size_t ni = 0; ni < sizeof sizes / sizeof sizes[0]; ni++)
                for (int k = 0; k < 5; k++)
                    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
                        for (int bf = 0; bf < 2; bf++) {
                            struct spec s = {sizes[ni], one_host ? sizes[ni] : 1, TPUEMU__COLL_KIND__COLL_ALL_REDUCE,
                                             ops[o], bf, algos[a], 0, 0, counts_for(sizes[ni], k), 1024, NULL};
                            check_exact(&s);
                        }
}

Test(coll, reduce_scatter_all_gather_and_broadcast, .timeout = 120)
{
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (size_t ni = 0; ni < sizeof sizes / sizeof sizes[0]; ni++)
            for (int k = 0; k < 5; k++)
                for (int bf = 0; bf < 2; bf++) {
                    int n = sizes[ni];
                    uint64_t count = counts_for(n, k);
                    struct spec rs = {n, 1, TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER, TPUEMU__REDUCE_OP__REDUCE_SUM,
                                      bf, algos[a], 0, 0, count, 1024, NULL};
                    struct spec rs1 = rs; /* fused receives */
                    rs1.per_host = n;
                    struct spec ag = {n, 1, TPUEMU__COLL_KIND__COLL_ALL_GATHER, 0, bf, algos[a], 0, 0, count / 4,
                                      1024, NULL};
                    check_exact(&rs);
                    check_exact(&rs1);
                    check_exact(&ag);
                    for (int root = 0; root < n; root++) {
                        struct spec bc = {n, 1, TPUEMU__COLL_KIND__COLL_BROADCAST, 0, bf, algos[a], root, 0, count,
                                          1024, NULL};
                        check_exact(&bc);
                    }
                }
}

/* Runs the all-reduce s (hosts of s->per_host cores) on net, checks that every
 * replica holds the exact sum and the same bits, and leaves the bytes each
 * core sent each other in net->traffic (mnet_close it). */
static void run_traffic(struct mnet *net, const struct spec *s)
{
    uint8_t *in[MAXN], *orig[MAXN];
    struct result res[MAXN];

    mnet_init(net, s->n, s->per_host);
    for (int r = 0; r < s->n; r++) {
        in[r] = make_input(s, r, 3, 0);
        orig[r] = make_input(s, r, 3, 0);
    }
    run_on(net, s, in, res);
    for (int r = 0; r < s->n; r++) {
        for (uint64_t i = 0; i < s->count; i++)
            cr_assert_eq(elem(s, res[r].out, i), reduce_ref(s, orig, r, i), "replica %d element %llu", r,
                         (unsigned long long)i);
        cr_assert_eq(memcmp(res[r].out, res[0].out, res[0].len), 0, "replica %d differs from replica 0", r);
    }
    for (int r = 0; r < s->n; r++) {
        free(in[r]);
        free(orig[r]);
    }
    free_results(res, s->n);
}

/* Hosts of per_host cores each: the hierarchical schedule reduces inside each
 * host and crosses hosts only between cores of the same index. */
static void check_hier_traffic(int n, int per_host, uint64_t count)
{
    struct spec s = {n, per_host, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, 0,
                     TPUEMU__ALGO__ALGO_HIER, 0, 0, count, 4096, NULL};
    struct mnet net;

    run_traffic(&net, &s);
    for (int r = 0; r < n; r++)
        for (int q = 0; q < n; q++) {
            int same_host = r / per_host == q / per_host, same_index = r % per_host == q % per_host;
            if (net.traffic[r][q])
                cr_assert(same_host || same_index,
                          "%d hosts x %d cores: replica %d sent %llu bytes to replica %d (another host, another "
                          "index): not the hierarchical schedule", n / per_host, per_host, r,
                          (unsigned long long)net.traffic[r][q], q);
        }
    mnet_close(&net);
}

Test(coll, hierarchical_crosses_hosts_only_between_same_index, .timeout = 60)
{
    check_hier_traffic(4, 2, 1000);    /* 2 x 2, hd across hosts */
    check_hier_traffic(6, 3, 3001);    /* 2 x 3 */
    check_hier_traffic(8, 4, 70001);   /* 2 x 4 */
    check_hier_traffic(8, 2, 300007);  /* 4 x 2, ring across hosts (1.2 MB: 600 KB a core) */
}

/* Halving-doubling on hosts of per_host cores: exact, every replica the same
 * bits, and the pairs across hosts exchange the smallest halves. Each core
 * sends count * 4 bytes over the reduce-scatter and the all-gather together;
 * a step across hosts that came first would carry half of each (count * 4 /
 * 2 twice), the last ones carry per_host times less. Returns the most
 * bytes a core sent to other hosts. */
static uint64_t check_hd_across_hosts(int n, int per_host, uint64_t count)
{
    struct spec s = {.n = n,
                     .per_host = per_host,
                     .kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE,
                     .op = TPUEMU__REDUCE_OP__REDUCE_SUM,
                     .algo = TPUEMU__ALGO__ALGO_HD,
                     .count = count,
                     .chunk = 4096};
    struct mnet net;
    uint64_t most = 0;

    run_traffic(&net, &s);
    for (int r = 0; r < n; r++) {
        uint64_t across = 0;
        for (int q = 0; q < n; q++)
            if (r / per_host != q / per_host)
                across += net.traffic[r][q];
        most = across > most ? across : most;
    }
    mnet_close(&net);
    return most;
}

Test(coll, halving_doubling_keeps_its_largest_halves_inside_hosts, .timeout = 60)
{
    const uint64_t count = 64000; /* 256,000 bytes a core */
    uint64_t b24 = check_hd_across_hosts(8, 4, count), b42 = check_hd_across_hosts(8, 2, count);
    uint64_t b81 = check_hd_across_hosts(8, 1, count);
    printf("hd, 256,000 bytes a core: most bytes one core sent to other hosts: 2 x 4 %llu, 4 x 2 %llu, 8 x 1 %llu\n",
           (unsigned long long)b24, (unsigned long long)b42, (unsigned long long)b81);
    /* 2 hosts of 4: only the last of 3 halvings (and the first doubling)
     * cross: an eighth of the buffer each way, not half */
    cr_assert_eq(b24, 2 * count * 4 / 8, "2 x 4: %llu bytes across hosts", (unsigned long long)b24);
    /* 4 hosts of 2: the first halving stays inside; the other two cross
     * (1/4 + 1/8 of the buffer, each way) */
    cr_assert_eq(b42, 2 * (count * 4 / 4 + count * 4 / 8), "4 x 2: %llu bytes across hosts", (unsigned long long)b42);
    /* one core a host: everything crosses, as before (1/2 + 1/4 + 1/8) */
    cr_assert_eq(b81, 2 * (count * 4 / 2 + count * 4 / 4 + count * 4 / 8), "8 x 1: %llu", (unsigned long long)b81);
    /* not a power of two (6 = 2 x 3: the fix-up folds ranks in pairs): still exact and equal */
    check_hd_across_hosts(6, 3, 3001);
}

Test(coll, hierarchical_with_uneven_hosts_falls_back_and_stays_exact, .timeout = 60)
{
    /* 5 replicas, 2 per host: hosts of 2, 2 and 1 cores do not fit */
    struct spec s = {5, 2, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, 0, TPUEMU__ALGO__ALGO_HIER,
                     0, 0, 5003, 1024, NULL};
    check_exact(&s);
}

/* Fractional inputs: the result depends on the reduction order, yet every
 * replica holds the same bits, and the same run gives the same bits again. */
Test(coll, replicas_agree_bitwise_and_runs_repeat, .timeout = 60)
{
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (int n = 2; n <= MAXN; n++) {
            struct spec s = {n, 1, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, 0, algos[a],
                             0, 0, 30011, 2048, NULL};
            uint8_t *first = NULL;
            for (int run = 0; run < 2; run++) {
                struct mnet net;
                uint8_t *in[MAXN];
                struct result res[MAXN];
                mnet_init(&net, n, 1);
                for (int r = 0; r < n; r++)
                    in[r] = make_input(&s, r, 11, 1);
                run_on(&net, &s, in, res);
                for (int r = 1; r < n; r++)
                    cr_assert_eq(memcmp(res[r].out, res[0].out, res[0].len), 0, "algo %d n %d: replica %d differs",
                                 algos[a], n, r);
                if (!first) {
                    first = malloc(res[0].len);
                    memcpy(first, res[0].out, res[0].len);
                } else {
                    cr_assert_eq(memcmp(first, res[0].out, res[0].len), 0, "algo %d n %d: a second run differs",
                                 algos[a], n);
                }
                for (int r = 0; r < n; r++)
                    free(in[r]);
                free_results(res, n);
                mnet_close(&net);
            }
            free(first);
        }
}

/* Reproducible mode: the same bits whatever the algorithm and chunking, and
 * within a rounding of the float64 sum. */
Test(coll, reproducible_sums_agree_across_algorithms_and_chunks, .timeout = 60)
{
    for (int bf = 0; bf < 2; bf++)
        for (int n = 2; n <= MAXN; n += 3) {
            uint8_t *first = NULL;
            const int ralgos[] = {TPUEMU__ALGO__ALGO_RING, TPUEMU__ALGO__ALGO_HD};
            const uint64_t chunks[] = {1024, 8192, 0};
            for (int a = 0; a < 2; a++)
                for (int ci = 0; ci < 3; ci++) {
                    /* the last chunk size on one host: receives fused (m_fuse), same bits */
                    struct spec s = {n, ci == 2 ? n : 1, TPUEMU__COLL_KIND__COLL_ALL_REDUCE,
                                     TPUEMU__REDUCE_OP__REDUCE_SUM, bf, ralgos[a], 0, 1, 20011, chunks[ci], NULL};
                    struct mnet net;
                    uint8_t *in[MAXN];
                    struct result res[MAXN];
                    mnet_init(&net, n, s.per_host);
                    uint8_t *orig[MAXN];
                    for (int r = 0; r < n; r++) {
                        in[r] = make_input(&s, r, 5, 1);
                        orig[r] = make_input(&s, r, 5, 1);
                    }
                    run_on(&net, &s, in, res);
                    for (int r = 0; r < n; r++)
                        cr_assert_eq(memcmp(res[r].out, res[0].out, res[0].len), 0, "replica %d differs", r);
                    if (!first) {
                        first = malloc(res[0].len);
                        memcpy(first, res[0].out, res[0].len);
                        for (uint64_t i = 0; i < s.count; i++) {
                            double ref = 0;
                            for (int r = 0; r < n; r++)
                                ref += elem(&s, orig[r], i);
                            cr_assert(fabs(elem(&s, first, i) - ref) <= fabs(ref) * (bf ? 1.0 / 128 : 1e-6) + 1e-6,
                                      "element %llu: %g, the float64 sum is %g", (unsigned long long)i,
                                      (double)elem(&s, first, i), ref);
                        }
                    } else {
                        cr_assert_eq(memcmp(first, res[0].out, res[0].len), 0,
                                     "n %d bf16 %d: algo %d chunk %llu gives other bits", n, bf, ralgos[a],
                                     (unsigned long long)chunks[ci]);
                    }
                    for (int r = 0; r < n; r++) {
                        free(in[r]);
                        free(orig[r]);
                    }
                    free_results(res, n);
                    mnet_close(&net);
                }
            free(first);
        }
}

Test(coll, replica_groups_reduce_independently, .timeout = 60)
{
    static const uint32_t pairs[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    static const uint32_t interleaved[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
        struct spec s1 = {8, 1, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, 0, algos[a], 0, 0,
                          999, 1024, pairs};
        struct spec s2 = s1, s3 = s1;
        s2.groups = interleaved;
        s3.groups = interleaved;
        s3.kind = TPUEMU__COLL_KIND__COLL_BROADCAST;
        s3.root = 3;
        check_exact(&s1);
        check_exact(&s2);
        check_exact(&s3);
    }
}

/* Runs s (inputs from seed, fractional with frac) on a fresh in-memory net
 * whose replicas in seg_off have no host segment; checks every replica's
 * result exactly (integer inputs) or bitwise equal to replica 0's (frac),
 * and returns the largest number of bytes one core sent another core of its
 * own host (*out_first: replica 0's result, when not NULL, malloc'd). */
static uint64_t run_direct(const struct spec *s, unsigned seg_off, int frac, uint64_t seed, uint8_t **out_first)
{
    struct mnet net;
    uint8_t *in[MAXN], *orig[MAXN];
    struct result res[MAXN];
    uint64_t most = 0;

    mnet_init(&net, s->n, s->per_host);
    net.seg_off = seg_off;
    for (int r = 0; r < s->n; r++) {
        in[r] = make_input(s, r, seed, frac);
        orig[r] = make_input(s, r, seed, frac);
    }
    run_on(&net, s, in, res);
    for (int r = 0; r < s->n; r++) {
        cr_assert_eq(res[r].len, s->count * esz(s), "replica %d: %zu bytes", r, res[r].len);
        if (frac)
            cr_assert_eq(memcmp(res[r].out, res[0].out, res[0].len), 0, "n %d op %d bf16 %d: replica %d differs",
                         s->n, s->op, s->bf16, r);
        else
            for (uint64_t i = 0; i < s->count; i++)
                cr_assert_eq(elem(s, res[r].out, i), reduce_ref(s, orig, r, i),
                             "n %d op %d bf16 %d count %llu: replica %d element %llu is %g, not %g", s->n, s->op,
                             s->bf16, (unsigned long long)s->count, r, (unsigned long long)i,
                             (double)elem(s, res[r].out, i), (double)reduce_ref(s, orig, r, i));
        for (int q = 0; q < s->n; q++)
            if (q / s->per_host == r / s->per_host && net.traffic[r][q] > most)
                most = net.traffic[r][q];
    }
    if (out_first) {
        *out_first = malloc(res[0].len + 1);
        memcpy(*out_first, res[0].out, res[0].len);
    }
    for (int r = 0; r < s->n; r++) {
        free(in[r]);
        free(orig[r]);
    }
    free_results(res, s->n);
    mnet_close(&net);
    return most;
}

/* The direct intra-host all-reduce (coll/direct.c): with every core of the
 * host holding a segment, the automatic choice reduces through the segments
 * and the links carry only the hand-shake's and the barriers' 8-byte words
 * (at most 32 bytes from one core to another: 2 hand-shake + 2 barrier
 * words); results exact for every op, dtype and count (0, 1, n-1, odd, larger
 * than the L1 block of the reduction) on 3 to 8 cores, with the MEAN divided
 * by the group size and bfloat16 rounded once. The same reduced tensor on
 * every replica, as tpu_ops.cross_replica_sum gives
 * (tensorflow/python/tpu/ops/tpu_ops.py: "Sum the input tensor across
 * replicas according to group_assignment"). */
Test(coll, direct_all_reduce_on_one_host_through_the_segments, .timeout = 120)
{
    const uint64_t counts[] = {0, 1, 0, 1001, 70001}; /* 1001: one barrier; 70001: two */
    for (int n = 3; n <= MAXN; n++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
                for (int bf = 0; bf < 2; bf++) {
                    struct spec s = {n, n, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, ops[o], bf, TPUEMU__ALGO__ALGO_AUTO,
                                     0, 0, k == 2 ? (uint64_t)n - 1 : counts[k], 1024, NULL};
                    run_iters = (uint32_t)(o % 3); /* repeated runs alternate the cores' areas */
                    uint64_t most = run_direct(&s, 0, 0, s.count + 3, NULL);
                    run_iters = 0;
                    cr_assert(most <= 32 * (o % 3 ? o % 3 : 1), "n %d count %llu: a core sent %llu bytes to another over the links; the "
                              "direct path sends only barrier words", n, (unsigned long long)s.count,
                              (unsigned long long)most);
                }
}

/* Fractional inputs (the sum depends on the order): every replica gets the
 * same bits, run after run, on one host through the segments. */
Test(coll, direct_all_reduce_is_bitwise_identical_and_repeats, .timeout = 60)
{
    for (int n = 3; n <= MAXN; n++)
        for (int bf = 0; bf < 2; bf++) {
            struct spec s = {n, n, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, bf,
                             TPUEMU__ALGO__ALGO_AUTO, 0, 0, 30011, 2048, NULL};
            uint8_t *a, *b;
            cr_assert(run_direct(&s, 0, 1, 11, &a) <= 32, "n %d: not the direct path", n);
            run_iters = 5; /* the cores alternate between their areas: the last run still gives the same bits */
            run_direct(&s, 0, 1, 11, &b);
            run_iters = 0;
            cr_assert_eq(memcmp(a, b, s.count * esz(&s)), 0, "n %d bf16 %d: a second run gives other bits", n, bf);
            free(a);
            free(b);
        }
}

/* The cores of a host use the direct path only when every one of them can
 * and they are at least 3 (on 2, hd is one exchange straight from the ring):
 * one core without a segment (a worker with TPUEMU_COLL_SHM_DIRECT=0, or
 * whose link fell back to TCP) makes them all agree on the rings, and the
 * result is still exact. A buffer larger than the segments takes the rings
 * too; an explicit algorithm is kept. */
Test(coll, direct_all_reduce_needs_every_core_and_room, .timeout = 60)
{
    struct spec s = {4, 4, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, TPUEMU__REDUCE_OP__REDUCE_SUM, 0,
                     TPUEMU__ALGO__ALGO_AUTO, 0, 0, 70001, 4096, NULL};
    cr_assert(run_direct(&s, 0, 0, 1, NULL) <= 32, "all four cores have segments: the direct path");
    for (int r = 0; r < 4; r++)
        cr_assert(run_direct(&s, 1u << r, 0, 1, NULL) > 70001, "replica %d has no segment: the rings carry the data",
                  r);
    s.count = MSEG_AREA / 4 + 1; /* one element more than a segment's area */
    cr_assert(run_direct(&s, 0, 0, 2, NULL) > MSEG_AREA / 4, "too large for the segments: the rings");
    s.count = 70001;
    s.algo = TPUEMU__ALGO__ALGO_RING;
    cr_assert(run_direct(&s, 0, 0, 3, NULL) > 70001, "--algo ring is kept");
    s.algo = TPUEMU__ALGO__ALGO_AUTO;
    s.n = s.per_host = 2; /* two cores: halving-doubling, one exchange through the ring */
    cr_assert(run_direct(&s, 0, 0, 4, NULL) > 70001, "two cores keep the rings");
}

/* Several hosts: the phases inside each host of the hierarchical all-reduce
 * go through the segments (only words between cores of one host), the phase
 * across hosts is unchanged; exact for every op and dtype, also when one
 * host's cores agree on the direct path and another's do not (the step
 * numbers of the cross phase are the same either way). */
Test(coll, hierarchical_uses_the_segments_inside_each_host, .timeout = 60)
{
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int bf = 0; bf < 2; bf++) {
            struct spec s = {8, 4, TPUEMU__COLL_KIND__COLL_ALL_REDUCE, ops[o], bf, TPUEMU__ALGO__ALGO_HIER, 0, 0,
                             70001, 4096, NULL};
            cr_assert(run_direct(&s, 0, 0, 5 + o, NULL) <= 32, "op %d bf16 %d: the intra-host phases used the links",
                      ops[o], bf);
            cr_assert(run_direct(&s, 1u << 5, 0, 6 + o, NULL) > 1000, "host 1 without the direct path");
            s.n = 6, s.per_host = 3;
            run_direct(&s, 1u << 0, 0, 7 + o, NULL);
        }
}

/* A spec the engine refuses is answered at once, exactly once, and aborts
 * the collective on the peers (it may run there). */
Test(coll, a_bad_spec_is_refused_and_aborted_on_the_peers, .timeout = 30)
{
    struct mnet net;
    struct core_ident id;
    hbm mem;
    struct coll_stats stats;
    struct coll *c;
    struct result res;
    float x[3] = {1, 2, 3};
    Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;

    mnet_init(&net, 2, 1);
    ident_init(&id, "host0", 0);
    id.epoch = 7;
    id.replica_id = 0;
    id.num_replicas = 2;
    hbm_init(&mem, 1ull << 30);
    coll_stats_init(&stats);
    struct coll_env env = {&id, &mem, {&mem_ops, &net.self[0]}, &stats};
    cr_assert_not_null(c = coll_new(&env));
    cs.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
    cs.count = 4; /* the input holds 3 */
    h.kind = TPUEMU__FRAME_KIND__FRAME_COLL;
    h.epoch = 7;
    h.seq = 42;
    h.coll = &cs;
    memset(&res, 0, sizeof res);
    coll_submit(c, &h, (uint8_t *)x, sizeof x, on_done, &res);
    cr_assert_eq(res.done, 1);
    cr_assert_eq(res.e.code, CODE_INVALID_ARGUMENT);
    cr_assert(strstr(res.e.msg, "input is 16 bytes, but the frame carries 12") != NULL, "%s", res.e.msg);
    cr_assert_eq(net.nfailed, 1);
    cr_assert_eq(net.failed_seq[0], 42);
    cr_assert_eq(prom_get(&stats.failed), 0, "a refusal is not a failed collective");
    free(res.out);
    coll_free(c);
    hbm_destroy(&mem);
    mnet_close(&net);
}
