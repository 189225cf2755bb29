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
 * gives a system whose all-reduces are right again. A chunk lost after its
 * sender had all it needed, the sender in the next step already (several
 * steps per execution): its next chunk comes in the lost one's place, and the
 * fit fails UNAVAILABLE (retried by a fit with recovery), not INTERNAL.
 *
 * Clock steps: a worker whose wall clock jumps minutes ahead and back (a
 * preload library, tests/support/clockshift.c, steps it while it runs) keeps
 * its place in the system, its heartbeats, its collectives and its control
 * port, with a cluster token (messages are dated, and refused more than 60 s
 * off); one whose clock is minutes off from the start takes the resolver's
 * time from the answer to its first heartbeat and joins.
 *
 * Nothing lost on disk: on a small tmpfs filled up (mounted by the test in a
 * mount namespace of its own; root only), a checkpoint save fails naming the
 * file and the reason and leaves the previous checkpoint loadable, with the
 * state it had; a TensorBoard callback and a profiler writing there only warn,
 * and the fit trains to its last epoch; with room again, all of them write.
 * (A checkpoint damaged or cut short on disk is refused on load with the
 * reason: test_ckpt flips every bit and cuts at every length, it_train loads
 * damaged files into a model.) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

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

/* ---- nothing lost on disk ---- */

#define DIM 20
#define ROWS 512
#define BATCH 128

static void make_data(float *x, int32_t *y, size_t rows)
{
    for (size_t i = 0; i < rows; i++) {
        y[i] = (int32_t)(i % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13) % 17) / 17.0f + (float)y[i] * (j == (size_t)y[i]);
    }
}

static char warned[8][600];
static int nwarned;

static void keep_warning(const char *msg, void *user)
{
    (void)user;
    if (nwarned < 8)
        snprintf(warned[nwarned++], sizeof warned[0], "%s", msg);
}

/* The warning that has all of a, b and c in it, or NULL. */
static const char *warning_with(const char *a, const char *b, const char *c)
{
    for (int i = 0; i < nwarned; i++)
        if (strstr(warned[i], a) && strstr(warned[i], b) && strstr(warned[i], c))
            return warned[i];
    return NULL;
}

/* Fills the file system of dir: a file written until it is full. */
static void fill(const char *path)
{
    static char block[4096];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ssize_t n;
    cr_assert_geq(fd, 0, "cannot create %s: %s", path, strerror(errno));
    for (int i = 0; i < 1 << 16 && (n = write(fd, block, sizeof block)) > 0; i++)
        ;
    n = write(fd, block, 1);
    cr_assert(n < 0 && errno == ENOSPC, "%s: the file system is not full", path);
    close(fd);
}

static size_t entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t n = 0;
    cr_assert_not_null(d);
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The bytes of the event files under dir (0: none). */
static long long event_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    long long n = 0;
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        char p[1200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0 && stat(p, &st) == 0)
            n += st.st_size;
    }
    closedir(d);
    return n;
}

/* DIM -> [Dense(hidden, relu)] -> Dense(4, softmax), `spe` steps a request;
 * hidden 0: no hidden layer */
static tpu_model *new_model(colltest *t, size_t hidden, unsigned spe)
{
    tpu_strategy *s;
    tpu_model *m;
    tpu_compile_options co;
    cr_assert_eq(tpu_strategy_new(t->c, &s), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_new(s, DIM, &m), TPU_OK, "%s", tpu_last_error());
    if (hidden)
        cr_assert_eq(tpu_model_add_dense(m, hidden, TPU_ACT_RELU), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(m, 4, TPU_ACT_SOFTMAX), TPU_OK);
    cr_assert_eq(tpu_model_set_seed(m, 5), TPU_OK);
    tpu_compile_options_init(&co);
    co.batch_size = BATCH;
    co.steps_per_execution = spe;
    cr_assert_eq(tpu_model_compile(m, &co), TPU_OK, "%s", tpu_last_error());
    return m;
}

static void fit(tpu_model *m, tpu_dataset *ds, int epochs, tpu_callback *cb, const char *when)
{
    tpu_fit_options fo;
    tpu_history *h;
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    fo.callbacks = cb;
    fo.num_callbacks = cb ? 1 : 0;
    tpu_status st = tpu_model_fit(m, ds, &fo, &h);
    cr_assert_eq(st, TPU_OK, "%s: fit: %s: %s", when, tpu_status_name(st), tpu_last_error());
    cr_assert_eq(tpu_history_num_epochs(h), (size_t)epochs, "%s: the fit stopped early", when);
    tpu_history_free(h);
}

