/* Requests to the resolver: open and check each envelope, dispatch by body
 * case through a table, and the registry-side handlers (heartbeat with
 * identity checks, cluster spec). System state changes live in system.c;
 * leaving and forgetting cores in forget.c; how long a core may be silent
 * in liveness.c; replies and the links to the cores in reply.c, below them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corelink.h"
#include "machine.h"
#include "log.h"
#include "resolver.h"
#include "slice.h"

/* ---- heartbeat ---- */

static void reply_heartbeat(resolver *r, rreq *req, const rentry *en)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__HeartbeatReply hr = TPUEMU__HEARTBEAT_REPLY__INIT;
    hr.core = en->w.core;
    hr.heartbeat_ms = r->heartbeat_ms;
    hr.system_epoch = r->sys.epoch;
    m.body_case = TPUEMU__MESSAGE__BODY_HEARTBEAT_REPLY;
    m.heartbeat_reply = &hr;
    rsv_reply(r, req, &m);
}

static void refresh(resolver *r, rentry *en, const winfo *w, uint64_t now)
{
    uint64_t epoch = en->w.epoch;
    int32_t replica = en->w.replica_id;
    int notice_was = en->w.notice_kind;
    uint32_t faults_were = en->w.faults;

    if (strcmp(en->w.control_addr, w->control_addr) != 0)
        rsv_drop_link(en);
    en->w = *w;
    if (w->epoch < epoch) { /* a heartbeat sent before a reset we already saw acked */
        en->w.epoch = epoch;
        en->w.replica_id = replica;
    }
    en->last_hb_ms = now;
    if (w->faults > faults_were && w->last_fault[0])
        rsv_event(r, "fault", w->host_id, w->core, "fault injected: %s%s", w->last_fault,
                  w->faults - faults_were > 1 ? " (and others since the last heartbeat)" : "");
    if (w->notice_kind && !w->notice_under_way && w->notice_kind != notice_was)
        rsv_event(r, "notice", w->host_id, w->core, "%s notice: the event is in %.1f s",
                  w->notice_kind == TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION ? "preemption" : "maintenance",
                  w->notice_at_ms > now ? (double)(w->notice_at_ms - now) / 1000.0 : 0.0);
    if (w->notice_under_way && !en->dead) {
        /* kept out of initializes until it is back; calls waiting on it fail now */
        reg_set_dead(&r->reg, en, 1);
        rsv_drop_link(en);
        log_warn("core down for maintenance", "host=%s core=%d pid=%u window_ms=%u", log_q(w->host_id), w->core,
                 w->pid, w->notice_window_ms);
        rsv_event(r, "maintenance", w->host_id, w->core, "down for maintenance for %.1f s (pid %u)",
                  (double)w->notice_window_ms / 1000.0, w->pid);
    } else if (!w->notice_under_way && en->dead) {
        reg_set_dead(&r->reg, en, 0);
        log_info("core back", "host=%s core=%d pid=%u", log_q(w->host_id), w->core, w->pid);
        rsv_event(r, "back", w->host_id, w->core, "back (pid %u)", w->pid);
    }
}

static void replace(resolver *r, rentry *en, const winfo *w, uint64_t now)
{
    int was_ready = sys_core_state(r, en) == TPUEMU__CORE_STATE__CORE_READY ||
                    (en->dead && r->sys.initialized && en->w.epoch == r->sys.epoch &&
                     en->w.replica_id >= 0);
    log_info("core re-registered", "host=%s core=%d old_pid=%u new_pid=%u control=%s",
             log_q(w->host_id), w->core, en->w.pid, w->pid, log_q(w->control_addr));
    rsv_event(r, "registered", w->host_id, w->core, "registered again: pid %u replaces pid %u%s", w->pid, en->w.pid,
              was_ready ? " (the system is degraded until it is initialized again)" : "");
    if (was_ready)
        log_warn("core of the initialized system replaced; the system is degraded until it is "
                 "initialized again", "host=%s core=%d epoch=%llu", log_q(w->host_id), w->core,
                 (unsigned long long)r->sys.epoch);
    rsv_drop_link(en);
    prom_add(&r->metrics.registrations, 1);
    en->w = *w;
    en->last_hb_ms = en->registered_ms = now;
    en->preempted = 0;
    reg_set_dead(&r->reg, en, 0);
}

