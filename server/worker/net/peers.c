/* peers: the channels of one worker for the current system epoch (made
 * lazily, one per peer replica, by chan.c), the failures of collectives
 * (recorded per seq, broadcast as ABORT frames so every survivor fails fast,
 * not only the neighbours), the shared-memory listener's lifetime, and the
 * transport ops table (xport.h) the collectives engine runs on. */
#include "peers.h"

#include "chan_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "tuning.h"

#define DEFAULT_HEARTBEAT_MS 1000u
#define DEFAULT_DEAD_AFTER 3u
#define TIMEOUT_MAX_MS 600000u
/* While a collective waits for a chunk the loop polls instead of sleeping,
 * yielding the CPU between polls, for this long after the last progress
 * (--spin-us, TPUEMU_SPIN_US; 0: sleep at once). A sleeping
 * receiver costs a wake-up per step (on this VM tens of microseconds, more when
 * its CPU is busy); sched_yield hands the CPU to whatever else is runnable, the
 * peer being waited for included, so the poll does not starve it. Measured on
 * the 2-core VM (bench/allreduce.sh style, 0 against 100 and 300 alternating,
 * medians of 5): shm n = 2 4 KiB 17.5 -> 10-11 us, 64 KiB 48 -> 25-31 us, 1 MiB
 * 220 -> 132-147 us; shm n = 4 1 MiB 824 -> 651-698 us (4-64 KiB even); TCP
 * n = 4 64 KiB 269 -> 200-205 us, 1 MiB 1920 -> 1325-1384 us; TCP n = 2 even.
 * The default, 200 us, is in core/tuning.c. */
#define PEERS_FUSE_MIN (128u * 1024u)
/* The host segment's work bytes (TPUEMU_COLL_SHM_MAX, 1 MiB by default): the
 * largest all-reduce (in float32 bytes) the direct intra-host path takes. */
#define PEERS_SEG_LIMIT (256u * 1024u * 1024u)

static void peers_fail_seq(struct peers *p, uint64_t seq, const err *e, int broadcast, int culprit);

/* ---- this core's host segment (the direct all-reduce, coll/direct.c) ---- */

static void seg_drop(struct peers *p)
{
    if (p->seg)
        munmap(p->seg, p->seg_len);
    if (p->segfd >= 0)
        close(p->segfd);
    p->seg = NULL;
    p->seg_len = 0;
    p->segfd = -1;
}

/* A sealed memfd of two areas of TPUEMU_COLL_SHM_MAX bytes (the inputs the
 * peers read, the slice results they copy out), made for an epoch where a
 * same-host peer offers shared memory; its pages cost nothing until a
 * collective touches them. TPUEMU_COLL_SHM_DIRECT=0: none (the cores of the
 * host then agree not to use the direct path). */
