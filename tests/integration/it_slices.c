/* Slices, the TPU name and the shape TensorFlow sees, against real daemons:
 * workers of a Cloud TPU slice (--accelerator-type, tpu-slice), the checks
 * the resolver makes of them, num_accelerators() per host, TensorFlow's
 * ClusterSpec, and TPU_NAME as a TPU name or a list of hosts. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "cluster.h"

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

static const char *const V4_16[] = {"--accelerator-type", "v4-16", NULL};

/* A resolver (extra args rargs) and no workers. */
static cluster *resolver_only(const char *const *rargs)
{
    cluster_opts o = {.resolver_args = rargs};
    return cluster_start(&o);
}

/* Starts workers host/0..n-1 of a v4-16 and waits until all are IDLE. */
static void add_host(cluster *c, const char *host, int n, int idle_after)
{
    for (int k = 0; k < n; k++)
        cluster_add_worker(c, host, k, V4_16);
    cr_assert(cluster_wait_count(c, TPU_CORE_IDLE, idle_after, 10000), "%d cores registered, want %d",
              cluster_count(c, TPU_CORE_IDLE), idle_after);
}

/* A worker that the resolver refuses for good exits 3 and its log names why. */
static void expect_refused(cluster *c, int i, const char *why)
{
    cr_assert(cluster_wait_exit(&c->workers[i], 10000), "worker %d was not refused", i);
    cr_assert(WIFEXITED(c->workers[i].status) && WEXITSTATUS(c->workers[i].status) == 3,
              "worker %d: status %d, want exit 3", i, c->workers[i].status);
    cr_assert(cl_log_contains(&c->workers[i], why), "worker %d's log does not say '%s'", i, why);
}

/* Cloud TPU's system-architecture page: a v4 host has 4 chips, one device
 * each (megacore), so a v4-16 is 2 hosts of 4 devices and core 4 does not
 * exist; a v3-8 is one host of 8 cores. The worker refuses what no such
 * slice has before it starts (exit 2), naming the flag and the counts. */
Test(slices, worker_checks_its_place_in_the_slice, .timeout = 30)
{
    run_result r;
    const char *beyond[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--accelerator-type", "v4-16",
                            "--core", "4", NULL};
    run_cmd(beyond, NULL, 10000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--core 4 does not exist on a v4-16 host: it has 4 devices (cores 0..3); "
                            "the slice is 2 hosts of 4"), SHOW(r));
    run_result_free(&r);

    const char *v38[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--accelerator-type", "v3-8",
                         "--core", "8", NULL};
    run_cmd(v38, NULL, 10000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "a v3-8 host: it has 8 devices (cores 0..7); the slice is 1 host of 8"), SHOW(r));
    run_result_free(&r);

    const char *contra[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--accelerator-type", "v4-16",
                            "--tpu-type", "v3", NULL};
    run_cmd(contra, NULL, 10000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--tpu-type v3 contradicts --accelerator-type v4-16 (a v4 slice)"), SHOW(r));
    run_result_free(&r);

    const char *envs[] = {"TPUEMU_ACCELERATOR_TYPE=v7-8", NULL};
    const char *bad[] = {CL_WORKER, "--resolver", "127.0.0.1:1", NULL};
    run_cmd(bad, envs, 10000, &r);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "--accelerator-type: slice 'v7-8': 'v7' is not a TPU type"), SHOW(r));
    run_result_free(&r);
}

/* tpu-slice starts a whole v4-16 (2 hosts x 4 devices) the way Cloud TPU
 * shapes it. TensorFlow on it: initialize_tpu_system's Topology has mesh
 * [2, 2, 2, 1], 2 tasks of 4 (tensorflow/python/tpu/topology.py);
 * TPUClusterResolver.num_accelerators() is {'TPU': 4}, the devices per host,
 * and cluster_spec() is {'worker': [one address per host]}
 * (tensorflow/python/distribute/cluster_resolver/tpu/tpu_cluster_resolver.py). */
