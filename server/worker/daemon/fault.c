/* Injected faults (fault.h). */
#include "fault.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "wire.h"
#include "selfpause.h"

const char *fault_kind_name(int kind)
{
    switch (kind) {
    case TPUEMU__FAULT_KIND__FAULT_KILL:
        return "kill";
    case TPUEMU__FAULT_KIND__FAULT_PAUSE:
        return "pause";
    case TPUEMU__FAULT_KIND__FAULT_SLOW:
        return "slow";
    case TPUEMU__FAULT_KIND__FAULT_HBM:
        return "hbm";
    case TPUEMU__FAULT_KIND__FAULT_PREEMPT:
        return "preempt";
    case TPUEMU__FAULT_KIND__FAULT_MAINTENANCE:
        return "maintenance";
    case TPUEMU__FAULT_KIND__FAULT_SKEW:
        return "skew";
    case TPUEMU__FAULT_KIND__FAULT_LINK_DELAY:
        return "link-delay";
    case TPUEMU__FAULT_KIND__FAULT_LINK_LOSS:
        return "link-loss";
    case TPUEMU__FAULT_KIND__FAULT_PARTITION:
        return "partition";
    default:
        return "unknown";
    }
}

static int is_link(int kind)
{
    return kind == TPUEMU__FAULT_KIND__FAULT_LINK_DELAY || kind == TPUEMU__FAULT_KIND__FAULT_LINK_LOSS ||
           kind == TPUEMU__FAULT_KIND__FAULT_PARTITION;
}

/* The fault in the profiler's ring, so that a profile shows when it hit. */
static void record(struct fault *f, int kind, const char *what, uint32_t duration_ms, uint32_t percent)
{
    struct trace_ev ev;
    char pct[16] = "", dur[32] = "";
    if (percent)
        snprintf(pct, sizeof pct, " %u%%", percent);
    if (duration_ms)
        snprintf(dur, sizeof dur, " for %u ms", duration_ms);
    snprintf(f->last, sizeof f->last, "%.60s%s%s", what, pct, dur);
    f->recorded++;
    if (!f->env.trace)
        return;
    memset(&ev, 0, sizeof ev);
    ev.kind = TPUEMU__TRACE_KIND__TRACE_FAULT;
    ev.t0 = uv_hrtime();
    ev.op = (uint32_t)kind;
    ev.n = duration_ms;
    ev.m = percent;
    snprintf(ev.algo, sizeof ev.algo, "%.*s", (int)sizeof ev.algo - 1, what); /* cut to fit */
    trace_add(f->env.trace, &ev);
}

void fault_init(struct fault *f, const struct fault_env *env)
{
    f->env = *env;
    uv_timer_init(env->loop, &f->act);
    uv_timer_init(env->loop, &f->slow);
    uv_timer_init(env->loop, &f->reap);
    uv_timer_init(env->loop, &f->hbm_end);
    uv_timer_init(env->loop, &f->event);
    uv_timer_init(env->loop, &f->window);
    uv_timer_init(env->loop, &f->skew_end);
    f->act.data = f->slow.data = f->reap.data = f->hbm_end.data = f->event.data = f->window.data = f;
    f->skew_end.data = f;
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++) {
        uv_timer_init(env->loop, &f->sched[i].timer);
        f->sched[i].timer.data = &f->sched[i];
        f->sched[i].f = f;
        f->sched[i].a.kind = 0;
    }
    f->started = 1;
    for (int i = 0; i < FAULT_KINDS; i++)
        atomic_init(&f->injected[i], 0);
}

/* The pause is over (its grace too): its helper, which has sent SIGCONT and
 * exited, is collected so that it does not linger as a zombie. */
static void on_reap(uv_timer_t *t)
{
    struct fault *f = t->data;
    if (!f->helper)
        return;
    pid_t r = waitpid(f->helper, NULL, WNOHANG);
    if (r == f->helper || (r < 0 && errno == ECHILD)) {
        f->helper = 0;
        log_info("fault over: the process runs again", "kind=pause");
        return;
    }
    uv_timer_start(&f->reap, on_reap, 20, 0);
}