static void seg_make(struct peers *p)
{
    const struct tuning *tu = tuning_get();
    unsigned long max = (unsigned long)tu->coll_shm_max;
    int any = 0;
    void *m;

    if (!tu->coll_shm_direct || p->tcp_only || !p->shm || p->self < 0 || max < 64)
        return;
    for (uint32_t r = 0; r < p->n && !any; r++)
        any = (int)r != p->self && peers_same_host_shm(p, (int)r);
    if (!any)
        return;
    if (max > PEERS_SEG_LIMIT)
        max = PEERS_SEG_LIMIT;
    max = (max + 4095u) & ~4095ul;
    p->seg_len = 2 * (size_t)max;
    p->segfd = memfd_create("tpuemu-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->segfd < 0 || ftruncate(p->segfd, (off_t)p->seg_len) < 0 ||
        fcntl(p->segfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
        (m = mmap(NULL, p->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->segfd, 0)) == MAP_FAILED) {
        log_warn("no host segment; same-host all-reduces use the rings", "reason=%s", log_q(strerror(errno)));
        seg_drop(p);
        return;
    }
    p->seg = m;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct peers *p = h->data;
    p->open_handles--;
}

/* The failure bound is the resolver's own: heartbeat interval x dead-after
 * (3 s with the defaults). A link that hears nothing from its peer for half of
 * it probes the peer's control socket (probe.h) for up to a quarter of it
 * (at least 500 ms: a live but busy loop must get to answer); only a peer that does not answer is blamed. With the
 * link's check period (1/8 of the silence, at most 250 ms) and the ABORT that
 * carries the cause to every other core, every survivor fails inside the bound
 * (about 2.4 s with the defaults). A peer that answers but sends nothing for
 * ten times the bound is given up on too, so nothing waits forever. */
static void set_timeouts(struct peers *p, uint64_t bound_ms)
{
    p->timeout_ms = (unsigned)(bound_ms / 2);
    p->probe_ms = (unsigned)(bound_ms / 4 < 500 ? 500 : bound_ms / 4);
    p->stall_ms = (unsigned)(bound_ms * 10);
}

int peers_new(const struct peers_env *env, struct peers **out, err *e)
{
    struct peers *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the peer links");
    p->auth = env->auth;
    p->id = env->id;
    p->trace = env->trace;
    p->loop = env->loop;
    p->self = -1;
    p->segfd = -1;
    p->tcp_only = env->tcp_only;
    set_timeouts(p, DEFAULT_HEARTBEAT_MS * DEFAULT_DEAD_AFTER);
    uv_timer_init(env->loop, &p->defer);
    p->defer.data = p;
    uv_idle_init(env->loop, &p->spin);
    p->spin.data = p;
    p->spin_ns = (uint64_t)tuning_get()->spin_us * 1000u;
    hold_init(p);
    p->open_handles = 3;
    p->tcp_tx = &chan_tcp_tx;
    p->shm_tx = &chan_shm_tx;
    p->ctl = &chan_tcp_ctl;
    p->fail_seq = peers_fail_seq;
    p->faults = &hold_faults;
    *out = p;
    if (!p->tcp_only && shm_listen(p, e) != CODE_OK) {
        log_warn("no shared-memory transport; collectives use TCP", "reason=%s", log_q(e->msg));
        p->shm_name[0] = '\0';
    }
    err_clear(e);
    return CODE_OK;
}

static void drop_all(struct peers *p)
{
    struct lop *op;
    for (uint32_t i = 0; i < p->n; i++)
        if (p->links && p->links[i]) {
            chan_destroy(p->links[i]);
            p->links[i] = NULL;
        }
    while ((op = lopq_pop(&p->dq)) != NULL) {
        free(op->fail);
        free(op);
    }
}

void peers_stop(struct peers *p)
{
    if (!p || p->stopping)
        return;
    p->stopping = 1;
    drop_all(p);
    seg_drop(p);
    shm_listener_close(p);
    uv_timer_stop(&p->defer);
    uv_close((uv_handle_t *)&p->defer, on_handle_closed);
    uv_idle_stop(&p->spin);
    uv_close((uv_handle_t *)&p->spin, on_handle_closed);
    hold_close(p, on_handle_closed);
}

void peers_free(struct peers *p)
{
    if (!p)
        return;
    /* every handle closed with the loop (peers_stop before it ran dry) */
    seg_drop(p);
    peertab_free(p->tab);
    free(p->links);
    free(p);
}

const char *peers_shm_name(const struct peers *p)
{
    return p && !p->stopping ? p->shm_name : "";
}

void peers_reset(struct peers *p, const Tpuemu__ResetCore *r)
{
    size_t n;
    err e;

    if (!p || p->stopping)
        return;
    drop_all(p);
    seg_drop(p); /* peers that mapped it keep their mapping until their own reset */
    peertab_free(p->tab);
    free(p->links);
    p->tab = NULL;
    p->links = NULL;
    p->n = 0;
    p->self = -1;
    memset(p->failed, 0, sizeof p->failed);
    p->nfailed = 0;
    p->cur_seq = 0;
    p->cur_what = NULL;
    p->epoch = r->epoch;
    {
        uint64_t t = (uint64_t)(r->heartbeat_ms ? r->heartbeat_ms : DEFAULT_HEARTBEAT_MS) *
                     (r->dead_after ? r->dead_after : DEFAULT_DEAD_AFTER);
        set_timeouts(p, t > TIMEOUT_MAX_MS ? TIMEOUT_MAX_MS : t);
        p->machine_cores = r->machine_cores;
        p->machine_cpus = r->machine_cpus;
        if (r->replica_id >= 0)
            log_info("collective timeouts", "bound_ms=%llu silence_ms=%u probe_ms=%u stall_ms=%u dead_after=%u "
                     "machine_cores=%u machine_cpus=%u", (unsigned long long)t, p->timeout_ms, p->probe_ms,
                     p->stall_ms, r->dead_after, r->machine_cores, r->machine_cpus);
    }
    n = r->num_replicas;
    if (r->replica_id < 0 || n == 0)
        return;
    if ((size_t)r->replica_id >= n) {
        log_warn("reset without a usable peer list; collectives will fail", "replica=%d replicas=%zu",
                 (int)r->replica_id, n);
        return;
    }
    /* kept as it came (columns): a replica's fields are read when a channel to it is made */
    if (peertab_open(r->peer_table.data, r->peer_table.len, n, &p->tab, &e) != CODE_OK) {
        log_warn("reset without a usable peer list; collectives will fail", "replicas=%zu reason=%s", n,
                 log_q(e.msg));
        return;
    }
    if (!(p->links = calloc(n, sizeof *p->links))) {
        peertab_free(p->tab);
        p->tab = NULL;
        log_error("out of memory for the peer list", "peers=%zu", n);
        return;
    }
    p->n = (uint32_t)n;
    p->self = r->replica_id;
    seg_make(p);
}

static struct chan *peers_chan(struct peers *p, int replica, err *e)
{
    struct chan *l;
    if (!p || p->stopping || p->self < 0)
        return err_set(e, CODE_FAILED_PRECONDITION, "this core is not part of an initialized system"),
               NULL;
    if (replica < 0 || (uint32_t)replica >= p->n || replica == p->self) {
        err_set(e, CODE_INVALID_ARGUMENT, "replica %d is not a peer of replica %d (%u replicas)", replica,
                p->self, p->n);
        return NULL;
    }
    if (!(l = chan_get(p, replica)))
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a link");
    return l;
}

void peers_accept(struct peers *p, dp_conn *c)
{
    const struct core_ident *id = p->id;
    uint64_t ep = dp_conn_auth_epoch(c);
    int32_t r = dp_conn_auth_replica(c);
    int gone = p->stopping; /* as a worker without peers: in no system */
    struct chan *l;

    if (gone || p->self < 0 || ep != p->epoch) {
        dp_conn_fail(c, CODE_FAILED_PRECONDITION,
                     "core %s/%d is in system epoch %llu%s, the connecting core (replica %d) in epoch "
                     "%llu: one of them missed a re-initialize", id->host_id, id->core,
                     (unsigned long long)(gone ? 0 : p->epoch), !gone && p->self >= 0 ? "" : " (not in the system)",
                     (int)r, (unsigned long long)ep);
        return;
    }
    if (!(l = chan_get(p, r))) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT, "replica %d is not a peer of replica %d (%u replicas)",
                     (int)r, p->self, p->n);
        return;
    }
    tcp_attach_in(l, c);
}

