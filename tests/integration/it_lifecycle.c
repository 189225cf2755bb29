/* Integration: the cluster comes up, its spec, and the TPU system lifecycle
 * (initialize, epochs, replica order, mesh shapes, takeover, shutdown). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "cluster.h"

static tpu_cluster *connect_ok(cluster *c, tpu_resolver **r)
{
    tpu_cluster *cc;
    tpu_status st = cluster_connect(c, r, &cc);
    cr_assert_eq(st, TPU_OK, "connect to %s: %s: %s", c->addr, tpu_status_name(st), tpu_last_error());
    return cc;
}

static tpu_status init(tpu_cluster *cc, uint32_t expect, uint32_t timeout_ms, int partial,
                       tpu_topology **t)
{
    tpu_init_options o = {.expect = expect, .timeout_ms = timeout_ms, .allow_partial = partial};
    *t = NULL;
    return tpu_initialize_system(cc, &o, t);
}

static tpu_topology *init_ok(tpu_cluster *cc, uint32_t expect)
{
    tpu_topology *t;
    tpu_status st = init(cc, expect, 5000, 0, &t);
    cr_assert_eq(st, TPU_OK, "initialize: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_not_null(t);
    return t;
}

Test(lifecycle, one_worker_spec_fields, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    cr_assert_not_null(s, "%s", tpu_last_error());
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 1);
    cr_assert_eq(tpu_cluster_spec_core(s, 0, &ci), TPU_OK);
    cr_assert_str_eq(ci.host_id, "h0");
    cr_assert_eq(ci.core, 0);
    cr_assert_eq(ci.state, TPU_CORE_IDLE);
    cr_assert_str_eq(ci.tpu_type, "v3", "the worker's default type");
    cr_assert_eq(ci.hbm_capacity, 16ull << 30, "v3 has 16 GiB per core");
    cr_assert_eq(ci.hbm_used, 0);
    cr_assert_eq(ci.pid, (uint32_t)c->workers[0].pid, "pid of the worker process");
    cr_assert_eq(ci.replica_id, -1);
    cr_assert(strncmp(ci.control_addr, "tcp://127.0.0.1:", 16) == 0, "control %s", ci.control_addr);
    cr_assert(strncmp(ci.data_addr, "127.0.0.1:", 10) == 0, "data %s", ci.data_addr);
    cr_assert_str_eq(ci.version, TPUEMU_VERSION);
    cr_assert_lt(ci.heartbeat_age_ms, 1000);
    cr_assert_eq(tpu_cluster_spec_core(s, 1, &ci), TPU_OUT_OF_RANGE);
    cr_assert_eq(tpu_cluster_spec_epoch(s), 0);
    cr_assert_not(tpu_cluster_spec_initialized(s));
    cr_assert_eq(tpu_cluster_spec_heartbeat_ms(s), 100);
    cr_assert_eq(tpu_cluster_spec_dead_after(s), 3);
    tpu_cluster_spec_free(s);
    cluster_free(c);
}

Test(lifecycle, eight_workers_on_two_hosts_sorted, .timeout = 30)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 4};
    cluster *c = cluster_start(&o);
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not_null(s);
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 8);
    for (size_t i = 0; i < 8; i++) {
        tpu_core_info ci;
        char host[8];
        cr_assert_eq(tpu_cluster_spec_core(s, i, &ci), TPU_OK);
        snprintf(host, sizeof host, "h%zu", i / 4);
        cr_assert_str_eq(ci.host_id, host, "sorted by host, then core");
        cr_assert_eq(ci.core, (int)(i % 4));
        for (size_t k = 0; k < i; k++) {
            tpu_core_info o2;
            tpu_cluster_spec_core(s, k, &o2);
            cr_assert_str_neq(o2.control_addr, ci.control_addr, "each core has its own control port");
            cr_assert_str_neq(o2.data_addr, ci.data_addr, "each core has its own data port");
        }
    }
    tpu_cluster_spec_free(s);

    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    int n = 0;
    tpu_system_metadata md;
    /* num_accelerators() is per host, as TensorFlow's {'TPU': 4} (tpu_cluster_resolver.py) */
    cr_assert_eq(tpu_num_accelerators(cc, &n), TPU_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(tpu_system_metadata_get(cc, &md), TPU_OK);
    cr_assert_eq(md.num_cores, 8);
    cr_assert_eq(md.num_hosts, 2);
    cr_assert_eq(md.num_of_cores_per_host, 4);
    cr_assert_str_eq(md.tpu_type, "v3");
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, sixty_four_workers, .timeout = 120)
{
    /* 64 workers share the machine's cores (under the sanitizers too): beat
     * every 500 ms so none is declared dead just for waiting on a CPU */
    cluster_opts o = {.hosts = 8, .cores_per_host = 8, .heartbeat_ms = 500};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_cluster_spec *s;
    int64_t t0 = cl_now_ms();
    cr_assert_eq(tpu_cluster_spec_get(cc, &s), TPU_OK);
    int64_t spec_ms = cl_now_ms() - t0;
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 64);
    tpu_cluster_spec_free(s);

    t0 = cl_now_ms();
    tpu_topology *t = init_ok(cc, 64);
    int64_t init_ms = cl_now_ms() - t0;
    int shape[4];
    cr_assert_eq(tpu_topology_num_replicas(t), 64);
    cr_assert_eq(tpu_topology_mesh_shape(t, shape), 4);
    /* v3: 2 cores per chip, 32 chips -> y = 4 (largest divisor <= sqrt 32), x = 8 */
    cr_assert(shape[0] == 8 && shape[1] == 4 && shape[2] == 1 && shape[3] == 2,
              "mesh [%d, %d, %d, %d], want [8, 4, 1, 2]", shape[0], shape[1], shape[2], shape[3]);
    cr_assert_eq(tpu_topology_num_tasks(t), 8);
    cr_assert_eq(tpu_topology_num_tpus_per_task(t), 8);
    for (int i = 0; i < 64; i++) {
        tpu_topology_core tc;
        char host[8];
        cr_assert_eq(tpu_topology_core_get(t, i, &tc), TPU_OK);
        snprintf(host, sizeof host, "h%d", i / 8);
        cr_assert_str_eq(tc.host_id, host);
        cr_assert_eq(tc.core, i % 8);
        cr_assert_eq(tc.task_id, i / 8);
    }
    cr_log_info("64 workers: cluster spec %lld ms, initialize %lld ms", (long long)spec_ms,
                (long long)init_ms);
    cr_expect_lt(spec_ms, 2000, "cluster spec of 64 cores took %lld ms", (long long)spec_ms);
    cr_expect_lt(init_ms, 5000, "initialize of 64 cores took %lld ms", (long long)init_ms);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, initialize_two_hosts, .timeout = 30)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 4};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    cr_assert_eq(tpu_system_check(cc), TPU_FAILED_PRECONDITION, "nothing initialized yet");
    cr_assert(strstr(tpu_last_error(), "not initialized"), "%s", tpu_last_error());

    tpu_topology *t = init_ok(cc, 0);
    int shape[4];
    cr_assert_eq(tpu_topology_epoch(t), 1);
    cr_assert_eq(tpu_topology_num_replicas(t), 8);
    cr_assert_eq(tpu_topology_num_tasks(t), 2);
    cr_assert_eq(tpu_topology_num_tpus_per_task(t), 4);
    cr_assert_str_eq(tpu_topology_tpu_type(t), "v3");
    cr_assert_eq(tpu_topology_num_missing(t), 0);
    tpu_topology_mesh_shape(t, shape);
    /* v3-8: 4 chips of 2 cores -> [2, 2, 1, 2] */
    cr_assert(shape[0] == 2 && shape[1] == 2 && shape[2] == 1 && shape[3] == 2,
              "mesh [%d, %d, %d, %d]", shape[0], shape[1], shape[2], shape[3]);
    for (int i = 0; i < 8; i++) {
        tpu_topology_core tc;
        cr_assert_eq(tpu_topology_core_get(t, i, &tc), TPU_OK);
        cr_assert_eq(tc.replica_id, i);
        cr_assert_str_eq(tc.host_id, i < 4 ? "h0" : "h1", "a host's cores are adjacent in the ring");
        cr_assert_eq(tc.core, i % 4);
        cr_assert_eq(tc.task_id, i / 4);
        int chip = i / 2;
        cr_assert(tc.coords[0] == chip % 2 && tc.coords[1] == (chip / 2) % 2 && tc.coords[2] == 0 &&
                      tc.coords[3] == i % 2,
                  "replica %d coords [%d, %d, %d, %d]", i, tc.coords[0], tc.coords[1], tc.coords[2],
                  tc.coords[3]);
        cr_assert(strncmp(tc.data_addr, "127.0.0.1:", 10) == 0);
    }
    tpu_topology_core tc;
    cr_assert_neq(tpu_topology_core_get(t, 8, &tc), TPU_OK);
    cr_assert_neq(tpu_topology_core_get(t, -1, &tc), TPU_OK);
    cr_assert_eq(tpu_system_check(cc), TPU_OK, "%s", tpu_last_error());

    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not_null(s);
    cr_assert(tpu_cluster_spec_initialized(s));
    cr_assert_eq(tpu_cluster_spec_epoch(s), 1);
    for (size_t i = 0; i < 8; i++) {
        tpu_core_info ci;
        tpu_cluster_spec_core(s, i, &ci);
        cr_assert_eq(ci.state, TPU_CORE_READY, "%s/%d is %s", ci.host_id, ci.core,
                     tpu_core_state_name(ci.state));
        cr_assert_eq(ci.replica_id, (int)i);
    }
    tpu_cluster_spec_free(s);
    tpu_topology_free(t);

    t = init_ok(cc, 8);
    cr_assert_eq(tpu_topology_epoch(t), 2, "every initialize starts a new epoch");
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, initialize_names_missing_cores, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    cluster_add_worker(c, "h1", 0, NULL);
    cr_assert(cluster_wait_count(c, CL_ALIVE, 3, 10000));
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t;
    int64_t t0 = cl_now_ms();
    tpu_status st = init(cc, 4, 600, 0, &t);
    int64_t ms = cl_now_ms() - t0;
    /* tensorflow/python/tpu/tpu_strategy_util.py: NotFoundError "TPUs not found in
     * the cluster. Failed in initialization: ..." */
    cr_assert_eq(st, TPU_NOT_FOUND, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_null(t);
    cr_assert_geq(ms, 500, "it waits for the cores until the deadline (%lld ms)", (long long)ms);
    cr_assert_lt(ms, 3000, "and not much longer (%lld ms)", (long long)ms);
    const char *m = tpu_last_error();
    cr_assert(strncmp(m, "TPUs not found in the cluster. Failed in initialization: ", 57) == 0, "%s", m);
    cr_assert(strstr(m, "3 of 4"), "counts: %s", m);
    cr_assert(strstr(m, "h1/1 (never registered)"), "names the gap: %s", m);
    cr_assert(strstr(m, "--expect") || strstr(m, "allow-partial"), "says what to do: %s", m);

    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not(tpu_cluster_spec_initialized(s), "a failed initialize leaves nothing initialized");
    tpu_cluster_spec_free(s);

    /* with allow_partial the same call goes on with the three */
    st = init(cc, 4, 400, 1, &t);
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_eq(tpu_topology_num_replicas(t), 3);
    cr_assert_eq(tpu_topology_num_missing(t), 1);
    cr_assert(strstr(tpu_topology_missing(t, 0), "h1/1"), "missing: %s", tpu_topology_missing(t, 0));
    cr_assert_null(tpu_topology_missing(t, 1));
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* A resolver no core has registered with: TensorFlow's initialize_tpu_system
 * (tensorflow/python/tpu/tpu_strategy_util.py) raises
 * NotFoundError("TPUs not found in the cluster. Failed in initialization: "
 * + ...) when the cluster has no TPU for it; tpuemu's initialize waits up to
 * its deadline for one, then fails the same way (NOT_FOUND, TensorFlow's
 * words first), saying how many it found and what is missing. NOT_FOUND is
 * "not there yet", not a broken cluster: the same call succeeds once a worker
 * has registered, as a loop waiting for cores (the example's --recover) does. */
Test(lifecycle, initialize_without_cores_is_not_found, .timeout = 30)
{
    cluster_opts o = {.hosts = 0, .cores_per_host = 0};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t;
    int64_t t0 = cl_now_ms();
    tpu_status st = init(cc, 0, 400, 0, &t);
    int64_t ms = cl_now_ms() - t0;
    cr_assert_eq(st, TPU_NOT_FOUND, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_null(t);
    const char *m = tpu_last_error();
    const char *tf = "TPUs not found in the cluster. Failed in initialization: ";
    cr_assert(strncmp(m, tf, strlen(tf)) == 0, "TensorFlow's words first: %s", m);
    cr_assert(strstr(m, "0 of 1 expected cores alive after 0.4 s"), "counts: %s", m);
    cr_assert(strstr(m, "missing: 1 more not yet seen"), "names the gap: %s", m);
    cr_assert_geq(ms, 350, "it waits for a core until the deadline (%lld ms)", (long long)ms);

    /* a loop waiting for cores goes on through NOT_FOUND and gets one */
    cluster_add_worker(c, "h0", 0, NULL);
    int tries = 0;
    do {
        st = init(cc, 1, 1000, 0, &t);
        tries++;
    } while (st == TPU_NOT_FOUND && tries < 20);
    cr_assert_eq(st, TPU_OK, "after %d tries: %s: %s", tries, tpu_status_name(st), tpu_last_error());
    cr_assert_eq(tpu_topology_num_replicas(t), 1);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, initialize_names_dead_cores, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 3};
    cluster *c = cluster_start(&o);
    cluster_kill_worker(c, 1);
    cr_assert(cluster_wait_core_state(c, "h0", 1, TPU_CORE_DEAD, 3000), "h0/1 never marked DEAD");
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t;
    /* a default initialize never waits for a core that is gone; it
     * goes on at once with the alive ones and names the dead one as missing */
    int64_t t0 = cl_now_ms();
    tpu_status st = init(cc, 0, 5000, 0, &t);
    int64_t ms = cl_now_ms() - t0;
    cr_assert_eq(st, TPU_OK, "expect 0 goes on without the dead core: %s: %s",
                 tpu_status_name(st), tpu_last_error());
    cr_assert_lt(ms, 2500, "and does not wait for it until the deadline (%lld ms)", (long long)ms);
    cr_assert_eq(tpu_topology_num_replicas(t), 2);
    cr_assert_eq(tpu_topology_num_missing(t), 1);
    cr_assert(strstr(tpu_topology_missing(t, 0), "h0/1 (dead"), "missing: %s",
              tpu_topology_missing(t, 0));
    tpu_topology_free(t);
    /* a count says "wait for them": expect 3 fails naming the dead core */
    st = init(cc, 3, 300, 0, &t);
    cr_assert_eq(st, TPU_NOT_FOUND, "%s", tpu_status_name(st));
    cr_assert(strstr(tpu_last_error(), "h0/1 (dead"), "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "2 of 3"), "%s", tpu_last_error());
    /* expect 2: the two alive ones are enough */
    st = init(cc, 2, 2000, 0, &t);
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), tpu_last_error());
    tpu_topology_core tc;
    tpu_topology_core_get(t, 1, &tc);
    cr_assert_eq(tc.core, 2, "the dead core is skipped in the ring");
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, second_client_takes_over, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    tpu_resolver *ra, *rb;
    tpu_cluster *a = connect_ok(c, &ra), *b = connect_ok(c, &rb);
    tpu_topology *ta = init_ok(a, 2), *tb;
    cr_assert_eq(tpu_system_check(a), TPU_OK);
    tb = init_ok(b, 2);
    cr_assert_eq(tpu_topology_epoch(tb), tpu_topology_epoch(ta) + 1);
    cr_assert_eq(tpu_system_check(b), TPU_OK);
    cr_assert_eq(tpu_system_check(a), TPU_FAILED_PRECONDITION);
    const char *m = tpu_last_error();
    cr_assert(strstr(m, "re-initialized by client"), "%s", m);
    cr_assert(strstr(m, "epoch 1"), "names the old epoch: %s", m);
    cr_assert(strstr(m, "initialize_system again") || strstr(m, "initialize"), "%s", m);
    /* a's shutdown must not tear down b's system */
    cr_assert_eq(tpu_shutdown_system(a), TPU_FAILED_PRECONDITION, "%s", tpu_status_name(tpu_last_status()));
    cr_assert_eq(tpu_system_check(b), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(ta);
    tpu_topology_free(tb);
    tpu_cluster_free(a);
    tpu_cluster_free(b);
    tpu_resolver_free(ra);
    tpu_resolver_free(rb);
    cluster_free(c);
}

Test(lifecycle, shutdown, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t = init_ok(cc, 2);
    cr_assert_eq(tpu_shutdown_system(cc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_system_check(cc), TPU_FAILED_PRECONDITION);
    cr_assert(strstr(tpu_last_error(), "shut down"), "%s", tpu_last_error());
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not(tpu_cluster_spec_initialized(s));
    cr_assert_eq(tpu_cluster_spec_epoch(s), 2, "shutdown starts a new epoch");
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++) {
        tpu_core_info ci;
        tpu_cluster_spec_core(s, i, &ci);
        cr_assert_eq(ci.state, TPU_CORE_IDLE);
    }
    tpu_cluster_spec_free(s);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, mesh_v2_one_host, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 8, .tpu_type = "v2"};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t = init_ok(cc, 8);
    int s[4];
    tpu_topology_mesh_shape(t, s);
    cr_assert(s[0] == 2 && s[1] == 2 && s[2] == 1 && s[3] == 2, "v2-8 mesh [%d, %d, %d, %d]", s[0], s[1],
              s[2], s[3]);
    tpu_topology_core tc;
    tpu_topology_core_get(t, 5, &tc);
    /* replica 5: chip 2 -> x 0, y 1; core on chip 1 */
    cr_assert(tc.coords[0] == 0 && tc.coords[1] == 1 && tc.coords[2] == 0 && tc.coords[3] == 1,
              "replica 5 coords [%d, %d, %d, %d]", tc.coords[0], tc.coords[1], tc.coords[2], tc.coords[3]);
    cr_assert_eq(tpu_topology_num_tasks(t), 1);
    cr_assert_str_eq(tpu_topology_tpu_type(t), "v2");
    tpu_cluster_spec *sp = cluster_spec(c);
    tpu_core_info ci;
    tpu_cluster_spec_core(sp, 0, &ci);
    cr_assert_eq(ci.hbm_capacity, 8ull << 30, "v2 has 8 GiB per core");
    tpu_cluster_spec_free(sp);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, mesh_v4_two_hosts, .timeout = 30)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 4, .tpu_type = "v4"};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t = init_ok(cc, 8);
    int s[4];
    tpu_topology_mesh_shape(t, s);
    cr_assert(s[0] == 2 && s[1] == 2 && s[2] == 2 && s[3] == 1, "v4 8 chips mesh [%d, %d, %d, %d]", s[0],
              s[1], s[2], s[3]);
    tpu_topology_core tc;
    tpu_topology_core_get(t, 7, &tc);
    cr_assert(tc.coords[0] == 1 && tc.coords[1] == 1 && tc.coords[2] == 1 && tc.coords[3] == 0,
              "replica 7 coords [%d, %d, %d, %d]", tc.coords[0], tc.coords[1], tc.coords[2], tc.coords[3]);
    tpu_topology_core_get(t, 4, &tc);
    cr_assert_eq(tc.task_id, 1);
    cr_assert_str_eq(tc.host_id, "h1");
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, mixed_generations_refused, .timeout = 30)
{
    const char *v4[] = {"--tpu-type", "v4", NULL};
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .tpu_type = "v3"};
    cluster *c = cluster_start(&o);
    int i = cluster_add_worker(c, "h1", 0, v4);
    (void)i;
    cr_assert(cluster_wait_count(c, CL_ALIVE, 2, 10000));
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t;
    tpu_status st = init(cc, 2, 2000, 0, &t);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "v3") && strstr(tpu_last_error(), "v4"), "%s", tpu_last_error());
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