static void log_registered(const winfo *w)
{
    log_info("core registered", "host=%s core=%d pid=%u tpu_type=%s control=%s data=%s",
             log_q(w->host_id), w->core, w->pid, w->tpu_type, log_q(w->control_addr),
             log_q(w->data_addr));
}

/* core -1: the core this incarnation holds on its host, else the lowest index
 * not held by a live entry. -1 if the host is full. */
static int assign_core(const registry *g, const winfo *w)
{
    size_t cnt, first = reg_host_range(g, w->host_id, &cnt);
    int idx = 0;

    for (size_t i = first; i < first + cnt; i++)
        if (g->v[i]->w.incarnation == w->incarnation)
            return g->v[i]->w.core;
    for (size_t i = first; i < first + cnt; i++) {
        const rentry *en = g->v[i];
        if (en->w.core > idx || en->dead)
            break;
        idx++;
    }
    return idx > REG_CORE_MAX ? -1 : idx;
}

/* A core of a slice (--accelerator-type) must fit it, as a Cloud TPU slice's
 * hosts do: an index below its host's device count, the same slice as every
 * other live core that names one, and no more hosts than the slice has. A
 * core outside any slice is not checked. */
static int slice_check(const registry *g, const winfo *w, err *e)
{
    struct slice sl;
    char hosts[256];
    const char *prev = NULL;
    size_t hl = 0;
    unsigned nhosts = 0;
    int mine = 0;

    /* typed and untyped cores do not mix: an untyped one would join the
     * slice without its shape (more hosts or cores than the slice has) */
    for (size_t i = 0; i < g->n; i++) {
        const rentry *en = g->v[i];
        if (en->dead || (en->w.core == w->core && strcmp(en->w.host_id, w->host_id) == 0))
            continue;
        if (!w->accelerator_type[0] && en->w.accelerator_type[0])
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "core %s/%d names no slice, but the resolver serves a %s (core %s/%d): give every "
                           "worker the same --accelerator-type", w->host_id, w->core, en->w.accelerator_type,
                           en->w.host_id, en->w.core);
        if (w->accelerator_type[0] && !en->w.accelerator_type[0])
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "core %s/%d is part of a %s, but core %s/%d names no slice: one resolver serves one "
                           "slice; give every worker the same --accelerator-type", w->host_id, w->core,
                           w->accelerator_type, en->w.host_id, en->w.core);
    }
    if (!w->accelerator_type[0])
        return CODE_OK;
    if (slice_parse(w->accelerator_type, &sl, e) != CODE_OK) /* reg_validate parsed it */
        return e->code;
    if (w->core >= (int)sl.devices_per_host)
        return err_set(e, CODE_INVALID_ARGUMENT, "host %s has no free core of a %s host (cores 0..%u are "
                       "taken)", w->host_id, w->accelerator_type, sl.devices_per_host - 1);
    for (size_t i = 0; i < g->n; i++) {
        const rentry *en = g->v[i];
        if (en->dead || !en->w.accelerator_type[0] ||
            (en->w.core == w->core && strcmp(en->w.host_id, w->host_id) == 0))
            continue;
        if (strcmp(en->w.accelerator_type, w->accelerator_type) != 0)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "core %s/%d is part of a %s, but core %s/%d is part of a %s: one resolver "
                           "serves one slice; give every worker the same --accelerator-type",
                           w->host_id, w->core, w->accelerator_type, en->w.host_id, en->w.core,
                           en->w.accelerator_type);
        if (prev && strcmp(prev, en->w.host_id) == 0)
            continue;
        prev = en->w.host_id;
        nhosts++;
        if (strcmp(prev, w->host_id) == 0)
            mine = 1;
        if (hl < sizeof hosts)
            hl += (size_t)snprintf(hosts + hl, sizeof hosts - hl, "%s%s", nhosts > 1 ? ", " : "", prev);
    }
    if (!mine && nhosts >= sl.hosts)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "a %s has %u host%s and the resolver has cores of %u already (%s): host %s is one "
                       "too many", w->accelerator_type, sl.hosts, sl.hosts == 1 ? "" : "s", nhosts, hosts,
                       w->host_id);
    return CODE_OK;
}