static void peers_fail_seq(struct peers *p, uint64_t seq, const err *e, int broadcast, int culprit)
{
    struct failed_seq *f;

    if (p->stopping || chan_seq_failed(p, seq, NULL) != CODE_OK)
        return;
    f = &p->failed[p->nfailed++ % PEERS_FAILED_MAX];
    f->used = 1;
    f->seq = seq;
    f->e = *e;
    if (f->e.code == CODE_OK)
        f->e.code = CODE_UNKNOWN;
    log_info("collective failed", "seq=%llu reason=%s", (unsigned long long)seq, log_q(e->msg));
    for (uint32_t i = 0; i < p->n; i++)
        if (p->links && p->links[i])
            chan_fail_seq(p->links[i], seq, &f->e);
    if (!broadcast)
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        struct chan *l;
        if ((int)i == p->self || (int)i == culprit || !(l = chan_get(p, (int)i)))
            continue;
        if (chan_queue_abort(l, seq, &f->e) == 0)
            l->ctl.ops->abort(l); /* over TCP, whichever transport moves the chunks */
    }
}

static void peers_abort(struct peers *p, uint64_t seq, const err *e)
{
    if (p)
        peers_fail_seq(p, seq, e, 1, -1);
}

/* ---- the transport ops table (xport.h) ---- */

