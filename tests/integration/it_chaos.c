/* Fault injection (tpu_inject_fault, tpuctl chaos) against real daemons: a
 * pause stops every thread of the worker (the kernel shows it stopped, the
 * resolver declares the core dead) and it comes back by itself; a kill ends
 * the worker with SIGKILL; a slow-down is logged and ends by itself; HBM
 * pressure shows in the core's HBM use and is given back by itself; a fault
 * with a bad field, of an unknown kind or for a core that is not there is
 * refused with an error naming what was wrong, and nothing is injected.
 * Preemption and maintenance as Cloud TPU shows them: a notice listed on the
 * core while it still runs, then PREEMPTED (the worker exits 4 when the
 * notice runs out), or MAINTENANCE (UNHEALTHY_MAINTENANCE, kept out of
 * initializes) and back, restarted; one notice at a time. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include <tpuemu/data.h>
#include <tpuemu/model.h>

/* The state letter of /proc/PID/stat ('T': stopped), or 0. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* after the command name, which may hold spaces */
    return p && p[1] == ' ' ? p[2] : 0;
}

static int wait_state(pid_t pid, char want, int timeout_ms)
{
    int64_t end = cl_now_ms() + timeout_ms;
    do {
        if (proc_state(pid) == want)
            return 1;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    } while (cl_now_ms() < end);
    return 0;
}

static cluster *start2(void)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    cr_assert_not_null(c, "the cluster did not start");
    return c;
}

Test(chaos, pause_stops_the_worker_and_it_comes_back, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    pid_t pid = c->workers[1].pid;
    int scale = cl_time_scale();

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault f = {.kind = TPU_FAULT_PAUSE, .duration_ms = 4000u * (uint32_t)scale, .percent = 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &f), TPU_OK, "%s", tpu_last_error());
    cr_assert(wait_state(pid, 'T', 2000 * scale), "worker h0/1 (pid %d) was not stopped by the pause (state '%c')",
              (int)pid, proc_state(pid));
    /* a host that hangs: its heartbeats stop, the resolver declares it dead */
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 3500 * scale),
              "the resolver did not see the paused core h0/1 as dead");
    /* and the same process comes back by itself */
    cr_assert(cl_wait_log(&c->workers[1], "fault over: the process runs again", 15000 * scale),
              "the pause did not end; see %s", c->workers[1].log);
    cr_assert_neq(proc_state(pid), 'T');
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_IDLE, 5000 * scale),
              "h0/1 did not come back after its pause");
    uint32_t now_pid = 0;
    cluster_core_state(c, "h0", 1, &now_pid);
    cr_assert_eq(now_pid, (uint32_t)pid, "h0/1 came back as another process");
    cr_assert(cl_wait_log(&c->workers[1], "fault injected: every thread of this worker stops", 1000));
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, kill_ends_the_worker_at_once, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    int scale = cl_time_scale();

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault f = {.kind = TPU_FAULT_KILL, .duration_ms = 0, .percent = 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    cr_assert(cluster_wait_exit(&c->workers[0], 5000 * scale), "h0/0 is still running after the kill");
    cr_assert(WIFSIGNALED(c->workers[0].status) && WTERMSIG(c->workers[0].status) == SIGKILL,
              "h0/0 ended with status %#x, not by SIGKILL", c->workers[0].status);
    cr_assert(cl_wait_log(&c->workers[0], "fault injected: this worker dies now", 1000), "see %s", c->workers[0].log);
    cr_assert(cluster_wait_core_state(c, "h0", 0, TPU_CORE_DEAD, 5000 * scale), "the resolver did not see h0/0 die");
    cr_assert_eq(cluster_core_state(c, "h0", 1, NULL), TPU_CORE_IDLE, "the other core was hit too");
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, slow_down_is_logged_and_ends_by_itself, .timeout = 120)
{
    cluster *c = start2();
    run_result rr;
    int scale = cl_time_scale();

    cluster_tpuctl(c, &rr, 10000 * scale, "chaos", "slow", "h0/0", "30", "500", NULL);
    cr_assert_eq(rr.code, 0, "tpuctl chaos slow: %s", rr.err);
    cr_assert(strstr(rr.out, "injected slow into core h0/0"), "%s", rr.out);
    run_result_free(&rr);
    cr_assert(cl_wait_log(&c->workers[0], "fault injected: training compute slowed", 2000 * scale));
    cr_assert(cl_wait_log(&c->workers[0], "percent=30 duration_ms=500", 1000));
    cr_assert(cl_wait_log(&c->workers[0], "fault over: training compute at its own speed again", 5000 * scale),
              "the slow-down did not end after 500 ms; see %s", c->workers[0].log);
    cluster_free(c);
}

struct hbm_arg {
    const char *host;
    int core;
    double lo, hi; /* share of the capacity in use, inclusive */
};

static int hbm_share_in(cluster *c, void *arg)
{
    struct hbm_arg *a = arg;
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    int ok = 0;
    if (s && cluster_find_core(s, a->host, a->core, &ci) && ci.hbm_capacity) {
        double share = (double)ci.hbm_used / (double)ci.hbm_capacity;
        ok = share >= a->lo && share <= a->hi;
    }
    tpu_cluster_spec_free(s);
    return ok;
}