struct bg_init {
    cluster *c;
    tpu_status st;
    int done;
    pthread_mutex_t mu;
};

static void *bg_init_run(void *arg)
{
    struct bg_init *b = arg;
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_topology *t = NULL;
    tpu_init_options o = {.expect = 2, .timeout_ms = 1500, .allow_partial = 0};
    if (cluster_connect(b->c, &r, &cc) == TPU_OK) {
        /* our foreground initialize may be the one in progress: retry then,
         * for up to 10 s (a count of retries alone is spent in a few ms on a
         * fast machine while the foreground is always in progress) */
        struct timespec t0, now, ms = {0, 1000000};
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            b->st = tpu_initialize_system(cc, &o, &t);
            tpu_topology_free(t);
            t = NULL;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (b->st != TPU_ABORTED || now.tv_sec - t0.tv_sec >= 10)
                break;
            nanosleep(&ms, NULL);
        }
        tpu_cluster_free(cc);
        tpu_resolver_free(r);
    } else {
        b->st = TPU_INTERNAL;
    }
    pthread_mutex_lock(&b->mu);
    b->done = 1;
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

Test(lifecycle, one_initialize_at_a_time, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    struct bg_init b = {.c = c};
    pthread_t th;
    pthread_mutex_init(&b.mu, NULL);
    cr_assert_eq(pthread_create(&th, NULL, bg_init_run, &b), 0);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    int aborted = 0;
    char msg[1024] = "";
    for (;;) {
        pthread_mutex_lock(&b.mu);
        int done = b.done;
        pthread_mutex_unlock(&b.mu);
        if (done || aborted)
            break;
        tpu_topology *t;
        tpu_status st = init(cc, 1, 100, 0, &t);
        tpu_topology_free(t);
        if (st == TPU_ABORTED) {
            aborted = 1;
            snprintf(msg, sizeof msg, "%s", tpu_last_error());
        } else { /* leave the background one room to begin its wait */
            struct timespec pause = {0, 10 * 1000000};
            nanosleep(&pause, NULL);
        }
    }
    pthread_join(th, NULL);
    cr_assert(aborted, "a second initialize while one waits must get ABORTED (the waiting one ended %s)",
              tpu_status_name(b.st));
    cr_assert(strstr(msg, "another initialize"), "%s", msg);
    cr_assert_eq(b.st, TPU_NOT_FOUND, "the waiting one ends at its deadline: %s", tpu_status_name(b.st));
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

Test(lifecycle, core_auto_assign, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 3, .auto_core = 1};
    cluster *c = cluster_start(&o);
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 3);
    for (size_t i = 0; i < 3; i++) {
        tpu_core_info ci;
        tpu_cluster_spec_core(s, i, &ci);
        cr_assert_eq(ci.core, (int)i, "the lowest free indices are assigned");
    }
    tpu_cluster_spec_free(s);
    cluster_free(c);
}

