/* peers: the links of one worker for the current system epoch (made lazily,
 * one per peer replica), the failures of collectives (recorded per seq,
 * broadcast as ABORT frames so every survivor fails fast, not only the
 * neighbours), and completions delivered from the loop rather than from
 * inside link_send/link_recv. */
#include "link_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "worker.h"

#define DEFAULT_HEARTBEAT_MS 1000u
#define DEFAULT_DEAD_AFTER 3u
#define TIMEOUT_MAX_MS 600000u

static const err ok_err = {CODE_OK, ""};

static void on_handle_closed(uv_handle_t *h)
{
    struct peers *p = h->data;
    if (--p->open_handles == 0) {
        free(p->info);
        free(p->links);
        free(p);
    }
}

static void on_defer(uv_timer_t *t)
{
    struct peers *p = t->data;
    struct lop *op;
    /* callbacks may queue more; they run in this pass too */
    while ((op = lopq_pop(&p->dq)) != NULL) {
        op->cb(op->arg, op->fail ? op->fail : &ok_err);
        free(op->fail);
        free(op);
    }
}

void peers_defer(struct peers *p, struct lop *op)
{
    lopq_push(&p->dq, op);
    if (!uv_is_active((uv_handle_t *)&p->defer))
        uv_timer_start(&p->defer, on_defer, 0, 0);
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

int peers_init(struct worker *w, err *e)
{
    struct peers *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the peer links");
    p->w = w;
    p->loop = w->loop;
    p->self = -1;
    p->tcp_only = w->tcp_only;
    set_timeouts(p, DEFAULT_HEARTBEAT_MS * DEFAULT_DEAD_AFTER);
    uv_timer_init(w->loop, &p->defer);
    p->defer.data = p;
    p->open_handles = 1;
    w->peers = p;
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
            link_destroy(p->links[i]);
            p->links[i] = NULL;
        }
    while ((op = lopq_pop(&p->dq)) != NULL) {
        free(op->fail);
        free(op);
    }
}

void peers_stop(struct worker *w)
{
    struct peers *p = w->peers;
    if (!p || p->stopping)
        return;
    p->stopping = 1;
    drop_all(p);
    shm_listener_close(p);
    uv_timer_stop(&p->defer);
    uv_close((uv_handle_t *)&p->defer, on_handle_closed);
    w->peers = NULL;
}

const char *peers_shm_name(const peers *p)
{
    return p ? p->shm_name : "";
}

unsigned peers_timeout_ms(const peers *p)
{
    return p->timeout_ms;
}

void peers_reset(struct worker *w, const Tpuemu__ResetCore *r)
{
    struct peers *p = w->peers;
    size_t n;

    if (!p)
        return;
    drop_all(p);
    free(p->info);
    free(p->links);
    p->info = NULL;
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
    }
    n = r->n_peers;
    if (r->replica_id < 0 || n == 0)
        return;
    if (n != r->num_replicas || (size_t)r->replica_id >= n) {
        log_warn("reset without a usable peer list; collectives will fail", "peers=%zu replicas=%u",
                 n, r->num_replicas);
        return;
    }
    p->info = calloc(n, sizeof *p->info);
    p->links = calloc(n, sizeof *p->links);
    if (!p->info || !p->links) {
        free(p->info);
        free(p->links);
        p->info = NULL;
        p->links = NULL;
        log_error("out of memory for the peer list", "peers=%zu", n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const Tpuemu__PeerInfo *pi = r->peers[i];
        struct peer_info *d = &p->info[i];
        snprintf(d->host, sizeof d->host, "%s", pi && pi->host_id ? pi->host_id : "?");
        d->core = pi ? pi->core : -1;
        snprintf(d->data_addr, sizeof d->data_addr, "%s", pi && pi->data_addr ? pi->data_addr : "");
        snprintf(d->shm_name, sizeof d->shm_name, "%s", pi && pi->shm_name ? pi->shm_name : "");
        snprintf(d->control_addr, sizeof d->control_addr, "%s",
                 pi && pi->control_addr ? pi->control_addr : "");
        d->incarnation = pi ? pi->incarnation : 0;
    }
    p->n = (uint32_t)n;
    p->self = r->replica_id;
}

