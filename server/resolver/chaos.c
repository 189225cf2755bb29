/* InjectFault sent to the resolver itself (tpuctl chaos kill|pause resolver):
 * what a crashed or hung resolver does to the workers and clients. Checked
 * whole (only kill, or a pause of 1..600000 ms, at once), answered, then done
 * CHAOS_DELAY_MS later, so the answer is on its way first. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "log.h"
#include "resolver.h"
#include "selfpause.h"

#define CHAOS_DELAY_MS 50u
#define CHAOS_MAX_MS 600000u
#define CHAOS_GRACE_MS 1000u /* a pause counts as under way this long after it ends */

static void on_fault(uv_timer_t *t)
{
    resolver *r = t->data;

    if (r->fault_kind == TPUEMU__FAULT_KIND__FAULT_KILL) {
        log_warn("fault injected: the resolver dies now (SIGKILL)", "kind=kill");
        log_flush_suppressed(1);
        raise(SIGKILL);
    }
    log_warn("fault injected: every thread of the resolver stops", "kind=pause duration_ms=%u", r->fault_ms);
    rsv_event(r, "fault", NULL, 0, "fault injected into the resolver: every thread stops for %u ms", r->fault_ms);
    log_flush_suppressed(1);
    r->fault_kind = 0; /* from here on, its helper and grace say it is under way */
    r->fault_helper = self_pause(r->fault_ms);
    r->fault_until_ms = uv_now(r->loop) + r->fault_ms + CHAOS_GRACE_MS;
    if (r->fault_helper < 0) {
        log_error("pause not injected: no helper process", "reason=%s", log_q(strerror(errno)));
        r->fault_helper = 0;
    }
}

/* A pause under way: its helper still there, or its grace not over. */
static int pausing(resolver *r)
{
    if (r->fault_helper > 0) {
        pid_t w = waitpid(r->fault_helper, NULL, WNOHANG);
        if (w == r->fault_helper || (w < 0 && errno == ECHILD))
            r->fault_helper = 0;
    }
    return r->fault_helper > 0 || uv_now(r->loop) < r->fault_until_ms;
}

void rsv_inject_fault(resolver *r, rreq *req, const Tpuemu__InjectFault *q)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__InjectFaultReply body = TPUEMU__INJECT_FAULT_REPLY__INIT;
    int kind = (int)q->kind;

    if (kind != TPUEMU__FAULT_KIND__FAULT_KILL && kind != TPUEMU__FAULT_KIND__FAULT_PAUSE) {
        rsv_reply_error(r, req, CODE_INVALID_ARGUMENT, "the resolver takes the faults kill and pause, not kind %d "
                        "(the others are a core's: aim them at HOST/CORE)", kind);
        return;
    }
    if (q->skew_ms || q->latency_ms || q->seed || (q->peer_host && *q->peer_host) || q->peer_core) {
        rsv_reply_error(r, req, CODE_INVALID_ARGUMENT, "a fault on the resolver takes no skew, latency, seed or "
                        "peer (got skew %d ms, latency %u ms, seed %u, peer '%.64s'/%d): those are a core's faults",
                        (int)q->skew_ms, q->latency_ms, q->seed, q->peer_host ? q->peer_host : "", (int)q->peer_core);
        return;
    }
    if (q->percent || q->notice_ms || q->delay_ms || q->at_step ||
        (kind == TPUEMU__FAULT_KIND__FAULT_KILL && q->duration_ms) ||
        (kind == TPUEMU__FAULT_KIND__FAULT_PAUSE && (q->duration_ms < 1 || q->duration_ms > CHAOS_MAX_MS))) {
        rsv_reply_error(r, req, CODE_INVALID_ARGUMENT, "a fault on the resolver is a kill, or a pause of 1 to %u ms, "
                        "at once: no percent, notice, delay or step (got %u ms, %u %%, notice %u ms, delay %u ms, "
                        "step %llu)", CHAOS_MAX_MS, q->duration_ms, q->percent, q->notice_ms, q->delay_ms,
                        (unsigned long long)q->at_step);
        return;
    }
    if (r->fault_kind || pausing(r)) {
        rsv_reply_error(r, req, CODE_FAILED_PRECONDITION, "a '%s' fault is already under way on the resolver",
                        r->fault_kind == TPUEMU__FAULT_KIND__FAULT_KILL ? "kill" : "pause");
        return;
    }
    r->fault_kind = kind;
    r->fault_ms = q->duration_ms;
    m.body_case = TPUEMU__MESSAGE__BODY_INJECT_FAULT_REPLY;
    m.inject_fault_reply = &body;
    rsv_reply(r, req, &m);
    uv_timer_start(&r->fault_timer, on_fault, CHAOS_DELAY_MS, 0);
}
