/* Pod scale: 256 cores on this machine, as 32 hosts of 8, start,
 * register, initialize, run an all-reduce and a few training steps, and stop;
 * what a tool or a user would check at each step: every core listed and
 * alive, the topology's shape, every element of every replica's result, and
 * every replica's weights bitwise the same after training.
 *
 * Every daemon on its default timing: with 128 workers per CPU a worker waits
 * long for its turn to run, and the resolver stretches the heartbeat (and with
 * it the dead-core time, from which the collectives' timeouts derive) by the
 * machine's cores per CPU; the test checks it does, and that the idle pod's
 * workers together use little CPU. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "cluster.h"
#include "machine.h"
#include "raw.h"

#define HOSTS 32
#define PER_HOST 8
#define N (HOSTS * PER_HOST)
#define DIM 16
#define CLASSES 4
#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

/* Every one of the first N workers is registered under its own pid, alive. */
static int all_registered_anew(cluster *c, void *arg)
{
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    int ok = 1;
    (void)arg;
    if (!s)
        return 0;
    for (int i = 0; i < N && ok; i++)
        ok = cluster_find_core(s, c->workers[i].host, c->workers[i].core, &ci) &&
             ci.pid == (uint32_t)c->workers[i].pid &&
             (ci.state == TPU_CORE_IDLE || ci.state == TPU_CORE_READY);
    tpu_cluster_spec_free(s);
    return ok;
}

/* CPU time of every thread of pid so far (ns; schedstat counts to the ns,
 * where /proc/PID/stat's ticks miss a process that runs 100 us a second). */
static uint64_t cpu_ns(pid_t pid)
{
    char path[64];
    uint64_t sum = 0;
    struct dirent *d;
    DIR *dir;
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    if (!(dir = opendir(path)))
        return 0;
    while ((d = readdir(dir))) {
        char f[300];
        unsigned long long ns;
        FILE *fp;
        if (d->d_name[0] == '.')
            continue;
        snprintf(f, sizeof f, "/proc/%d/task/%s/schedstat", (int)pid, d->d_name);
        if ((fp = fopen(f, "r"))) {
            if (fscanf(fp, "%llu", &ns) == 1)
                sum += ns;
            fclose(fp);
        }
    }
    closedir(dir);
    return sum;
}

static uint64_t workers_cpu_ns(cluster *c)
{
    uint64_t sum = 0;
    for (int i = 0; i < N; i++)
        sum += cpu_ns(c->workers[i].pid);
    return sum;
}

static void quiet(const char *msg, void *user)
{
    (void)msg, (void)user;
}