/* Stops this whole process for ms (selfpause.h). */
static void pause_now(struct fault *f, uint32_t ms)
{
    pid_t child;

    log_warn("fault injected: every thread of this worker stops", "kind=pause duration_ms=%u", ms);
    record(f, TPUEMU__FAULT_KIND__FAULT_PAUSE, "pause", ms, 0);
    log_flush_suppressed(1);
    child = self_pause(ms);
    if (child < 0) {
        log_error("pause not injected: no helper process", "reason=%s", log_q(strerror(errno)));
        return;
    }
    f->helper = child;
    /* after the pause and its grace: a request that waited in a socket while
     * this process was stopped is handled before it, as one made during the
     * pause (another kill or pause is refused), however soon this process
     * runs again */
    uv_timer_start(&f->reap, on_reap, (uint64_t)ms + FAULT_PAUSE_GRACE_MS, 0);
}

static void on_act(uv_timer_t *t)
{
    struct fault *f = t->data;
    int kind = f->pending;

    f->pending = 0;
    if (kind == TPUEMU__FAULT_KIND__FAULT_KILL) {
        log_warn("fault injected: this worker dies now (SIGKILL)", "kind=kill");
        record(f, kind, "kill", 0, 0);
        log_flush_suppressed(1);
        raise(SIGKILL);
    } else if (kind == TPUEMU__FAULT_KIND__FAULT_PAUSE) {
        pause_now(f, f->pause_ms);
    }
}

static void on_slow_over(uv_timer_t *t)
{
    struct fault *f = t->data;
    f->env.set_throttle(f->env.arg, f->env.base_pct);
    log_info("fault over: training compute at its own speed again", "kind=slow percent=%d", f->env.base_pct);
}

/* Gives back the pressure's HBM; an initialize may have emptied HBM already
 * (the id is then not live, and nothing is taken twice). */
static void hbm_give_back(struct fault *f)
{
    err ignored;
    if (f->hbm_id && hbm_release(f->env.hbm, f->hbm_id, &ignored) == CODE_OK)
        log_info("fault over: HBM pressure released", "kind=hbm");
    f->hbm_id = 0;
}

static void on_hbm_end(uv_timer_t *t)
{
    hbm_give_back(t->data);
}

/* Takes percent % of the core's capacity (the pressure before it given back
 * first); RESOURCE_EXHAUSTED with nothing changed if that is not free. */
static int hbm_press(struct fault *f, uint32_t percent, uint32_t duration_ms, err *e)
{
    hbm *h = f->env.hbm;
    uint64_t want = h->capacity / 100u * percent;
    int64_t dims[1] = {(int64_t)want}, old_dims[1] = {(int64_t)f->hbm_bytes};
    uint32_t id;
    int had = 0;
    err ignored;

    if (f->hbm_id && hbm_release(h, f->hbm_id, &ignored) == CODE_OK)
        had = 1; /* else an initialize emptied HBM, and it */
    f->hbm_id = 0;
    /* checked first: a refusal here is not an out-of-memory of the core's (hbm.ooms) */
    if (want > hbm_free_bytes(h) || hbm_alloc(h, HBM_OTHER, FAULT_HBM_NAME, "u8", dims, 1, &id, e) != CODE_OK) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "HBM pressure of %u %% (%llu bytes) does not fit: %llu of %llu bytes "
                "are free", percent, (unsigned long long)want, (unsigned long long)hbm_free_bytes(h),
                (unsigned long long)h->capacity);
        /* nothing changed: the earlier pressure is taken again (it fitted a moment ago) */
        if (had && hbm_alloc(h, HBM_OTHER, FAULT_HBM_NAME, "u8", old_dims, 1, &f->hbm_id, &ignored) != CODE_OK)
            f->hbm_id = 0;
        return e->code;
    }
    f->hbm_id = id;
    f->hbm_bytes = want;
    log_warn("fault injected: HBM taken", "kind=hbm percent=%u bytes=%llu duration_ms=%u", percent,
             (unsigned long long)want, duration_ms);
    record(f, TPUEMU__FAULT_KIND__FAULT_HBM, "hbm", duration_ms, percent);
    if (duration_ms)
        uv_timer_start(&f->hbm_end, on_hbm_end, duration_ms, 0);
    else
        uv_timer_stop(&f->hbm_end);
    return CODE_OK;
}

