/* The TPU system: initialize, shutdown, system check, dead detection, and
 * recovery of the epoch from heartbeats. The only part that changes the
 * system epoch. It never blocks: waits are timers and corelink callbacks,
 * each tagged so a late callback for a finished operation finds nothing. */
#include "system.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corelink.h"
#include "log.h"
#include "resolver.h"
#include "topology.h"

#define MISSING_LIST_MAX 32

struct shut_op {
    struct shut_op *next;
    resolver *r;
    uint64_t tag;
    rreq req;
    uint64_t epoch;
    size_t outstanding, failed;
    uv_timer_t timer;
};

static resolver *of_sys(rsys *s)
{
    return (resolver *)((char *)s - offsetof(resolver, sys));
}

Tpuemu__CoreState sys_core_state(const resolver *r, const rentry *en)
{
    if (en->dead && en->preempted)
        return TPUEMU__CORE_STATE__CORE_PREEMPTED;
    if (en->dead && en->w.notice_under_way &&
        wire_now_ms() - en->last_hb_ms <= rsv_dead_ms(r))
        return TPUEMU__CORE_STATE__CORE_MAINTENANCE;
    if (en->dead)
        return TPUEMU__CORE_STATE__CORE_DEAD;
    if (r->sys.initialized && en->w.epoch == r->sys.epoch && en->w.replica_id >= 0)
        return TPUEMU__CORE_STATE__CORE_READY;
    return TPUEMU__CORE_STATE__CORE_IDLE;
}

static uint64_t bump_epoch(resolver *r, enum sys_event_kind kind, const char *client)
{
    rsys *s = &r->sys;
    s->last.kind = kind;
    snprintf(s->last.client, sizeof s->last.client, "%s", client);
    s->last.at_ms = wire_now_ms();
    s->last.from = s->epoch;
    s->epoch++;
    s->last.to = s->epoch;
    s->issued = s->epoch;
    s->initialized = 0;
    return s->epoch;
}

/* ---- initialize ---- */

static void init_clear(resolver *r)
{
    struct init_op *op = &r->sys.init;
    uv_timer_stop(&r->sys.init_timer);
    for (size_t i = 0; i < op->nmissing; i++)
        free(op->missing[i]);
    free(op->missing);
    free(op->chosen);
    memset(op, 0, sizeof *op);
}