static struct claim *take_claim(resolver *r, uint64_t tag)
{
    for (struct claim **pp = &r->claims; *pp; pp = &(*pp)->next) {
        if ((*pp)->tag == tag) {
            struct claim *c = *pp;
            *pp = c->next;
            r->nclaims--;
            return c;
        }
    }
    return NULL;
}

static void accept_worker(resolver *r, rreq *req, rentry *en)
{
    struct corelink *l;
    err e;

    /* the control connection is made now and kept, not at the initialize
     * that needs every core's at once; a link the open-file share does not
     * allow is made (and refused, naming the limit) when a call needs it */
    if ((l = rsv_link(r, en, &e)) != NULL)
        corelink_keep_open(l);
    sys_note_worker(r, en);
    reply_heartbeat(r, req, en);
    sys_on_change(r);
}

static void probe_done(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                       const Tpuemu__WorkerInfo *w)
{
    resolver *r = ctx;
    struct claim *c = take_claim(r, tag);
    rentry *en;
    char name[300];
    (void)idx;

    if (!c)
        return;
    reg_name(c->w.host_id, c->w.core, name, sizeof name);
    en = reg_lookup(&r->reg, c->w.host_id, c->w.core);
    if (!en || en->probe_tag != tag || en->w.incarnation != c->old_inc) {
        if (en && en->probe_tag == tag)
            en->probe_tag = 0;
        rsv_reply_error(r, &c->req, CODE_UNAVAILABLE, "core %s changed hands while it was checked; "
                        "retrying", name);
        free(c);
        return;
    }
    en->probe_tag = 0;
    if (code == CODE_OK && w->incarnation == c->old_inc) {
        double age = (double)(wire_now_ms() - en->last_hb_ms) / 1000.0;
        log_warn("duplicate core refused", "host=%s core=%d holder_pid=%u claimant_pid=%u "
                 "claimant_control=%s", log_q(c->w.host_id), c->w.core, en->w.pid, c->w.pid,
                 log_q(c->w.control_addr));
        rsv_reply_error(r, &c->req, CODE_ALREADY_EXISTS,
                        "core %s is already held by a live worker (pid %u, control %s, last "
                        "heartbeat %.1f s ago); give this worker another --core, or stop the other one",
                        name, en->w.pid, en->w.control_addr, age);
        free(c);
        return;
    }
    log_info("previous holder did not answer the probe", "host=%s core=%d old_pid=%u reason=%s",
             log_q(c->w.host_id), c->w.core, en->w.pid,
             log_q(code == CODE_OK ? "another incarnation answered" : msg));
    replace(r, en, &c->w, wire_now_ms());
    accept_worker(r, &c->req, en);
    free(c);
}

/* A live entry holds the key: ask it whether it is still there before giving
 * the key away. The reply to the claimant waits for the answer. */
static void start_probe(resolver *r, rreq *req, rentry *en, const winfo *w)
{
    struct claim *c;
    struct corelink *l;
    /* Long enough for a live but busy holder to answer (a loaded machine, a
     * worker under valgrind), short enough that a worker restarted right after
     * a crash gets its core back well before the old one would be declared dead:
     * half of the dead-core time, at least 500 ms. */
    uint32_t timeout = (uint32_t)(rsv_dead_ms(r) / 2);
    if (timeout < 500)
        timeout = 500;
    err e;

    if (r->nclaims >= RSV_MAX_CLAIMS || !(c = calloc(1, sizeof *c))) {
        rsv_reply_error(r, req, CODE_UNAVAILABLE, "too many registrations are being checked; retrying");
        return;
    }
    c->tag = ++r->next_tag;
    c->req = *req;
    c->w = *w;
    c->old_inc = en->w.incarnation;
    if (!(l = rsv_link(r, en, &e)) || corelink_probe(l, timeout, probe_done, c->tag, 0, &e) != CODE_OK) {
        log_info("previous holder cannot be probed", "host=%s core=%d reason=%s",
                 log_q(w->host_id), w->core, log_q(e.msg));
        replace(r, en, w, wire_now_ms());
        accept_worker(r, req, en);
        free(c);
        return;
    }
    en->probe_tag = c->tag;
    c->next = r->claims;
    r->claims = c;
    r->nclaims++;
}