/* Checks a fault's fields: CODE_OK, or INVALID_ARGUMENT naming what is wrong. */
static int check(const Tpuemu__InjectFault *req, err *e)
{
    int kind = (int)req->kind;

    switch (kind) {
    case TPUEMU__FAULT_KIND__FAULT_KILL:
        if (req->duration_ms || req->percent)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault 'kill' takes no duration or percent (got %u ms, %u %%)",
                           req->duration_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_PAUSE:
        if (req->duration_ms < 1 || req->duration_ms > FAULT_MAX_MS || req->percent)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'pause' needs a duration from 1 to %u ms and no percent (got %u ms, %u %%)",
                           FAULT_MAX_MS, req->duration_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_SLOW:
        if (req->percent < 1 || req->percent > 100 || req->duration_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'slow' needs a percent of full speed from 1 to 100 and a duration up to %u ms "
                           "(0: until the next 'slow'; got %u %%, %u ms)",
                           FAULT_MAX_MS, req->percent, req->duration_ms);
        break;
    case TPUEMU__FAULT_KIND__FAULT_HBM:
        if (req->percent < 1 || req->percent > 100 || req->duration_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'hbm' needs a percent of the core's HBM from 1 to 100 and a duration up to %u ms "
                           "(0: until the next initialize; got %u %%, %u ms)",
                           FAULT_MAX_MS, req->percent, req->duration_ms);
        break;
    case TPUEMU__FAULT_KIND__FAULT_PREEMPT:
        if (req->duration_ms || req->percent || req->notice_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'preempt' takes a notice up to %u ms and no duration or percent (got notice "
                           "%u ms, %u ms, %u %%)", FAULT_MAX_MS, req->notice_ms, req->duration_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_MAINTENANCE:
        if (req->duration_ms < 1 || req->duration_ms > FAULT_MAX_MS || req->percent || req->notice_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'maintenance' needs a duration (the window) from 1 to %u ms, a notice up to %u ms "
                           "and no percent (got %u ms, notice %u ms, %u %%)",
                           FAULT_MAX_MS, FAULT_MAX_MS, req->duration_ms, req->notice_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_SKEW:
        if (req->skew_ms < -FAULT_MAX_SKEW_MS || req->skew_ms > FAULT_MAX_SKEW_MS || req->percent ||
            req->duration_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "fault 'skew' needs a skew from -%d to %d ms, a duration up to %u ms (0: until the next "
                           "skew) and no percent (got %d ms, %u ms, %u %%)", FAULT_MAX_SKEW_MS, FAULT_MAX_SKEW_MS,
                           FAULT_MAX_MS, req->skew_ms, req->duration_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_LINK_DELAY:
        if (req->latency_ms < 1 || req->latency_ms > FAULT_MAX_LATENCY_MS || req->percent)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault 'link-delay' needs a latency from 1 to %u ms and no "
                           "percent (got %u ms, %u %%)", FAULT_MAX_LATENCY_MS, req->latency_ms, req->percent);
        break;
    case TPUEMU__FAULT_KIND__FAULT_LINK_LOSS:
        if (req->percent < 1 || req->percent > 100 || req->latency_ms)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault 'link-loss' needs a percent of chunks lost from 1 to 100 "
                           "and no latency (got %u %%, %u ms)", req->percent, req->latency_ms);
        break;
    case TPUEMU__FAULT_KIND__FAULT_PARTITION:
        if (req->percent || req->latency_ms)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault 'partition' takes no percent or latency (got %u %%, "
                           "%u ms)", req->percent, req->latency_ms);
        break;
    default:
        return err_set(e, CODE_INVALID_ARGUMENT, "fault kind %d is not kill (1), pause (2), slow (3), hbm (4), "
                       "preempt (5), maintenance (6), skew (7), link-delay (8), link-loss (9) or partition (10)",
                       kind);
    }
    if (is_link(kind)) {
        if (req->duration_ms < 1 || req->duration_ms > FAULT_MAX_MS)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' needs a duration from 1 to %u ms (got %u ms)",
                           fault_kind_name(kind), FAULT_MAX_MS, req->duration_ms);
        if (!req->peer_host || !*req->peer_host || strlen(req->peer_host) > IDENT_HOST_ID_MAX || req->peer_core < 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' needs the core at the other end of the link (peer "
                           "host id of 1 to %d characters, core >= 0)", fault_kind_name(kind), IDENT_HOST_ID_MAX);
        if (req->seed && kind != TPUEMU__FAULT_KIND__FAULT_LINK_LOSS)
            return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' takes no seed (got %u): only link-loss draws",
                           fault_kind_name(kind), req->seed);
    } else if ((req->peer_host && *req->peer_host) || req->latency_ms || req->seed) {
        return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' takes no peer, latency or seed: only link faults do",
                       fault_kind_name(kind));
    }
    if (req->skew_ms && kind != TPUEMU__FAULT_KIND__FAULT_SKEW)
        return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' takes no skew (got %d ms)", fault_kind_name(kind),
                       req->skew_ms);
    if (req->notice_ms && kind != TPUEMU__FAULT_KIND__FAULT_PREEMPT && kind != TPUEMU__FAULT_KIND__FAULT_MAINTENANCE)
        return err_set(e, CODE_INVALID_ARGUMENT, "fault '%s' takes no notice (got %u ms): only preempt and "
                       "maintenance come with one", fault_kind_name(kind), req->notice_ms);
    if (req->delay_ms && req->at_step)
        return err_set(e, CODE_INVALID_ARGUMENT, "a fault waits for a delay or for a step, not both (got %u ms and "
                       "step %llu)", req->delay_ms, (unsigned long long)req->at_step);
    if (req->delay_ms > FAULT_MAX_DELAY_MS)
        return err_set(e, CODE_INVALID_ARGUMENT, "a fault's delay is at most %u ms (got %u)", FAULT_MAX_DELAY_MS,
                       req->delay_ms);
    return CODE_OK;
}