Test(chaos, hbm_pressure_takes_memory_and_gives_it_back, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    int scale = cl_time_scale();

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault f = {.kind = TPU_FAULT_HBM, .duration_ms = 0, .percent = 90};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    struct hbm_arg taken = {"h0", 0, 0.89, 0.91};
    cr_assert(cluster_wait_until(hbm_share_in, c, &taken, 5000 * scale), "h0/0 does not show 90 %% of its HBM in use");
    struct hbm_arg other = {"h0", 1, 0.0, 0.0};
    cr_assert(hbm_share_in(c, &other), "h0/1's HBM was taken too");
    /* a new pressure replaces the old one */
    f.percent = 60;
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    struct hbm_arg less = {"h0", 0, 0.59, 0.61};
    cr_assert(cluster_wait_until(hbm_share_in, c, &less, 5000 * scale), "h0/0 does not show 60 %% in use");
    /* one for 1 s replaces that, and is given back after it: nothing else
     * can bring the use to 0 once 60 % was seen */
    f.percent = 30;
    f.duration_ms = 1000;
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    struct hbm_arg none = {"h0", 0, 0.0, 0.0};
    cr_assert(cluster_wait_until(hbm_share_in, c, &none, 10000 * scale), "h0/0's HBM was not given back");
    cr_assert(cl_wait_log(&c->workers[0], "fault over: HBM pressure released", 1000), "see %s", c->workers[0].log);
    /* out of range: refused, nothing taken */
    f.percent = 0;
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "'hbm' needs a percent"), "%s", tpu_last_error());
    cr_assert(hbm_share_in(c, &none));
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, bad_faults_are_refused_and_nothing_is_injected, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    pid_t pid = c->workers[0].pid;
    run_result rr;
    int scale = cl_time_scale();

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    /* refused by the worker: out-of-range fields */
    const struct {
        tpu_fault f;
        const char *says;
    } bad[] = {
        {{.kind = TPU_FAULT_PAUSE, .duration_ms = 0, .percent = 0}, "'pause' needs a duration"},
        {{.kind = TPU_FAULT_PAUSE, .duration_ms = 600001, .percent = 0}, "'pause' needs a duration"},
        {{.kind = TPU_FAULT_SLOW, .duration_ms = 1000, .percent = 0}, "'slow' needs a percent"},
        {{.kind = TPU_FAULT_SLOW, .duration_ms = 1000, .percent = 101}, "'slow' needs a percent"},
        {{.kind = TPU_FAULT_KILL, .duration_ms = 5, .percent = 0}, "'kill' takes no duration"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &bad[i].f), TPU_INVALID_ARGUMENT, "case %zu: %s", i,
                     tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad[i].says) && strstr(tpu_last_error(), "h0/0"), "case %zu: %s", i,
                  tpu_last_error());
    }
    /* refused by the library: a kind that is not one, a core that is not there */
    tpu_fault nokind = {.kind = (tpu_fault_kind)11, .duration_ms = 0, .percent = 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &nokind), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "fault kind 11"), "%s", tpu_last_error());
    tpu_fault kill = {.kind = TPU_FAULT_KILL, .duration_ms = 0, .percent = 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 7, &kill), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), "h0/7"), "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h9", 0, &kill), TPU_NOT_FOUND);
    /* nothing was injected: the worker runs, unstopped, and logged no fault */
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    cr_assert(cluster_alive(&c->workers[0]));
    cr_assert_neq(proc_state(pid), 'T');
    cr_assert_not(cl_wait_log(&c->workers[0], "fault injected", 100), "see %s", c->workers[0].log);
    /* one kill or pause at a time */
    /* one kill or pause at a time: the second is refused whether it arrives
     * before the first has stopped the worker or waits in its socket until
     * the worker runs again (the pause's grace covers it) */
    tpu_fault p = {.kind = TPU_FAULT_PAUSE, .duration_ms = 1000, .percent = 0};
    cr_assert_eq(tpu_resolver_set_timeout_ms(r, 10000u * (uint32_t)scale), TPU_OK); /* past the pause */
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &p), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &p), TPU_FAILED_PRECONDITION, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "already under way"), "%s", tpu_last_error());
    cr_assert(cl_wait_log(&c->workers[1], "fault over: the process runs again", 20000 * scale));
    /* the command line names what it does not take */
    cluster_tpuctl(c, &rr, 10000 * scale, "chaos", "frob", "h0/0", NULL);
    cr_assert_eq(rr.code, 2);
    cr_assert(strstr(rr.err, "'frob' is not a fault kind"), "%s", rr.err);
    run_result_free(&rr);
    cluster_tpuctl(c, &rr, 10000 * scale, "chaos", "pause", "h0/0", "soon", NULL);
    cr_assert_eq(rr.code, 2);
    cr_assert(strstr(rr.err, "pause needs a duration"), "%s", rr.err);
    run_result_free(&rr);
    cr_assert(cluster_alive(&c->workers[0]));
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, a_fault_waits_for_its_delay, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    int scale = cl_time_scale();

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault f = {.kind = TPU_FAULT_KILL, .delay_ms = 3000u * (uint32_t)scale};
    int64_t t0 = cl_now_ms();
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &f), TPU_OK, "%s", tpu_last_error());
    cr_assert(cl_wait_log(&c->workers[1], "fault scheduled", 2000 * scale), "see %s", c->workers[1].log);
    if (cl_now_ms() - t0 < 2500 * scale) /* not yet: the kill waits for its 3 s */
        cr_assert(cluster_alive(&c->workers[1]), "h0/1 died before its fault's delay");
    cr_assert(cluster_wait_exit(&c->workers[1], 15000 * scale), "h0/1 still runs long after its fault's delay");
    cr_assert_geq(cl_now_ms() - t0, 3000 * scale, "h0/1 died before its fault's delay");
    cr_assert(WIFSIGNALED(c->workers[1].status) && WTERMSIG(c->workers[1].status) == SIGKILL);
    cr_assert(cl_wait_log(&c->workers[1], "when=\"delay\"", 1000), "see %s", c->workers[1].log);
    /* both a delay and a step: refused */
    tpu_fault both = {.kind = TPU_FAULT_KILL, .delay_ms = 10, .at_step = 3};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &both), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "not both"), "%s", tpu_last_error());
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

#define DIM 16
#define ROWS 256
#define BATCH 32 /* 8 steps an epoch */

