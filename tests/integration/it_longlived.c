/* Integration: what a worker that runs for weeks meets now and then.
 *
 * A resend on its control port: a request whose reply was lost on the way
 * (the connection reset after the worker answered, by the fault-injecting
 * proxy of tests/support/proxy.c) is sent again, byte for byte, by the
 * client's transport; the worker answers it from its reply cache, as the
 * resolver does, instead of refusing it as a replay, and does nothing twice.
 *
 * A lost chunk: one data-plane chunk, picked by --test-lose-chunk, is thrown
 * away on its way to one core; the all-reduce fails UNAVAILABLE on every core
 * with the same cause, naming the link and the chunk, and the next initialize
 * gives a system whose all-reduces are right again.
 *
 * Clock steps: a worker whose wall clock jumps minutes ahead and back (a
 * preload library, tests/support/clockshift.c, steps it while it runs) keeps
 * its place in the system, its heartbeats, its collectives and its control
 * port, with a cluster token (messages are dated, and refused more than 60 s
 * off); one whose clock is minutes off from the start takes the resolver's
 * time from the answer to its first heartbeat and joins. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "addr.h"
#include "cluster.h"
#include "colltest.h"
#include "proxy.h"
#include "raw.h"
#include "spcall.h"

/* The incarnation of host/core (the recipient of its control messages), from
 * a raw cluster spec request: the library's core info does not carry it. */
static uint64_t incarnation_of(cluster *c, const auth *a, const char *host, int core)
{
    int sock = raw_req_open(c->addr, 5000 * cl_time_scale());
    wire_msg m = TPUEMU__MESSAGE__INIT, *rep;
    Tpuemu__ClusterSpecRequest q = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint64_t inc = 0;
    cr_assert_geq(sock, 0);
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &q;
    cr_assert_eq(raw_call_msg(sock, a, &m, &rep, NULL), CODE_OK);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC, "%s", wire_body_name(rep));
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

/* host/core's control address ("tcp://127.0.0.1:PORT") into out. */
static void control_addr_of(cluster *c, const char *host, int core, char *out, size_t n)
{
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    cr_assert_not_null(s);
    cr_assert(cluster_find_core(s, host, core, &ci), "%s/%d is not registered", host, core);
    snprintf(out, n, "%s", ci.control_addr);
    tpu_cluster_spec_free(s);
}

/* Opens a reply from the worker; CODE_OK or wire_open's code. */
static wire_msg *open_reply(const auth *a, const uint8_t *buf, size_t len)
{
    wire_msg *m = NULL;
    err e;
    cr_assert_eq(wire_open(a, NULL, buf, len, WIRE_MAX_REPLY, &m, &e), CODE_OK, "the reply does not open: %s", e.msg);
    return m;
}

/* The faults waiting on h0/0, through the client library. */
static size_t waiting_faults(cluster *c)
{
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_scheduled_fault l[16];
    size_t n = 99;
    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_list_faults(tc, "h0", 0, l, 16, sizeof *l, &n), TPU_OK, "%s", tpu_last_error());
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    return n;
}