/* ---- notices: preemption and maintenance ---- */

static void on_window_end(uv_timer_t *t)
{
    struct fault *f = t->data;
    memset(f->env.notice, 0, sizeof *f->env.notice);
    log_info("maintenance over: the core is back, restarted (initialize the system again)", "kind=maintenance");
    f->env.maintenance(f->env.arg, 0);
    f->env.notified(f->env.arg);
}

static void on_event(uv_timer_t *t)
{
    struct fault *f = t->data;
    struct notice *n = f->env.notice;

    if (n->kind == TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION) {
        log_warn("preempted: this core terminates now", "kind=preempt");
        record(f, TPUEMU__FAULT_KIND__FAULT_PREEMPT, "preempted", 0, 0);
        log_flush_suppressed(1);
        f->env.preempted(f->env.arg);
    } else if (n->kind == TPUEMU__NOTICE_KIND__NOTICE_MAINTENANCE) {
        n->under_way = 1;
        log_warn("maintenance event: this core leaves its system and is down", "kind=maintenance window_ms=%u",
                 n->window_ms);
        record(f, TPUEMU__FAULT_KIND__FAULT_MAINTENANCE, "maintenance", n->window_ms, 0);
        f->env.maintenance(f->env.arg, 1);
        f->env.notified(f->env.arg);
        uv_timer_start(&f->window, on_window_end, n->window_ms, 0);
    }
}

/* A notice now, its event notice_ms later: FAILED_PRECONDITION while another
 * notice is pending or its maintenance under way. */