/* A small model and its dataset, on the initialized system of tc. */
static void build_model(tpu_cluster *tc, tpu_strategy **s, tpu_dataset **ds, tpu_model **m)
{
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    for (size_t i = 0; i < ROWS; i++) {
        y[i] = (int32_t)(i % 4);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13) % 17) / 17.0f;
    }
    cr_assert_eq(tpu_strategy_new(tc, s), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(*ds, BATCH, 1), TPU_OK);
    cr_assert_eq(tpu_model_new(*s, DIM, m), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(*m, 16, TPU_ACT_RELU), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(*m, 4, TPU_ACT_SOFTMAX), TPU_OK);
}

/* A client of c, with the system initialized on both cores. */
static void connect_init(cluster *c, tpu_resolver **r, tpu_cluster **tc)
{
    tpu_topology *topo;
    tpu_init_options io = {.expect = 2, .timeout_ms = 10000u * (uint32_t)cl_time_scale()};
    cr_assert_eq(cluster_connect(c, r, tc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_initialize_system(*tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
}

static tpu_status compile_model(tpu_model *m)
{
    tpu_compile_options co;
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.batch_size = BATCH;
    return tpu_model_compile(m, &co);
}

Test(chaos, hbm_pressure_makes_a_compile_fail_naming_it, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;

    connect_init(c, &r, &tc);
    tpu_fault f = {.kind = TPU_FAULT_HBM, .percent = 100};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &f), TPU_OK, "%s", tpu_last_error());
    build_model(tc, &s, &ds, &m);
    cr_assert_eq(compile_model(m), TPU_RESOURCE_EXHAUSTED, "the compile fitted in a full HBM: %s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "h0/1") && strstr(tpu_last_error(), "chaos: HBM pressure"),
              "the out-of-memory error does not name the core and the pressure: %s", tpu_last_error());
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, a_fault_waits_for_its_training_step, .timeout = 180)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    int scale = cl_time_scale();

    connect_init(c, &r, &tc);
    /* h0/1 dies once it has finished step 6 of the 8 x 4 this fit would run */
    tpu_fault f = {.kind = TPU_FAULT_KILL, .at_step = 6};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &f), TPU_OK, "%s", tpu_last_error());
    build_model(tc, &s, &ds, &m);
    cr_assert_eq(compile_model(m), TPU_OK, "%s", tpu_last_error());
    memset(&fo, 0, sizeof fo);
    fo.epochs = 4;
    tpu_status st = tpu_model_fit(m, ds, &fo, &h);
    cr_assert_neq(st, TPU_OK, "the fit went on through the kill of h0/1");
    cr_assert(strstr(tpu_last_error(), "h0/1"), "the error does not name h0/1: %s", tpu_last_error());
    cr_assert(cluster_wait_exit(&c->workers[1], 10000 * scale), "h0/1 still runs");
    cr_assert(WIFSIGNALED(c->workers[1].status) && WTERMSIG(c->workers[1].status) == SIGKILL);
    cr_assert(cl_wait_log(&c->workers[1], "when=\"after step 6\"", 1000), "see %s", c->workers[1].log);
    cr_assert_leq(tpu_model_step(m), 6, "the client saw %llu steps done", (unsigned long long)tpu_model_step(m));
    tpu_history_free(h);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* ---- preemption and maintenance, with Cloud TPU's health names ---- */

/* Core host/core's info and health from a fresh spec: 1 if listed. */
static int core_health_of(cluster *c, const char *host, int core, tpu_core_info *ci, tpu_core_health *h,
                          tpu_health *node)
{
    tpu_cluster_spec *s = cluster_spec(c);
    int found = 0;
    cr_assert_not_null(s, "no cluster spec");
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s) && !found; i++) {
        tpu_cluster_spec_core(s, i, ci);
        if (!strcmp(ci->host_id, host) && ci->core == core) {
            cr_assert_eq(tpu_cluster_spec_core_health(s, i, h), TPU_OK, "%s", tpu_last_error());
            found = 1;
        }
    }
    if (node)
        *node = tpu_cluster_spec_health(s);
    ci->host_id = NULL; /* the spec's strings go with it */
    tpu_cluster_spec_free(s);
    return found;
}