Test(scale, pod_of_256_cores, .timeout = 900)
{
    static const char *const wargs[] = {"--trace-events", "1024", NULL};
    int mport = cl_free_port();
    char mp[16];
    snprintf(mp, sizeof mp, "%d", mport);
    const char *const rargs[] = {"--max-cores", "256", "--metrics-port", mp, NULL};
    cluster_opts o = {.hosts = HOSTS, .cores_per_host = PER_HOST, .heartbeat_ms = 1000, .dead_after = 3,
                      .worker_args = wargs, .resolver_args = rargs};
    cluster *c = cluster_start(&o);
    run_result r;
    char n[8];

    snprintf(n, sizeof n, "%d", N);
    cr_assert_eq(cluster_count(c, CL_ALIVE), N);

    /* initialize: the whole pod, 32 tasks of 8 */
    cluster_tpuctl(c, &r, 120000, "init", "--expect", n, "--timeout-ms", "60000", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "256 cores on 32 hosts (32 tasks x 8 cores per task)"), SHOW(r));
    run_result_free(&r);
    /* the heartbeat follows the machine: 32 cores a CPU keep the flag's 1 s */
    char want_hb[96];
    uint32_t hb = 1000 * machine_stretch(N, machine_cpus());
    snprintf(want_hb, sizeof want_hb, "heartbeat %u ms, dead after 3 missed", hb);
    cluster_tpuctl(c, &r, 60000, "cluster", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "256 cores (256 ready, 0 idle, 0 dead) on 32 hosts"), SHOW(r));
    cr_assert(strstr(r.out, want_hb), "want %s: " SHOW(r), want_hb);
    run_result_free(&r);

    /* the cluster console's data lists every core of the pod, READY under
     * its host, and its page (which draws a pod this size as a heat map) is
     * served */
    {
        char *body = NULL;
        int st = http_get_all(mport, "/api/cluster", &body);
        cr_assert_eq(st, 200, "GET /api/cluster: %d", st);
        int cores = 0, ready = 0;
        for (const char *q = body; (q = strstr(q, "\"replica\":")); q++)
            cores++;
        for (const char *q = body; (q = strstr(q, "\"state\":\"READY\"")); q++)
            ready++;
        cr_assert(strstr(body, "\"host\":\"h31\""), "host h31 is not in the console's data");
        free(body);
        cr_assert_eq(cores, N, "the console lists %d cores of %d", cores, N);
        cr_assert_eq(ready, N, "the console lists %d cores READY of %d", ready, N);
        cr_assert_eq(http_get_all(mport, "/", &body), 200);
        cr_assert(body && strstr(body, "console.js"), "GET / is not the console's page");
        free(body);
    }

    /* idle is idle: over three heartbeats (at least 10 s) of the initialized,
     * idle pod, the 256 workers together use under 5 % of one core (about
     * 1 % here; 1,024 idle workers on 2 CPUs measured about 1 %) */
    {
        uint64_t window_ms = 3ull * hb < 10000 ? 10000 : 3ull * hb;
        uint64_t c0 = workers_cpu_ns(c), c1;
        struct timespec ts = {(time_t)(window_ms / 1000), (long)(window_ms % 1000) * 1000000L};
        double pct;
        nanosleep(&ts, NULL);
        c1 = workers_cpu_ns(c);
        pct = (double)(c1 - c0) / 1e6 / (double)window_ms * 100.0;
        fprintf(stderr, "it_scale: %d idle workers used %.2f %% of one core over %llu ms\n", N, pct,
                (unsigned long long)window_ms);
        cr_assert(c1 > c0, "no CPU time read for the workers (is /proc/PID/task/*/schedstat there?)");
        cr_assert(pct < 5.0, "%d idle workers used %.2f %% of one core over %llu ms (at most 5 %%)", N, pct,
                  (unsigned long long)window_ms);
    }

    tpu_resolver *res;
    tpu_cluster *cc;
    cr_assert_eq(cluster_connect(c, &res, &cc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_attach_system(cc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_cluster_num_replicas(cc), N);

    /* a 4 KiB all-reduce over every replica, twice */
    enum { COUNT = 1024 };
    float **bufs = calloc(N, sizeof *bufs);
    cr_assert_not_null(bufs);
    for (int i = 0; i < N; i++)
        cr_assert_not_null(bufs[i] = malloc(COUNT * sizeof(float)));
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            for (int k = 0; k < COUNT; k++)
                bufs[i][k] = (float)(i + 1) + (float)k / 1024.0f * (float)round;
        cr_assert_eq(tpu_all_reduce(cc, (void *const *)bufs, COUNT, TPU_F32, TPU_SUM, NULL), TPU_OK, "%s",
                     tpu_last_error());
        for (int i = 0; i < N; i++)
            for (int k = 0; k < COUNT; k++) {
                float want = (float)(N * (N + 1) / 2) + (float)N * ((float)k / 1024.0f * (float)round);
                cr_assert_float_eq(bufs[i][k], want, 1e-3f * want, "round %d: replica %d element %d: %g, not %g",
                                   round, i, k, (double)bufs[i][k], (double)want);
            }
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    free(bufs);

    /* training: 3 steps of a small model, per-core batch 8 */
    enum { BATCH = 8, STEPS = 3 };
    size_t rows = (size_t)N * BATCH * STEPS;
    float *x = malloc(rows * DIM * sizeof(float));
    int32_t *y = malloc(rows * sizeof(int32_t));
    cr_assert(x && y);
    for (size_t i = 0; i < rows; i++) {
        y[i] = (int32_t)(i % CLASSES);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 31 + j * 17) % 13) / 13.0f + (j % CLASSES == (size_t)y[i]);
    }
    tpu_set_warning_handler(quiet, NULL);
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
    tpu_compile_options co;
    cr_assert_eq(tpu_strategy_new(cc, &s), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(s), N);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, rows, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, (size_t)N * BATCH, 1), TPU_OK);
    cr_assert_eq(tpu_model_new(s, DIM, &m), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(m, 32, TPU_ACT_RELU), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX), TPU_OK);
    cr_assert_eq(tpu_model_set_seed(m, 7), TPU_OK);
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.01f);
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = (size_t)N * BATCH;
    cr_assert_eq(tpu_model_compile(m, &co), TPU_OK, "%s", tpu_last_error());
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    cr_assert_eq(tpu_model_fit(m, ds, &fo, NULL), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_model_step(m), (uint64_t)STEPS);

    size_t np = tpu_model_num_params(m);
    float *w0 = malloc(np * sizeof(float)), *w = malloc(np * sizeof(float));
    cr_assert(w0 && w);
    cr_assert_eq(tpu_model_get_weights(m, 0, w0, np), TPU_OK, "%s", tpu_last_error());
    for (int i = 1; i < N; i++) {
        cr_assert_eq(tpu_model_get_weights(m, i, w, np), TPU_OK, "%s", tpu_last_error());
        cr_assert_eq(memcmp(w0, w, np * sizeof(float)), 0, "replica %d's weights differ from replica 0's", i);
    }
    free(w0);
    free(w);
    tpu_model_free(m);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    free(x);
    free(y);
    tpu_cluster_free(cc);
    tpu_resolver_free(res);

    /* every core still alive, and the resolver */
    cr_assert_eq(cluster_count(c, CL_ALIVE), N);
    cr_assert(cluster_alive(&c->resolver), "see %s", c->resolver.log);

    /* bad input at scale: a second worker claiming a held core is refused and
     * told why; one more core than --max-cores is refused with the limit named
     * and keeps trying, while the pod goes on */
    int dup = cluster_add_worker(c, "h5", 3, NULL);
    cr_assert(cluster_wait_exit(&c->workers[dup], 60000), "the second h5/3 still runs; see %s",
              c->workers[dup].log);
    cr_assert(WIFEXITED(c->workers[dup].status) && WEXITSTATUS(c->workers[dup].status) == 3,
              "exit status 3 for a duplicate core; see %s", c->workers[dup].log);
    cr_assert(cl_log_contains(&c->workers[dup], "ALREADY_EXISTS: core h5/3 is already held by a live worker"),
              "see %s", c->workers[dup].log);
    int over = cluster_add_worker(c, "h32", 0, NULL);
    cr_assert(cl_wait_log(&c->workers[over], "--max-cores", 60000), "see %s",
              c->workers[over].log);
    cr_assert(cl_log_contains(&c->workers[over], "resolver already tracks 256 cores"), "see %s",
              c->workers[over].log);
    cr_assert(cluster_alive(&c->workers[over]), "a worker refused for --max-cores keeps trying; see %s",
              c->workers[over].log);
    cluster_kill_worker(c, over);

    /* a registration storm: every worker killed and started again at once;
     * each registers anew (the resolver probes the old holders, 64 at a time,
     * and asks the rest to retry), and the pod initializes again */
    for (int i = 0; i < N; i++)
        cluster_kill_worker(c, i);
    for (int i = 0; i < N; i++)
        cluster_restart_worker(c, i);
    cr_assert(cluster_wait_until(all_registered_anew, c, NULL, 120000),
              "not every restarted worker registered again; see %s", c->resolver.log);
    cr_assert(cluster_alive(&c->resolver), "see %s", c->resolver.log);
    cluster_tpuctl(c, &r, 120000, "init", "--expect", n, "--timeout-ms", "60000", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "256 cores on 32 hosts"), SHOW(r));
    run_result_free(&r);
    cluster_tpuctl(c, &r, 60000, "health", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "cores: 256, 256 healthy, 0 unhealthy"), SHOW(r));
    run_result_free(&r);
    cluster_tpuctl(c, &r, 60000, "cluster", "--summary", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "h31   8      8      0     0 "), "one row per host, all ready: " SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}
