/* Integration: tpuctl output, --json, exit codes and errors; daemon flags,
 * --help, and graceful stop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include "json.h"

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

Test(cli, cluster_table, .timeout = 30)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 5000, "cluster", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cluster: 2 cores (0 ready, 2 idle, 0 dead) on 2 hosts, epoch 0, "
                            "initialized no, heartbeat 100 ms"),
              SHOW(r));
    const char *cols[] = {"HOST", "CORE", "STATE", "REPLICA", "TYPE", "HBM_USED", "HBM_PEAK", "HBM_CAP",
                          "HEARTBEAT_AGE", "PID", "CONTROL", "DATA"};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        cr_assert(strstr(r.out, cols[i]), "column %s: " SHOW(r), cols[i]);
    cr_assert(strstr(r.out, "IDLE"), SHOW(r));
    cr_assert(strstr(r.out, "16.00"), "HBM capacity in GiB with 2 decimals: " SHOW(r));
    cr_assert(strstr(r.out, "tcp://127.0.0.1:"), SHOW(r));
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)c->workers[1].pid);
    cr_assert(strstr(r.out, pid), "pid %s listed: " SHOW(r), pid);
    cr_assert_str_empty(r.err, SHOW(r));
    cr_assert_lt(r.ms, 2000, "took %lld ms", (long long)r.ms);
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, init_shutdown_output, .timeout = 30)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 10000, "init", "--expect", "4", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    /* v3, 4 cores: 2 chips -> [2, 1, 1, 2] */
    cr_assert(strstr(r.out, "TPU system initialized: epoch 1, v3, 4 cores on 2 hosts (2 tasks x 2 cores "
                            "per task), mesh [2, 1, 1, 2]"),
              SHOW(r));
    cr_assert(strstr(r.out, "REPLICA") && strstr(r.out, "TASK") && strstr(r.out, "COORDS") &&
                  strstr(r.out, "DATA"),
              SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cluster: 4 cores (4 ready, 0 idle, 0 dead) on 2 hosts, epoch 1, initialized yes"),
              SHOW(r));
    cr_assert(strstr(r.out, "READY"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "shutdown", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "TPU system shut down (epoch 2)"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, init_missing_fails, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 10000, "init", "--expect", "3", "--timeout-ms", "300", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    /* TensorFlow's initialize_tpu_system (tensorflow/python/tpu/tpu_strategy_util.py)
     * raises NotFoundError "TPUs not found in the cluster. Failed in initialization: ..." */
    cr_assert(strncmp(r.err, "NOT_FOUND: TPUs not found in the cluster. Failed in initialization: ", 68) == 0,
              SHOW(r));
    cr_assert(strstr(r.err, "2 of 3"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 10000, "init", "--expect", "3", "--timeout-ms", "300", "--allow-partial", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "2 cores on 1 hosts") || strstr(r.out, "2 cores on 1 host"), SHOW(r));
    cr_assert(strstr(r.out, "missing: "), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, json_output, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 5000, "--json", "cluster", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), "not one JSON object: " SHOW(r));
    cr_assert(strstr(r.out, "\"h0\""), SHOW(r));
    cr_assert(strstr(r.out, "IDLE"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 10000, "--json", "init", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), SHOW(r));
    cr_assert(strstr(r.out, "\"epoch\""), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "--json", "health", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), SHOW(r));
    cr_assert(strstr(r.out, "HEALTHY"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "--json", "shutdown", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "--json", "version", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), SHOW(r));
    cr_assert(strstr(r.out, TPUEMU_VERSION), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, health_ok, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2, .shared_ok = 1};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 5000, "health", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "state: READY"), SHOW(r));
    cr_assert(strstr(r.out, "health: HEALTHY"), SHOW(r));
    if (!c->external)
        cr_assert(strstr(r.out, "h0/1"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, health_no_cores, .timeout = 30)
{
    cluster_opts o = {0};
    cluster *c = cluster_start(&o);
    run_result r;
    cluster_tpuctl(c, &r, 5000, "health", NULL);
    cr_assert(strstr(r.out, "CREATING"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

/* Lines of out that start with prefix: the rows of a table. */
static int rows_starting(const char *out, const char *prefix)
{
    int n = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += strncmp(p, prefix, strlen(prefix)) == 0;
    return n;
}

/* At pod scale a listing must be readable: --host, --state, --summary and
 * health --unhealthy pick what is shown; the first line counts everything. */
Test(cli, listings_pick_hosts_and_states, .timeout = 60)
{
    cluster_opts o = {.hosts = 3, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    run_result r;

    cluster_tpuctl(c, &r, 10000, "init", "--expect", "6", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);
    cluster_kill_worker(c, 5); /* h2/1 */
    cr_assert(cluster_wait_core_state(c, "h2", 1, TPU_CORE_DEAD, 15000));

    cluster_tpuctl(c, &r, 5000, "cluster", "--host", "h1", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cluster: 6 cores (5 ready, 0 idle, 1 dead) on 3 hosts"), SHOW(r));
    cr_assert(strstr(r.out, "showing 2 of 6 cores (--host h1)"), SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h1 "), 2, SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h0 ") + rows_starting(r.out, "h2 "), 0, SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", "--state", "dead", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h2 "), 1, SHOW(r));
    cr_assert(strstr(r.out, "DEAD"), SHOW(r));
    cr_assert_null(strstr(r.out, "READY "), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", "--host", "h[02]", "--state", "ready", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h0 "), 2, SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h2 "), 1, SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", "--summary", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "HOST  CORES  READY  IDLE  DEAD"), SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h"), 3, "one row per host: " SHOW(r));
    cr_assert(strstr(r.out, "h2    2      1      0     1 "), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "--json", "cluster", "--summary", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(json_is_object(r.out), SHOW(r));
    cr_assert(strstr(r.out, "{\"host\":\"h2\",\"cores\":2,\"ready\":1,\"idle\":0,\"dead\":1,"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "health", "--unhealthy", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.out, "cores: 6, 5 healthy, 1 unhealthy (1 TIMEOUT)"), SHOW(r));
    cr_assert_eq(rows_starting(r.out, "h0/") + rows_starting(r.out, "h1/") + rows_starting(r.out, "h2/"), 1,
                 "only the unhealthy core: " SHOW(r));
    cr_assert(strstr(r.out, "h2/1  DEAD   TIMEOUT"), SHOW(r));
    cr_assert(strstr(r.err, "1 of 6 cores are unhealthy: h2/1"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "health", "--host", "h0,h1", NULL);
    cr_assert_eq(r.code, 0, "the two healthy hosts: " SHOW(r));
    cr_assert(strstr(r.out, "health: HEALTHY"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "health", "--host", "nosuchhost", NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.err, "NOT_FOUND: none of the 6 cores matches --host nosuchhost"), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 5000, "cluster", "--state", "asleep", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--state: 'asleep' is not a core state (READY, IDLE, DEAD, PREEMPTED or MAINTENANCE)"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, unreachable_resolver, .timeout = 15)
{
    char addr[64];
    run_result r;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", cl_free_port());
    const char *argv[] = {CL_TPUCTL, "--tpu", addr, "cluster", NULL};
    run_cmd(argv, NULL, 10000, &r);
    cr_assert(r.exited, "tpuctl hung");
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strncmp(r.err, "UNAVAILABLE: ", 13) == 0, SHOW(r));
    cr_assert(strstr(r.err, addr), "names the address: " SHOW(r));
    cr_assert(strstr(r.err, "nothing is listening"), SHOW(r));
    cr_assert_lt(r.ms, 1500, "fails fast: %lld ms", (long long)r.ms);
    run_result_free(&r);
}

Test(cli, tpu_name_environment, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    char env[96];
    snprintf(env, sizeof env, "TPU_NAME=grpc://%s", c->addr);
    const char *envs[] = {env, NULL};
    const char *argv[] = {CL_TPUCTL, "cluster", NULL};
    run_result r;
    run_cmd(argv, envs, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cluster: 1 cores") || strstr(r.out, "cluster: 1 core"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

Test(cli, usage_errors, .timeout = 15)
{
    run_result r;
    const char *bogus[] = {CL_TPUCTL, "frobnicate", NULL};
    run_cmd(bogus, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strncmp(r.err, "tpuctl: ", 8) == 0, SHOW(r));
    run_result_free(&r);

    const char *noarg[] = {CL_TPUCTL, NULL};
    run_cmd(noarg, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    run_result_free(&r);

    const char *badflag[] = {CL_TPUCTL, "--timeout-ms", "soon", "cluster", NULL};
    run_cmd(badflag, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--timeout-ms"), SHOW(r));
    run_result_free(&r);

    const char *badcmdflag[] = {CL_TPUCTL, "init", "--expect", "many", NULL};
    run_cmd(badcmdflag, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--expect"), SHOW(r));
    run_result_free(&r);

    const char *help[] = {CL_TPUCTL, "--help", NULL};
    run_cmd(help, NULL, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cluster") && strstr(r.out, "init") && strstr(r.out, "health"), SHOW(r));
    run_result_free(&r);

    const char *cmdhelp[] = {CL_TPUCTL, "init", "--help", NULL};
    run_cmd(cmdhelp, NULL, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "--expect") && strstr(r.out, "--allow-partial"), SHOW(r));
    run_result_free(&r);

    const char *ver[] = {CL_TPUCTL, "version", NULL};
    run_cmd(ver, NULL, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, TPUEMU_VERSION), SHOW(r));
    run_result_free(&r);
}

Test(cli, daemon_flags, .timeout = 20)
{
    run_result r;
    const char *bad[] = {CL_RESOLVER, "--heartbeat-ms", "x", NULL};
    run_cmd(bad, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "tpu-resolver: --heartbeat-ms: 'x' is not an integer"), SHOW(r));
    run_result_free(&r);

    const char *range[] = {CL_RESOLVER, "--dead-after", "0", NULL};
    run_cmd(range, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--dead-after"), SHOW(r));
    run_result_free(&r);

    const char *help[] = {CL_RESOLVER, "--help", NULL};
    run_cmd(help, NULL, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "--heartbeat-ms") && strstr(r.out, "TPUEMU_HEARTBEAT_MS"), SHOW(r));
    run_result_free(&r);

    const char *wbad[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--core", "1024", NULL};
    run_cmd(wbad, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "tpu-worker: --core"), SHOW(r));
    run_result_free(&r);

    const char *wtype[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--tpu-type", "v9", NULL};
    run_cmd(wtype, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "v9"), SHOW(r));
    run_result_free(&r);

    const char *whelp[] = {CL_WORKER, "--help", NULL};
    run_cmd(whelp, NULL, 5000, &r);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "--resolver") && strstr(r.out, "--host-id"), SHOW(r));
    run_result_free(&r);

    const char *envbad[] = {"TPUEMU_HEARTBEAT_MS=fast", NULL};
    const char *plain[] = {CL_RESOLVER, NULL};
    run_cmd(plain, envbad, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "TPUEMU_HEARTBEAT_MS"), SHOW(r));
    run_result_free(&r);
}

Test(cli, graceful_stop, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    cr_assert(cl_log_contains(&c->resolver, "auth=off"), "start-up log says auth=off");
    kill(c->workers[0].pid, SIGTERM);
    cr_assert(cluster_wait_exit(&c->workers[0], 5000), "worker did not stop on SIGTERM");
    cr_assert(WIFEXITED(c->workers[0].status) && WEXITSTATUS(c->workers[0].status) == 0,
              "worker exit status %d", c->workers[0].status);
    cr_assert(cl_log_contains(&c->workers[0], "stopped"));
    kill(c->resolver.pid, SIGTERM);
    cr_assert(cluster_wait_exit(&c->resolver, 5000), "resolver did not stop on SIGTERM");
    cr_assert(WIFEXITED(c->resolver.status) && WEXITSTATUS(c->resolver.status) == 0,
              "resolver exit status %d", c->resolver.status);
    cr_assert(cl_log_contains(&c->resolver, "stopped"));
    cluster_free(c);
}

Test(cli, stop_while_initialize_waits, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    run_result r;
    /* a pending initialize must be answered UNAVAILABLE when the resolver stops */
    const char *argv[] = {CL_TPUCTL, "--tpu", c->addr, "init", "--expect", "2", "--timeout-ms", "20000", NULL};
    pid_t killer = fork();
    cr_assert_geq(killer, 0);
    if (killer == 0) {
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
        kill(c->resolver.pid, SIGTERM);
        _exit(0);
    }
    run_cmd(argv, NULL, 15000, &r);
    waitpid(killer, NULL, 0);
    cr_assert(r.exited, "tpuctl init hung after the resolver stopped");
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.err, "UNAVAILABLE: ") && strstr(r.err, "shutting down"), SHOW(r));
    cr_assert(cluster_wait_exit(&c->resolver, 5000));
    cr_assert(WIFEXITED(c->resolver.status) && WEXITSTATUS(c->resolver.status) == 0);
    cluster_free(c);
}

/* --data-port puts the data plane on a fixed port, --advertise-data tells
 * others where to reach it; the client's collectives then use that address. */
Test(cli, data_port_and_advertise_data, .timeout = 60)
{
    cluster_opts o = {0};
    cluster *c = cluster_start(&o);
    run_result r;
    char port[16], adv[64], want[64];
    int dp = cl_free_port();
    snprintf(port, sizeof port, "%d", dp);
    snprintf(adv, sizeof adv, "127.0.0.1:%d", dp);
    const char *extra[] = {"--data-port", port, "--advertise-data", adv, NULL};
    cluster_add_worker(c, "h0", 0, extra);
    cr_assert(cluster_wait_count(c, CL_ALIVE, 1, 15000), "the worker did not register");
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    cr_assert(s && cluster_find_core(s, "h0", 0, &ci));
    cr_assert_str_eq(ci.data_addr, adv, "the resolver lists %s, not the advertised %s", ci.data_addr, adv);
    tpu_cluster_spec_free(s);
    /* the data plane really is there: an all-reduce through it, checked */
    cluster_tpuctl(c, &r, 30000, "bench", "allreduce", "--init", "--min", "4K", "--max", "4K", "--iters", "2",
                   "--warmup", "1", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_result_free(&r);

    /* a second worker cannot take the same port: it says which, and exits */
    const char *again[] = {"--data-port", port, NULL};
    int w2 = cluster_add_worker(c, "h1", 0, again);
    cr_assert(cluster_wait_exit(&c->workers[w2], 10000), "a worker on a taken --data-port kept running");
    snprintf(want, sizeof want, "cannot listen for the data plane on 127.0.0.1 port %d", dp);
    cr_assert(cl_log_contains(&c->workers[w2], want), "no '%s' in its log", want);

    const char *bad[] = {CL_WORKER, "--resolver", c->addr, "--advertise-data", "nowhere", NULL};
    run_cmd(bad, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--advertise-data: 'nowhere' is not HOST:PORT"), SHOW(r));
    run_result_free(&r);
    const char *range[] = {CL_WORKER, "--resolver", c->addr, "--data-port", "70000", NULL};
    run_cmd(range, NULL, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--data-port"), SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}

/* Where the TPU comes from is named right and shown safely: a bad
 * $TPUEMU_TPU_API is the environment's fault, not --tpu's; a \r in TPU_NAME
 * (a line ending copied from a file) is refused and shown escaped, not
 * printed raw. */
Test(cli, tpu_sources_and_paths_are_named_right, .timeout = 30)
{
    run_result r;
    const char *api[] = {"TPUEMU_TPU_API=not a host:99999", NULL};
    const char *argv[] = {CL_TPUCTL, "--tpu", "my-tpu", "cluster", NULL};
    run_cmd(argv, api, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "$TPUEMU_TPU_API") && !strstr(r.err, "--tpu:"), SHOW(r));
    run_result_free(&r);

    const char *cr[] = {"TPU_NAME=my-tpu\r", NULL};
    const char *argv2[] = {CL_TPUCTL, "cluster", NULL};
    run_cmd(argv2, cr, 5000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "my-tpu\\x0d") && !strchr(r.err, '\r'), SHOW(r));
    run_result_free(&r);
}
