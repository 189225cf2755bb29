/* Forgetting cores: a worker that stops cleanly leaves (Leave, bound to its
 * incarnation), a core dead for --forget-after-ms expires, an operator forgets
 * a dead one (ForgetCore), and a full registry makes room from its
 * longest-dead core (handlers.c). A core that is gone is then no longer
 * listed, nor named as missing by an initialize. Live cores are never
 * forgotten here: their next heartbeat would register them again. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "resolver.h"

const char *rsv_forget_reason_name(enum forget_reason why)
{
    static const char *const names[FORGET_REASONS] = {"left", "expired", "operator", "evicted"};
    return (int)why >= 0 && why < FORGET_REASONS ? names[why] : "?";
}

void rsv_forget(resolver *r, rentry *en, enum forget_reason why)
{
    uint64_t silent = wire_now_ms() - en->last_hb_ms;

    if (why != FORGET_LEFT)
        log_info("core forgotten", "host=%s core=%d pid=%u reason=%s silent_ms=%llu", log_q(en->w.host_id),
                 en->w.core, en->w.pid, rsv_forget_reason_name(why), (unsigned long long)silent);
    if (r->sys.initialized && en->w.epoch == r->sys.epoch && en->w.replica_id >= 0)
        log_warn("core of the initialized system forgotten; the system is degraded until it is "
                 "initialized again", "host=%s core=%d epoch=%llu", log_q(en->w.host_id), en->w.core,
                 (unsigned long long)r->sys.epoch);
    if (why != FORGET_LEFT)
        rsv_event(r, "forgotten", en->w.host_id, en->w.core, "forgotten (%s) after %.1f s of silence",
                  rsv_forget_reason_name(why), (double)silent / 1000.0);
    prom_add(&r->metrics.forgotten[why], 1);
    rsv_drop_link(en); /* calls waiting on it complete with CANCELLED */
    reg_remove(&r->reg, en);
}

int rsv_left_lately(const resolver *r, uint64_t inc)
{
    uint64_t now = wire_now_ms();
    for (size_t i = 0; i < RSV_LEFT_MAX; i++)
        if (r->left[i].inc == inc && inc && now - r->left[i].at_ms <= AUTH_WINDOW_MS)
            return 1;
    return 0;
}

static void note_left(resolver *r, uint64_t inc)
{
    r->left[r->left_next].inc = inc;
    r->left[r->left_next].at_ms = wire_now_ms();
    r->left_next = (r->left_next + 1) % RSV_LEFT_MAX;
}

/* host and core of a request; INVALID_ARGUMENT naming what is wrong. */
static int check_key(const char *host, int core, err *e)
{
    size_t len = host ? strlen(host) : 0;
    if (len < 1 || len >= REG_HOST_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "host_id must be 1..%d characters", REG_HOST_MAX - 1);
    if (core < 0 || core > REG_CORE_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "core %d is out of range (0..%d)", core, REG_CORE_MAX);
    return CODE_OK;
}