Test(lifecycle, initialize_bad_arguments, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc = connect_ok(c, &r);
    tpu_topology *t;
    cr_assert_eq(init(cc, 1, 600001, 0, &t), TPU_INVALID_ARGUMENT, "timeout over 600000 ms");
    cr_assert_eq(init(cc, 5000, 100, 0, &t), TPU_INVALID_ARGUMENT, "expect over --max-cores");
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_eq(tpu_cluster_spec_epoch(s), 0, "refused requests change nothing");
    tpu_cluster_spec_free(s);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* TPU_NAME as tensorflow/python/tpu/client/client.py reads it: a comma list
 * is every host of the slice (_environment_var_to_network_endpoints: each
 * item's grpc:// dropped, port 8470 when none); master() is the first. */
Test(lifecycle, resolver_addresses, .timeout = 10)
{
    tpu_resolver *r;
    cr_assert_eq(tpu_resolver_new("grpc://10.0.0.1:8471, h2", &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_str_eq(tpu_resolver_master(r), "grpc://10.0.0.1:8471");
    cr_assert_eq(tpu_resolver_num_endpoints(r), 2);
    cr_assert_str_eq(tpu_resolver_endpoint(r, 1), "h2:8470");
    cr_assert_null(tpu_resolver_endpoint(r, 2));
    tpu_resolver_free(r);
    cr_assert_eq(tpu_resolver_new("h:notaport", &r), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_last_status(), TPU_INVALID_ARGUMENT);
    cr_assert_str_not_empty(tpu_last_error());
}

/* A bare word in a comma list is a host with the default port, as
 * TensorFlow reads it, never a TPU name: when it does not resolve, the error
 * says how it was read and how to write it. The word is a 64-byte DNS label,
 * which no resolver accepts, so the lookup fails without leaving the machine. */
Test(lifecycle, list_word_that_does_not_resolve, .timeout = 10)
{
    char word[65], list[128];
    tpu_resolver *r;
    tpu_cluster *c = NULL;
    memset(word, 'a', 64);
    word[64] = '\0';
    snprintf(list, sizeof list, "%s, 127.0.0.1:8471", word);
    cr_assert_eq(tpu_resolver_new(list, &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_resolver_set_timeout_ms(r, 3000), TPU_OK);
    tpu_status st = tpu_connect_to_cluster(r, &c);
    cr_assert_eq(st, TPU_UNAVAILABLE, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_null(c);
    const char *msg = tpu_last_error();
    cr_assert(strstr(msg, "cannot resolve") && strstr(msg, word), "%s", msg);
    cr_assert(strstr(msg, "in the comma list") && strstr(msg, "taken as a host name with the default port 8470"), "%s",
              msg);
    cr_assert(strstr(msg, "HOST:PORT or grpc://HOST:PORT"), "%s", msg);
    tpu_resolver_free(r);

    /* with a port it is an address as written: no word about lists */
    snprintf(list, sizeof list, "%s:8470, 127.0.0.1:8471", word);
    cr_assert_eq(tpu_resolver_new(list, &r), TPU_OK, "%s", tpu_last_error());
    st = tpu_connect_to_cluster(r, &c);
    cr_assert_eq(st, TPU_UNAVAILABLE, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "cannot resolve") && !strstr(tpu_last_error(), "comma list"), "%s",
              tpu_last_error());
    tpu_resolver_free(r);
}
