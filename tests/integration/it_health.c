/* Integration: health and identity: dead detection, restarts, resolver
 * restart recovery, duplicate host/core claims. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

#include "cluster.h"

/* h0/CORE is IDLE and held by workers[*idx] (core index = that worker's --core). */
static int held_idle_by(cluster *c, void *arg)
{
    int idx = *(int *)arg;
    uint32_t p = 0;
    return cluster_core_state(c, "h0", c->workers[idx].core, &p) == TPU_CORE_IDLE &&
           p == (uint32_t)c->workers[idx].pid;
}

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

Test(health, killed_worker_goes_dead_and_comes_back, .timeout = 40)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 3};
    cluster *c = cluster_start(&o);
    uint32_t old_pid = (uint32_t)c->workers[1].pid, pid = 0;
    int64_t t0 = cl_now_ms();
    cluster_kill_worker(c, 1);
    /* dead after 3 x 100 ms; allow the check interval and a margin */
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 1500), "h0/1 not DEAD within 1.5 s");
    int64_t ms = cl_now_ms() - t0;
    cr_assert_geq(ms, 200, "not dead before dead_after x heartbeat (%lld ms)", (long long)ms);

    run_result r;
    cluster_tpuctl(c, &r, 5000, "health", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.out, "health: UNHEALTHY") || strstr(r.out, "health: TIMEOUT"), SHOW(r));
    cr_assert(strstr(r.out, "TIMEOUT") && strstr(r.out, "no heartbeat for "), SHOW(r));
    cr_assert(strstr(r.out, "TIMEOUT"), SHOW(r));
    cr_assert(strstr(r.err, "UNAVAILABLE: 1 of 3 cores are unhealthy: h0/1"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", NULL);
    cr_assert(strstr(r.out, "(2 ready, 0 idle, 1 dead)") || strstr(r.out, "(0 ready, 2 idle, 1 dead)"), SHOW(r));
    run_result_free(&r);

    cluster_restart_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, CL_ALIVE, 5000), "restarted h0/1 did not re-register");
    cluster_core_state(c, "h0", 1, &pid);
    cr_assert_eq(pid, (uint32_t)c->workers[1].pid, "the new process holds the core");
    cr_assert_neq(pid, old_pid);
    cr_assert(cl_wait_log(&c->resolver, "core re-registered", 2000), "resolver logs the replacement");
    cluster_tpuctl(c, &r, 5000, "health", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(health, stopped_worker_dead_then_back, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    uint32_t pid = 0;
    cluster_signal_worker(c, 0, SIGSTOP);
    cr_assert(cluster_wait_core_state(c, "h0", 0, TPU_CORE_DEAD, 1500));
    cluster_signal_worker(c, 0, SIGCONT);
    cr_assert(cluster_wait_core_state(c, "h0", 0, CL_ALIVE, 3000), "a core that heartbeats again is back");
    cluster_core_state(c, "h0", 0, &pid);
    cr_assert_eq(pid, (uint32_t)c->workers[0].pid, "same process");
    cr_assert(cl_wait_log(&c->resolver, "core back", 2000));
    cluster_free(c);
}

Test(health, restarted_ready_core_is_idle_and_reported, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 10000, "init", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    cluster_restart_worker(c, 1);
    int idx = 1;
    cr_assert(cluster_wait_until(held_idle_by, c, &idx, 5000),
              "the restarted core is listed IDLE with its new pid");
    cluster_tpuctl(c, &r, 5000, "health", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.out, "UNHEALTHY_TENSORFLOW") && strstr(r.out, "restarted: not part of initialized system epoch 1"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(health, resolver_restart_keeps_workers, .timeout = 40)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    tpu_resolver *rr;
    tpu_cluster *cc;
    tpu_topology *t = NULL;
    cr_assert_eq(cluster_connect(c, &rr, &cc), TPU_OK);
    cr_assert_eq(tpu_initialize_system(cc, NULL, &t), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(rr);
    pid_t pids[4];
    for (int i = 0; i < 4; i++)
        pids[i] = c->workers[i].pid;

    cluster_restart_resolver(c);
    cr_assert(cluster_wait_count(c, TPU_CORE_READY, 4, 3000),
              "every worker back (and READY in epoch 1) within a few heartbeats; alive now: %d",
              cluster_count(c, CL_ALIVE));
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_eq(tpu_cluster_spec_epoch(s), 1, "the epoch is learned back from the workers");
    cr_assert(tpu_cluster_spec_initialized(s));
    for (int i = 0; i < 4; i++) {
        tpu_core_info ci;
        cr_assert(cluster_find_core(s, c->workers[i].host, c->workers[i].core, &ci));
        cr_assert_eq(ci.pid, (uint32_t)pids[i], "worker %d was not restarted", i);
        cr_assert_eq(c->workers[i].pid, pids[i]);
    }
    tpu_cluster_spec_free(s);
    cluster_free(c);
}

Test(health, duplicate_core_refused, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    int dup = cluster_add_worker(c, "h0", 0, NULL);
    cr_assert(cluster_wait_exit(&c->workers[dup], 5000), "the second worker for h0/0 must exit");
    int st = c->workers[dup].status;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "non-zero exit (status %d)", st);
    cr_assert(cl_log_contains(&c->workers[dup], "ALREADY_EXISTS"), "stderr says ALREADY_EXISTS");
    cr_assert(cl_log_contains(&c->workers[dup], "already held by a live worker"));
    uint32_t pid = 0;
    cr_assert_eq(cluster_core_state(c, "h0", 0, &pid), TPU_CORE_IDLE);
    cr_assert_eq(pid, (uint32_t)c->workers[0].pid, "the first worker keeps the core");
    cr_assert(cluster_alive(&c->workers[0]));
    cluster_free(c);
}

Test(health, hung_holder_is_replaced, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    /* the holder stops answering but is not dead yet: the probe decides */
    cluster_signal_worker(c, 0, SIGSTOP);
    int b = cluster_add_worker(c, "h0", 0, NULL);
    cr_assert(cluster_wait_until(held_idle_by, c, &b, 5000),
              "the new worker takes h0/0 from a holder that does not answer the probe");
    cr_assert(cluster_alive(&c->workers[b]));
    /* the old one wakes up: the core is held by a live worker now */
    cluster_signal_worker(c, 0, SIGCONT);
    cr_assert(cluster_wait_exit(&c->workers[0], 5000), "the displaced worker must exit");
    cr_assert(cl_log_contains(&c->workers[0], "ALREADY_EXISTS"));
    cr_assert(cluster_alive(&c->workers[b]));
    cluster_free(c);
}