static int give_notice(struct fault *f, int kind, uint32_t notice_ms, uint32_t window_ms, err *e)
{
    struct notice *n = f->env.notice;
    uint64_t now = uv_now(f->env.loop);

    if (n->kind)
        return err_set(e, CODE_FAILED_PRECONDITION, "a %s notice is already %s on this core (one at a time)",
                       n->kind == TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION ? "preemption" : "maintenance",
                       n->under_way ? "under way" : "pending");
    n->kind = kind == TPUEMU__FAULT_KIND__FAULT_PREEMPT ? TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION
                                                      : TPUEMU__NOTICE_KIND__NOTICE_MAINTENANCE;
    n->event_ms = now + notice_ms;
    n->window_ms = window_ms;
    n->under_way = 0;
    prom_add(&f->injected[kind], 1);
    if (kind == TPUEMU__FAULT_KIND__FAULT_PREEMPT)
        log_warn("preemption notice: this core is terminated when it runs out", "kind=preempt notice_ms=%u",
                 notice_ms);
    else
        log_warn("maintenance notice: this core goes down for a maintenance event when it runs out",
                 "kind=maintenance notice_ms=%u window_ms=%u", notice_ms, window_ms);
    record(f, kind, kind == TPUEMU__FAULT_KIND__FAULT_PREEMPT ? "preempt-notice" : "maint-notice", notice_ms, 0);
    f->env.notified(f->env.arg);
    uv_timer_start(&f->event, on_event, notice_ms, 0);
    return CODE_OK;
}

/* Makes the fault happen now; kill and pause at once unless deferred (then
 * FAULT_DELAY_MS later, after the reply). */
static void on_skew_end(uv_timer_t *t)
{
    (void)t;
    wire_set_clock_skew_ms(0);
    log_info("fault over: this worker's clock is right again", "kind=skew");
}

/* A link fault starts now: the transport holds the sends to the peer. */
static int link_start(struct fault *f, const struct fault_args *a, err *e)
{
    const char *name = fault_kind_name(a->kind);
    char what[112], peer[96]; /* the trace keeps 15 characters of what */

    snprintf(peer, sizeof peer, "%s/%d", a->peer_host, a->peer_core);

    if (f->env.link_fault(f->env.arg, a->kind, a->peer_host, a->peer_core, a->latency_ms, a->percent, a->duration_ms,
                          a->seed, e) != CODE_OK)
        return e->code;
    prom_add(&f->injected[a->kind], 1);
    if (a->kind == TPUEMU__FAULT_KIND__FAULT_LINK_DELAY)
        log_warn("fault injected: the chunks this core sends on the link are held back", "kind=%s peer=%s "
                 "latency_ms=%u duration_ms=%u", name, log_q(peer), a->latency_ms, a->duration_ms);
    else if (a->kind == TPUEMU__FAULT_KIND__FAULT_LINK_LOSS)
        log_warn("fault injected: the chunks this core sends on the link are lost and sent again", "kind=%s "
                 "peer=%s percent=%u duration_ms=%u seed=%u", name, log_q(peer), a->percent, a->duration_ms, a->seed);
    else
        log_warn("fault injected: nothing this core sends on the link passes", "kind=%s peer=%s duration_ms=%u",
                 name, log_q(peer), a->duration_ms);
    /* the trace event's name says the peer: "delay>h0/1" */
    snprintf(what, sizeof what, "%.5s>%s", a->kind == TPUEMU__FAULT_KIND__FAULT_PARTITION ? "cut" : name + 5, peer);
    record(f, a->kind, what, a->duration_ms, a->kind == TPUEMU__FAULT_KIND__FAULT_LINK_DELAY ? a->latency_ms
                                                                                          : a->percent);
    return CODE_OK;
}

