/* Integration: hardening of the control plane.
 *
 * Finding 1, what must not make a daemon exit: a heartbeat whose reply is
 * lost gets its original answer when nanomsg resends it; an old error reply
 * replayed on the path is not taken as the answer; a message dated ahead
 * (within the window) does not lock correctly dated ones out; and what a
 * person must fix (a wrong token) still stops the worker, with the fix in the
 * message. The worker talks to the resolver through the fault-injecting proxy
 * of tests/support/proxy.c.
 *
 * Finding 4, liveness is not readiness: a resolver outage makes a worker not
 * ready (/readyz, --probe-ready) but never not alive (/healthz, --probe), so
 * an orchestrator's liveness probe does not restart it.
 *
 * Finding 5, cores that are gone are forgotten: a worker stopped with SIGTERM
 * leaves, a dead core is forgotten on demand or after --forget-after-ms, and a
 * full registry makes room from its longest-dead core; a default initialize
 * never waits for any of them.
 *
 * Finding 3, control messages are bound to their recipient: the resolver's
 * reset telling a core to leave the system, captured on its way and sent to
 * another core within the replay window, is refused there and changes
 * nothing.
 *
 * Finding 2, strangers cannot stop a port: connections that never
 * authenticate, held (and renewed) on a worker's data port, its metrics port
 * and the resolver's control port, leave all-reduces, health checks,
 * registration and tpuctl working.
 *
 * Finding 6, a resolver with more cores than descriptors: a clear refusal
 * naming the open-file limit, never a crash, and it goes on serving.
 *
 * Finding 7 (the smaller ones): a collective's payload is checked from its
 * header, before it is allocated; a signed message captured before a resolver
 * restart is refused after it. */
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include "fdlimit.h"
#include "proxy.h"
#include "raw.h"

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

enum { ST_DROPPED, ST_RESENT, ST_REPLIES, ST_INJECTED };

static int stat_of(proxy *p, int which)
{
    struct proxy_stats s;
    proxy_get_stats(p, &s);
    switch (which) {
    case ST_DROPPED: return s.dropped;
    case ST_RESENT: return s.resent;
    case ST_REPLIES: return s.replies;
    default: return s.injected;
    }
}

/* Waits until the proxy's counter reaches n; 0 at the deadline or as soon as
 * the worker has exited (nothing more will come). */
static int wait_stat(proxy *p, cl_proc *w, int which, int n, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    while (cl_now_ms() < end) {
        if (stat_of(p, which) >= n)
            return 1;
        if (!cluster_alive(w))
            return 0;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return stat_of(p, which) >= n;
}

static const char *exit_str(const cl_proc *w)
{
    static char s[64];
    if (WIFEXITED(w->status))
        snprintf(s, sizeof s, "exit status %d", WEXITSTATUS(w->status));
    else
        snprintf(s, sizeof s, "signal %d", WTERMSIG(w->status));
    return s;
}

/* A worker h0/0 whose control traffic to the resolver goes through p. */
static int add_proxied_worker(cluster *c, proxy *p)
{
    const char *extra[] = {"--resolver", proxy_addr(p), NULL}; /* the last --resolver wins */
    int w = cluster_add_worker(c, "h0", 0, extra);
    cr_assert(cluster_wait_count(c, CL_ALIVE, 1, 15000), "the proxied worker did not register");
    return w;
}

/* Finding 1. A worker whose heartbeat reply is lost sends a fresh heartbeat
 * at the next beat, on the same connection or a new one, and goes on; a
 * nanomsg REQ client (tpuctl) resends the same bytes on reconnect and the
 * resolver answers them again from its duplicate-request cache instead of
 * refusing them as a replay. */
Test(hardening, dropped_heartbeat_reply_is_answered_again, .timeout = 180)
{
    cluster_opts o = {.token = 1, .heartbeat_ms = 1000};
    cluster *c = cluster_start(&o);
    proxy *p = proxy_start(c->addr), *q = proxy_start(c->addr);
    cr_assert_not_null(p);
    cr_assert_not_null(q);
    int w = add_proxied_worker(c, p);
    cl_proc *wp = &c->workers[w];
    run_result r;

    for (int k = 1; k <= 4; k++) {
        proxy_drop_replies(p, 1);
        cr_assert(wait_stat(p, wp, ST_DROPPED, k, 20000), "reply %d was not dropped", k);
        int replies = stat_of(p, ST_REPLIES);
        /* the next reply: the answer to the next heartbeat */
        int more = wait_stat(p, wp, ST_REPLIES, replies + 1, 20000);
        cr_assert(cluster_alive(wp), "the worker exited (%s) after heartbeat reply %d was lost; see %s",
                  exit_str(wp), k, wp->log);
        cr_assert(more, "no reply reached the worker after drop %d", k);
    }
    int replies = stat_of(p, ST_REPLIES);
    cr_assert(wait_stat(p, wp, ST_REPLIES, replies + 3, 20000), "heartbeats stopped after the drops");
    cr_assert(cluster_alive(wp), "the worker exited (%s); see %s", exit_str(wp), wp->log);
    cr_assert_eq(cluster_count(c, CL_ALIVE), 1);
    cr_assert_not(cl_log_contains(wp, "UNAUTHENTICATED"), "see %s", wp->log);

    /* tpuctl through its own proxy: each call's reply is dropped once */
    for (int k = 1; k <= 2; k++) {
        proxy_drop_replies(q, 1);
        cluster_tpuctl(c, &r, 30000, "--tpu", proxy_addr(q), "cluster", NULL);
        cr_assert_eq(r.code, 0, "tpuctl cluster whose reply was lost once: " SHOW(r));
        cr_assert(strstr(r.out, "h0"), SHOW(r));
        run_result_free(&r);
    }
    cr_assert_eq(stat_of(q, ST_DROPPED), 2);
    cr_assert_geq(stat_of(q, ST_RESENT), 2, "nanomsg did not resend the request whose reply was lost");
    cr_assert(cl_log_contains(&c->resolver, "duplicate request answered again"),
              "the resolver answered resends from its duplicate-request cache; see %s", c->resolver.log);
    proxy_free(q);
    proxy_free(p);
    cluster_free(c);
}

/* Sends req (n bytes) to the resolver directly; the reply bytes, malloc'd. */
static uint8_t *direct_reply(cluster *c, const void *req, size_t n, size_t *rlen)
{
    uint8_t *rep = NULL;
    int s = raw_req_open(c->addr, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);
    cr_assert_eq(raw_req_call(s, req, n, &rep, rlen), 0, "the resolver did not answer");
    raw_req_close(s);
    return rep;
}

Test(hardening, replayed_error_replies_are_not_taken_as_answers, .timeout = 120)
{
    cluster_opts o = {.token = 1};
    cluster *c = cluster_start(&o);
    proxy *p = proxy_start(c->addr);
    cr_assert_not_null(p);
    int w = add_proxied_worker(c, p);
    cl_proc *wp = &c->workers[w];
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);

    /* 1: the signed refusal of garbage, which answers no request (id 0) */
    static const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
    size_t rlen;
    uint8_t *rep = direct_reply(c, garbage, sizeof garbage - 1, &rlen);
    wire_msg *m;
    cr_assert_eq(wire_open(&a, NULL, rep, rlen, WIRE_MAX_REPLY, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_ERROR);
    cr_assert_eq(m->request_id, 0);
    wire_msg_free(m);

    /* 2: the signed refusal of a replayed request (re-encoded so that it is
     * not byte-identical: the same signed body with an unknown envelope field) */
    wire_msg q = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest cs = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    q.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    q.cluster_spec_request = &cs;
    uint8_t *req, *rep2, *rep3;
    size_t qlen, r2len, r3len;
    cr_assert_eq(wire_seal(&a, "client test", &q, &req, &qlen, NULL, &e), CODE_OK);
    rep2 = direct_reply(c, req, qlen, &r2len);
    free(rep2);
    uint8_t *req2 = malloc(qlen + 2);
    memcpy(req2, req, qlen);
    req2[qlen] = 0x78; /* field 15, varint */
    req2[qlen + 1] = 0x01;
    rep3 = direct_reply(c, req2, qlen + 2, &r3len);
    cr_assert_eq(wire_open(&a, NULL, rep3, r3len, WIRE_MAX_REPLY, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_ERROR);
    cr_assert_eq((int)m->error->code, CODE_UNAUTHENTICATED, "%s", m->error->message);
    wire_msg_free(m);

    /* each injected in place of the answer to one of the worker's heartbeats */
    const uint8_t *inj[] = {rep, rep3};
    const size_t injlen[] = {rlen, r3len};
    for (int k = 0; k < 2; k++) {
        proxy_inject_reply(p, inj[k], injlen[k]);
        cr_assert(wait_stat(p, wp, ST_INJECTED, k + 1, 20000), "reply %d not injected", k + 1);
        int replies = stat_of(p, ST_REPLIES);
        int more = wait_stat(p, wp, ST_REPLIES, replies + 3, 20000);
        cr_assert(cluster_alive(wp), "the worker exited (%s) on a replayed error reply; see %s",
                  exit_str(wp), wp->log);
        cr_assert(more, "heartbeats stopped after the injected reply %d", k + 1);
    }
    cr_assert_eq(cluster_count(c, CL_ALIVE), 1);
    free(rep);
    free(rep3);
    free(req);
    free(req2);
    proxy_free(p);
    cluster_free(c);
}

Test(hardening, client_takes_only_the_answer_to_its_request, .timeout = 120)
{
    cluster_opts o = {.token = 1};
    cluster *c = cluster_start(&o);
    proxy *p = proxy_start(c->addr);
    cr_assert_not_null(p);
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_cluster_spec *spec = NULL;
    cr_assert_eq(tpu_resolver_new(proxy_addr(p), &r), TPU_OK);
    cr_assert_eq(tpu_resolver_set_token_file(r, c->token_file), TPU_OK);
    cr_assert_eq(tpu_resolver_set_timeout_ms(r, (uint32_t)(10000 * cl_time_scale())), TPU_OK);
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_OK, "%s", tpu_last_error());

    /* the signed refusal of garbage (request_id 0) in place of the answer */
    static const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
    size_t rlen;
    uint8_t *rep = direct_reply(c, garbage, sizeof garbage - 1, &rlen);
    proxy_inject_reply(p, rep, rlen);
    cr_assert_eq(tpu_cluster_spec_get(cc, &spec), TPU_OK, "a replayed refusal was taken as the answer: %s",
                 tpu_last_error());
    tpu_cluster_spec_free(spec);
    struct proxy_stats st;
    proxy_get_stats(p, &st);
    cr_assert_eq(st.injected, 1);
    free(rep);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    proxy_free(p);
    cluster_free(c);
}

static auth step_auth;

/* What a resolver whose clock was stepped 125 s ahead answers a heartbeat:
 * its own refusal text, bound to the request, signed with the right token. */
static uint8_t *stepped_clock_refusal(const uint8_t *req, size_t len, void *arg, size_t *out_len)
{
    wire_msg *m;
    err e;
    uint8_t *out = NULL;
    replay *r = replay_new(4);
    (void)arg;
    if (!r)
        return NULL;
    if (wire_open(&step_auth, NULL, req, len, WIRE_MAX_REQUEST, &m, &e) == CODE_OK) {
        replay_check(r, m->nonce, m->sent_unix_ms, m->sent_unix_ms + 125000, &e);
        if (wire_seal_error(&step_auth, "resolver", m->nonce, e.code, e.msg, &out, out_len) != CODE_OK)
            out = NULL;
        wire_msg_free(m);
    }
    replay_free(r);
    return out;
}

static int count_in_log(const cl_proc *p, const char *needle)
{
    char *s = cl_read_file(p->log);
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)) != NULL; q += strlen(needle))
        n++;
    free(s);
    return n;
}