static void h_heartbeat(resolver *r, rreq *req, const wire_msg *m)
{
    const Tpuemu__WorkerInfo *wi = m->heartbeat ? m->heartbeat->worker : NULL;
    uint64_t now = wire_now_ms();
    rentry *en;
    winfo w;
    char name[300];
    err e;

    prom_add(&r->metrics.heartbeats, 1);
    if (reg_validate(wi, &e) != CODE_OK) {
        log_warn_limited("heartbeat refused", "sender=%s reason=%s", log_q(m->sender), log_q(e.msg));
        rsv_reply_error(r, req, e.code, "heartbeat: %s", e.msg);
        return;
    }
    reg_winfo_copy(&w, wi, now);
    if (rsv_left_lately(r, w.incarnation)) {
        rsv_reply_error(r, req, CODE_ABORTED, "this worker (pid %u) left the cluster; a worker that "
                        "starts again registers anew", w.pid);
        return;
    }
    if (w.core < 0 && (w.core = assign_core(&r->reg, &w)) < 0) {
        rsv_reply_error(r, req, CODE_RESOURCE_EXHAUSTED, "host %s has no free core index (0..%d)",
                        w.host_id, REG_CORE_MAX);
        return;
    }
    if (slice_check(&r->reg, &w, &e) != CODE_OK) {
        log_warn_limited("heartbeat refused", "host=%s core=%d reason=%s", log_q(w.host_id), w.core,
                         log_q(e.msg));
        rsv_reply_error(r, req, e.code, "heartbeat: %s", e.msg);
        return;
    }
    en = reg_lookup(&r->reg, w.host_id, w.core);
    if (!en) {
        rentry *old;
        /* full: the core dead for longest makes room; live ones never do */
        if (r->reg.n >= r->reg.max && (old = reg_longest_dead(&r->reg)) != NULL)
            rsv_forget(r, old, FORGET_EVICTED);
        if (!(en = reg_add(&r->reg, &w, now, &e))) {
            log_warn_limited("heartbeat refused", "host=%s core=%d reason=%s", log_q(w.host_id), w.core,
                     log_q(e.msg));
            rsv_reply_error(r, req, e.code, "%s", e.msg);
            return;
        }
        prom_add(&r->metrics.registrations, 1);
        log_registered(&w);
        rsv_event(r, "registered", w.host_id, w.core, "registered (pid %u, %s, control %s)", w.pid, w.tpu_type,
                  w.control_addr);
    } else if (en->w.incarnation == w.incarnation) {
        refresh(r, en, &w, now);
    } else if (en->probe_tag) {
        rsv_reply_error(r, req, CODE_UNAVAILABLE, "checking whether the previous holder of %s is "
                        "alive; retrying", reg_name(w.host_id, w.core, name, sizeof name));
        return;
    } else if (en->dead) {
        replace(r, en, &w, now);
    } else {
        start_probe(r, req, en, &w);
        return;
    }
    accept_worker(r, req, en);
}

/* ---- cluster spec ---- */