Test(longlived, full_disk_loses_no_checkpoint_and_stops_no_training, .timeout = 180)
{
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    char mnt[300], ckpt[400], filler[400], logdir[400], dir[500];
    double saved_loss, loss, acc;

    if (geteuid() != 0)
        cr_skip_test("mounting a small tmpfs needs root (CI runs as root); not run");
    /* a mount of our own, gone with this process whatever happens */
    cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare(CLONE_NEWNS): %s", strerror(errno));
    cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0, "%s", strerror(errno));
    snprintf(mnt, sizeof mnt, "%s/small-disk", cl_tmpdir());
    cr_assert_eq(mkdir(mnt, 0700), 0, "%s: %s", mnt, strerror(errno));
    cr_assert_eq(mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700"), 0, "mount tmpfs on %s: %s",
                 mnt, strerror(errno));
    snprintf(ckpt, sizeof ckpt, "%s/model.ckpt", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    snprintf(logdir, sizeof logdir, "%s/logs", mnt);
    tpu_set_warning_handler(keep_warning, NULL);

    colltest *t = ct_start(1, (int[]){2}, NULL, 500);
    make_data(x, y, ROWS);
    tpu_dataset *ds;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, BATCH, 1), TPU_OK);
    tpu_model *m = new_model(t, 32, 1);
    fit(m, ds, 1, NULL, "the first epoch");
    cr_assert_eq(tpu_model_save_checkpoint(m, ckpt), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_evaluate(m, ds, &saved_loss, &acc), TPU_OK, "%s", tpu_last_error());

    /* the disk full: the next save fails, saying which file and why */
    fill(filler);
    fit(m, ds, 1, NULL, "the second epoch");
    tpu_status st = tpu_model_save_checkpoint(m, ckpt);
    cr_assert_eq(st, TPU_RESOURCE_EXHAUSTED, "a save on a full disk: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), ckpt) && strstr(tpu_last_error(), "No space left on device"),
              "the error should name %s and the reason: %s", ckpt, tpu_last_error());
    cr_assert_eq(entries(mnt), 2u, "the failed save left a file behind in %s", mnt);
    /* the previous checkpoint loads, with the state it had */
    tpu_model *m2 = new_model(t, 32, 1);
    cr_assert_eq(tpu_model_load_checkpoint(m2, ckpt), TPU_OK, "the previous checkpoint: %s", tpu_last_error());
    cr_assert_eq(tpu_model_evaluate(m2, ds, &loss, &acc), TPU_OK, "%s", tpu_last_error());
    cr_assert(loss == saved_loss, "the previous checkpoint gives loss %.9g, it was saved at %.9g", loss, saved_loss);

    /* TensorBoard's event files and a profile on the full disk: warned, and
     * the fit trains every epoch */
    tpu_callback cb;
    cr_assert_eq(tpu_callback_profiler(logdir, 1, 2, &cb), TPU_OK, "%s", tpu_last_error());
    nwarned = 0;
    /* (a model compiled on the cores takes the place of the one before) */
    fit(m2, ds, 2, &cb, "TensorBoard and the profiler on a full disk");
    cr_assert_not_null(warning_with("TensorBoard: ", logdir, "No space left on device"),
                       "no warning names the event file and the reason (%d warnings: '%s')", nwarned,
                       nwarned ? warned[0] : "");
    cr_assert_not_null(warning_with("profiler: ", logdir, "No space left on device"),
                       "no warning names the profile's file and the reason (%d warnings: '%s')", nwarned,
                       nwarned ? warned[0] : "");
    for (int i = 0; i < nwarned; i++)
        fprintf(stderr, "full disk: warned: %s\n", warned[i]);
    tpu_callback_free(&cb);

    /* room again: everything is written */
    cr_assert_eq(unlink(filler), 0);
    fit(m2, ds, 1, NULL, "with room again");
    cr_assert_eq(tpu_model_save_checkpoint(m2, ckpt), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_evaluate(m2, ds, &saved_loss, &acc), TPU_OK, "%s", tpu_last_error());
    tpu_model *m3 = new_model(t, 32, 1);
    cr_assert_eq(tpu_model_load_checkpoint(m3, ckpt), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_evaluate(m3, ds, &loss, &acc), TPU_OK, "%s", tpu_last_error());
    cr_assert(loss == saved_loss, "the new checkpoint gives loss %.9g, it was saved at %.9g", loss, saved_loss);
    cr_assert_eq(tpu_callback_tensorboard(logdir, 0, 0, &cb), TPU_OK, "%s", tpu_last_error());
    nwarned = 0;
    fit(m3, ds, 2, &cb, "TensorBoard with room again");
    cr_assert_eq(nwarned, 0, "warned with room on the disk: %s", warned[0]);
    snprintf(dir, sizeof dir, "%s/train", logdir);
    cr_assert_gt(event_bytes(dir), 100, "no events were written in %s with room again", dir);
    tpu_callback_free(&cb);

    tpu_set_warning_handler(NULL, NULL);
    tpu_model_free(m3);
    tpu_model_free(m2);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    ct_free(t);
    cr_assert_eq(umount2(mnt, MNT_DETACH), 0, "%s", strerror(errno));
}