void rsv_leave(resolver *r, rreq *req, const Tpuemu__Leave *q)
{
    const Tpuemu__CoreRef *c = q->core;
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__LeaveReply lr = TPUEMU__LEAVE_REPLY__INIT;
    char name[300];
    rentry *en;
    err e;

    if (!c || check_key(c->host_id, c->core, &e) != CODE_OK || c->incarnation == 0) {
        rsv_reply_error(r, req, CODE_INVALID_ARGUMENT, "leave: %s",
                        !c ? "no core given" : c->incarnation == 0 ? "incarnation must not be 0" : e.msg);
        return;
    }
    reg_name(c->host_id, c->core, name, sizeof name);
    /* a heartbeat of this process still on its way must not bring it back */
    note_left(r, c->incarnation);
    en = reg_lookup(&r->reg, c->host_id, c->core);
    if (!en) {
        rsv_reply_error(r, req, CODE_NOT_FOUND, "leave: core %s is not registered here", name);
        return;
    }
    if (en->w.incarnation != c->incarnation) {
        rsv_reply_error(r, req, CODE_FAILED_PRECONDITION, "leave: core %s is held by another process "
                        "(pid %u) now; nothing changed", name, en->w.pid);
        return;
    }
    if (q->preempted) {
        /* listed PREEMPTED, as Cloud TPU lists a preempted node, until a new
         * process registers on its key or it is forgotten */
        log_warn("core preempted", "host=%s core=%d pid=%u", log_q(en->w.host_id), en->w.core, en->w.pid);
        rsv_event(r, "preempted", en->w.host_id, en->w.core, "preempted (pid %u terminated)", en->w.pid);
        en->preempted = 1;
        en->w.notice_kind = 0;
        if (!en->dead)
            reg_set_dead(&r->reg, en, 1);
        rsv_drop_link(en);
    } else {
        log_info("core left", "host=%s core=%d pid=%u", log_q(en->w.host_id), en->w.core, en->w.pid);
        rsv_event(r, "left", en->w.host_id, en->w.core, "left: its worker stopped (pid %u)", en->w.pid);
        rsv_forget(r, en, FORGET_LEFT);
    }
    m.body_case = TPUEMU__MESSAGE__BODY_LEAVE_REPLY;
    m.leave_reply = &lr;
    rsv_reply(r, req, &m);
    sys_on_change(r);
}

void rsv_forget_core(resolver *r, rreq *req, const Tpuemu__ForgetCore *q)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ForgetCoreReply fr = TPUEMU__FORGET_CORE_REPLY__INIT;
    Tpuemu__WorkerInfo wi;
    Tpuemu__Notice nb;
    char name[300];
    rentry *en;
    winfo w;
    uint64_t silent;
    err e;

    if (check_key(q->host_id, q->core, &e) != CODE_OK) {
        rsv_reply_error(r, req, CODE_INVALID_ARGUMENT, "forget: %s", e.msg);
        return;
    }
    reg_name(q->host_id, q->core, name, sizeof name);
    if (!(en = reg_lookup(&r->reg, q->host_id, q->core))) {
        rsv_reply_error(r, req, CODE_NOT_FOUND, "forget: core %s is not registered here (tpuctl cluster "
                        "lists the cores that are)", name);
        return;
    }
    silent = wire_now_ms() - en->last_hb_ms;
    if (!en->dead || (en->w.notice_under_way && !en->preempted &&
                      silent <= rsv_dead_ms(r))) {
        rsv_reply_error(r, req, CODE_FAILED_PRECONDITION, "forget: core %s is alive (pid %u, last "
                        "heartbeat %.1f s ago): its next heartbeat would register it again; stop its "
                        "worker instead (SIGTERM: it leaves by itself)", name, en->w.pid,
                        (double)silent / 1000.0);
        return;
    }
    w = en->w;
    log_info("core forgotten on request", "host=%s core=%d client=%s", log_q(w.host_id), w.core,
             log_q(q->client_id && *q->client_id ? q->client_id : "?"));
    rsv_forget(r, en, FORGET_OPERATOR);
    reg_winfo_view(&w, &wi, &nb, wire_now_ms());
    fr.worker = &wi;
    fr.silent_ms = silent;
    m.body_case = TPUEMU__MESSAGE__BODY_FORGET_CORE_REPLY;
    m.forget_core_reply = &fr;
    rsv_reply(r, req, &m);
    sys_on_change(r);
}

void rsv_expire(resolver *r)
{
    uint64_t now = wire_now_ms();
    int changed = 0;

    if (!r->forget_after_ms)
        return;
    for (size_t i = 0; i < r->reg.n;) {
        rentry *en = r->reg.v[i];
        if (en->dead && now - en->last_hb_ms > r->forget_after_ms) {
            rsv_forget(r, en, FORGET_EXPIRED); /* the next entry moves to i */
            changed = 1;
        } else {
            i++;
        }
    }
    if (changed)
        sys_on_change(r);
}