struct link *peers_link_get(struct peers *p, int r)
{
    if (p->stopping || r < 0 || (uint32_t)r >= p->n || r == p->self || !p->links)
        return NULL;
    if (!p->links[r])
        p->links[r] = link_new(p, r);
    return p->links[r];
}

struct link *peers_link(peers *p, int replica, err *e)
{
    struct link *l;
    if (!p || p->self < 0)
        return err_set(e, CODE_FAILED_PRECONDITION, "this core is not part of an initialized system"),
               NULL;
    if (replica < 0 || (uint32_t)replica >= p->n || replica == p->self) {
        err_set(e, CODE_INVALID_ARGUMENT, "replica %d is not a peer of replica %d (%u replicas)", replica,
                p->self, p->n);
        return NULL;
    }
    if (!(l = peers_link_get(p, replica)))
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a link");
    return l;
}

void peers_accept(struct worker *w, dp_conn *c)
{
    struct peers *p = w->peers;
    uint64_t ep = dp_conn_auth_epoch(c);
    int32_t r = dp_conn_auth_replica(c);
    struct link *l;

    if (!p || p->self < 0 || ep != p->epoch) {
        dp_conn_fail(c, CODE_FAILED_PRECONDITION,
                     "core %s/%d is in system epoch %llu%s, the connecting core (replica %d) in epoch "
                     "%llu: one of them missed a re-initialize", w->host_id, w->core,
                     (unsigned long long)(p ? p->epoch : 0), p && p->self >= 0 ? "" : " (not in the system)",
                     (int)r, (unsigned long long)ep);
        return;
    }
    if (!(l = peers_link_get(p, r))) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT, "replica %d is not a peer of replica %d (%u replicas)",
                     (int)r, p->self, p->n);
        return;
    }
    tcp_attach_in(l, c);
}

int peers_failed(const peers *p, uint64_t seq, err *e)
{
    if (!p)
        return CODE_OK;
    for (unsigned i = 0; i < PEERS_FAILED_MAX; i++)
        if (p->failed[i].used && p->failed[i].seq == seq) {
            if (e)
                *e = p->failed[i].e;
            return p->failed[i].e.code != CODE_OK ? p->failed[i].e.code : CODE_UNKNOWN;
        }
    return CODE_OK;
}

const char *peers_what_of(const struct peers *p, uint64_t seq)
{
    for (uint32_t i = 0; i < p->n; i++) {
        const struct link *l = p->links ? p->links[i] : NULL;
        if (!l)
            continue;
        for (const struct lop *op = l->rq.head; op; op = op->next)
            if (op->seq == seq)
                return op->what;
        for (const struct lop *op = l->sq.head; op; op = op->next)
            if (op->seq == seq)
                return op->what;
    }
    if (p->cur_seq == seq && p->cur_what)
        return p->cur_what;
    return "collective";
}

void peers_fail_seq(struct peers *p, uint64_t seq, const err *e, int broadcast, int culprit)
{
    struct failed_seq *f;

    if (p->stopping || peers_failed(p, seq, NULL) != CODE_OK)
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
            link_fail_seq(p->links[i], seq, &f->e);
    if (!broadcast)
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        struct link *l;
        err de;
        if ((int)i == p->self || (int)i == culprit || !(l = peers_link_get(p, (int)i)))
            continue;
        if (link_queue_abort(l, seq, &f->e) != 0)
            continue;
        if (l->out && l->out_ready)
            tcp_send_abort(l);
        else if (!l->out && tcp_dial(l, &de) != CODE_OK)
            l->naborts = 0;
    }
}

void peers_abort(peers *p, uint64_t seq, const err *e)
{
    if (p)
        peers_fail_seq(p, seq, e, 1, -1);
}