static void init_system(tpu_cluster *tc, uint32_t expect)
{
    tpu_topology *tp;
    tpu_init_options io = {.expect = expect, .timeout_ms = 15000, .allow_partial = 0};
    cr_assert_eq(tpu_initialize_system(tc, &io, &tp), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(tp);
}

/* Cloud TPU: a preemptible node gets a notice, then is terminated; the node
 * lists state PREEMPTED. */
Test(chaos, preempt_gives_a_notice_then_the_core_is_preempted, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_core_info ci;
    tpu_core_health h;
    tpu_health node;
    int scale = cl_time_scale();
    uint32_t notice = 4000u * (uint32_t)scale;

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    init_system(tc, 2);
    int64_t t0 = cl_now_ms();
    tpu_fault f = {.kind = TPU_FAULT_PREEMPT, .notice_ms = notice};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &f), TPU_OK, "%s", tpu_last_error());
    /* the notice reaches the resolver by the worker's next heartbeat (at
     * once), while the core still runs: seen long before it runs out */
    do
        cr_assert(core_health_of(c, "h0", 1, &ci, &h, NULL));
    while (ci.state == TPU_CORE_READY && ci.notice.kind == TPU_NOTICE_NONE && cl_now_ms() - t0 < (int64_t)notice);
    cr_assert_eq(ci.state, TPU_CORE_READY, "h0/1 is %s before its notice was listed", tpu_core_state_name(ci.state));
    cr_assert_eq(ci.notice.kind, TPU_NOTICE_PREEMPTION, "h0/1 lists no preemption notice");
    cr_assert_leq(ci.notice.event_in_ms, notice);
    cr_assert_eq(h.health, TPU_HEALTHY, "%s", tpu_health_name(h.health));
    cr_assert(strstr(h.details, "preemption notice: terminated in "), "%s", h.details);
    /* the worker terminates when the notice runs out, not before, with status 4 */
    cr_assert(cluster_wait_exit(&c->workers[1], (int)notice + 10000), "h0/1's worker still runs");
    cr_assert_geq(cl_now_ms() - t0, (int64_t)notice, "h0/1's worker ended before its notice ran out");
    cr_assert(WIFEXITED(c->workers[1].status) && WEXITSTATUS(c->workers[1].status) == 4,
              "h0/1's worker ended with status %#x, not exit 4", c->workers[1].status);
    cr_assert(cl_log_contains(&c->workers[1], "preemption notice: this core is terminated"), "see %s",
              c->workers[1].log);
    cr_assert(cl_log_contains(&c->workers[1], "preempted: this core terminates now"), "see %s", c->workers[1].log);
    /* listed PREEMPTED at once (it said so when it left), not forgotten, not DEAD */
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_PREEMPTED, 2000), "h0/1 is not listed PREEMPTED");
    cr_assert(core_health_of(c, "h0", 1, &ci, &h, &node));
    cr_assert_eq(h.health, TPU_HEALTH_UNSPECIFIED, "%s", tpu_health_name(h.health));
    cr_assert(strstr(h.details, "preempted"), "%s", h.details);
    cr_assert_neq(node, TPU_HEALTHY);
    cr_assert_eq(cluster_core_state(c, "h0", 0, NULL), TPU_CORE_READY, "the other core was hit too");
    /* an initialize that needs it names it */
    tpu_topology *tp = NULL;
    tpu_init_options io = {.expect = 2, .timeout_ms = 300, .allow_partial = 0};
    cr_assert_eq(tpu_initialize_system(tc, &io, &tp), TPU_NOT_FOUND, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "h0/1 (preempted)"), "%s", tpu_last_error());
    /* a worker started again on the key takes it over */
    cluster_restart_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_IDLE, 10000 * scale), "h0/1 did not come back");
    init_system(tc, 2);
    cr_assert(core_health_of(c, "h0", 1, &ci, &h, &node));
    cr_assert_eq(h.health, TPU_HEALTHY, "%s: %s", tpu_health_name(h.health), h.details);
    cr_assert_eq(node, TPU_HEALTHY);
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* Cloud TPU: a maintenance event comes with a notice; during it the node is
 * UNHEALTHY_MAINTENANCE; afterwards its cores have restarted. */