Test(hardening, refusals_for_clocks_apart_are_not_fatal, .timeout = 120)
{
    cluster_opts o = {.token = 1};
    cluster *c = cluster_start(&o);
    err e;
    cr_assert_eq(auth_from_token(&step_auth, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);
    proxy *p = proxy_start(c->addr);
    cr_assert_not_null(p);
    int w = add_proxied_worker(c, p);
    cl_proc *wp = &c->workers[w];

    /* five heartbeats in a row refused for the clock (more than the strikes
     * that stop a worker whose token differs), then the clock is right again */
    proxy_respond(p, 5, stepped_clock_refusal, NULL);
    cr_assert(wait_stat(p, wp, ST_INJECTED, 5, 20000), "the refusals were not all sent; worker %s",
              cluster_alive(wp) ? "alive" : exit_str(wp));
    int replies = stat_of(p, ST_REPLIES);
    int more = wait_stat(p, wp, ST_REPLIES, replies + 3, 20000);
    cr_assert(cluster_alive(wp), "the worker exited (%s) when the clocks were apart; see %s", exit_str(wp),
              wp->log);
    cr_assert(more, "heartbeats did not resume");
    cr_assert(cluster_wait_count(c, CL_ALIVE, 1, 15000));
    cr_assert(cl_log_contains(wp, "clocks must agree"), "the worker says why; see %s", wp->log);
    cr_assert_eq(count_in_log(wp, "heartbeat refused; retrying"), 1,
                 "logged once while it lasted, not per heartbeat; see %s", wp->log);
    proxy_free(p);
    cluster_free(c);
}

Test(hardening, message_dated_ahead_does_not_lock_out_others, .timeout = 300)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);
    int s = raw_req_open(c->addr, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);

    /* one message dated 55 s ahead: inside the 60 s window, so accepted */
    wire_msg q = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest cs = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    q.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    q.cluster_spec_request = &cs;
    uint8_t *buf, *rep;
    size_t len, rlen;
    wire_msg *m;
    int64_t t0 = cl_now_ms();
    cr_assert_eq(raw_seal_at(&a, &q, wire_now_unix_ms() + 55000, &buf, &len, NULL), 0);
    cr_assert_eq(raw_req_call(s, buf, len, &rep, &rlen), 0);
    free(buf);
    cr_assert_eq(wire_open(&a, NULL, rep, rlen, WIRE_MAX_REPLY, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC, "%s",
                 m->body_case == TPUEMU__MESSAGE__BODY_ERROR ? m->error->message : "");
    wire_msg_free(m);
    free(rep);

    /* then more correctly dated messages than the replay cache holds (16384),
     * as fast as they go: the dated-ahead one is the oldest arrival long
     * before its own time comes */
    int sent = 0, refused = 0;
    char first[512] = "";
    int64_t end = t0 + 150000;
    while (sent < 17000 && cl_now_ms() < end) {
        int rc = raw_call_msg(s, &a, &q, &m, NULL);
        cr_assert_eq(rc, CODE_OK, "reply %d did not open", sent);
        if (m->body_case == TPUEMU__MESSAGE__BODY_ERROR) {
            if (!refused++)
                snprintf(first, sizeof first, "%s", m->error->message);
        }
        wire_msg_free(m);
        sent++;
    }
    int64_t took = cl_now_ms() - t0;
    raw_req_close(s);
    cr_log_info("%d messages in %lld ms", sent, (long long)took);
    cr_assert_eq(refused, 0, "%d of %d correctly dated messages refused after one dated 55 s ahead "
                 "(first: %s)", refused, sent, first);
    cl_proc *wp = &c->workers[0];
    cr_assert(cluster_alive(wp), "the worker exited (%s); see %s", exit_str(wp), wp->log);
    cr_assert_eq(cluster_count(c, CL_ALIVE), 1);
    cr_assert_not(cl_log_contains(wp, "UNAUTHENTICATED"), "see %s", wp->log);
    cr_assert_geq(sent, 17000, "only %d messages in %lld ms: too slow to fill the cache", sent,
                  (long long)took);
    cluster_free(c);
}