Test(slices, tpu_slice_starts_a_v4_16, .timeout = 60)
{
    cluster *c = resolver_only(NULL);
    char ra[80];
    static cl_proc sp; /* static: the support code keeps a pointer to stop it at exit */
    snprintf(ra, sizeof ra, "%s", c->addr);
    /* what follows "--" goes to every worker */
    const char *args[] = {"--accelerator-type", "v4-16", "--resolver", ra, "--", "--log-level", "debug", NULL};
    cl_spawn(&sp, TPUEMU_SLICE_BIN, args, NULL);
    cr_assert(cluster_wait_count(c, TPU_CORE_IDLE, 8, 20000), "%d of 8 cores registered",
              cluster_count(c, TPU_CORE_IDLE));
    cr_assert(cl_log_contains(&sp, "tpu-slice: v4-16: 2 hosts x 4 devices, mesh [2, 2, 2, 1]; starting 8"),
              "see %s", sp.log);
    cr_assert(cl_log_contains(&sp, "level=debug daemon=worker"), "the workers got --log-level debug: %s", sp.log);

    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 8);
    for (size_t i = 0; i < 8; i++) {
        tpu_core_info ci;
        char host[8];
        cr_assert_eq(tpu_cluster_spec_core(s, i, &ci), TPU_OK);
        snprintf(host, sizeof host, "host%zu", i / 4);
        cr_assert_str_eq(ci.host_id, host);
        cr_assert_eq(ci.core, (int)(i % 4));
        cr_assert_str_eq(ci.tpu_type, "v4");
    }
    /* the ClusterSpec: job "worker", host0 then host1, each at its first core's address */
    cr_assert_str_eq(tpu_cluster_spec_job_name(s), "worker");
    cr_assert_eq(tpu_cluster_spec_num_tasks(s), 2);
    for (size_t t = 0; t < 2; t++) {
        tpu_core_info ci;
        cr_assert_eq(tpu_cluster_spec_core(s, t * 4, &ci), TPU_OK);
        cr_assert_str_eq(tpu_cluster_spec_task_address(s, t), ci.control_addr + strlen("tcp://"));
    }
    cr_assert_null(tpu_cluster_spec_task_address(s, 2));
    tpu_cluster_spec_free(s);

    tpu_resolver *r;
    tpu_cluster *cc;
    cr_assert_eq(cluster_connect(c, &r, &cc), TPU_OK, "%s", tpu_last_error());
    int n = 0;
    cr_assert_eq(tpu_num_accelerators(cc, &n), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(n, 4, "num_accelerators() is per host: {'TPU': 4}");
    tpu_init_options io = {.expect = 8, .timeout_ms = 10000};
    tpu_topology *t;
    cr_assert_eq(tpu_initialize_system(cc, &io, &t), TPU_OK, "%s", tpu_last_error());
    int mesh[4];
    cr_assert_eq(tpu_topology_mesh_shape(t, mesh), 4);
    cr_assert(mesh[0] == 2 && mesh[1] == 2 && mesh[2] == 2 && mesh[3] == 1, "mesh [%d, %d, %d, %d]", mesh[0],
              mesh[1], mesh[2], mesh[3]);
    cr_assert_eq(tpu_topology_num_tasks(t), 2);
    cr_assert_eq(tpu_topology_num_tpus_per_task(t), 4);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);

    /* tpuctl shows the same ClusterSpec, in text and JSON */
    run_result rr;
    cluster_tpuctl(c, &rr, 5000, "cluster", NULL);
    cr_assert_eq(rr.code, 0, SHOW(rr));
    cr_assert(strstr(rr.out, "cluster spec: {'worker': ['127.0.0.1:"), SHOW(rr));
    run_result_free(&rr);
    cluster_tpuctl(c, &rr, 5000, "--json", "cluster", NULL);
    cr_assert_eq(rr.code, 0, SHOW(rr));
    cr_assert(strstr(rr.out, "\"cluster_spec\":{\"worker\":[\"127.0.0.1:"), SHOW(rr));
    run_result_free(&rr);

    /* SIGTERM stops the slice: every worker leaves, tpu-slice exits 0 */
    kill(sp.pid, SIGTERM);
    cr_assert(cluster_wait_exit(&sp, 15000), "tpu-slice did not stop");
    cr_assert(WIFEXITED(sp.status) && WEXITSTATUS(sp.status) == 0, "tpu-slice status %d", sp.status);
    cr_assert(cluster_wait_count(c, TPU_CORE_IDLE, 0, 10000) && cluster_wait_count(c, TPU_CORE_READY, 0, 10000),
              "the slice's cores did not leave");
    cluster_free(c);
}