Test(chaos, maintenance_takes_the_core_down_and_it_comes_back_restarted, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_core_info ci;
    tpu_core_health h;
    tpu_health node;
    int scale = cl_time_scale();
    uint32_t pid0 = (uint32_t)c->workers[0].pid, pid = 0;

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    init_system(tc, 2);
    tpu_fault f = {.kind = TPU_FAULT_MAINTENANCE, .notice_ms = 300, .duration_ms = 6000u * (uint32_t)scale};
    /* a model trained before the event */
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_fit_options fo;
    tpu_history *hist = NULL;
    build_model(tc, &s, &ds, &m);
    cr_assert_eq(compile_model(m), TPU_OK, "%s", tpu_last_error());
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    cr_assert_eq(tpu_model_fit(m, ds, &fo, &hist), TPU_OK, "%s", tpu_last_error());
    tpu_history_free(hist);
    hist = NULL;
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    int64_t end = cl_now_ms() + 5000 * scale;
    do
        cr_assert(core_health_of(c, "h0", 0, &ci, &h, &node));
    while (ci.state != TPU_CORE_MAINTENANCE && cl_now_ms() < end);
    cr_assert_eq(ci.state, TPU_CORE_MAINTENANCE, "h0/0 was not listed MAINTENANCE (%s)", tpu_core_state_name(ci.state));
    cr_assert_eq(h.health, TPU_UNHEALTHY_MAINTENANCE, "%s", tpu_health_name(h.health));
    cr_assert_eq(node, TPU_UNHEALTHY_MAINTENANCE, "%s", tpu_health_name(node));
    cr_assert(ci.notice.under_way && ci.notice.kind == TPU_NOTICE_MAINTENANCE);
    cr_assert(strstr(h.details, "maintenance event: down for "), "%s", h.details);
    /* work is refused while it is down */
    tpu_topology *tp = NULL;
    tpu_init_options io = {.expect = 2, .timeout_ms = 300, .allow_partial = 0};
    cr_assert_eq(tpu_initialize_system(tc, &io, &tp), TPU_NOT_FOUND, "an initialize used the core in maintenance");
    cr_assert(strstr(tpu_last_error(), "h0/0 (down for maintenance)"), "%s", tpu_last_error());
    cr_assert(cl_wait_log(&c->workers[0], "maintenance event: this core leaves its system", 2000), "see %s",
              c->workers[0].log);
    /* back by itself, the same process, restarted: out of the initialized system */
    cr_assert(cluster_wait_core_state(c, "h0", 0, TPU_CORE_IDLE, 15000 * scale), "h0/0 did not come back");
    cluster_core_state(c, "h0", 0, &pid);
    cr_assert_eq(pid, pid0, "h0/0 came back as another process");
    cr_assert(core_health_of(c, "h0", 0, &ci, &h, &node));
    cr_assert_eq(h.health, TPU_UNHEALTHY_TENSORFLOW, "%s: %s", tpu_health_name(h.health), h.details);
    cr_assert(strstr(h.details, "restarted"), "%s", h.details);
    cr_assert_eq(ci.notice.kind, TPU_NOTICE_NONE, "the notice is still listed after the maintenance");
    cr_assert(cl_log_contains(&c->workers[0], "maintenance over: the core is back, restarted"));
    /* the restart lost the model it had compiled, as a restarted TPU worker loses
     * its programs: a step on it is UNAVAILABLE (worth initializing again, which
     * elastic fit and --recover do), naming the core and why */
    fo.epochs = 2;
    cr_assert_eq(tpu_model_fit(m, ds, &fo, &hist), TPU_UNAVAILABLE, "a fit on the restarted core: %s",
                 tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "h0/0") && strstr(tpu_last_error(), "it was reset since"),
              "the error does not name h0/0 and its reset: %s", tpu_last_error());
    tpu_history_free(hist);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    /* initialized again, everything is healthy */
    init_system(tc, 2);
    cr_assert(core_health_of(c, "h0", 0, &ci, &h, &node));
    cr_assert_eq(node, TPU_HEALTHY, "%s", tpu_health_name(node));
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(chaos, bad_notices_are_refused_whole, .timeout = 60)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_core_info ci;
    tpu_core_health h;

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    struct {
        tpu_fault f;
        tpu_status want;
        const char *says;
    } bad[] = {
        {{.kind = TPU_FAULT_PREEMPT, .duration_ms = 10}, TPU_INVALID_ARGUMENT, "fault 'preempt' takes a notice"},
        {{.kind = TPU_FAULT_PREEMPT, .notice_ms = 600001}, TPU_INVALID_ARGUMENT, "fault 'preempt' takes a notice"},
        {{.kind = TPU_FAULT_MAINTENANCE, .notice_ms = 10}, TPU_INVALID_ARGUMENT, "needs a duration (the window)"},
        {{.kind = TPU_FAULT_KILL, .notice_ms = 10}, TPU_INVALID_ARGUMENT, "fault 'kill' takes no notice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &bad[i].f), bad[i].want, "case %zu: %s", i, tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad[i].says), "case %zu: %s", i, tpu_last_error());
    }
    /* one notice at a time: a second is refused, the first stays */
    tpu_fault first = {.kind = TPU_FAULT_MAINTENANCE, .notice_ms = 600000, .duration_ms = 1000};
    tpu_fault second = {.kind = TPU_FAULT_PREEMPT, .notice_ms = 1000};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &first), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &second), TPU_FAILED_PRECONDITION, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "a maintenance notice is already pending"), "%s", tpu_last_error());
    /* nothing of the refused ones: h0/1 has no notice, h0/0 only the maintenance one */
    int64_t end = cl_now_ms() + 5000 * cl_time_scale();
    do {
        cr_assert(core_health_of(c, "h0", 0, &ci, &h, NULL));
    } while (ci.notice.kind == TPU_NOTICE_NONE && cl_now_ms() < end);
    cr_assert_eq(ci.notice.kind, TPU_NOTICE_MAINTENANCE);
    cr_assert(core_health_of(c, "h0", 1, &ci, &h, NULL));
    cr_assert_eq(ci.notice.kind, TPU_NOTICE_NONE);
    cr_assert(cl_wait_log(&c->workers[0], "maintenance notice", 1000));
    cr_assert_not(cl_log_contains(&c->workers[0], "preemption notice"), "a refused notice was given");
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* ---- scenario files ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* The "line N: ..." lines of tpuctl chaos --scenario's output, as one string. */
static void plan_of(const char *out, char *plan, size_t n)
{
    size_t len = 0;
    plan[0] = 0;
    for (const char *p = strstr(out, "line "); p && len < n; p = strstr(p + 1, "\nline ")) {
        const char *s = *p == '\n' ? p + 1 : p, *e = strchr(s, '\n');
        int k = snprintf(plan + len, n - len, "%.*s\n", (int)(e ? e - s : (long)strlen(s)), s);
        len += k > 0 ? (size_t)k : 0;
    }
}

Test(chaos, scenario_is_checked_whole_and_replays_with_its_seed, .timeout = 120)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    char path[600], bad[600], plan1[4096], plan2[4096];
    run_result r;

    snprintf(path, sizeof path, "%s/scenario.txt", cl_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.txt", cl_tmpdir());
    /* far in the future: scheduled now, nothing happens during the test */
    write_file(path, "# replayable\nseed 11\n"
                     "at 600000ms slow random-core 50 1000\n"
                     "at step 1000000 preempt random-host notice=4000\n"
                     "at 3600000ms maintenance random-core 2000 notice=500\n");
    /* a bad line anywhere: refused naming it, nothing injected, not even the good lines before it */
    write_file(bad, "at 600000ms slow h0/0 50\nat 600000ms pause h0/1\n");
    cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", bad, NULL);
    cr_assert_eq(r.code, 2, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "bad.txt:2: pause needs a duration in ms"), "%s", r.err);
    run_result_free(&r);
    for (int i = 0; i < 4; i++)
        cr_assert_not(cl_log_contains(&c->workers[i], "fault scheduled"), "a fault of a refused scenario was injected");

    cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, NULL);
    cr_assert_eq(r.code, 0, "exit %d: %s %s", r.code, r.out, r.err);
    cr_assert(strstr(r.out, "seed 11: 3 faults"), "%s", r.out);
    plan_of(r.out, plan1, sizeof plan1);
    run_result_free(&r);
    /* a random host's cores are one host's: two lines for the preempt */
    cr_assert(strstr(plan1, "line 4: preempt on core h0/0") ? strstr(plan1, "line 4: preempt on core h0/1") != NULL
                                                              : strstr(plan1, "line 4: preempt on core h1/1") != NULL,
              "%s", plan1);
    /* the same seed on the same cluster: the same cores (the workers refuse nothing: the slow and the notices wait) */
    cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, "--seed", "11", NULL);
    plan_of(r.out, plan2, sizeof plan2);
    int code = r.code;
    run_result_free(&r);
    cr_assert_eq(code, 0);
    cr_assert_str_eq(plan1, plan2, "the replay picked other cores");
    /* every fault is on its worker's schedule */
    int scheduled = 0;
    for (int i = 0; i < 4; i++)
        scheduled += cl_log_contains(&c->workers[i], "fault scheduled");
    cr_assert_geq(scheduled, 2, "%d workers logged a scheduled fault", scheduled);
    cluster_free(c);
}