Test(hardening, wrong_token_stops_the_worker_saying_what_to_do, .timeout = 120)
{
    cluster_opts o = {.token = 1};
    cluster *c = cluster_start(&o);
    char wrong[512];
    snprintf(wrong, sizeof wrong, "%s/wrong-token", c->dir);
    FILE *f = fopen(wrong, "w");
    cr_assert_not_null(f);
    fputs("a-completely-different-token-42\n", f);
    fclose(f);
    const char *extra[] = {"--token-file", wrong, NULL}; /* the last --token-file wins */
    int w = cluster_add_worker(c, "h9", 0, extra);
    cl_proc *wp = &c->workers[w];
    cr_assert(cluster_wait_exit(wp, 30000), "a worker with the wrong token kept running");
    cr_assert(WIFEXITED(wp->status) && WEXITSTATUS(wp->status) == 3, "%s", exit_str(wp));
    cr_assert(cl_log_contains(wp, "tpu-worker: UNAUTHENTICATED"), "see %s", wp->log);
    cr_assert(cl_log_contains(wp, "check --token-file"), "the exit says what to do; see %s", wp->log);
    cr_assert_eq(cluster_core_state(c, "h9", 0, NULL), TPU_CORE_UNKNOWN);
    cluster_free(c);
}

/* ---- helpers of the tests below ---- */


/* The value of the sample `name{labels}` in the daemon's /metrics (raw.h's
 * http_metric); -1 if it is not there. */
static double metric(int port, const char *name, const char *labels)
{
    int status;
    double v = http_metric(port, name, labels, &status);
    cr_assert_eq(status, 200, "GET /metrics on port %d: status %d", port, status);
    return v;
}

/* ---- finding 5: cores that are gone are forgotten ---- */

Test(hardening, worker_stopped_cleanly_leaves_the_cluster, .timeout = 120)
{
    int rmp = cl_free_port();
    char rms[16];
    snprintf(rms, sizeof rms, "%d", rmp);
    const char *rargs[] = {"--metrics-port", rms, NULL};
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1, .resolver_args = rargs};
    cluster *c = cluster_start(&o);
    cl_proc *wp = &c->workers[1];
    run_result r;

    kill(wp->pid, SIGTERM);
    cr_assert(cluster_wait_exit(wp, 10000), "the worker did not stop on SIGTERM");
    cr_assert(WIFEXITED(wp->status) && WEXITSTATUS(wp->status) == 0, "%s", exit_str(wp));
    /* it told the resolver before it exited */
    cr_assert_eq(cluster_core_state(c, "h0", 1, NULL), TPU_CORE_UNKNOWN,
                 "a worker stopped with SIGTERM is still listed; see %s", c->resolver.log);
    cr_assert(cl_log_contains(&c->resolver, "core left"), "see %s", c->resolver.log);
    cr_assert_eq(metric(rmp, "tpuemu_resolver_cores_forgotten_total", "reason=\"left\""), 1);
    /* a default initialize does not wait for it */
    cluster_tpuctl(c, &r, 20000, "init", "--timeout-ms", "5000", NULL);
    cr_assert_eq(r.code, 0, "initialize waited for a core that left: " SHOW(r));
    cr_assert(strstr(r.out, "1 cores on 1 host"), SHOW(r));
    run_result_free(&r);
    /* started again, it registers as a new core */
    cluster_restart_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, CL_ALIVE, 15000), "the restarted worker did not register");
    cluster_free(c);
}