static void init_fail(resolver *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void init_fail(resolver *r, int code, const char *fmt, ...)
{
    struct init_op *op = &r->sys.init;
    rreq req = {op->ctl, op->req_id, 0};
    char msg[ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_warn("initialize failed", "client=%s code=%s reason=%s", log_q(op->client), code_name(code),
             log_q(msg));
    rsv_event(r, "init-failed", NULL, 0, "initialize by %s failed: %s: %s", op->client, code_name(code), msg);
    op->ctl = NULL;
    init_clear(r);
    rsv_reply_error(r, &req, code, "%s", msg);
}

static void add_missing(struct init_op *op, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_missing(struct init_op *op, size_t *cap, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    char *s;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (op->nmissing == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        char **nv = realloc(op->missing, nc * sizeof *nv);
        if (!nv)
            return;
        op->missing = nv;
        *cap = nc;
    }
    if ((s = strdup(buf)) != NULL)
        op->missing[op->nmissing++] = s;
}

/* Fills op->missing: dead entries, gaps in core indices on known hosts (when
 * a count was asked for), then "N more not yet seen". need = cores short. */
static void build_missing(resolver *r, size_t need)
{
    struct init_op *op = &r->sys.init;
    registry *g = &r->reg;
    uint64_t now = wire_now_ms();
    size_t cap = 0, listed = 0;
    int width = 0, complete = 1;

    for (size_t i = 0; i < g->n; i++)
        if (g->v[i]->w.core + 1 > width)
            width = g->v[i]->w.core + 1;
    for (size_t i = 0; i < g->n && complete;) {
        size_t cnt, first = reg_host_range(g, g->v[i]->w.host_id, &cnt), k = first;
        const char *host = g->v[i]->w.host_id;
        for (int c = 0; c < width; c++) {
            rentry *en = (k < first + cnt && g->v[k]->w.core == c) ? g->v[k++] : NULL;
            if (listed >= MISSING_LIST_MAX) {
                complete = 0;
                break;
            }
            if (en && en->dead) {
                Tpuemu__CoreState st = sys_core_state(r, en);
                if (st == TPUEMU__CORE_STATE__CORE_PREEMPTED)
                    add_missing(op, &cap, "%s/%d (preempted)", host, c);
                else if (st == TPUEMU__CORE_STATE__CORE_MAINTENANCE)
                    add_missing(op, &cap, "%s/%d (down for maintenance)", host, c);
                else
                    add_missing(op, &cap, "%s/%d (dead: no heartbeat for %.1f s)", host, c,
                                (double)(now - en->last_hb_ms) / 1000.0);
                listed++;
            } else if (!en && op->expect) {
                add_missing(op, &cap, "%s/%d (never registered)", host, c);
                listed++;
            }
        }
        i = first + cnt;
    }
    if (need > listed)
        add_missing(op, &cap, complete ? "%zu more not yet seen" : "%zu more", need - listed);
}

static char *join_missing(const struct init_op *op, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < op->nmissing && len + 1 < n; i++) {
        const char *sep = i == 0 ? "" : (i + 1 == op->nmissing && strstr(op->missing[i], "more") &&
                                         !strchr(op->missing[i], '/')) ? ", and " : ", ";
        int k = snprintf(buf + len, n - len, "%s%s", sep, op->missing[i]);
        if (k < 0)
            break;
        len += (size_t)k;
    }
    return buf;
}

/* Cores an initialize waits for: the count asked for, else every core alive
 * now. A dead core (no heartbeat, not yet forgotten) is gone for a default
 * initialize: it goes on without it and names it in the topology's missing
 * list; whoever wants to wait for a restarting core asks for a count. */
static size_t init_target(const resolver *r)
{
    const struct init_op *op = &r->sys.init;
    size_t alive;
    if (op->expect)
        return op->expect;
    alive = reg_alive(&r->reg);
    return alive ? alive : 1;
}

static void init_timer_cb(uv_timer_t *t);
static void init_ack(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                     const Tpuemu__WorkerInfo *w);
static void ignore_ack(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                       const Tpuemu__WorkerInfo *w);

/* TensorFlow's Topology has the same number of devices on every task
 * (tensorflow/python/tpu/topology.py; TPUClusterResolver.num_accelerators
 * raises otherwise): a slice's cores (registered with an accelerator type)
 * are refused, naming each host and its count, when their hosts differ.
 * Cores outside any slice are as many per host as were started. Returns 1 to
 * go on; else the initialize has failed. */
static int hosts_equal(resolver *r, struct init_op *op)
{
    const char *slice = NULL;
    char list[512];
    size_t ll = 0, first = 0, i;
    int differ = 0;
    size_t want = 0;

    for (i = 0; i < op->nchosen && !slice; i++) {
        const rentry *en = reg_lookup(&r->reg, op->chosen[i].host, op->chosen[i].core);
        if (en && en->w.accelerator_type[0])
            slice = en->w.accelerator_type;
    }
    if (!slice)
        return 1;
    for (i = 1; i <= op->nchosen; i++) {
        if (i < op->nchosen && strcmp(op->chosen[i].host, op->chosen[first].host) == 0)
            continue;
        if (first == 0)
            want = i - first;
        else if (i - first != want)
            differ = 1;
        if (ll < sizeof list)
            ll += (size_t)snprintf(list + ll, sizeof list - ll, "%s%s: %zu", first ? ", " : "",
                                   op->chosen[first].host, i - first);
        first = i;
    }
    if (!differ)
        return 1;
    init_fail(r, CODE_FAILED_PRECONDITION,
              "initialize: the hosts of the %s have different numbers of cores (%s); TensorFlow's "
              "Topology needs the same number of devices on every host: bring the missing cores back, "
              "or stop every core of the short host", slice, list);
    return 0;
}

/* Chooses the first n alive cores in ring order and resets every alive core. */
static void init_proceed(resolver *r, size_t n)
{
    struct init_op *op = &r->sys.init;
    registry *g = &r->reg;
    uint64_t now = wire_now_ms(), wait;
    struct cl_peers *peers;
    char a[300], b[300];
    size_t k = 0;
    err e;

    op->chosen = calloc(n, sizeof *op->chosen);
    if (!op->chosen) {
        init_fail(r, CODE_RESOURCE_EXHAUSTED, "out of memory choosing %zu cores", n);
        return;
    }
    for (size_t i = 0; i < g->n && k < n; i++) {
        const rentry *en = g->v[i];
        if (en->dead)
            continue;
        if (k > 0 && strcmp(en->w.tpu_type, op->tpu_type) != 0) {
            reg_name(op->chosen[0].host, op->chosen[0].core, a, sizeof a);
            reg_name(en->w.host_id, en->w.core, b, sizeof b);
            init_fail(r, CODE_INVALID_ARGUMENT,
                      "initialize: cores %s (%s) and %s (%s) are different TPU generations; a "
                      "system is one generation: stop the odd workers or restart them with "
                      "--tpu-type %s", a, op->tpu_type, b, en->w.tpu_type, op->tpu_type);
            return;
        }
        struct sys_chosen *c = &op->chosen[k++];
        snprintf(c->host, sizeof c->host, "%s", en->w.host_id);
        c->core = en->w.core;
        c->inc = en->w.incarnation;
        snprintf(c->data_addr, sizeof c->data_addr, "%s", en->w.data_addr);
        snprintf(c->control_addr, sizeof c->control_addr, "%s", en->w.control_addr);
        snprintf(c->shm_name, sizeof c->shm_name, "%s", en->w.shm_name);
        if (k == 1)
            snprintf(op->tpu_type, sizeof op->tpu_type, "%s", en->w.tpu_type);
    }
    op->nchosen = k;
    if (!hosts_equal(r, op))
        return;
    op->epoch = bump_epoch(r, SYS_EV_INIT, op->client);
    snprintf(r->sys.owner, sizeof r->sys.owner, "%s", op->client);
    op->phase = INIT_RESETTING;
    op->reset_ms = now;
    wait = op->deadline_ms > now ? op->deadline_ms - now : 0;
    if (wait < SYS_RESET_MIN_MS)
        wait = SYS_RESET_MIN_MS;
    op->deadline_ms = now + wait;
    log_debug("initialize: resetting cores", "epoch=%llu cores=%zu client=%s",
              (unsigned long long)op->epoch, k, log_q(op->client));

    /* every chosen core learns all of them (ResetCore.peer_table, replica
     * order, packed once) and the heartbeat settings its collective timeouts
     * derive from */
    {
        struct peertab_row *rows = calloc(op->nchosen ? op->nchosen : 1, sizeof *rows);
        if (!rows) {
            init_fail(r, CODE_RESOURCE_EXHAUSTED, "out of memory listing %zu cores", op->nchosen);
            return;
        }
        for (size_t i = 0; i < op->nchosen; i++) {
            const struct sys_chosen *c = &op->chosen[i];
            rows[i] = (struct peertab_row){c->host, c->core, c->data_addr, c->control_addr, c->shm_name, c->inc};
        }
        rsv_machine_update(r);
        peers = cl_peers_new(rows, op->nchosen, r->heartbeat_ms, r->dead_after, &e);
        free(rows);
        if (peers) {
            peers->machine_cores = r->machine_cores;
            peers->machine_cpus = r->machine_cpus;
        }
        if (!peers) {
            init_fail(r, e.code, "initialize: %s", e.msg);
            return;
        }
        peers->keep_faults = op->keep_faults;
    }

    /* chosen cores first, in replica order; then every other alive core leaves */
    k = 0;
    for (size_t i = 0; i < g->n; i++) {
        rentry *en = g->v[i];
        corelink *l;
        int chosen = k < op->nchosen && strcmp(op->chosen[k].host, en->w.host_id) == 0 &&
                     op->chosen[k].core == en->w.core;
        if (en->dead)
            continue;
        l = rsv_link(r, en, &e);
        if (chosen) {
            if (!l || corelink_reset(l, op->epoch, (int32_t)k, (uint32_t)op->nchosen, peers,
                                     (uint32_t)wait, init_ack, op->tag, (int)k, &e) != CODE_OK) {
                cl_peers_unref(peers);
                if (e.code == CODE_RESOURCE_EXHAUSTED) { /* ours to fix, not the core's */
                    init_fail(r, CODE_RESOURCE_EXHAUSTED, "core %s could not be sent the reset: %s",
                              reg_name(en->w.host_id, en->w.core, a, sizeof a), e.msg);
                    return;
                }
                init_fail(r, CODE_UNAVAILABLE, "core %s could not be sent the reset (%s; control "
                          "%s); restart it and initialize again",
                          reg_name(en->w.host_id, en->w.core, a, sizeof a), e.msg, en->w.control_addr);
                return;
            }
            k++;
        } else if (l) {
            corelink_reset(l, op->epoch, -1, 0, NULL, SYS_RESET_MIN_MS, ignore_ack, 0, 0, &e);
        }
    }
    cl_peers_unref(peers);
    uv_timer_start(&r->sys.init_timer, init_timer_cb, wait, 0);
}

static void init_succeed(resolver *r)
{
    struct init_op *op = &r->sys.init;
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Topology t = TPUEMU__TOPOLOGY__INIT;
    Tpuemu__TopologyCore *tc = calloc(op->nchosen, sizeof *tc);
    Tpuemu__TopologyCore **tcp = calloc(op->nchosen, sizeof *tcp);
    uint32_t *coords = calloc(op->nchosen * 4, sizeof *coords);
    unsigned *task_of = calloc(op->nchosen ? op->nchosen : 1, sizeof *task_of);
    unsigned (*xyz)[4] = calloc(op->nchosen ? op->nchosen : 1, sizeof *xyz);
    unsigned shape[4];
    uint32_t shape32[4];
    size_t tasks = 0, per = 0, run = 0;
    rreq req = {op->ctl, op->req_id, 0};

    if (!tc || !tcp || !coords || !task_of || !xyz) {
        free(tc);
        free(tcp);
        free(coords);
        free(task_of);
        free(xyz);
        init_fail(r, CODE_RESOURCE_EXHAUSTED, "out of memory building the topology");
        return;
    }
    r->sys.initialized = 1;
    topo_mesh(op->tpu_type, (unsigned)op->nchosen, shape);
    for (int i = 0; i < 4; i++)
        shape32[i] = shape[i];
    /* physical positions: each host a block of chips (ring order stays the
     * replica ids, which the collectives follow) */
    for (size_t i = 0; i < op->nchosen; i++) {
        if (i == 0 || strcmp(op->chosen[i].host, op->chosen[i - 1].host) != 0)
            tasks++;
        task_of[i] = (unsigned)(tasks - 1);
    }
    topo_layout(shape, op->nchosen, task_of, xyz);
    tasks = 0;
    for (size_t i = 0; i < op->nchosen; i++) {
        struct sys_chosen *c = &op->chosen[i];
        rentry *en = reg_lookup(&r->reg, c->host, c->core);
        if (en && en->w.incarnation == c->inc) {
            en->w.epoch = op->epoch;
            en->w.replica_id = (int32_t)i;
        }
        if (i == 0 || strcmp(c->host, op->chosen[i - 1].host) != 0) {
            tasks++;
            run = 0;
        }
        if (++run > per)
            per = run;
        tpuemu__topology_core__init(&tc[i]);
        tc[i].replica_id = (int32_t)i;
        tc[i].host_id = c->host;
        tc[i].core = c->core;
        tc[i].task_id = (uint32_t)(tasks - 1);
        for (int j = 0; j < 4; j++)
            coords[i * 4 + (size_t)j] = xyz[i][j];
        tc[i].n_coords = 4;
        tc[i].coords = &coords[i * 4];
        tc[i].data_addr = c->data_addr;
        tc[i].control_addr = c->control_addr;
        tcp[i] = &tc[i];
    }
    t.epoch = op->epoch;
    t.n_mesh_shape = 4;
    t.mesh_shape = shape32;
    t.n_cores = op->nchosen;
    t.cores = tcp;
    t.num_tasks = (uint32_t)tasks;
    t.num_tpus_per_task = (uint32_t)per;
    t.n_missing = op->nmissing;
    t.missing = op->missing;
    t.tpu_type = op->tpu_type;
    t.owner = r->sys.owner;
    m.body_case = TPUEMU__MESSAGE__BODY_TOPOLOGY;
    m.topology = &t;
    rsv_event(r, "init", NULL, 0, "system initialized: epoch %llu, %zu cores on %zu hosts, by %s",
              (unsigned long long)op->epoch, op->nchosen, tasks, op->client);
    log_info("system initialized", "epoch=%llu cores=%zu hosts=%zu owner=%s ms=%llu",
             (unsigned long long)op->epoch, op->nchosen, tasks, log_q(op->client),
             (unsigned long long)(wire_now_ms() - op->start_ms));
    rsv_reply(r, &req, &m);
    op->ctl = NULL;
    free(tc);
    free(tcp);
    free(coords);
    free(task_of);
    free(xyz);
    init_clear(r);
}

static void ignore_ack(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                       const Tpuemu__WorkerInfo *w)
{
    (void)ctx, (void)tag, (void)idx, (void)w;
    if (code != CODE_OK && code != CODE_CANCELLED)
        log_debug("reset of an unchosen core failed", "code=%s reason=%s", code_name(code), log_q(msg));
}

static void init_ack(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                     const Tpuemu__WorkerInfo *w)
{
    resolver *r = ctx;
    struct init_op *op = &r->sys.init;
    struct sys_chosen *c;
    char name[300];

    if (op->phase != INIT_RESETTING || op->tag != tag || idx < 0 || (size_t)idx >= op->nchosen)
        return;
    c = &op->chosen[idx];
    reg_name(c->host, c->core, name, sizeof name);
    if (code == CODE_CANCELLED) {
        init_fail(r, CODE_UNAVAILABLE, "core %s went away before it acknowledged the reset (it "
                  "stopped heartbeating or was replaced; control %s); restart it and initialize "
                  "again", name, c->control_addr);
        return;
    }
    if (code == CODE_DEADLINE_EXCEEDED) {
        init_fail(r, CODE_UNAVAILABLE, "core %s did not acknowledge the reset within %llu ms "
                  "(control %s); it may be hung; restart it and initialize again", name,
                  (unsigned long long)(op->deadline_ms - op->reset_ms), c->control_addr);
        return;
    }
    if (code != CODE_OK) {
        init_fail(r, CODE_UNAVAILABLE, "core %s refused the reset: %s: %s (control %s); restart it "
                  "and initialize again", name, code_name(code), msg, c->control_addr);
        return;
    }
    if (w->incarnation != c->inc || w->epoch != op->epoch) {
        init_fail(r, CODE_UNAVAILABLE, "core %s answered the reset as another process or epoch "
                  "(epoch %llu, expected %llu); it was restarted meanwhile; initialize again",
                  name, (unsigned long long)w->epoch, (unsigned long long)op->epoch);
        return;
    }
    if (!c->acked) {
        c->acked = 1;
        op->nacked++;
    }
    if (op->nacked == op->nchosen) {
        if (r->sys.epoch != op->epoch) {
            init_fail(r, CODE_ABORTED, "the TPU system was shut down by client %s while this "
                      "initialize waited for its cores; initialize again", r->sys.last.client);
            return;
        }
        init_succeed(r);
    }
}

/* Waiting phase: proceed if enough cores are alive. */
void sys_on_change(resolver *r)
{
    struct init_op *op = &r->sys.init;
    size_t target;

    if (op->phase != INIT_WAITING || r->stopping)
        return;
    target = init_target(r);
    if (reg_alive(&r->reg) < target)
        return;
    if (!op->expect && r->reg.n_dead)
        build_missing(r, 0);
    init_proceed(r, target);
}

static void init_deadline(resolver *r)
{
    struct init_op *op = &r->sys.init;
    size_t target = init_target(r), alive = reg_alive(&r->reg);
    char list[ERR_MSG_MAX / 2];

    if (op->phase == INIT_RESETTING) {
        for (size_t i = 0; i < op->nchosen; i++)
            if (!op->chosen[i].acked) {
                init_ack(r, op->tag, (int)i, CODE_DEADLINE_EXCEEDED, "", NULL);
                return;
            }
        return;
    }
    build_missing(r, target > alive ? target - alive : 0);
    if (op->allow_partial && alive >= 1) {
        init_proceed(r, alive < target ? alive : target);
        return;
    }
    /* TensorFlow's initialize_tpu_system (tensorflow/python/tpu/tpu_strategy_util.py)
     * raises NotFoundError("TPUs not found in the cluster. Failed in
     * initialization: ...") when the cluster has no TPU devices for it */
    init_fail(r, CODE_NOT_FOUND, "TPUs not found in the cluster. Failed in initialization: %zu of %zu "
              "expected cores alive after %.1f s; missing: %s; start or restart those workers, or pass a "
              "smaller --expect (or --allow-partial)", alive, target, (double)op->timeout_ms / 1000.0,
              join_missing(op, list, sizeof list));
}

static void init_timer_cb(uv_timer_t *t)
{
    init_deadline(of_sys(t->data));
}

void sys_initialize(resolver *r, void *ctl, uint64_t req_id, const Tpuemu__InitializeRequest *q)
{
    struct init_op *op = &r->sys.init;
    rreq req = {ctl, req_id, 0};
    uint32_t timeout = q->timeout_ms ? q->timeout_ms : 10000;

    if (q->abandon_request_id) {
        const char *who = q->client_id && *q->client_id ? q->client_id : "?";
        if (op->phase == INIT_WAITING && op->req_id == q->abandon_request_id && strcmp(op->client, who) == 0) {
            init_fail(r, CODE_CANCELLED, "initialize abandoned by its client (%s)", who);
            rsv_reply_error(r, &req, CODE_CANCELLED, "initialize abandoned");
        } else {
            rsv_reply_error(r, &req, CODE_NOT_FOUND, "no initialize of request %llu from %s waits for cores",
                            (unsigned long long)q->abandon_request_id, who);
        }
        return;
    }
    if (q->expect > r->max_cores) {
        rsv_reply_error(r, &req, CODE_INVALID_ARGUMENT, "initialize: expect %u is more than this "
                        "resolver tracks (--max-cores %u)", q->expect, r->max_cores);
        return;
    }
    if (q->timeout_ms > 600000) {
        rsv_reply_error(r, &req, CODE_INVALID_ARGUMENT, "initialize: timeout_ms %u is more than "
                        "600000 (10 minutes)", q->timeout_ms);
        return;
    }
    if (op->phase != INIT_IDLE) {
        rsv_reply_error(r, &req, CODE_ABORTED, "another initialize (from client %s) is in progress; "
                        "retry when it finishes", op->client);
        return;
    }
    memset(op, 0, sizeof *op);
    op->phase = INIT_WAITING;
    op->tag = ++r->next_tag;
    op->ctl = ctl;
    op->req_id = req_id;
    op->expect = q->expect;
    op->timeout_ms = timeout;
    op->allow_partial = q->allow_partial;
    op->keep_faults = q->keep_scheduled_faults;
    snprintf(op->client, sizeof op->client, "%s", q->client_id && *q->client_id ? q->client_id : "?");
    op->start_ms = wire_now_ms();
    op->deadline_ms = op->start_ms + timeout;
    uv_timer_start(&r->sys.init_timer, init_timer_cb, timeout, 0);
    sys_on_change(r);
}

/* ---- shutdown ---- */

static void shut_closed(uv_handle_t *h)
{
    free(h->data);
}

static void shut_finish(struct shut_op *op)
{
    resolver *r = op->r;
    struct shut_op **pp = &r->sys.shuts;
    while (*pp && *pp != op)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = op->next;
        r->sys.nshuts--;
    }
    if (op->req.ctl) {
        if (r->stopping) {
            rsv_reply_error(r, &op->req, CODE_UNAVAILABLE, "tpu-resolver is shutting down");
        } else {
            wire_msg m = TPUEMU__MESSAGE__INIT;
            Tpuemu__ShutdownReply sr = TPUEMU__SHUTDOWN_REPLY__INIT;
            sr.epoch = op->epoch;
            m.body_case = TPUEMU__MESSAGE__BODY_SHUTDOWN_REPLY;
            m.shutdown_reply = &sr;
            rsv_reply(r, &op->req, &m);
        }
    }
    uv_timer_stop(&op->timer);
    uv_close((uv_handle_t *)&op->timer, shut_closed);
}

static void shut_timer_cb(uv_timer_t *t)
{
    struct shut_op *op = t->data;
    log_warn("shutdown: some cores did not acknowledge the reset", "epoch=%llu missing=%zu",
             (unsigned long long)op->epoch, op->outstanding);
    shut_finish(op);
}

static void shut_ack(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                     const Tpuemu__WorkerInfo *w)
{
    resolver *r = ctx;
    struct shut_op *op = r->sys.shuts;
    (void)idx, (void)w;
    while (op && op->tag != tag)
        op = op->next;
    if (!op)
        return;
    if (code != CODE_OK) {
        log_warn("shutdown: core did not acknowledge the reset", "epoch=%llu code=%s reason=%s",
                 (unsigned long long)op->epoch, code_name(code), log_q(msg));
        op->failed++;
    }
    if (--op->outstanding == 0)
        shut_finish(op);
}

static int check_error(resolver *r, uint64_t epoch, char *msg, size_t n)
{
    rsys *s = &r->sys;
    double ago = (double)(wire_now_ms() - s->last.at_ms) / 1000.0;

    if (epoch == s->epoch && s->initialized)
        return 0;
    if (epoch > s->epoch)
        snprintf(msg, n, "this resolver has no epoch %llu (it restarted?); initialize again",
                 (unsigned long long)epoch);
    else if (epoch != 0 && epoch < s->epoch && s->last.kind == SYS_EV_INIT)
        snprintf(msg, n, "the TPU system was re-initialized by client %s %.1f s ago (epoch %llu "
                 "\u2192 %llu); this handle belongs to epoch %llu: call tpu_initialize_system again",
                 s->last.client, ago, (unsigned long long)s->last.from,
                 (unsigned long long)s->last.to, (unsigned long long)epoch);
    else if (epoch != 0 && epoch < s->epoch && s->last.kind == SYS_EV_SHUTDOWN)
        snprintf(msg, n, "the TPU system was shut down by client %s %.1f s ago (epoch %llu \u2192 "
                 "%llu); initialize it again", s->last.client, ago,
                 (unsigned long long)s->last.from, (unsigned long long)s->last.to);
    else if (epoch != 0 && epoch < s->epoch)
        snprintf(msg, n, "the TPU system is now in epoch %llu; this handle belongs to epoch %llu: "
                 "call tpu_initialize_system again", (unsigned long long)s->epoch,
                 (unsigned long long)epoch);
    else
        snprintf(msg, n, "the TPU system is not initialized; call tpu_initialize_system first");
    return 1;
}

void sys_shutdown(resolver *r, void *ctl, uint64_t req_id, const Tpuemu__ShutdownRequest *q)
{
    rreq req = {ctl, req_id, 0};
    char msg[ERR_MSG_MAX];
    const char *client = q->client_id && *q->client_id ? q->client_id : "?";
    struct shut_op *op;
    uint64_t from = r->sys.epoch;
    err e;

    if (q->epoch != 0 && check_error(r, q->epoch, msg, sizeof msg)) {
        rsv_reply_error(r, &req, CODE_FAILED_PRECONDITION, "%s", msg);
        return;
    }
    if (r->sys.nshuts >= SYS_MAX_SHUTDOWNS || !(op = calloc(1, sizeof *op))) {
        rsv_reply_error(r, &req, CODE_UNAVAILABLE, "%zu shutdowns are already in progress; retry",
                        r->sys.nshuts);
        return;
    }
    op->r = r;
    op->tag = ++r->next_tag;
    op->req = req;
    op->epoch = bump_epoch(r, SYS_EV_SHUTDOWN, client);
    r->sys.owner[0] = '\0';
    uv_timer_init(r->loop, &op->timer);
    op->timer.data = op;
    op->next = r->sys.shuts;
    r->sys.shuts = op;
    r->sys.nshuts++;
    log_info("system shut down", "epoch=%llu from=%llu client=%s", (unsigned long long)op->epoch,
             (unsigned long long)from, log_q(client));
    rsv_event(r, "shutdown", NULL, 0, "system shut down by %s (epoch %llu)", client, (unsigned long long)op->epoch);
    if (r->sys.init.phase == INIT_RESETTING)
        init_fail(r, CODE_ABORTED, "the TPU system was shut down by client %s while this initialize "
                  "waited for its cores; initialize again", client);
    for (size_t i = 0; i < r->reg.n; i++) {
        rentry *en = r->reg.v[i];
        corelink *l;
        if (en->dead || !(l = rsv_link(r, en, &e)))
            continue;
        if (corelink_reset(l, op->epoch, -1, 0, NULL, SYS_RESET_MIN_MS, shut_ack, op->tag, 0, &e) == CODE_OK)
            op->outstanding++;
        else
            log_warn("shutdown: could not send the reset", "host=%s core=%d reason=%s",
                     log_q(en->w.host_id), en->w.core, log_q(e.msg));
    }
    if (op->outstanding == 0)
        shut_finish(op);
    else
        uv_timer_start(&op->timer, shut_timer_cb, SYS_RESET_MIN_MS + 100, 0);
}

void sys_check(resolver *r, void *ctl, uint64_t req_id, const Tpuemu__SystemCheck *q)
{
    rreq req = {ctl, req_id, 0};
    char msg[ERR_MSG_MAX];
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__SystemCheckReply sr = TPUEMU__SYSTEM_CHECK_REPLY__INIT;

    if (check_error(r, q->epoch, msg, sizeof msg)) {
        rsv_reply_error(r, &req, CODE_FAILED_PRECONDITION, "%s", msg);
        return;
    }
    sr.epoch = r->sys.epoch;
    m.body_case = TPUEMU__MESSAGE__BODY_SYSTEM_CHECK_REPLY;
    m.system_check_reply = &sr;
    rsv_reply(r, &req, &m);
}

/* ---- heartbeats and health ---- */

void sys_note_worker(resolver *r, const rentry *en)
{
    rsys *s = &r->sys;

    if (en->w.epoch > s->epoch) {
        log_info("system epoch recovered from a worker", "epoch=%llu was=%llu host=%s core=%d",
                 (unsigned long long)en->w.epoch, (unsigned long long)s->epoch,
                 log_q(en->w.host_id), en->w.core);
        s->epoch = en->w.epoch;
        s->initialized = 0;
    }
    /* a core reset into an epoch this process never started: the system was
     * initialized before the resolver restarted */
    if (en->w.replica_id >= 0 && en->w.epoch == s->epoch && s->epoch > s->issued &&
        !s->initialized && s->init.phase != INIT_RESETTING) {
        s->initialized = 1;
        s->owner[0] = '\0';
        log_info("system recovered as initialized", "epoch=%llu", (unsigned long long)s->epoch);
    }
}

void sys_dead_check(resolver *r, uint64_t now)
{
    uint64_t limit = rsv_dead_ms(r);
    int changed = 0;

    for (size_t i = 0; i < r->reg.n; i++) {
        rentry *en = r->reg.v[i];
        if (en->dead || now - en->last_hb_ms <= limit)
            continue;
        reg_set_dead(&r->reg, en, 1);
        rsv_drop_link(en); /* stop reconnecting to it; calls waiting on it fail now */
        changed = 1;
        log_warn("core dead", "host=%s core=%d pid=%u age_ms=%llu", log_q(en->w.host_id), en->w.core,
                 en->w.pid, (unsigned long long)(now - en->last_hb_ms));
        rsv_event(r, "dead", en->w.host_id, en->w.core, "dead: no heartbeat for %.1f s (pid %u)",
                  (double)(now - en->last_hb_ms) / 1000.0, en->w.pid);
    }
    if (changed)
        sys_on_change(r);
}

int sys_start(resolver *r)
{
    int rc = uv_timer_init(r->loop, &r->sys.init_timer);
    r->sys.init_timer.data = &r->sys;
    return rc;
}

void sys_stop(resolver *r)
{
    struct init_op *op = &r->sys.init;
    if (op->phase != INIT_IDLE)
        init_fail(r, CODE_UNAVAILABLE, "tpu-resolver is shutting down");
    while (r->sys.shuts)
        shut_finish(r->sys.shuts);
    uv_close((uv_handle_t *)&r->sys.init_timer, NULL);
}