/* A Cloud TPU slice has a fixed shape (Cloud TPU's system-architecture page:
 * a v4-16 is 2 hosts of 4 devices), and one TPU node is one slice. The
 * resolver refuses, at registration, a core its host does not have (an
 * index it would have to assign beyond 0..3), a third host, and a core of
 * another slice; the worker exits 3 with the resolver's reason. */
Test(slices, resolver_refuses_what_the_slice_does_not_have, .timeout = 60)
{
    cluster *c = resolver_only(NULL);
    add_host(c, "h0", 4, 4);
    add_host(c, "h1", 4, 8);

    const char *v4auto[] = {"--accelerator-type", "v4-16", NULL};
    int i = cluster_add_worker(c, "h0", -1, v4auto);
    expect_refused(c, i, "host h0 has no free core of a v4-16 host (cores 0..3 are taken)");

    i = cluster_add_worker(c, "h2", 0, V4_16);
    expect_refused(c, i, "a v4-16 has 2 hosts and the resolver has cores of 2 already (h0, h1): host h2 is one "
                         "too many");

    const char *v48[] = {"--accelerator-type", "v4-8", NULL};
    i = cluster_add_worker(c, "h9", 0, v48);
    expect_refused(c, i, "core h9/0 is part of a v4-8, but core h0/0 is part of a v4-16: one resolver serves "
                         "one slice");
    cr_assert_eq(cluster_count(c, TPU_CORE_IDLE), 8, "the slice's own cores are untouched");
    cluster_free(c);
}

/* Typed and untyped workers do not mix (an untyped one joined a typed
 * slice, and init built more cores than the slice has); host ids tpuctl
 * reads as targets are refused by the worker and by the resolver. */