Test(hardening, dead_core_forgotten_on_demand, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1};
    cluster *c = cluster_start(&o);
    run_result r;

    /* a live core is not forgotten: its worker would register it again */
    cluster_tpuctl(c, &r, 10000, "forget", "h0/1", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strncmp(r.err, "FAILED_PRECONDITION: ", 21) == 0, SHOW(r));
    run_result_free(&r);
    cluster_tpuctl(c, &r, 10000, "forget", "h0/7", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strncmp(r.err, "NOT_FOUND: ", 11) == 0, SHOW(r));
    run_result_free(&r);
    cluster_tpuctl(c, &r, 10000, "forget", "h0", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    run_result_free(&r);

    cluster_kill_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 15000));
    cluster_tpuctl(c, &r, 10000, "forget", "h0/1", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "h0/1"), SHOW(r));
    run_result_free(&r);
    cr_assert_eq(cluster_core_state(c, "h0", 1, NULL), TPU_CORE_UNKNOWN);
    cluster_tpuctl(c, &r, 20000, "init", "--timeout-ms", "5000", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "1 cores on 1 host"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(hardening, forget_core_through_the_library, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc;
    uint64_t silent = 0;

    cr_assert_eq(cluster_connect(c, &r, &cc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_forget_core(cc, "h0", 0, NULL), TPU_FAILED_PRECONDITION);
    cr_assert(strstr(tpu_last_error(), "alive"), "%s", tpu_last_error());
    cr_assert_eq(tpu_forget_core(cc, "h0", -1, NULL), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_forget_core(cc, NULL, 0, NULL), TPU_INVALID_ARGUMENT);
    cluster_kill_worker(c, 0);
    cr_assert(cluster_wait_core_state(c, "h0", 0, TPU_CORE_DEAD, 15000));
    cr_assert_eq(tpu_forget_core(cc, "h0", 0, &silent), TPU_OK, "%s", tpu_last_error());
    /* it was dead: silent for at least the dead-core time, 3 x 100 ms */
    cr_assert_geq(silent, 300, "silent_ms %llu", (unsigned long long)silent);
    cr_assert_eq(tpu_forget_core(cc, "h0", 0, NULL), TPU_NOT_FOUND);
    cr_assert_eq(cluster_count(c, CL_ALIVE), 1);
    cr_assert_eq(cluster_core_state(c, "h0", 0, NULL), TPU_CORE_UNKNOWN);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(hardening, dead_core_forgotten_after_the_bound, .timeout = 120)
{
    int rmp = cl_free_port();
    char rms[16];
    snprintf(rms, sizeof rms, "%d", rmp);
    const char *rargs[] = {"--forget-after-ms", "1000", "--metrics-port", rms, NULL};
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .resolver_args = rargs};
    cluster *c = cluster_start(&o);
    run_result r;

    cluster_kill_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 15000));
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_UNKNOWN, 20000),
              "a core dead for longer than --forget-after-ms is still listed");
    cr_assert_eq(metric(rmp, "tpuemu_resolver_cores_forgotten_total", "reason=\"expired\""), 1);
    cluster_tpuctl(c, &r, 20000, "init", "--timeout-ms", "5000", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(hardening, full_registry_makes_room_from_the_longest_dead, .timeout = 120)
{
    const char *rargs[] = {"--max-cores", "2", NULL};
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .resolver_args = rargs};
    cluster *c = cluster_start(&o);

    cluster_kill_worker(c, 0);
    cr_assert(cluster_wait_core_state(c, "h0", 0, TPU_CORE_DEAD, 15000));
    cluster_kill_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 15000));
    /* h0/0 died first: it makes room */
    cluster_add_worker(c, "h1", 0, NULL);
    cr_assert(cluster_wait_core_state(c, "h1", 0, CL_ALIVE, 15000),
              "a full registry of dead cores refused a new one; see %s", c->resolver.log);
    cr_assert_eq(cluster_core_state(c, "h0", 0, NULL), TPU_CORE_UNKNOWN);
    cr_assert_eq(cluster_core_state(c, "h0", 1, NULL), TPU_CORE_DEAD);
    /* live cores are never pushed out */
    cluster_restart_worker(c, 0);
    cr_assert(cluster_wait_core_state(c, "h0", 0, CL_ALIVE, 15000));
    cr_assert_eq(cluster_core_state(c, "h0", 1, NULL), TPU_CORE_UNKNOWN);
    cluster_add_worker(c, "h2", 0, NULL);
    cr_assert(cl_wait_log(&c->resolver, "--max-cores", 15000), "see %s", c->resolver.log);
    cr_assert_eq(cluster_core_state(c, "h2", 0, NULL), TPU_CORE_UNKNOWN);
    cr_assert_eq(cluster_count(c, CL_ALIVE), 2);
    cluster_free(c);
}

/* ---- finding 4: liveness is not readiness ---- */

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0)
        ;
}

/* Runs BIN --probe-flag --metrics-port PORT; its exit status. */
static int run_probe(const char *bin, const char *flag, int port, run_result *r)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const char *argv[] = {bin, flag, "--metrics-port", ps, NULL};
    run_cmd(argv, NULL, 10000, r);
    cr_assert(r->exited, "%s %s did not exit", bin, flag);
    return r->code;
}

/* Waits (bounded) until GET path on port answers want; the last status. */
static int wait_http(int port, const char *path, int want, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    int st;
    while ((st = http_get_all(port, path, NULL)) != want && cl_now_ms() < end)
        nap_ms(50);
    return st;
}

Test(hardening, resolver_outage_leaves_workers_live, .timeout = 120)
{
    cluster_opts o = {.heartbeat_ms = 100};
    cluster *c = cluster_start(&o);
    int mp = cl_free_port();
    char mps[16];
    snprintf(mps, sizeof mps, "%d", mp);
    const char *extra[] = {"--metrics-port", mps, NULL};
    int w = cluster_add_worker(c, "h0", 0, extra);
    cl_proc *wp = &c->workers[w];
    run_result r;
    char *body;

    cr_assert(cluster_wait_count(c, CL_ALIVE, 1, 15000), "the worker did not register");
    cr_assert_eq(wait_http(mp, "/readyz", 200, 10000), 200, "registered but /readyz is not 200");
    cr_assert_eq(http_get_all(mp, "/healthz", NULL), 200);
    cr_assert_eq(run_probe(CL_WORKER, "--probe", mp, &r), 0, SHOW(r));
    run_result_free(&r);
    cr_assert_eq(run_probe(CL_WORKER, "--probe-ready", mp, &r), 0, SHOW(r));
    run_result_free(&r);

    /* the resolver stops answering (an outage, a restart that takes long) */
    kill(c->resolver.pid, SIGSTOP);
    cr_assert_eq(wait_http(mp, "/readyz", 503, 15000), 503, "/readyz stayed 200 without the resolver");
    cr_assert_eq(http_get_all(mp, "/readyz", &body), 503);
    cr_assert(strstr(body, "has not answered"), "/readyz says why: %s", body);
    free(body);
    /* not ready, but alive: a liveness probe must not get it restarted */
    cr_assert_eq(http_get_all(mp, "/healthz", &body), 200, "/healthz failed during a resolver outage: %s",
                 body);
    free(body);
    cr_assert_eq(run_probe(CL_WORKER, "--probe", mp, &r), 0, "liveness failed in an outage: " SHOW(r));
    run_result_free(&r);
    cr_assert_eq(run_probe(CL_WORKER, "--probe-ready", mp, &r), 1, SHOW(r));
    cr_assert(strstr(r.err, "503"), SHOW(r));
    run_result_free(&r);
    cr_assert_eq(metric(mp, "tpuemu_worker_registered", "host=\"h0\",core=\"0\""), 0);

    /* the resolver is back: ready again, without a restart */
    kill(c->resolver.pid, SIGCONT);
    cr_assert_eq(wait_http(mp, "/readyz", 200, 15000), 200, "not ready again after the outage");
    cr_assert(cluster_alive(wp), "the worker exited (%s); see %s", exit_str(wp), wp->log);
    /* the resolver knows it was the one not running: it reads the heartbeats
     * that waited in its sockets before it judges, and no core died */
    cr_assert(cl_log_contains(&c->resolver, "dead-core check deferred"), "see %s", c->resolver.log);
    cr_assert_not(cl_log_contains(&c->resolver, "msg=\"core dead\""),
                  "the resolver declared a core dead for its own outage; see %s", c->resolver.log);
    cluster_free(c);
}

/* ---- finding 3: control messages are bound to their recipient ---- */