Test(longlived, control_port_answers_a_resend_again, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    char ctl[300];
    auth a;
    err e;

    auth_global_init();
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);
    control_addr_of(c, "h0", 0, ctl, sizeof ctl);
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    to.host_id = "h0";
    to.core = 0;
    to.incarnation = incarnation_of(c, &a, "h0", 0);

    /* a fault due in an hour: done once, it is listed once */
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__InjectFault f = TPUEMU__INJECT_FAULT__INIT;
    f.kind = TPUEMU__FAULT_KIND__FAULT_SLOW;
    f.percent = 50;
    f.duration_ms = 1000;
    f.delay_ms = 3600000;
    m.recipient = &to;
    m.body_case = TPUEMU__MESSAGE__BODY_INJECT_FAULT;
    m.inject_fault = &f;
    uint8_t *req, *rep = NULL;
    size_t qlen, rlen = 0;
    uint64_t nonce;
    cr_assert_eq(wire_seal(&a, "client test", &m, &req, &qlen, &nonce, &e), CODE_OK, "%s", e.msg);

    /* through the proxy, whose first reply is dropped with a reset: the
     * client's transport connects again and sends the same bytes */
    proxy *p = proxy_start(ctl);
    cr_assert_not_null(p);
    addr pa;
    cr_assert_eq(addr_parse(proxy_addr(p), 0, &pa, &e), CODE_OK, "%s", e.msg);
    spcall sc;
    spcall_init(&sc, WIRE_MAX_REPLY);
    cr_assert_eq(spcall_connect(&sc, pa.host, pa.port, 5000 * cl_time_scale(), NULL, &e), CODE_OK, "%s", e.msg);
    proxy_drop_replies(p, 1);
    int rc = spcall_request(&sc, req, qlen, wire_now_ms() + 20000u * (uint64_t)cl_time_scale(), &rep, &rlen, &e);
    cr_assert_eq(rc, CODE_OK, "no answer through the proxy: %s", e.msg);
    spcall_close(&sc);
    struct proxy_stats ps;
    proxy_get_stats(p, &ps);
    cr_assert_eq(ps.dropped, 1, "the proxy dropped %d replies", ps.dropped);
    cr_assert_geq(ps.resent, 1, "the client did not resend the request whose reply was lost");
    wire_msg *ans = open_reply(&a, rep, rlen);
    cr_assert_eq(ans->body_case, TPUEMU__MESSAGE__BODY_CORE_REPORT, "the resend was answered '%s': %s",
                 wire_body_name(ans), ans->body_case == TPUEMU__MESSAGE__BODY_ERROR ? ans->error->message : "");
    cr_assert_eq(ans->request_id, nonce, "the answer names another request");
    wire_msg_free(ans);
    cr_assert(cl_wait_log(&c->workers[0], "duplicate request answered again", 5000), "see %s", c->workers[0].log);
    cr_assert_not(cl_log_contains(&c->workers[0], "replay"), "the worker refused the resend; see %s",
                  c->workers[0].log);
    cr_assert_eq(waiting_faults(c), 1, "the fault was injected once per copy of the request");

    /* the same bytes straight to the worker: byte for byte the first answer */
    int s = raw_req_open(ctl, 5000 * cl_time_scale());
    cr_assert_geq(s, 0);
    uint8_t *again;
    size_t alen;
    cr_assert_eq(raw_req_call(s, req, qlen, &again, &alen), 0, "no answer to a resend");
    cr_assert(alen == rlen && memcmp(again, rep, rlen) == 0, "a resend got another answer than the first");
    free(again);

    /* the same signed message in another envelope (an unknown field added) is
     * no resend: a replay, refused, and nothing done */
    uint8_t *other = malloc(qlen + 2);
    cr_assert_not_null(other);
    memcpy(other, req, qlen);
    other[qlen] = 0x78; /* field 15, varint 1 */
    other[qlen + 1] = 0x01;
    cr_assert_eq(raw_req_call(s, other, qlen + 2, &again, &alen), 0, "no answer to a replay");
    ans = open_reply(&a, again, alen);
    cr_assert_eq(ans->body_case, TPUEMU__MESSAGE__BODY_ERROR, "a replay was answered '%s'", wire_body_name(ans));
    cr_assert_eq((int)ans->error->code, CODE_UNAUTHENTICATED, "%s", ans->error->message);
    cr_assert(strstr(ans->error->message, "replay"), "%s", ans->error->message);
    wire_msg_free(ans);
    free(again);
    free(other);
    raw_req_close(s);
    cr_assert_eq(waiting_faults(c), 1, "a resend or a replay injected the fault again");

    free(rep);
    free(req);
    proxy_free(p);
    cluster_free(c);
}

/* ---- a lost chunk ---- */