Test(slices, untyped_workers_and_reserved_host_ids_are_refused, .timeout = 60)
{
    cluster *c = resolver_only(NULL);
    add_host(c, "h0", 4, 4);
    int i = cluster_add_worker(c, "h1", 0, NULL);
    expect_refused(c, i, "core h1/0 names no slice, but the resolver serves a v4-16 (core h0/");
    cr_assert_eq(cluster_count(c, TPU_CORE_IDLE), 4, "the slice's own cores are untouched");
    cluster_free(c);

    c = resolver_only(NULL);
    cluster_add_worker(c, "u0", 0, NULL);
    cr_assert(cluster_wait_count(c, TPU_CORE_IDLE, 1, 10000));
    i = cluster_add_worker(c, "h0", 0, V4_16);
    expect_refused(c, i, "core h0/0 is part of a v4-16, but core u0/0 names no slice");
    cluster_free(c);

    static const char *const reserved[] = {"all", "resolver", "random-core", "random-host"};
    for (size_t k = 0; k < 4; k++) {
        run_result r;
        const char *argv[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--host-id", reserved[k], NULL};
        run_cmd(argv, NULL, 10000, &r);
        cr_assert_eq(r.code, 2, SHOW(r));
        cr_assert(strstr(r.err, "is a word tpuctl reads as a target"), SHOW(r));
        run_result_free(&r);
    }
}

/* TensorFlow's Topology has the same number of devices on every task, and
 * TPUClusterResolver.num_accelerators() raises RuntimeError('TPU cores on
 * each device is not the same. This should never happen. Devices: ...')
 * when hosts differ (_verify_and_return_same_core_count in
 * tensorflow/python/distribute/cluster_resolver/tpu/tpu_cluster_resolver.py).
 * A v4-16 with a host short of a core is refused both ways, naming the hosts
 * and their counts; with the core back it initializes. */
Test(slices, hosts_of_different_sizes_are_refused, .timeout = 60)
{
    cluster *c = resolver_only(NULL);
    add_host(c, "h0", 4, 4);
    add_host(c, "h1", 3, 7);
    tpu_resolver *r;
    tpu_cluster *cc;
    cr_assert_eq(cluster_connect(c, &r, &cc), TPU_OK, "%s", tpu_last_error());

    int n = -1;
    cr_assert_eq(tpu_num_accelerators(cc, &n), TPU_FAILED_PRECONDITION);
    cr_assert_str_eq(tpu_last_error(), "TPU cores on each device is not the same. This should never happen. "
                                       "Devices: {'h0': ['0', '1', '2', '3'], 'h1': ['0', '1', '2']}");
    cr_assert_eq(n, -1, "nothing written on failure");

    tpu_init_options io = {.timeout_ms = 5000};
    tpu_topology *t = NULL;
    cr_assert_eq(tpu_initialize_system(cc, &io, &t), TPU_FAILED_PRECONDITION);
    cr_assert(strstr(tpu_last_error(), "the hosts of the v4-16 have different numbers of cores (h0: 4, h1: 3)"),
              "%s", tpu_last_error());
    cr_assert_null(t);
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not(tpu_cluster_spec_initialized(s), "a refused initialize changes nothing");
    tpu_cluster_spec_free(s);

    cluster_add_worker(c, "h1", 3, V4_16);
    cr_assert(cluster_wait_count(c, TPU_CORE_IDLE, 8, 10000));
    cr_assert_eq(tpu_num_accelerators(cc, &n), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(n, 4);
    cr_assert_eq(tpu_initialize_system(cc, &io, &t), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_topology_num_replicas(t), 8);
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* TPU_NAME=my-tpu is a TPU node name: TensorFlow asks the Cloud TPU API for
 * it (tensorflow/python/tpu/client/client.py: _use_api for a name without
 * grpc://; _fetch_cloud_tpu_metadata), and a name it does not know fails
 * with "Could not lookup TPU metadata from name '...'. Please doublecheck the
 * tpu argument in the TPUClusterResolver constructor. Exception: ...". Here
 * the API is the resolver at $TPUEMU_TPU_API, named by --name. */
Test(slices, tpu_name_is_looked_up_at_the_resolver, .timeout = 30)
{
    const char *rargs[] = {"--name", "my-tpu", NULL};
    cluster *c = resolver_only(rargs);
    add_host(c, "h0", 2, 2);
    cr_assert_eq(setenv("TPUEMU_TPU_API", c->addr, 1), 0);

    tpu_resolver *r;
    tpu_cluster *cc;
    cr_assert_eq(tpu_resolver_new("my-tpu", &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_str_eq(tpu_resolver_tpu_name(r), "my-tpu");
    cr_assert_str_eq(tpu_resolver_endpoint(r, 0), c->addr, "the Cloud TPU API's address");
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_OK, "%s", tpu_last_error());
    tpu_cluster_spec *s;
    cr_assert_eq(tpu_cluster_spec_get(cc, &s), TPU_OK, "%s", tpu_last_error());
    cr_assert_str_eq(tpu_cluster_spec_tpu_name(s), "my-tpu");
    cr_assert_eq(tpu_cluster_spec_num_cores(s), 2);
    tpu_cluster_spec_free(s);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);

    cr_assert_eq(tpu_resolver_new("other-tpu", &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), "Could not lookup TPU metadata from name 'other-tpu'. Please doublecheck "
                                       "the tpu argument in the TPUClusterResolver constructor. Exception: TPU "
                                       "'other-tpu' was not found: this resolver serves the TPU 'my-tpu'"),
              "%s", tpu_last_error());
    tpu_resolver_free(r);

    /* a bare word is a name, never a host name: "localhost" is looked up too */
    cr_assert_eq(tpu_resolver_new("localhost", &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_NOT_FOUND);
    tpu_resolver_free(r);
    /* not a name, and no port or scheme to be an address */
    cr_assert_eq(tpu_resolver_new("10.0.0.1", &r), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "'10.0.0.1' is not a TPU name"), "%s", tpu_last_error());
    cr_assert_eq(tpu_resolver_new("My_TPU", &r), TPU_INVALID_ARGUMENT);

    /* tpuctl with TPU_NAME=my-tpu, and with a name the resolver does not know */
    char api[96];
    snprintf(api, sizeof api, "TPUEMU_TPU_API=%s", c->addr);
    const char *good[] = {api, "TPU_NAME=my-tpu", NULL};
    const char *argv[] = {CL_TPUCTL, "cluster", NULL};
    run_result rr;
    run_cmd(argv, good, 5000, &rr);
    cr_assert_eq(rr.code, 0, SHOW(rr));
    cr_assert(strstr(rr.out, "cluster: 2 cores") && strstr(rr.out, ", TPU name my-tpu"), SHOW(rr));
    run_result_free(&rr);
    const char *unknown[] = {api, "TPU_NAME=nope", NULL};
    run_cmd(argv, unknown, 5000, &rr);
    cr_assert_eq(rr.code, 1, SHOW(rr));
    cr_assert(strstr(rr.err, "NOT_FOUND: Could not lookup TPU metadata from name 'nope'."), SHOW(rr));
    run_result_free(&rr);
    unsetenv("TPUEMU_TPU_API");
    cluster_free(c);
}

/* A resolver without --name knows no TPU by name; a --name that Cloud TPU
 * would not accept (its node names: lowercase letters, digits, hyphens) is
 * refused at start. */
Test(slices, resolver_name_rules, .timeout = 30)
{
    cluster *c = resolver_only(NULL);
    cr_assert_eq(setenv("TPUEMU_TPU_API", c->addr, 1), 0);
    tpu_resolver *r;
    tpu_cluster *cc;
    cr_assert_eq(tpu_resolver_new("my-tpu", &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), "this resolver has no TPU name (start it with --name)"), "%s",
              tpu_last_error());
    tpu_resolver_free(r);
    unsetenv("TPUEMU_TPU_API");
    cluster_free(c);

    run_result rr;
    const char *argv[] = {CL_RESOLVER, "--listen", "127.0.0.1:1", "--name", "My_TPU", NULL};
    run_cmd(argv, NULL, 5000, &rr);
    cr_assert_eq(rr.code, 2, SHOW(rr));
    cr_assert(strstr(rr.err, "--name: 'My_TPU' is not a TPU name"), SHOW(rr));
    run_result_free(&rr);
}

/* TPU_NAME=grpc://A,grpc://B lists every host of the slice, task 0 first
 * (client.py's _environment_var_to_network_endpoints): cluster_spec() is the
 * list as given, master() the first, and the client talks to the first: the
 * others are other hosts, not alternatives to try. */
Test(slices, comma_list_is_every_host, .timeout = 30)
{
    cluster *c = resolver_only(NULL);
    add_host(c, "h0", 1, 1);
    char list[160], dead[64];
    snprintf(dead, sizeof dead, "127.0.0.1:%d", cl_free_port());
    snprintf(list, sizeof list, "grpc://%s,grpc://10.0.0.3:8470", c->addr);

    tpu_resolver *r;
    tpu_cluster *cc;
    cr_assert_eq(tpu_resolver_new(list, &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_null(tpu_resolver_tpu_name(r));
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_OK, "%s", tpu_last_error());
    tpu_cluster_spec *s;
    cr_assert_eq(tpu_cluster_spec_get(cc, &s), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_cluster_spec_num_tasks(s), 2);
    cr_assert_str_eq(tpu_cluster_spec_task_address(s, 0), c->addr);
    cr_assert_str_eq(tpu_cluster_spec_task_address(s, 1), "10.0.0.3:8470");
    tpu_cluster_spec_free(s);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);

    /* the first host does not answer: that is the error, the second is not tried */
    snprintf(list, sizeof list, "grpc://%s,grpc://%s", dead, c->addr);
    cr_assert_eq(tpu_resolver_new(list, &r), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_UNAVAILABLE);
    cr_assert(strstr(tpu_last_error(), dead), "names the master: %s", tpu_last_error());
    tpu_resolver_free(r);
    cluster_free(c);
}