Test(hardening, reset_for_another_core_is_refused, .timeout = 120)
{
    /* 1 s heartbeats: the fake core below stays alive for 3 s after it
     * heartbeats once, long enough to be sent the reset */
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1, .heartbeat_ms = 1000};
    cluster *c = cluster_start(&o);
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);

    /* a core of our own, h9/0, whose control socket is this test's */
    char url[64];
    int port = cl_free_port(), rep = nn_socket(AF_SP, NN_REP), tmo = 10000 * cl_time_scale();
    cr_assert_geq(rep, 0);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    cr_assert_geq(nn_bind(rep, url), 0, "%s", nn_strerror(nn_errno()));
    nn_setsockopt(rep, NN_SOL_SOCKET, NN_RCVTIMEO, &tmo, sizeof tmo);
    wire_msg hb = TPUEMU__MESSAGE__INIT, *m;
    Tpuemu__Heartbeat hbb = TPUEMU__HEARTBEAT__INIT;
    Tpuemu__WorkerInfo wi = TPUEMU__WORKER_INFO__INIT;
    wi.host_id = "h9";
    wi.core = 0;
    wi.incarnation = 0x5eed;
    wi.control_addr = url;
    wi.data_addr = "127.0.0.1:1";
    wi.tpu_type = "v3";
    wi.hbm_capacity = 1u << 30;
    wi.replica_id = -1;
    hbb.worker = &wi;
    hb.body_case = TPUEMU__MESSAGE__BODY_HEARTBEAT;
    hb.heartbeat = &hbb;
    int s = raw_req_open(c->addr, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);
    cr_assert_eq(raw_call_msg(s, &a, &hb, &m, NULL), CODE_OK);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_HEARTBEAT_REPLY, "%s",
                 m->body_case == TPUEMU__MESSAGE__BODY_ERROR ? m->error->message : "");
    wire_msg_free(m);
    raw_req_close(s);

    /* initialize on the two real cores: h9/0 is told to leave the system,
     * and that reset, signed by the resolver, is captured on its way */
    tpu_resolver *tr;
    tpu_cluster *tc;
    tpu_topology *topo;
    cr_assert_eq(cluster_connect(c, &tr, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_init_options io = {.expect = 2, .timeout_ms = 10000};
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    /* the resolver probed the fake core when it registered (it keeps its
     * control connection open): probes are answered, as a worker does, until
     * the reset comes */
    void *cap = NULL;
    int caplen;
    for (int k = 0;; k++) {
        cr_assert_lt(k, 8, "the fake core got %d probes and no reset", k);
        caplen = nn_recv(rep, &cap, NN_MSG, 0);
        cr_assert_gt(caplen, 0, "the resolver did not reset the fake core: %s", nn_strerror(nn_errno()));
        cr_assert_eq(wire_open(&a, NULL, cap, (size_t)caplen, WIRE_MAX_REQUEST, &m, &e), CODE_OK, "%s", e.msg);
        if (m->body_case != TPUEMU__MESSAGE__BODY_PROBE_CORE)
            break;
        wire_msg ans = TPUEMU__MESSAGE__INIT;
        Tpuemu__CoreReport cr = TPUEMU__CORE_REPORT__INIT;
        uint8_t *out;
        size_t outlen;
        cr.worker = &wi;
        ans.request_id = m->nonce;
        ans.body_case = TPUEMU__MESSAGE__BODY_CORE_REPORT;
        ans.core_report = &cr;
        cr_assert_eq(wire_seal(&a, "h9/0", &ans, &out, &outlen, NULL, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(nn_send(rep, out, outlen, 0), (int)outlen, "%s", nn_strerror(nn_errno()));
        free(out);
        wire_msg_free(m);
        nn_freemsg(cap);
    }
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_RESET_CORE, "the fake core got '%s'", wire_body_name(m));
    cr_assert_eq(m->reset_core->replica_id, -1);
    wire_msg_free(m);

    /* sent to h0/0 within the replay window: refused, nothing changes */
    tpu_cluster_spec *spec = cluster_spec(c);
    tpu_core_info ci;
    cr_assert(cluster_find_core(spec, "h0", 0, &ci));
    s = raw_req_open(ci.control_addr, 5000 * cl_time_scale());
    tpu_cluster_spec_free(spec);
    cr_assert_geq(s, 0);
    uint8_t *ans;
    size_t alen;
    cr_assert_eq(raw_req_call(s, cap, (size_t)caplen, &ans, &alen), 0, "h0/0 did not answer");
    raw_req_close(s);
    nn_freemsg(cap);
    cr_assert_eq(wire_open(&a, NULL, ans, alen, WIRE_MAX_REPLY, &m, &e), CODE_OK, "%s", e.msg);
    free(ans);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_ERROR,
                 "h0/0 accepted a reset addressed to h9/0 (answered '%s')", wire_body_name(m));
    cr_assert(strstr(m->error->message, "h9/0") && strstr(m->error->message, "h0/0"), "%s", m->error->message);
    wire_msg_free(m);
    cr_assert(cl_wait_log(&c->workers[0], "control request refused", 5000), "see %s", c->workers[0].log);
    cr_assert(cluster_alive(&c->workers[0]), "see %s", c->workers[0].log);
    cr_assert_eq(cluster_core_state(c, "h0", 0, NULL), TPU_CORE_READY);

    /* the system still works: an all-reduce on both cores */
    float b0[16], b1[16];
    void *bufs[2] = {b0, b1};
    for (int i = 0; i < 16; i++) {
        b0[i] = (float)i;
        b1[i] = 1.0f;
    }
    cr_assert_eq(tpu_all_reduce(tc, bufs, 16, TPU_F32, TPU_SUM, NULL), TPU_OK, "%s", tpu_last_error());
    for (int i = 0; i < 16; i++)
        cr_assert_float_eq(b0[i], (float)i + 1.0f, 0.0f);
    tpu_cluster_free(tc);
    tpu_resolver_free(tr);
    nn_close(rep);
    cluster_free(c);
}

/* ---- finding 2: strangers cannot stop a port ---- */

#define HOLD_MAX 512

/* The test holds hundreds of connections: its own soft open-file limit up to the hard one. */
/* Opens up to n TCP connections to hostport that send hello (hello_len
 * bytes, may be 0) and then nothing (fds[i] = -1 where one failed; it gives up
 * after 5 failures in a row, so it is bounded when the listener stops taking
 * them). How many are open. */
static int hold_conns_saying(const char *hostport, int *fds, int n, const void *hello, size_t hello_len)
{
    int open_n = 0, fails = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = fails >= 5 ? -1 : tcp_connect_addr(hostport, 500);
        if (fds[i] >= 0 && hello_len && tcp_send_all(fds[i], hello, hello_len) != 0) {
            close(fds[i]);
            fds[i] = -1;
        }
        if (fds[i] >= 0) {
            open_n++;
            fails = 0;
        } else {
            fails++;
        }
    }
    return open_n;
}

static int hold_conns(const char *hostport, int *fds, int n)
{
    return hold_conns_saying(hostport, fds, n, NULL, 0);
}

static void release_conns(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

static void all_reduce_works(tpu_cluster *tc, int n, const char *when)
{
    float b[8][32];
    void *bufs[8];
    for (int r = 0; r < n; r++) {
        bufs[r] = b[r];
        for (int i = 0; i < 32; i++)
            b[r][i] = (float)(r + 1) * (float)i;
    }
    cr_assert_eq(tpu_all_reduce(tc, bufs, 32, TPU_F32, TPU_SUM, NULL), TPU_OK, "all-reduce %s: %s", when,
                 tpu_last_error());
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 32; i++)
            cr_assert_float_eq(b[r][i], (float)(n * (n + 1) / 2) * (float)i, 0.0f, "replica %d element %d", r, i);
}