Test(longlived, lost_chunk_fails_every_core_alike_and_the_next_system_works, .timeout = 180)
{
    static const char *const tcp[] = {"--transport", "tcp", NULL};
    static const char *const lose[] = {"--test-lose-chunk", "h2/0:1", NULL};
    cluster_opts o = {.worker_args = tcp, .no_wait = 1};
    colltest *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->cl = cluster_start(&o);
    /* one core per host: no hand-shake of same-host cores before the ring */
    for (int k = 0; k < 3; k++) {
        char host[8];
        snprintf(host, sizeof host, "h%d", k);
        cluster_add_worker(t->cl, host, 0, NULL);
    }
    int victim = cluster_add_worker(t->cl, "h3", 0, lose); /* the first chunk from h2/0 never reaches it */
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 4, 20000), "only %d of 4 workers registered",
              cluster_count(t->cl, CL_ALIVE));
    cr_assert_eq(cluster_connect(t->cl, &t->r, &t->c), TPU_OK, "connect: %s", tpu_last_error());
    ct_reinit(t);
    cr_assert_eq(t->n, 4);

    /* a ring all-reduce of 4 MiB: every link carries 12 chunks of 512 KiB in order */
    size_t count = 1u << 20;
    void **b = ct_bufs(t->n, count, TPU_F32, 7, 0, t->n);
    tpu_collective_options co = {.algo = TPU_ALGO_RING};
    tpu_status s = tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, &co);
    char overall[1100];
    snprintf(overall, sizeof overall, "%s", tpu_last_error());
    cr_assert_eq(s, TPU_UNAVAILABLE, "the all-reduce with a lost chunk: %s: %s", tpu_status_name(s), overall);
    cr_assert(cl_log_contains(&t->cl->workers[victim], "lost on purpose"), "h3/0 lost no chunk; see %s",
              t->cl->workers[victim].log);
    tpu_collective_stats st;
    cr_assert_eq(tpu_last_collective(t->c, &st), TPU_OK);
    char seq[32];
    snprintf(seq, sizeof seq, "#%llu", (unsigned long long)st.seq);
    static const char cause[] = "from core h2/0 to core h3/0 was lost on the way";
    cr_assert(strstr(overall, cause) && strstr(overall, seq), "the error should name the link and %s: %s", seq,
              overall);
    /* the chunk: "chunk N (step S) of all-reduce #SEQ", the same on every core */
    const char *ch = strstr(overall, "chunk ");
    cr_assert_not_null(ch, "the error names no chunk: %s", overall);
    char chunk[160];
    snprintf(chunk, sizeof chunk, "%.*s", (int)(strstr(ch, cause) ? strstr(ch, cause) - ch : 0), ch);
    cr_assert(strstr(chunk, "(step ") && strstr(chunk, seq), "the chunk is not named: '%s' in %s", chunk, overall);
    for (int r = 0; r < t->n; r++) {
        tpu_replica_result rr;
        cr_assert_eq(tpu_last_collective_replica(t->c, r, &rr), TPU_OK);
        fprintf(stderr, "lost chunk: replica %d (%s) %s: %s\n", r, t->name[r], tpu_status_name(rr.status), rr.message);
        cr_assert_eq(rr.status, TPU_UNAVAILABLE, "core %s: %s: %s", t->name[r], tpu_status_name(rr.status), rr.message);
        cr_assert(strstr(rr.message, chunk) && strstr(rr.message, cause),
                  "core %s should give the same cause ('%s%s'): %s", t->name[r], chunk, cause, rr.message);
    }
    ct_free_bufs(b, t->n);

    /* the next initialize: a new system whose all-reduces are right */
    ct_reinit(t);
    cr_assert_eq(t->n, 4);
    int members[4] = {0, 1, 2, 3};
    char why[256];
    for (int k = 0; k < 2; k++) {
        b = ct_bufs(t->n, count, TPU_F32, 8 + k, 0, t->n);
        s = tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, &co);
        cr_assert_eq(s, TPU_OK, "after the next initialize: %s: %s", tpu_status_name(s), tpu_last_error());
        for (int r = 0; r < t->n; r++)
            cr_assert(ct_check_reduce(b[r], count, 0, TPU_F32, TPU_SUM, 8 + k, 0, members, 4, why, sizeof why),
                      "replica %d: %s", r, why);
        ct_free_bufs(b, t->n);
    }
    ct_free(t);
}

/* ---- clock steps ---- */

/* A file holding a clock offset for the preload library (ms). */
static void set_shift(const char *path, int64_t ms)
{
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    cr_assert_geq(fd, 0, "cannot write %s", path);
    cr_assert_eq(pwrite(fd, &ms, sizeof ms, 0), (ssize_t)sizeof ms);
    close(fd);
}