/* ---- the resolver itself ---- */

Test(chaos, resolver_pause_and_kill, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    int scale = cl_time_scale();
    pid_t rpid = c->resolver.pid;

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    init_system(tc, 2);
    /* only kill and pause, at once */
    tpu_fault bad = {.kind = TPU_FAULT_SLOW, .percent = 50};
    cr_assert_eq(tpu_inject_resolver_fault(tc, &bad), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "the resolver takes the faults kill and pause"), "%s", tpu_last_error());
    tpu_fault later = {.kind = TPU_FAULT_KILL, .delay_ms = 1000};
    cr_assert_eq(tpu_inject_resolver_fault(tc, &later), TPU_INVALID_ARGUMENT);
    cr_assert_eq(proc_state(rpid) == 'T' || !cluster_alive(&c->resolver), 0, "a refused fault was done");

    /* a hung resolver: stopped, then the same process answers again, the system still initialized */
    tpu_fault pause = {.kind = TPU_FAULT_PAUSE, .duration_ms = 3000u * (uint32_t)scale};
    cr_assert_eq(tpu_inject_resolver_fault(tc, &pause), TPU_OK, "%s", tpu_last_error());
    cr_assert(wait_state(rpid, 'T', 2000 * scale), "the resolver (pid %d) was not stopped (state '%c')", (int)rpid,
              proc_state(rpid));
    cr_assert(cl_wait_log(&c->resolver, "fault injected: every thread of the resolver stops", 1000));
    int64_t end = cl_now_ms() + 15000 * scale;
    while (proc_state(rpid) == 'T' && cl_now_ms() < end) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_neq(proc_state(rpid), 'T', "the resolver is still stopped");
    cr_assert(cluster_wait_count(c, TPU_CORE_READY, 2, 10000 * scale), "the cores are not READY after the pause");
    cr_assert_eq(c->resolver.pid, rpid);

    /* a crashed resolver: SIGKILL; started again, the workers register by their next heartbeats */
    tpu_fault kill = {.kind = TPU_FAULT_KILL};
    end = cl_now_ms() + 5000 * scale; /* the pause's grace: a second fault waits for it */
    tpu_status st;
    while ((st = tpu_inject_resolver_fault(tc, &kill)) == TPU_FAILED_PRECONDITION && cl_now_ms() < end) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(st, TPU_OK, "%s", tpu_last_error());
    cr_assert(cluster_wait_exit(&c->resolver, 5000 * scale), "the resolver still runs after the kill");
    cr_assert(WIFSIGNALED(c->resolver.status) && WTERMSIG(c->resolver.status) == SIGKILL,
              "the resolver ended with status %#x, not by SIGKILL", c->resolver.status);
    cluster_restart_resolver(c);
    cr_assert(cluster_wait_count(c, TPU_CORE_READY, 2, 10000 * scale), "the cores did not come back to the resolver");
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* ---- clock skew ---- */

/* With a cluster token, messages carry their sender's wall clock and a
 * daemon refuses those more than 60 s off (auth.h): a worker whose clock is
 * 2 minutes fast is refused by the resolver and goes dead, then comes back
 * when its clock is right again;10 s fast changes nothing. */
Test(chaos, clock_skew_beyond_the_window_cuts_a_core_off, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .token = 1};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *tc;
    int scale = cl_time_scale();
    run_result rr;

    cr_assert_eq(cluster_connect(c, &r, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault bad = {.kind = TPU_FAULT_SKEW, .skew_ms = 3600001};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &bad), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "fault 'skew' needs a skew from"), "%s", tpu_last_error());
    /* within the window (fast: a slow clock would date its messages before the resolver started) nothing changes */
    cluster_tpuctl(c, &rr, 10000, "chaos", "skew", "h0/0", "10000", NULL);
    cr_assert_eq(rr.code, 0, "exit %d: %s", rr.code, rr.err);
    run_result_free(&rr);
    /* beyond it, for a while */
    tpu_fault skew = {.kind = TPU_FAULT_SKEW, .skew_ms = 120000, .duration_ms = 4000u * (uint32_t)scale};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &skew), TPU_OK, "%s", tpu_last_error());
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 4000 * scale),
              "the resolver did not cut off h0/1, whose clock is 2 minutes fast");
    cr_assert(cl_wait_log(&c->workers[1], "heartbeat refused", 2000), "see %s", c->workers[1].log);
    cr_assert(cl_log_contains(&c->workers[1], "fault injected: this worker's clock is off"));
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_IDLE, 15000 * scale), "h0/1 did not come back");
    cr_assert(cl_log_contains(&c->workers[1], "fault over: this worker's clock is right again"));
    cr_assert_eq(cluster_core_state(c, "h0", 0, NULL), TPU_CORE_IDLE, "h0/0, 10 s fast, was cut off too");
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* ---- waiting faults: listed, cancelled, and not outliving the system ---- */

static size_t waiting(tpu_cluster *tc, const char *host, int core, tpu_scheduled_fault *l)
{
    size_t n = 99;
    cr_assert_eq(tpu_list_faults(tc, host, core, l, 16, sizeof *l, &n), TPU_OK, "%s", tpu_last_error());
    return n;
}

/* Faults waiting for a delay or a step are listed with their ids and can be
 * cancelled one by one or all at once; 16 far-future faults no longer lock a
 * core's slots for good; a new system cancels the faults waiting for a step
 * (their steps counted another run's) unless the initialize keeps them, and
 * keeps the faults waiting for their time. tpuctl chaos list / cancel show
 * the same. */