Test(hardening, idle_strangers_do_not_stop_the_data_plane, .timeout = 240)
{
    /* two hosts: the cores' links to each other go over TCP through the
     * data ports the strangers hold */
    cluster_opts o = {.hosts = 2, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    static int fds[2][HOLD_MAX];
    char data[2][256];
    tpu_cluster_spec *spec = cluster_spec(c);
    tpu_core_info ci;

    fdlimit_raise("it_hardening", 4096, 1024); /* the strangers' 600 connections */
    cr_assert_not_null(spec);
    for (int h = 0; h < 2; h++) {
        char host[8];
        snprintf(host, sizeof host, "h%d", h);
        cr_assert(cluster_find_core(spec, host, 0, &ci));
        snprintf(data[h], sizeof data[h], "%s", ci.data_addr);
    }
    tpu_cluster_spec_free(spec);

    /* 300 connections that never authenticate on each core's data port, more
     * than its 256 client connections, before anyone dials it */
    for (int h = 0; h < 2; h++)
        cr_assert_geq(hold_conns(data[h], fds[h], 300), 64, "could not open the strangers' connections to %s",
                      data[h]);
    /* initialize: a new epoch, the cores dial each other's data ports */
    tpu_resolver *tr;
    tpu_cluster *tc;
    tpu_topology *topo;
    cr_assert_eq(cluster_connect(c, &tr, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_init_options io = {.expect = 2, .timeout_ms = 20000};
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    /* the strangers renew theirs (the handshake deadline dropped the old ones) */
    for (int h = 0; h < 2; h++) {
        release_conns(fds[h], HOLD_MAX);
        hold_conns(data[h], fds[h], 300);
    }
    all_reduce_works(tc, 2, "with 300 strangers on each data port");
    for (int h = 0; h < 2; h++) {
        release_conns(fds[h], HOLD_MAX);
        cr_assert(cluster_alive(&c->workers[h]), "see %s", c->workers[h].log);
    }
    tpu_cluster_free(tc);
    tpu_resolver_free(tr);
    cluster_free(c);
}

Test(hardening, idle_strangers_do_not_stop_the_metrics_port, .timeout = 120)
{
    cluster_opts o = {0};
    cluster *c = cluster_start(&o);
    int mp = cl_free_port();
    char mps[16];
    snprintf(mps, sizeof mps, "%d", mp);
    const char *extra[] = {"--metrics-port", mps, NULL};
    int w = cluster_add_worker(c, "h0", 0, extra);
    static int fds[HOLD_MAX];
    char hp[32];
    run_result r;
    char *body;

    fdlimit_raise("it_hardening", 4096, 1024); /* the strangers' 600 connections */
    cr_assert(cluster_wait_count(c, CL_ALIVE, 1, 15000), "the worker did not register");
    cr_assert_eq(wait_http(mp, "/healthz", 200, 10000), 200);
    /* more idle connections than the port's 64 slots */
    snprintf(hp, sizeof hp, "127.0.0.1:%d", mp);
    cr_assert_geq(hold_conns(hp, fds, 100), 65, "could not open the strangers' connections");
    cr_assert_eq(http_get_all(mp, "/healthz", &body), 200, "/healthz with 100 idle connections held: %s",
                 body ? body : "");
    free(body);
    cr_assert_eq(run_probe(CL_WORKER, "--probe", mp, &r), 0, "the liveness probe failed: " SHOW(r));
    run_result_free(&r);
    cr_assert_eq(run_probe(CL_WORKER, "--probe-ready", mp, &r), 0, "the readiness probe failed: " SHOW(r));
    run_result_free(&r);
    release_conns(fds, HOLD_MAX);
    cr_assert(cluster_alive(&c->workers[w]), "see %s", c->workers[w].log);
    cluster_free(c);
}

/* The same at the resolver's metrics port, which serves the cluster console:
 * with more idle strangers than its slots, the console's page and its data
 * are still served, and the data still lists the core. */
Test(hardening, idle_strangers_do_not_stop_the_console, .timeout = 120)
{
    cluster_opts o = {0};
    int mp = cl_free_port();
    char mps[16], hp[32];
    snprintf(mps, sizeof mps, "%d", mp);
    const char *rargs[] = {"--metrics-port", mps, NULL};
    o.resolver_args = rargs;
    o.hosts = 1;
    o.cores_per_host = 1;
    cluster *c = cluster_start(&o);
    static int fds[HOLD_MAX];
    char *body;

    fdlimit_raise("it_hardening", 4096, 1024); /* the strangers' connections */
    cr_assert_eq(wait_http(mp, "/healthz", 200, 10000), 200);
    snprintf(hp, sizeof hp, "127.0.0.1:%d", mp);
    cr_assert_geq(hold_conns(hp, fds, 100), 65, "could not open the strangers' connections");
    cr_assert_eq(http_get_all(mp, "/api/cluster", &body), 200, "/api/cluster with 100 idle connections held: %s",
                 body ? body : "");
    cr_assert(body && strstr(body, "\"host\":\"h0\",\"core\":0,"), "the console's data lists no h0/0: %s",
              body ? body : "");
    free(body);
    cr_assert_eq(http_get_all(mp, "/", &body), 200, "the console's page with 100 idle connections held");
    free(body);
    release_conns(fds, HOLD_MAX);
    cr_assert(cluster_alive(&c->resolver), "see %s", c->resolver.log);
    cluster_free(c);
}

/* The resolver under an open-file limit of its own (the fixture sets it
 * before exec): strangers hold more idle connections than it has
 * descriptors, each having sent the SP header of a nanomsg REQ socket (so
 * nanomsg's 1 s header deadline does not drop them), and renew them; a new
 * worker must still register and tpuctl be answered. */
Test(hardening, idle_strangers_do_not_stop_the_resolver, .timeout = 240)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1, .resolver_nofile = 256};
    cluster *c = cluster_start(&o);
    static int fds[HOLD_MAX];
    run_result r;

    static const uint8_t sp_req[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
    fdlimit_raise("it_hardening", 4096, 1024); /* the strangers' 600 connections */
    cr_assert_geq(hold_conns_saying(c->addr, fds, 400, sp_req, sizeof sp_req), 64,
                  "could not open the strangers' connections");
    /* a worker that starts now registers */
    cluster_add_worker(c, "h1", 0, NULL);
    cr_assert(cluster_wait_count(c, CL_ALIVE, 2, 30000), "a new worker did not register with 400 idle "
              "connections held on the resolver's port; see %s", c->resolver.log);
    cluster_tpuctl(c, &r, 30000, "cluster", NULL);
    cr_assert_eq(r.code, 0, "tpuctl cluster with 400 idle connections held: " SHOW(r));
    cr_assert(strstr(r.out, "h1"), SHOW(r));
    run_result_free(&r);
    /* the strangers renew theirs */
    release_conns(fds, HOLD_MAX);
    hold_conns_saying(c->addr, fds, 400, sp_req, sizeof sp_req);
    /* and an initialize works */
    cluster_tpuctl(c, &r, 60000, "init", "--expect", "2", NULL);
    cr_assert_eq(r.code, 0, "tpuctl init with 400 idle connections held: " SHOW(r));
    run_result_free(&r);
    release_conns(fds, HOLD_MAX);
    cr_assert(cluster_alive(&c->resolver), "see %s", c->resolver.log);
    cluster_free(c);
}

/* finding 6: more cores than the resolver has descriptors for: a clear
 * refusal naming the limit, never a crash, and it goes on serving. */
Test(hardening, resolver_out_of_descriptors_refuses_and_serves, .timeout = 300)
{
    enum { N = 60 };
    /* 60 workers connect (one descriptor each), but their 60 links (one
     * each) do not fit in what 200 leave for links (51) */
    cluster_opts o = {.hosts = N / 4, .cores_per_host = 4, .heartbeat_ms = 500, .resolver_nofile = 200};
    cluster *c = cluster_start(&o);
    run_result r;
    char n[8];

    snprintf(n, sizeof n, "%d", N);
    for (int k = 0; k < 3; k++) {
        cluster_tpuctl(c, &r, 60000, "init", "--expect", n, "--timeout-ms", "20000", NULL);
        cr_assert(cluster_alive(&c->resolver), "the resolver died (attempt %d); see %s", k, c->resolver.log);
        cr_assert_eq(r.code, 1, "init of %d cores under 200 descriptors: " SHOW(r), N);
        cr_assert(strstr(r.err, "RESOURCE_EXHAUSTED") && strstr(r.err, "open-file limit") &&
                      strstr(r.err, "LimitNOFILE"),
                  "the refusal names the limit and what to do: " SHOW(r));
        run_result_free(&r);
    }
    /* still serving: the spec lists every core, a client is answered */
    cluster_tpuctl(c, &r, 30000, "cluster", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    cr_assert_eq(cluster_count(c, CL_ALIVE), N);
    cr_assert(cluster_alive(&c->resolver), "see %s", c->resolver.log);
    cr_assert_not(cl_log_contains(&c->resolver, "AddressSanitizer"), "see %s", c->resolver.log);
    cluster_free(c);
}

/* Finding 7: a collective's payload is checked against the collective and
 * the HBM from its header, before anything is allocated for it. A frame
 * announcing more than this replica's input, or a collective over the core's
 * HBM, is answered at once with the error naming it (the test sends no
 * payload byte: the old worker allocated the announced size, up to 256 MiB,
 * and waited for it), and the core still runs collectives. */
static void coll_header_only(const char *data, uint64_t epoch, uint64_t seq, uint64_t count, uint64_t announce,
                             int want_code, const char *needle)
{
    int fd;
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__CollSpec sp = TPUEMU__COLL_SPEC__INIT;

    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0, "no data-plane handshake with %s", data);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK);
    frame_header_free(ans);
    sp.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
    sp.op = TPUEMU__REDUCE_OP__REDUCE_SUM;
    sp.dtype = TPUEMU__DTYPE__DTYPE_F32;
    sp.count = count;
    h.kind = TPUEMU__FRAME_KIND__FRAME_COLL;
    h.epoch = epoch;
    h.seq = seq;
    h.coll = &sp;
    h.payload_bytes = announce;
    cr_assert_eq(dp_send(fd, &h, NULL, 0), 0);
    /* the header alone, never its payload: the answer must come anyway */
    cr_assert_eq(dp_recv(fd, 10000 * cl_time_scale(), &ans, NULL), 0,
                 "no answer to a header announcing %llu bytes before its payload (the worker waits for it)",
                 (unsigned long long)announce);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_COLL_RESULT, "kind %d", (int)ans->kind);
    cr_assert_eq(ans->seq, seq);
    cr_assert_not_null(ans->status);
    cr_assert_eq((int)ans->status->code, want_code, "%s: %s", code_name((int)ans->status->code),
                 ans->status->message);
    cr_assert(strstr(ans->status->message, needle), "'%s' not in: %s", needle, ans->status->message);
    printf("announced %llu bytes: %s\n", (unsigned long long)announce, ans->status->message);
    frame_header_free(ans);
    close(fd);
}