/* Starts worker host/core with its wall clock shifted by the offset in path. */
static int add_shifted_worker(cluster *c, const char *host, int core, const char *path)
{
    char *asan = getenv("ASAN_OPTIONS") ? strdup(getenv("ASAN_OPTIONS")) : NULL;
    char opts[1024];
    /* the sanitizers' runtime must come first among the libraries; the
     * preload library has no use for them */
    snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("LD_PRELOAD", TPUEMU_CLOCKSHIFT_LIB, 1);
    setenv("TPUEMU_TEST_CLOCK_FILE", path, 1);
    int w = cluster_add_worker(c, host, core, NULL);
    unsetenv("LD_PRELOAD");
    unsetenv("TPUEMU_TEST_CLOCK_FILE");
    if (asan)
        setenv("ASAN_OPTIONS", asan, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(asan);
    return w;
}

/* How many times s is in the process's log. */
static int log_count(const cl_proc *p, const char *s)
{
    char *log = cl_read_file(p->log);
    int n = 0;
    for (const char *q = log; (q = strstr(q, s)) != NULL; q += strlen(s))
        n++;
    free(log);
    return n;
}

static int wait_log_count(const cl_proc *p, const char *s, int n, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    while (log_count(p, s) < n) {
        if (cl_now_ms() >= end)
            return 0;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* The step_ms of the last "the wall clock stepped" line (0: none); the two
 * clocks it compares are read a few microseconds apart, so a step of 300000
 * ms may show as 299999. */
static long long last_step_ms(const cl_proc *p)
{
    char *log = cl_read_file(p->log);
    const char *q = log, *last = NULL;
    while ((q = strstr(q, "the wall clock stepped")) != NULL)
        last = q++;
    long long v = 0;
    if (last && (last = strstr(last, "step_ms=")) != NULL)
        v = strtoll(last + 8, NULL, 10);
    free(log);
    return v;
}

/* A checked all-reduce over the system of t. */
static void all_reduce_ok(colltest *t, int seed, const char *when)
{
    int members[CL_MAX_WORKERS];
    char why[256];
    size_t count = 100003;
    void **b = ct_bufs(t->n, count, TPU_F32, seed, 0, t->n);
    for (int r = 0; r < t->n; r++)
        members[r] = r;
    tpu_status s = tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, NULL);
    cr_assert_eq(s, TPU_OK, "%s: %s: %s", when, tpu_status_name(s), tpu_last_error());
    for (int r = 0; r < t->n; r++)
        cr_assert(ct_check_reduce(b[r], count, 0, TPU_F32, TPU_SUM, seed, 0, members, t->n, why, sizeof why),
                  "%s: replica %d: %s", when, r, why);
    ct_free_bufs(b, t->n);
}

Test(longlived, wall_clock_steps_keep_membership_and_collectives, .timeout = 180)
{
    cluster_opts o = {.token = 1, .heartbeat_ms = 1000, .no_wait = 1};
    colltest *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->cl = cluster_start(&o);
    char path[600], late[600];
    snprintf(path, sizeof path, "%s/clock-h0-1", t->cl->dir);
    snprintf(late, sizeof late, "%s/clock-h1-0", t->cl->dir);
    set_shift(path, 0);
    cluster_add_worker(t->cl, "h0", 0, NULL);
    int w = add_shifted_worker(t->cl, "h0", 1, path);
    cl_proc *wp = &t->cl->workers[w];
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 2, 20000), "only %d of 2 workers registered",
              cluster_count(t->cl, CL_ALIVE));
    cr_assert_eq(cluster_connect(t->cl, &t->r, &t->c), TPU_OK, "connect: %s", tpu_last_error());
    ct_reinit(t);
    cr_assert_eq(t->n, 2);
    all_reduce_ok(t, 11, "before any step");

    /* 5 minutes ahead, then 3 behind (8 back), then right again */
    static const int64_t shifts[] = {300000, -180000, 0};
    int64_t was = 0;
    for (int k = 0; k < 3; k++) {
        char step[64], when[96];
        set_shift(path, shifts[k]);
        snprintf(step, sizeof step, "step_ms=%lld", (long long)(shifts[k] - was));
        snprintf(when, sizeof when, "after the wall clock of h0/1 stepped by %lld ms", (long long)(shifts[k] - was));
        /* seen at its next heartbeat */
        cr_assert(wait_log_count(wp, "the wall clock stepped", k + 1, 10000), "%s: not seen; see %s", when, wp->log);
        long long logged = last_step_ms(wp);
        cr_assert(llabs(logged - (long long)(shifts[k] - was)) <= 50, "%s: the step logged is %lld ms, not %s; see %s",
                  when, logged, step, wp->log);
        was = shifts[k];
        all_reduce_ok(t, 12 + k, when);
        /* the control port takes a client's message, dated by the client's clock */
        tpu_scheduled_fault l[4];
        size_t n = 9;
        cr_assert_eq(tpu_list_faults(t->c, "h0", 1, l, 4, sizeof *l, &n), TPU_OK, "%s: %s", when, tpu_last_error());
        cr_assert_eq(n, 0);
        /* and the heartbeats of the next 2 s (two beats) are taken */
        int acked = log_count(&t->cl->resolver, "msg=\"core dead\"");
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
        cr_assert_eq(log_count(&t->cl->resolver, "msg=\"core dead\""), acked);
        cr_assert_eq(cluster_core_state(t->cl, "h0", 1, NULL), TPU_CORE_READY, "%s: h0/1 left the system", when);
    }
    cr_assert_not(cl_log_contains(&t->cl->resolver, "msg=\"core dead\""), "a core went dead; see %s",
                  t->cl->resolver.log);
    cr_assert_not(cl_log_contains(wp, "refused"), "h0/1 had a message refused; see %s", wp->log);
    cr_assert_not(cl_log_contains(&t->cl->workers[0], "refused"), "h0/0 had a message refused; see %s",
                  t->cl->workers[0].log);
    all_reduce_ok(t, 20, "after the steps");

    /* a worker whose clock is 4 minutes ahead from its start: its first
     * heartbeat is refused, the refusal tells it the resolver's time */
    set_shift(late, 240000);
    int w2 = add_shifted_worker(t->cl, "h1", 0, late);
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 3, 20000), "h1/0, 4 minutes ahead, did not join; see %s",
              t->cl->workers[w2].log);
    cr_assert(cl_log_contains(&t->cl->workers[w2], "messages are dated by the resolver's"), "see %s",
              t->cl->workers[w2].log);
    ct_reinit(t);
    cr_assert_eq(t->n, 3);
    all_reduce_ok(t, 21, "with a worker on the resolver's time");
    ct_free(t);
}