static struct xport_chan *x_chan(void *self, int replica, err *e)
{
    return (struct xport_chan *)peers_chan(self, replica, e);
}

static int x_send(struct xport_chan *ch, const struct xport_chunk *c, const void *buf, size_t len, xport_cb cb,
                  void *arg)
{
    return chan_send((struct chan *)ch, c, buf, len, cb, arg);
}

static int x_recv(struct xport_chan *ch, const struct xport_chunk *c, void *buf, size_t len, xport_cb cb,
                  void *arg)
{
    return chan_recv((struct chan *)ch, c, buf, len, cb, arg);
}

/* Only where the bytes come through a shared-memory ring (the same host, both
 * sides offering it), for chunks of PEERS_FUSE_MIN bytes up to half a ring.
 * The copy saved is what counts for large chunks (shm 1 MiB: n = 2 139 -> 101
 * us, n = 4 1040 -> 753 us, medians of 6 alternating runs); for small ones a
 * receive posted only once its reduce may run measured no better or slower
 * (n = 2 64 KiB, 32 KiB chunks: 22 -> 26 us), so they keep the early receive. */
static int x_fuse(void *self, int replica, size_t len)
{
    struct peers *p = self;
    if (!p || p->stopping || p->tcp_only || !p->shm || p->self < 0 || replica < 0 || (uint32_t)replica >= p->n ||
        replica == p->self || len < PEERS_FUSE_MIN || len > shm_ring_bytes() / 2)
        return 0;
    return peers_same_host_shm(p, replica);
}

static int x_recv_reduce(struct xport_chan *ch, const struct xport_chunk *c, void *buf, size_t len,
                         xport_reduce_fn red, void *red_arg, xport_cb cb, void *arg)
{
    return chan_recv_reduce((struct chan *)ch, c, buf, len, red, red_arg, cb, arg);
}

static const char *x_peer_name(const struct xport_chan *ch)
{
    return chan_peer_name((const struct chan *)ch);
}

static int x_is_shm(const struct xport_chan *ch)
{
    return chan_is_shm((const struct chan *)ch);
}

static void x_abort(void *self, uint64_t seq, const err *e)
{
    peers_abort(self, seq, e);
}

static int x_failed(const void *self, uint64_t seq, err *e)
{
    return chan_seq_failed(self, seq, e);
}

int peers_replica_addr(const struct peers *p, uint32_t r, char *addr, size_t acap, char *name, size_t ncap)
{
    if (!p || p->stopping || !p->tab || r >= p->n)
        return CODE_NOT_FOUND;
    peertab_data_addr(p->tab, r, addr, acap);
    snprintf(name, ncap, "%s/%d", peertab_host(p->tab, r), peertab_core(p->tab, r));
    return CODE_OK;
}

static int x_host(void *self, int replica)
{
    const struct peers *p = self;
    if (!p || p->stopping || !p->tab || replica < 0 || (uint32_t)replica >= p->n)
        return -1;
    return (int)peertab_host_index(p->tab, (size_t)replica);
}

static uint8_t *x_seg(void *self, int replica, size_t *len)
{
    struct peers *p = self;
    struct chan *l;
    *len = 0;
    if (!p || p->stopping || p->self < 0 || replica < 0 || (uint32_t)replica >= p->n)
        return NULL;
    if (replica == p->self) {
        *len = p->seg_len;
        return p->seg;
    }
    if (!p->links || !(l = p->links[replica]) || l->closing || !l->pseg)
        return NULL;
    *len = l->pseg_len;
    return (uint8_t *)(uintptr_t)l->pseg;
}

static const struct xport_ops peers_ops = {x_chan,  x_send,   x_recv, x_peer_name,   x_is_shm,
                                           x_abort, x_failed, x_fuse, x_recv_reduce, x_host, x_seg};

struct xport peers_xport(struct peers *p)
{
    struct xport x = {&peers_ops, p};
    return x;
}