Test(hardening, collective_payload_checked_before_allocation, .timeout = 120)
{
    const char *wargs[] = {"--hbm-bytes", "64M", NULL};
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .worker_args = wargs};
    cluster *c = cluster_start(&o);
    tpu_resolver *tr;
    tpu_cluster *tc;
    tpu_topology *topo;
    tpu_core_info ci;

    cr_assert_eq(cluster_connect(c, &tr, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_init_options io = {.expect = 1, .timeout_ms = 10000};
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    uint64_t epoch = tpu_topology_epoch(topo);
    tpu_topology_free(topo);
    tpu_cluster_spec *spec = cluster_spec(c);
    cr_assert(cluster_find_core(spec, "h0", 0, &ci));
    char data[300];
    snprintf(data, sizeof data, "%s", ci.data_addr);
    tpu_cluster_spec_free(spec);

    /* 16 f32 elements are 64 bytes; the frame announces 200 MiB */
    coll_header_only(data, epoch, 1000001, 16, 200u << 20, CODE_INVALID_ARGUMENT,
                     "this replica's input is 64 bytes, but the frame announces 209715200 (refused before reading "
                     "or allocating them)");
    /* 16 Mi f32 elements: the payload is the right size, the collective is over the core's 64 MiB */
    coll_header_only(data, epoch, 1000002, 16u << 20, 64u << 20, CODE_RESOURCE_EXHAUSTED, "bytes of HBM");
    cr_assert(cluster_alive(&c->workers[0]), "see %s", c->workers[0].log);

    /* the core still runs collectives */
    float b[16];
    void *bufs[1] = {b};
    for (int i = 0; i < 16; i++)
        b[i] = (float)i;
    cr_assert_eq(tpu_all_reduce(tc, bufs, 16, TPU_F32, TPU_SUM, NULL), TPU_OK, "%s", tpu_last_error());
    for (int i = 0; i < 16; i++)
        cr_assert_float_eq(b[i], (float)i, 0.0f);
    tpu_cluster_free(tc);
    tpu_resolver_free(tr);
    cluster_free(c);
}

/* Finding 7: the resolver's replay cache starts empty when it restarts, so a
 * signed message captured before the restart was accepted again after it,
 * within the 60 s window. The resolver now refuses whatever was sent before
 * it started; its workers go on with fresh heartbeats, none exits. */
Test(hardening, replay_across_a_resolver_restart_is_refused, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1};
    cluster *c = cluster_start(&o);
    auth a;
    err e;
    wire_msg m = TPUEMU__MESSAGE__INIT, *rep;
    Tpuemu__ClusterSpecRequest q = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint8_t *req, *ans;
    size_t len, alen;

    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK, "%s", e.msg);
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &q;
    cr_assert_eq(raw_seal_at(&a, &m, wire_now_unix_ms(), &req, &len, NULL), CODE_OK);

    /* before the restart: accepted */
    int s = raw_req_open(c->addr, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);
    cr_assert_eq(raw_req_call(s, req, len, &ans, &alen), 0, "no answer");
    raw_req_close(s);
    cr_assert_eq(wire_open(&a, NULL, ans, alen, WIRE_MAX_REPLY, &rep, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC, "%s", wire_body_name(rep));
    wire_msg_free(rep);
    free(ans);

    /* the same bytes after a restart, well within the window: refused */
    cluster_restart_resolver(c);
    s = raw_req_open(c->addr, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);
    cr_assert_eq(raw_req_call(s, req, len, &ans, &alen), 0, "no answer");
    raw_req_close(s);
    cr_assert_eq(wire_open(&a, NULL, ans, alen, WIRE_MAX_REPLY, &rep, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_ERROR,
                 "a message captured before the resolver restarted was accepted after it (answered '%s')",
                 wire_body_name(rep));
    cr_assert_eq((int)rep->error->code, CODE_UNAUTHENTICATED, "%s", rep->error->message);
    cr_assert(strstr(rep->error->message, "before this process started"), "%s", rep->error->message);
    printf("replayed after the restart: %s\n", rep->error->message);
    wire_msg_free(rep);
    free(ans);
    free(req);

    /* honest senders are not hurt: both workers heartbeat on, registered and alive */
    cr_assert(cluster_wait_count(c, CL_ALIVE, 2, 10000), "the workers did not come back; see %s", c->resolver.log);
    for (int i = 0; i < 2; i++)
        cr_assert(cluster_alive(&c->workers[i]), "worker %d exited: see %s", i, c->workers[i].log);
    tpu_cluster_spec *spec = cluster_spec(c);
    cr_assert_not_null(spec, "a fresh client call fails: %s", tpu_last_error());
    tpu_cluster_spec_free(spec);
    cluster_free(c);
}

/* Finding 2, a worker's control port: connections that never send an
 * authenticated request (here 300 that sent nanomsg's SP header and then
 * nothing) hold at most 64 places, the oldest closed as newer ones come, so
 * the resolver's resets and the peers' probes always get in: an initialize
 * (a reset to every core) and an all-reduce work while they are held. */
Test(hardening, idle_strangers_do_not_stop_a_workers_control_port, .timeout = 180)
{
    enum { N = 300, WAITING = 64 };
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1};
    cluster *c = cluster_start(&o);
    static int fds[N];
    static const uint8_t sp_req[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
    tpu_core_info ci;
    char ctl[64];
    run_result r;

    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert(s && cluster_find_core(s, "h0", 0, &ci));
    cr_assert(strncmp(ci.control_addr, "tcp://", 6) == 0, "control address %s", ci.control_addr);
    snprintf(ctl, sizeof ctl, "%s", ci.control_addr + 6);
    tpu_cluster_spec_free(s);
    fdlimit_raise("it_hardening", 4096, 1024); /* the strangers' 600 connections */
    cr_assert_eq(hold_conns_saying(ctl, fds, N, sp_req, sizeof sp_req), N, "the control port took fewer");
    int closed = 0;
    for (int i = 0; i < N - WAITING; i++)
        closed += tcp_wait_closed(fds[i], 5000 * cl_time_scale());
    cr_assert_eq(closed, N - WAITING, "only %d of the oldest %d silent connections were closed", closed,
                 N - WAITING);
    /* the resolver resets h0/0 through its control port; cores dial each other */
    cluster_tpuctl(c, &r, 60000, "init", "--expect", "2", NULL);
    cr_assert_eq(r.code, 0, "tpuctl init with %d strangers on h0/0's control port: " SHOW(r), N);
    run_result_free(&r);
    cluster_tpuctl(c, &r, 60000, "bench", "allreduce", "--min", "4K", "--max", "4K", "--iters", "2", "--warmup",
                   "1", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    release_conns(fds, N);
    cr_assert(cluster_alive(&c->workers[0]), "see %s", c->workers[0].log);
    cluster_free(c);
}

/* ---- slots without an idle timeout ---- */

static uint64_t incarnation_in(cluster *c, const char *host, int core)
{
    int sock = raw_req_open(c->addr, 3000);
    wire_msg m = TPUEMU__MESSAGE__INIT, *rep;
    Tpuemu__ClusterSpecRequest q = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint64_t inc = 0;
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &q;
    cr_assert_eq(raw_call_msg(sock, NULL, &m, &rep, NULL), CODE_OK);
    for (size_t i = 0; i < rep->cluster_spec->n_cores; i++) {
        const Tpuemu__WorkerInfo *w = rep->cluster_spec->cores[i]->worker;
        if (strcmp(w->host_id, host) == 0 && w->core == core)
            inc = w->incarnation;
    }
    wire_msg_free(rep);
    raw_req_close(sock);
    cr_assert_neq(inc, 0, "%s/%d is not registered", host, core);
    return inc;
}

/* A connection to a worker's shared-memory hello socket (abstract, same
 * user): 1 if the worker sent its challenge (the connection was taken). */
static int shm_hello_conn(uint64_t inc, int *fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char name[64];
    unsigned char chal[64];
    int n = snprintf(name, sizeof name, "tpuemu-%016llx", (unsigned long long)inc);
    memcpy(sa.sun_path + 1, name, (size_t)n);
    *fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert_geq(*fd, 0);
    cr_assert_eq(connect(*fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)),
                 0, "%s", strerror(errno));
    struct pollfd pf = {.fd = *fd, .events = POLLIN};
    if (poll(&pf, 1, 5000) != 1)
        return 0;
    return recv(*fd, chal, sizeof chal, 0) > 0;
}

/* 64 silent connections of the same user to a worker's shared-memory hello
 * socket used to fill its table for as long as they were held, so its
 * peers on the host fell back to TCP: now the oldest goes when the table is
 * full, and one silent 2 s is closed at the next connection. */
Test(hardening, silent_shm_hello_connections_are_evicted, .timeout = 60)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    uint64_t inc = incarnation_in(c, "h0", 0);
    int fds[64], extra, late;
    for (int i = 0; i < 64; i++)
        cr_assert(shm_hello_conn(inc, &fds[i]), "connection %d was not taken", i);
    cr_assert(shm_hello_conn(inc, &extra), "a 65th connection was turned away: the table stays full");
    nap_ms(2500); /* any time past 2 s: silence that long is a squatter's */
    cr_assert(shm_hello_conn(inc, &late), "a connection after the silent ones was turned away");
    char b;
    struct pollfd pf = {.fd = fds[63], .events = POLLIN};
    cr_assert_eq(poll(&pf, 1, 5000), 1);
    cr_assert_eq(recv(fds[63], &b, 1, 0), 0, "a connection silent for 2.5 s is still open");
    for (int i = 0; i < 64; i++)
        close(fds[i]);
    close(extra);
    close(late);
    cr_assert(cluster_alive(&c->workers[0]));
    cluster_free(c);
}

/* Without a token anyone on loopback authenticates to a profiler port: 256
 * idle clients used to lock it. Now, with the table full, a new client takes
 * the place of one silent for 2 s. */
Test(hardening, idle_profiler_clients_make_room, .timeout = 120)
{
    char port[16];
    int pp = cl_free_port(), fds[256], fd;
    snprintf(port, sizeof port, "%d", pp);
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .worker_args = (const char *const[]){"--profiler-port", port,
                                                                                               NULL}};
    cluster *c = cluster_start(&o);
    char addr[64];
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pp);
    for (int i = 0; i < 256; i++) {
        cr_assert_eq(dp_handshake(addr, NULL, 0, &fds[i], &ans, chal), 0, "client %d", i);
        cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK, "client %d: kind %d", i, (int)ans->kind);
        tpuemu__frame_header__free_unpacked(ans, NULL);
    }
    nap_ms(2500); /* the clients are silent for longer than 2 s */
    cr_assert_eq(dp_handshake(addr, NULL, 0, &fd, &ans, chal), 0);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK, "the 257th client was refused: the port is locked");
    tpuemu__frame_header__free_unpacked(ans, NULL);
    close(fd);
    for (int i = 0; i < 256; i++)
        close(fds[i]);
    cluster_free(c);
}