static int apply(struct fault *f, const struct fault_args *a, int deferred, err *e)
{
    int kind = a->kind;
    uint32_t duration_ms = a->duration_ms, percent = a->percent;
    int32_t skew_ms = a->skew_ms;

    if (is_link(kind))
        return link_start(f, a, e);
    if (kind == TPUEMU__FAULT_KIND__FAULT_SKEW) {
        wire_set_clock_skew_ms(skew_ms);
        prom_add(&f->injected[kind], 1);
        log_warn("fault injected: this worker's clock is off", "kind=skew skew_ms=%d duration_ms=%u", skew_ms,
                 duration_ms);
        record(f, kind, "skew", duration_ms, 0);
        if (duration_ms && skew_ms)
            uv_timer_start(&f->skew_end, on_skew_end, duration_ms, 0);
        else
            uv_timer_stop(&f->skew_end);
        return CODE_OK;
    }
    if (kind == TPUEMU__FAULT_KIND__FAULT_PREEMPT || kind == TPUEMU__FAULT_KIND__FAULT_MAINTENANCE)
        return give_notice(f, kind, a->notice_ms, duration_ms, e);
    if (kind == TPUEMU__FAULT_KIND__FAULT_HBM) {
        int rc = hbm_press(f, percent, duration_ms, e);
        if (rc == CODE_OK)
            prom_add(&f->injected[kind], 1);
        return rc;
    }
    if (kind != TPUEMU__FAULT_KIND__FAULT_SLOW && (f->pending || f->helper))
        return err_set(e, CODE_FAILED_PRECONDITION, "a '%s' fault is already under way on this core",
                       fault_kind_name(f->pending ? f->pending : TPUEMU__FAULT_KIND__FAULT_PAUSE));
    prom_add(&f->injected[kind], 1);
    if (kind == TPUEMU__FAULT_KIND__FAULT_SLOW) {
        f->env.set_throttle(f->env.arg, (int)percent);
        log_warn("fault injected: training compute slowed", "kind=slow percent=%u duration_ms=%u", percent,
                 duration_ms);
        record(f, kind, "slow", duration_ms, percent);
        if (duration_ms)
            uv_timer_start(&f->slow, on_slow_over, duration_ms, 0);
        else
            uv_timer_stop(&f->slow);
        return CODE_OK;
    }
    f->pending = kind;
    f->pause_ms = duration_ms;
    if (deferred)
        uv_timer_start(&f->act, on_act, FAULT_DELAY_MS, 0);
    else
        on_act(&f->act);
    return CODE_OK;
}

static void fire(struct fault_sched *sc, const char *why)
{
    struct fault_args a = sc->a;
    err e;

    sc->a.kind = 0;
    uv_timer_stop(&sc->timer);
    log_info("scheduled fault due", "kind=%s when=%s", fault_kind_name(a.kind), log_q(why));
    if (apply(sc->f, &a, 0, &e) != CODE_OK)
        log_warn("scheduled fault not injected", "kind=%s reason=%s", fault_kind_name(a.kind), log_q(e.msg));
}

static void on_sched_timer(uv_timer_t *t)
{
    struct fault_sched *sc = t->data;
    if (sc->a.kind)
        fire(sc, "delay");
}

void fault_on_step(struct fault *f, uint64_t step)
{
    char why[48];
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++) {
        if (f->sched[i].a.kind && f->sched[i].at_step)
            f->sched[i].trained = 1;
        if (f->sched[i].a.kind && f->sched[i].at_step && step >= f->sched[i].at_step) {
            snprintf(why, sizeof why, "after step %llu", (unsigned long long)step);
            fire(&f->sched[i], why);
        }
    }
}

int fault_inject(struct fault *f, const Tpuemu__InjectFault *req, err *e)
{
    struct fault_args a;
    int rc;

    if ((rc = check(req, e)) != CODE_OK)
        return rc;
    memset(&a, 0, sizeof a);
    a.kind = (int)req->kind;
    a.duration_ms = req->duration_ms;
    a.percent = req->percent;
    a.notice_ms = req->notice_ms;
    a.skew_ms = req->skew_ms;
    a.latency_ms = req->latency_ms;
    a.seed = req->seed;
    if (is_link(a.kind)) {
        snprintf(a.peer_host, sizeof a.peer_host, "%s", req->peer_host);
        a.peer_core = req->peer_core;
        if ((rc = f->env.link_check(f->env.arg, a.peer_host, a.peer_core, e)) != CODE_OK)
            return rc;
    }
    if (!req->delay_ms && !req->at_step)
        return apply(f, &a, 1, e);
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++) {
        struct fault_sched *sc = &f->sched[i];
        if (sc->a.kind)
            continue;
        sc->a = a;
        sc->at_step = req->at_step;
        sc->id = ++f->next_id;
        sc->trained = 0;
        if (req->delay_ms)
            uv_timer_start(&sc->timer, on_sched_timer, req->delay_ms, 0);
        log_warn("fault scheduled", "id=%u kind=%s delay_ms=%u at_step=%llu duration_ms=%u percent=%u notice_ms=%u",
                 sc->id, fault_kind_name(a.kind), req->delay_ms, (unsigned long long)req->at_step,
                 req->duration_ms, req->percent, req->notice_ms);
        return CODE_OK;
    }
    return err_set(e, CODE_RESOURCE_EXHAUSTED, "%d faults are already scheduled on this core", FAULT_MAX_SCHEDULED);
}