/* ---- a lost chunk, and the sender already in the next step ---- */

/* A chunk lost on the way after its sender had all it needed: the sender is
 * done with that all-reduce and sends the next step's chunk, which comes in
 * the lost one's place. That is a lost chunk (UNAVAILABLE, which a fit with
 * recovery retries from its checkpoint), not cores that disagree about the
 * collective (INTERNAL, which ends the job); and the next system trains. */
Test(longlived, chunk_lost_before_the_senders_next_step_fails_unavailable, .timeout = 180)
{
    static const char *const tcp[] = {"--transport", "tcp", NULL};
    static const char *const lose[] = {"--test-lose-chunk", "h0/0:1", NULL};
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    cluster_opts o = {.worker_args = tcp, .no_wait = 1};
    colltest *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->cl = cluster_start(&o);
    cluster_add_worker(t->cl, "h0", 0, NULL);
    int victim = cluster_add_worker(t->cl, "h1", 0, lose); /* the first chunk from h0/0 never reaches it */
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 2, 20000), "only %d of 2 workers registered",
              cluster_count(t->cl, CL_ALIVE));
    cr_assert_eq(cluster_connect(t->cl, &t->r, &t->c), TPU_OK, "connect: %s", tpu_last_error());
    ct_reinit(t);
    cr_assert_eq(t->n, 2);

    make_data(x, y, ROWS);
    tpu_dataset *ds;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, BATCH, 1), TPU_OK);
    /* no hidden layer: the gradient fits in one chunk, so a gradient all-reduce
     * of 2 cores sends one chunk each way; with every step of the epoch in one
     * execution the cores go from one step to the next without the client */
    tpu_model *m = new_model(t, 0, ROWS / BATCH);
    tpu_fit_options fo;
    tpu_history *h = NULL;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    tpu_status st = tpu_model_fit(m, ds, &fo, &h);
    char why[1100];
    snprintf(why, sizeof why, "%s", tpu_last_error());
    fprintf(stderr, "chunk lost before the next step: %s: %s\n", tpu_status_name(st), why);
    cr_assert(cl_log_contains(&t->cl->workers[victim], "lost on purpose"), "h1/0 lost no chunk; see %s",
              t->cl->workers[victim].log);
    cr_assert(cl_log_contains(&t->cl->workers[victim], "went on to #"),
              "h0/0 did not send the next step's chunk in the lost one's place; see %s", t->cl->workers[victim].log);
    cr_assert_eq(st, TPU_UNAVAILABLE, "the fit with a lost chunk: %s: %s", tpu_status_name(st), why);
    cr_assert(strstr(why, "from core h0/0 to core h1/0 was lost on the way") && !strstr(why, "disagree"),
              "the error should name the lost chunk's link: %s", why);
    tpu_history_free(h);
    tpu_model_free(m);

    /* what a fit with recovery does: a new system, the model compiled again */
    ct_reinit(t);
    cr_assert_eq(t->n, 2);
    m = new_model(t, 0, ROWS / BATCH);
    fit(m, ds, 2, NULL, "after the next initialize");
    tpu_model_free(m);
    tpu_dataset_free(ds);
    ct_free(t);
}