Test(chaos, waiting_faults_are_listed_cancelled_and_cleared_by_initialize, .timeout = 120)
{
    cluster *c = start2();
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_scheduled_fault l[16];
    size_t n;
    connect_init(c, &r, &tc);

    tpu_fault step = {.kind = TPU_FAULT_PREEMPT, .at_step = 3, .notice_ms = 1000};
    tpu_fault later = {.kind = TPU_FAULT_SLOW, .percent = 50, .duration_ms = 1000, .delay_ms = 3600000};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &step), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &later), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(waiting(tc, "h0", 0, l), 2);
    cr_assert_eq(l[0].kind, TPU_FAULT_PREEMPT);
    cr_assert_eq(l[0].at_step, 3u);
    cr_assert_eq(l[0].notice_ms, 1000u);
    cr_assert_eq(l[1].kind, TPU_FAULT_SLOW);
    cr_assert_eq(l[1].at_step, 0u);
    cr_assert(l[1].due_in_ms > 3000000u && l[1].due_in_ms <= 3600000u, "due in %u ms", l[1].due_in_ms);
    cr_assert_neq(l[0].id, l[1].id);
    cr_assert_eq(waiting(tc, "h0", 1, l), 0, "the other core has none");

    /* the CLI lists them too */
    run_result rr;
    cluster_tpuctl(c, &rr, 10000, "chaos", "list", "h0", NULL);
    cr_assert_eq(rr.code, 0, "exit %d: %s", rr.code, rr.err);
    cr_assert(strstr(rr.out, "preempt") && strstr(rr.out, "after step 3") && strstr(rr.out, "slow"), "%s", rr.out);
    run_result_free(&rr);

    /* a new system before any step: the step's fault waits for the coming run */
    tpu_topology *topo;
    tpu_init_options io = {.expect = 2, .timeout_ms = 10000u * (uint32_t)cl_time_scale()};
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    cr_assert_eq(waiting(tc, "h0", 0, l), 2, "a fault scheduled before its run was cancelled");
    /* a run that ends before step 1000, then a new system: the step's fault
     * is cancelled (its run is over), the timed one stays */
    step.at_step = 1000;
    cr_assert_eq(tpu_cancel_faults(tc, "h0", 0, l[0].id, NULL), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &step), TPU_OK, "%s", tpu_last_error());
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_fit_options fo = {.epochs = 1};
    build_model(tc, &s, &ds, &m);
    cr_assert_eq(compile_model(m), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_fit(m, ds, &fo, NULL), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    cr_assert_eq(waiting(tc, "h0", 0, l), 1);
    cr_assert_eq(l[0].kind, TPU_FAULT_SLOW, "the timed fault stays");
    cr_assert(cl_log_contains(&c->workers[0], "scheduled fault cancelled"), "see %s", c->workers[0].log);
    uint32_t slow_id = l[0].id;
    /* unless asked to keep them */
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &step), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(compile_model(m), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_fit(m, ds, &fo, NULL), TPU_OK, "%s", tpu_last_error());
    io.keep_scheduled_faults = 1;
    cr_assert_eq(tpu_initialize_system(tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    cr_assert_eq(waiting(tc, "h0", 0, l), 2, "kept");
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);

    /* cancel one by id; an id that waits nowhere is NOT_FOUND naming it */
    size_t k = 0;
    cr_assert_eq(tpu_cancel_faults(tc, "h0", 0, slow_id, &k), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(k, 1u);
    cr_assert_eq(waiting(tc, "h0", 0, l), 1);
    cr_assert_eq(l[0].kind, TPU_FAULT_PREEMPT);
    cr_assert_eq(tpu_cancel_faults(tc, "h0", 0, slow_id, &k), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), "id"), "%s", tpu_last_error());

    /* 16 far-future faults fill the core's slots; cancel all frees them */
    tpu_status st;
    while ((st = tpu_inject_fault(tc, "h0", 1, &later)) == TPU_OK && waiting(tc, "h0", 1, l) < 16)
        ;
    cr_assert_eq(waiting(tc, "h0", 1, l), 16);
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &later), TPU_RESOURCE_EXHAUSTED, "%s", tpu_last_error());
    cluster_tpuctl(c, &rr, 10000, "chaos", "cancel", "all", NULL);
    cr_assert_eq(rr.code, 0, "exit %d: %s", rr.code, rr.err);
    cr_assert(strstr(rr.out, "cancelled 16 waiting faults on core h0/1"), "%s", rr.out);
    cr_assert(strstr(rr.out, "cancelled 1 waiting fault on core h0/0"), "%s", rr.out);
    run_result_free(&rr);
    n = waiting(tc, "h0", 1, l);
    cr_assert_eq(n, 0);
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &later), TPU_OK, "%s", tpu_last_error());
    (void)st;
    tpu_cluster_free(tc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* What a worker would refuse part way through a scenario is found before the
 * first fault goes out: a link from a core to itself, two pauses of one core
 * whose times overlap, more than 16 faults waiting on a core (counting those
 * already there). Each is refused naming its line, and no worker logs a
 * fault. */
Test(chaos, scenario_is_checked_against_the_cores_before_injecting, .timeout = 120)
{
    cluster *c = start2();
    char path[600], text[4096];
    run_result r;
    size_t len;
    static const struct {
        const char *body, *want;
    } bad[] = {
        {"at 600000ms slow h0/0 50\nat 600000ms link-delay h0/1 h0/1 10 1000\n", "scen.txt:2: link-delay from core "
                                                                                  "h0/1 to itself"},
        {"at 600000ms slow h0/0 50\nat 0ms pause h0/1 2000\nat 1500ms pause h0/1 1000\n",
         "scen.txt:3: pause of core h0/1 at 1500 ms overlaps the pause of line 2"},
        {NULL, "scen.txt:18: core h0/0 would have 17 faults waiting, at most 16"},
    };
    snprintf(path, sizeof path, "%s/scen.txt", cl_tmpdir());
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].body) {
            write_file(path, bad[i].body);
        } else {
            len = (size_t)snprintf(text, sizeof text, "at 600000ms slow h0/1 50\n");
            for (int k = 0; k < 17; k++)
                len += (size_t)snprintf(text + len, sizeof text - len, "at %dms slow h0/0 50\n", 600000 + k);
            write_file(path, text);
        }
        cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, NULL);
        cr_assert_eq(r.code, 1, "case %zu: exit %d: %s %s", i, r.code, r.out, r.err);
        cr_assert(strstr(r.err, bad[i].want), "case %zu: '%s' not in: %s", i, bad[i].want, r.err);
        cr_assert(strstr(r.err, "nothing injected"), "%s", r.err);
        run_result_free(&r);
        for (int k = 0; k < 2; k++)
            cr_assert_not(cl_log_contains(&c->workers[k], "fault scheduled") ||
                              cl_log_contains(&c->workers[k], "fault injected"),
                          "case %zu: a fault of a refused scenario was injected (see %s)", i, c->workers[k].log);
    }
    /* with 15 waiting on h0/0 already, a scenario of two more is refused too */
    tpu_resolver *rs;
    tpu_cluster *tc;
    cr_assert_eq(cluster_connect(c, &rs, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault later = {.kind = TPU_FAULT_SLOW, .percent = 50, .duration_ms = 1000, .delay_ms = 3600000};
    for (int k = 0; k < 15; k++)
        cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &later), TPU_OK, "%s", tpu_last_error());
    write_file(path, "at 600000ms slow h0/0 50\nat 600001ms slow h0/0 50\n");
    cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, NULL);
    cr_assert_eq(r.code, 1, "exit %d: %s %s", r.code, r.out, r.err);
    cr_assert(strstr(r.err, "17 faults waiting") && strstr(r.err, "15 waiting there already"), "%s", r.err);
    run_result_free(&r);
    size_t n = 0;
    cr_assert_eq(tpu_list_faults(tc, "h0", 0, NULL, 0, 0, &n), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(n, 15u, "the refused scenario left %zu faults waiting", n);
    tpu_cluster_free(tc);
    tpu_resolver_free(rs);
    cluster_free(c);
}