static void unschedule(struct fault_sched *sc, const char *why)
{
    log_info("scheduled fault cancelled", "id=%u kind=%s at_step=%llu why=%s", sc->id, fault_kind_name(sc->a.kind),
             (unsigned long long)sc->at_step, log_q(why));
    sc->a.kind = 0;
    uv_timer_stop(&sc->timer);
}

int fault_scheduled(struct fault *f, uint32_t cancel, int cancel_all, Tpuemu__CoreReport *report, err *e)
{
    unsigned cancelled = 0;
    size_t n = 0;

    if (cancel && !cancel_all) {
        int i;
        for (i = 0; i < FAULT_MAX_SCHEDULED; i++)
            if (f->sched[i].a.kind && f->sched[i].id == cancel)
                break;
        if (i == FAULT_MAX_SCHEDULED)
            return err_set(e, CODE_NOT_FOUND, "no fault waits on this core under id %u (it fired, was cancelled, "
                           "or never was)", cancel);
        unschedule(&f->sched[i], "cancelled");
        cancelled = 1;
    }
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++) {
        struct fault_sched *sc = &f->sched[i];
        if (!sc->a.kind)
            continue;
        if (cancel_all) {
            unschedule(sc, "cancelled");
            cancelled++;
            continue;
        }
        Tpuemu__ScheduledFault *l = &f->listed[n];
        tpuemu__scheduled_fault__init(l);
        l->id = sc->id;
        l->kind = (Tpuemu__FaultKind)sc->a.kind;
        l->at_step = sc->at_step;
        if (!sc->at_step) {
            uint64_t due = uv_timer_get_due_in(&sc->timer);
            l->due_in_ms = due > UINT32_MAX ? UINT32_MAX : (uint32_t)due;
        }
        l->duration_ms = sc->a.duration_ms;
        l->percent = sc->a.percent;
        l->notice_ms = sc->a.notice_ms;
        snprintf(f->listed_host[n], sizeof f->listed_host[n], "%s", sc->a.peer_host);
        l->peer_host = f->listed_host[n];
        l->peer_core = sc->a.peer_core;
        f->listed_p[n] = l;
        n++;
    }
    report->n_scheduled = n;
    report->scheduled = n ? f->listed_p : NULL;
    report->cancelled = cancelled;
    return CODE_OK;
}

int fault_clear_steps(struct fault *f)
{
    int n = 0;
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++)
        if (f->sched[i].a.kind && f->sched[i].at_step && f->sched[i].trained) {
            unschedule(&f->sched[i], "a new system (initialize) after the run it waited in");
            n++;
        }
    return n;
}

void fault_stop(struct fault *f)
{
    if (!f->started)
        return;
    f->started = 0;
    f->pending = 0;
    for (int i = 0; i < FAULT_MAX_SCHEDULED; i++) {
        f->sched[i].a.kind = 0;
        uv_close((uv_handle_t *)&f->sched[i].timer, NULL);
    }
    uv_close((uv_handle_t *)&f->hbm_end, NULL);
    uv_close((uv_handle_t *)&f->event, NULL);
    uv_close((uv_handle_t *)&f->window, NULL);
    uv_close((uv_handle_t *)&f->skew_end, NULL);
    uv_close((uv_handle_t *)&f->act, NULL);
    uv_close((uv_handle_t *)&f->slow, NULL);
    uv_close((uv_handle_t *)&f->reap, NULL);
}
