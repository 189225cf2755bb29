/* Fault injection (tpu_inject_fault, tpuctl chaos) against real daemons: a
 * pause stops every thread of the worker (the kernel shows it stopped, the
 * resolver declares the core dead) and it comes back by itself; a kill ends
 * the worker with SIGKILL; a slow-down is logged and ends by itself; HBM
 * pressure shows in the core's HBM use and is given back by itself; a fault
 * with a bad field, of an unknown kind or for a core that is not there is
 * refused with an error naming what was wrong, and nothing is injected. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <criterion/criterion.h>

#include "cluster.h"

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
    tpu_fault f = {TPU_FAULT_PAUSE, 4000u * (uint32_t)scale, 0};
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
    tpu_fault f = {TPU_FAULT_KILL, 0, 0};
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
    tpu_fault f = {TPU_FAULT_HBM, 0, 90};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    struct hbm_arg taken = {"h0", 0, 0.89, 0.91};
    cr_assert(cluster_wait_until(hbm_share_in, c, &taken, 5000 * scale), "h0/0 does not show 90 %% of its HBM in use");
    struct hbm_arg other = {"h0", 1, 0.0, 0.0};
    cr_assert(hbm_share_in(c, &other), "h0/1's HBM was taken too");
    /* a new pressure replaces the old one, for 1 s */
    f.percent = 60;
    f.duration_ms = 1000;
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &f), TPU_OK, "%s", tpu_last_error());
    struct hbm_arg less = {"h0", 0, 0.59, 0.61};
    cr_assert(cluster_wait_until(hbm_share_in, c, &less, 5000 * scale), "h0/0 does not show 60 %% in use");
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
        {{TPU_FAULT_PAUSE, 0, 0}, "'pause' needs a duration"},
        {{TPU_FAULT_PAUSE, 600001, 0}, "'pause' needs a duration"},
        {{TPU_FAULT_SLOW, 1000, 0}, "'slow' needs a percent"},
        {{TPU_FAULT_SLOW, 1000, 101}, "'slow' needs a percent"},
        {{TPU_FAULT_KILL, 5, 0}, "'kill' takes no duration"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &bad[i].f), TPU_INVALID_ARGUMENT, "case %zu: %s", i,
                     tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad[i].says) && strstr(tpu_last_error(), "h0/0"), "case %zu: %s", i,
                  tpu_last_error());
    }
    /* refused by the library: a kind that is not one, a core that is not there */
    tpu_fault nokind = {(tpu_fault_kind)9, 0, 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 0, &nokind), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "fault kind 9"), "%s", tpu_last_error());
    tpu_fault kill = {TPU_FAULT_KILL, 0, 0};
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
    tpu_fault p = {TPU_FAULT_PAUSE, 1000, 0};
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &p), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_fault(tc, "h0", 1, &p), TPU_FAILED_PRECONDITION, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "already under way"), "%s", tpu_last_error());
    cr_assert(cl_wait_log(&c->workers[1], "fault over: the process runs again", 10000 * scale));
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