/* A fault for every core goes on past one that does not answer (a worker
 * stopped by the test, still listed alive: heartbeats 2 s apart, dead after
 * 30 of them) and reports each core's outcome. */
Test(chaos, all_goes_on_past_a_core_that_does_not_answer, .timeout = 120)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .heartbeat_ms = 2000, .dead_after = 30};
    cluster *c = cluster_start(&o);
    run_result r;
    cr_assert_not_null(c);
    cr_assert_eq(kill(c->workers[0].pid, SIGSTOP), 0);
    cluster_tpuctl(c, &r, 20000, "--timeout-ms", "1000", "chaos", "slow", "all", "50", "1000", NULL);
    kill(c->workers[0].pid, SIGCONT);
    cr_assert_eq(r.code, 1, "exit %d: %s %s", r.code, r.out, r.err);
    cr_assert(strstr(r.err, "UNAVAILABLE: core h0/0"), "%s", r.err);
    cr_assert(strstr(r.out, "injected slow into core h0/1"), "the core after the silent one was skipped: %s %s",
              r.out, r.err);
    run_result_free(&r);
    cr_assert(cl_wait_log(&c->workers[1], "fault injected", 5000), "see %s", c->workers[1].log);
    cluster_free(c);
}

/* Scenario text and resolver faults a careless or hostile hand writes: a NUL
 * byte is named as one (not as a long line), "5#0" is not 5 %, " 50" and
 * "+50" are not numbers, and a resolver pause with a field the resolver
 * would ignore is refused naming it. */
Test(chaos, scenario_text_and_resolver_fields_are_checked, .timeout = 60)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    char path[600];
    run_result r;
    FILE *f;

    snprintf(path, sizeof path, "%s/nul.txt", cl_tmpdir());
    cr_assert_not_null(f = fopen(path, "wb"));
    fwrite("at 600000ms slow h0/0 50\nat 0ms sl\0w h0/0 50\n", 1, 46, f);
    fclose(f);
    cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, NULL);
    cr_assert_eq(r.code, 2, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "nul.txt:2: the line holds a NUL byte") && !strstr(r.err, "longer than"), "%s", r.err);
    run_result_free(&r);
    static const char *const bad[] = {"at 600000ms slow h0/0 5#0\n", "at 600000ms slow h0/0 +50\n",
                                      "at step +3 kill h0/0\n"};
    snprintf(path, sizeof path, "%s/num.txt", cl_tmpdir());
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i]);
        cluster_tpuctl(c, &r, 10000, "chaos", "--scenario", path, NULL);
        cr_assert_eq(r.code, 2, "'%s' was taken: exit %d: %s %s", bad[i], r.code, r.out, r.err);
        run_result_free(&r);
    }
    cr_assert_not(cl_log_contains(&c->workers[0], "fault scheduled"), "see %s", c->workers[0].log);

    tpu_resolver *rs;
    tpu_cluster *tc;
    cr_assert_eq(cluster_connect(c, &rs, &tc), TPU_OK, "%s", tpu_last_error());
    tpu_fault p = {.kind = TPU_FAULT_PAUSE, .duration_ms = 100, .seed = 7};
    cr_assert_eq(tpu_inject_resolver_fault(tc, &p), TPU_INVALID_ARGUMENT, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "seed 7"), "%s", tpu_last_error());
    p.seed = 0;
    p.skew_ms = 5;
    cr_assert_eq(tpu_inject_resolver_fault(tc, &p), TPU_INVALID_ARGUMENT, "%s", tpu_last_error());
    p.skew_ms = 0;
    p.peer_host = "h0";
    cr_assert_eq(tpu_inject_resolver_fault(tc, &p), TPU_INVALID_ARGUMENT, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "peer 'h0'"), "%s", tpu_last_error());
    tpu_cluster_free(tc);
    tpu_resolver_free(rs);
    cluster_free(c);
}