static void h_cluster_spec(resolver *r, rreq *req, const wire_msg *m)
{
    wire_msg out = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpec cs = TPUEMU__CLUSTER_SPEC__INIT;
    size_t n = r->reg.n;
    Tpuemu__CoreInfo *ci = calloc(n ? n : 1, sizeof *ci);
    Tpuemu__CoreInfo **cip = calloc(n ? n : 1, sizeof *cip);
    Tpuemu__WorkerInfo *wi = calloc(n ? n : 1, sizeof *wi);
    Tpuemu__Notice *nb = calloc(n ? n : 1, sizeof *nb);
    uint64_t now = wire_now_ms();
    const char *want = m->cluster_spec_request ? m->cluster_spec_request->tpu_name : NULL;

    /* a client that names a TPU (TPU_NAME=my-tpu) asks the Cloud TPU API for
     * that node; another node's name is not found */
    if (want && *want && strcmp(want, r->tpu_name) != 0) {
        if (r->tpu_name[0])
            rsv_reply_error(r, req, CODE_NOT_FOUND, "TPU '%.64s' was not found: this resolver serves the TPU "
                            "'%s'", want, r->tpu_name);
        else
            rsv_reply_error(r, req, CODE_NOT_FOUND, "TPU '%.64s' was not found: this resolver has no TPU "
                            "name (start it with --name)", want);
        goto out;
    }
    if (!ci || !cip || !wi || !nb) {
        rsv_reply_error(r, req, CODE_RESOURCE_EXHAUSTED, "out of memory listing %zu cores", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const rentry *en = r->reg.v[i];
        tpuemu__core_info__init(&ci[i]);
        reg_winfo_view(&en->w, &wi[i], &nb[i], now);
        ci[i].worker = &wi[i];
        ci[i].state = sys_core_state(r, en);
        ci[i].heartbeat_age_ms = now - en->last_hb_ms;
        ci[i].registered_age_ms = now - en->registered_ms;
        cip[i] = &ci[i];
    }
    cs.n_cores = n;
    cs.cores = cip;
    cs.system_epoch = r->sys.epoch;
    cs.initialized = r->sys.initialized;
    cs.heartbeat_ms = r->heartbeat_ms;
    cs.dead_after = r->dead_after;
    cs.heartbeat_ms_flag = r->heartbeat_flag_ms;
    cs.machine_cores = r->machine_cores;
    cs.machine_cpus = r->machine_cpus;
    cs.resolver_version = (char *)TPUEMU_VERSION;
    cs.owner = r->sys.owner;
    cs.tpu_name = r->tpu_name;
    out.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC;
    out.cluster_spec = &cs;
    rsv_reply(r, req, &out);
out:
    free(ci);
    free(cip);
    free(wi);
    free(nb);
}

/* ---- system ---- */

static void h_initialize(resolver *r, rreq *req, const wire_msg *m)
{
    sys_initialize(r, req->ctl, req->id, m->initialize);
    req->ctl = NULL;
}

static void h_shutdown(resolver *r, rreq *req, const wire_msg *m)
{
    sys_shutdown(r, req->ctl, req->id, m->shutdown);
    req->ctl = NULL;
}

static void h_system_check(resolver *r, rreq *req, const wire_msg *m)
{
    sys_check(r, req->ctl, req->id, m->system_check);
    req->ctl = NULL;
}

static void h_leave(resolver *r, rreq *req, const wire_msg *m)
{
    rsv_leave(r, req, m->leave);
}

static void h_forget_core(resolver *r, rreq *req, const wire_msg *m)
{
    rsv_forget_core(r, req, m->forget_core);
}

static void h_inject_fault(resolver *r, rreq *req, const wire_msg *m)
{
    rsv_inject_fault(r, req, m->inject_fault);
}

/* ---- dispatch ---- */

static const struct {
    Tpuemu__Message__BodyCase body;
    void (*fn)(resolver *r, rreq *req, const wire_msg *m);
    const char *name;
} handlers[] = {
    {TPUEMU__MESSAGE__BODY_HEARTBEAT, h_heartbeat, "heartbeat"},
    {TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST, h_cluster_spec, "cluster_spec_request"},
    {TPUEMU__MESSAGE__BODY_INITIALIZE, h_initialize, "initialize"},
    {TPUEMU__MESSAGE__BODY_SHUTDOWN, h_shutdown, "shutdown"},
    {TPUEMU__MESSAGE__BODY_SYSTEM_CHECK, h_system_check, "system_check"},
    {TPUEMU__MESSAGE__BODY_LEAVE, h_leave, "leave"},
    {TPUEMU__MESSAGE__BODY_FORGET_CORE, h_forget_core, "forget_core"},
    {TPUEMU__MESSAGE__BODY_INJECT_FAULT, h_inject_fault, "inject_fault"},
};

/* protobuf-c leaves a oneof's message pointer NULL only on broken input; guard anyway */
static int body_present(const wire_msg *m)
{
    switch (m->body_case) {
    case TPUEMU__MESSAGE__BODY_HEARTBEAT: return m->heartbeat != NULL;
    case TPUEMU__MESSAGE__BODY_INITIALIZE: return m->initialize != NULL;
    case TPUEMU__MESSAGE__BODY_SHUTDOWN: return m->shutdown != NULL;
    case TPUEMU__MESSAGE__BODY_SYSTEM_CHECK: return m->system_check != NULL;
    case TPUEMU__MESSAGE__BODY_LEAVE: return m->leave != NULL;
    case TPUEMU__MESSAGE__BODY_FORGET_CORE: return m->forget_core != NULL;
    case TPUEMU__MESSAGE__BODY_INJECT_FAULT: return m->inject_fault != NULL;
    default: return 1;
    }
}

void rsv_on_request(sprep *s, const uint8_t *buf, size_t len, void *ctl)
{
    resolver *r = sprep_data(s);
    rreq req = {ctl, 0, 0};
    wire_msg *m = NULL;
    uint64_t now = wire_now_ms();
    const uint8_t *prev;
    size_t plen;
    err e;

    /* nanomsg's REQ resends the same bytes when its connection dropped before
     * the reply came: answer again what was answered, do nothing twice */
    switch (drc_lookup(r->drc, buf, len, ctl, now, &prev, &plen)) {
    case DRC_DONE:
        prom_add(&r->metrics.duplicates, 1);
        log_info_limited("duplicate request answered again", "bytes=%zu", len);
        if (sprep_reply(r->rep, ctl, prev, plen, &e) != CODE_OK)
            log_warn("cannot send a reply", "reason=%s", log_q(e.msg));
        return;
    case DRC_PENDING:
        prom_add(&r->metrics.duplicates, 1);
        log_info_limited("duplicate request waits for the answer to the first", "bytes=%zu", len);
        return;
    default:
        break;
    }
    if (wire_open(&r->auth, r->replay, buf, len, WIRE_MAX_REQUEST, &m, &e) != CODE_OK) {
        log_warn_limited("message refused", "bytes=%zu code=%s reason=%s", len, code_name(e.code),
                 log_q(e.msg));
        /* bound to the request when its envelope could be read, so that its
         * sender takes the refusal as the answer to that request and nothing else */
        req.id = wire_peek_nonce(buf, len, WIRE_MAX_REQUEST);
        req.refused = 1;
        rsv_reply_error(r, &req, e.code, "%s", e.msg);
        return;
    }
    req.id = m->nonce;
    drc_begin(r->drc, buf, len, m->nonce, now);
    if (r->stopping) {
        rsv_reply_error(r, &req, CODE_UNAVAILABLE, "tpu-resolver is shutting down");
        wire_msg_free(m);
        return;
    }
    for (size_t i = 0; i < sizeof handlers / sizeof *handlers; i++) {
        if (handlers[i].body == m->body_case) {
            if (!body_present(m)) {
                rsv_reply_error(r, &req, CODE_INVALID_ARGUMENT, "'%s' message has no body",
                                handlers[i].name);
            } else {
                log_debug("request", "type=%s sender=%s", handlers[i].name, log_q(m->sender));
                handlers[i].fn(r, &req, m);
            }
            wire_msg_free(m);
            return;
        }
    }
    log_warn_limited("message refused", "sender=%s reason=%s", log_q(m->sender),
             log_q("message type not handled here"));
    rsv_reply_error(r, &req, CODE_INVALID_ARGUMENT, "tpu-resolver does not handle '%s' messages",
                    wire_body_name(m));
    wire_msg_free(m);
}

void rsv_stop_claims(resolver *r)
{
    while (r->claims) {
        struct claim *c = r->claims;
        rentry *en = reg_lookup(&r->reg, c->w.host_id, c->w.core);
        if (en && en->probe_tag == c->tag)
            en->probe_tag = 0;
        r->claims = c->next;
        r->nclaims--;
        rsv_reply_error(r, &c->req, CODE_UNAVAILABLE, "tpu-resolver is shutting down");
        free(c);
    }
}
