/* Integration: TensorFlow's Topology on an initialized system
 * (tf.tpu.experimental.Topology, tensorflow/python/tpu/topology.py):
 * device_coordinates, the *_at_coordinates lookups and device names,
 * missing_devices, serialized() and Topology(serialized=...), with the
 * physical placement of a Cloud TPU slice (each host a block of chips). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include "json.h"

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

static tpu_topology *init_ok(cluster *c, tpu_resolver **r, tpu_cluster **cc)
{
    tpu_init_options o = {.expect = 0, .timeout_ms = 5000, .allow_partial = 0};
    tpu_topology *t = NULL;
    tpu_status st = cluster_connect(c, r, cc);
    cr_assert_eq(st, TPU_OK, "connect to %s: %s: %s", c->addr, tpu_status_name(st), tpu_last_error());
    st = tpu_initialize_system(*cc, &o, &t);
    cr_assert_eq(st, TPU_OK, "initialize: %s: %s", tpu_status_name(st), tpu_last_error());
    return t;
}

static void done(cluster *c, tpu_resolver *r, tpu_cluster *cc, tpu_topology *t)
{
    tpu_topology_free(t);
    tpu_cluster_free(cc);
    tpu_resolver_free(r);
    cluster_free(c);
}

/* The device ordinal d of host t in a slice whose hosts own bx x by x bz
 * chips: Cloud TPU places a host's chips as one block (a v3 host's 4 chips
 * are 2x2 in x, y; a v4 host's 2x2x1), the blocks tile the mesh x first,
 * then y, then z, and a host's device ordinals go core on chip first, then x,
 * y, z (a v3-8's devices 0..7 are [0,0,0,0], [0,0,0,1], [1,0,0,0], ...). */
static void expect_coords(const int mesh[4], const int b[3], int t, int d, int out[4])
{
    int gx = mesh[0] / b[0], gy = mesh[1] / b[1], chip = d / mesh[3];
    out[0] = (t % gx) * b[0] + chip % b[0];
    out[1] = (t / gx) % gy * b[1] + (chip / b[0]) % b[1];
    out[2] = t / (gx * gy) * b[2] + chip / (b[0] * b[1]);
    out[3] = d % mesh[3];
}

/* Everything TensorFlow's Topology answers, for a full slice of `tasks`
 * hosts of `per` devices each whose hosts own blocks of b chips. */
static void check_full(tpu_topology *t, const int mesh[4], int tasks, int per, const int b[3])
{
    const int *dc;
    int shape[3], got[4], v;
    char name[128], want[128];

    cr_assert_eq(tpu_topology_mesh_shape(t, got), 4);
    cr_assert(memcmp(got, mesh, sizeof got) == 0, "mesh [%d, %d, %d, %d]", got[0], got[1], got[2], got[3]);
    /* device_coordinates: rank 3, [num_tasks, num_tpus_per_task, 4] */
    cr_assert_eq(tpu_topology_device_coordinates(t, &dc, shape), TPU_OK, "%s", tpu_last_error());
    cr_assert(shape[0] == tasks && shape[1] == per && shape[2] == 4, "shape [%d, %d, %d]", shape[0],
              shape[1], shape[2]);
    for (int k = 0; k < tasks; k++)
        for (int d = 0; d < per; d++) {
            int w[4];
            const int *c = &dc[(k * per + d) * 4];
            expect_coords(mesh, b, k, d, w);
            cr_assert(memcmp(c, w, sizeof w) == 0,
                      "task %d device %d at [%d, %d, %d, %d], want [%d, %d, %d, %d]", k, d, c[0], c[1],
                      c[2], c[3], w[0], w[1], w[2], w[3]);
            /* the inverse maps: task_ordinal / tpu_device_ordinal_at_coordinates */
            cr_assert_eq(tpu_topology_task_ordinal_at_coordinates(t, c, &v), TPU_OK);
            cr_assert_eq(v, k);
            cr_assert_eq(tpu_topology_tpu_device_ordinal_at_coordinates(t, c, &v), TPU_OK);
            cr_assert_eq(v, d);
            /* _tpu_device_name / _tpu_host_device_name of topology.py */
            snprintf(want, sizeof want, "/job:worker/task:%d/device:TPU:%d", k, d);
            cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, c, "worker", name, sizeof name),
                         TPU_OK);
            cr_assert_str_eq(name, want);
            snprintf(want, sizeof want, "/task:%d/device:TPU:%d", k, d);
            cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, c, NULL, name, sizeof name),
                         TPU_OK);
            cr_assert_str_eq(name, want);
            snprintf(want, sizeof want, "/job:worker/task:%d/device:CPU:0", k);
            cr_assert_eq(tpu_topology_cpu_device_name_at_coordinates(t, c, "worker", name, sizeof name),
                         TPU_OK);
            cr_assert_str_eq(name, want);
        }
    /* a full slice: every place of the mesh holds a device */
    cr_assert_eq(tpu_topology_num_missing_devices(t), 0);
    cr_assert_eq(tpu_topology_missing_device(t, 0, got), TPU_OUT_OF_RANGE);
    /* numpy's IndexError outside the mesh */
    int out[4] = {mesh[0], 0, 0, 0};
    cr_assert_eq(tpu_topology_task_ordinal_at_coordinates(t, out, &v), TPU_OUT_OF_RANGE);
    cr_assert(strstr(tpu_last_error(), "outside the mesh"), "%s", tpu_last_error());
    out[0] = 0;
    out[3] = -1;
    cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, out, "worker", name, sizeof name),
                 TPU_OUT_OF_RANGE);
    cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, dc, "worker", name, 10),
                 TPU_INVALID_ARGUMENT, "a buffer too small is an error, not a cut name");
    cr_assert(strstr(tpu_last_error(), "too small"), "%s", tpu_last_error());
}

/* Runs tests/integration/topology_check.py (an independent decoder and
 * encoder of TopologyProto, no protobuf library) on the bytes. */
static void python_check(cluster *c, const uint8_t *bytes, size_t n, const char *mesh, const char *tasks,
                         const char *per, const char *block)
{
    char path[400];
    run_result r;
    snprintf(path, sizeof path, "%s/topology.pb", c->dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    const char *argv[] = {"/usr/bin/env", "python3", TOPOLOGY_CHECK_PY, path, mesh, tasks, per, block, NULL};
    run_cmd(argv, NULL, 30000, &r);
    cr_assert(r.exited && r.code == 0 && strncmp(r.out, "OK", 2) == 0, SHOW(r));
    run_result_free(&r);
}

Test(topology, v3_32_hosts_own_2x2_chips, .timeout = 60)
{
    /* A v3-32: 4 hosts of 4 chips (8 cores), mesh [4, 4, 1, 2]. On Cloud TPU
     * each host's 4 chips are a 2x2 block (Cloud TPU system architecture
     * page: a v3 host board has 4 chips), and TensorFlow's device_coordinates
     * (tensorflow/python/tpu/topology.py) is [num_tasks, num_tpus_per_task, 4]
     * = [4, 8, 4]. The replica ids stay in ring order (host by host). */
    cluster_opts o = {.hosts = 4, .cores_per_host = 8, .tpu_type = "v3", .heartbeat_ms = 300};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_topology *t = init_ok(c, &r, &cc);
    const int mesh[4] = {4, 4, 1, 2}, block[3] = {2, 2, 1};
    const uint8_t *ser;
    size_t n;

    check_full(t, mesh, 4, 8, block);
    for (int i = 0; i < 32; i++) {
        tpu_topology_core tc;
        int w[4];
        cr_assert_eq(tpu_topology_core_get(t, i, &tc), TPU_OK);
        cr_assert_eq(tc.task_id, i / 8, "replica %d: ring order host by host", i);
        cr_assert_eq(tc.core, i % 8);
        expect_coords(mesh, block, i / 8, i % 8, w);
        cr_assert(memcmp(tc.coords, w, sizeof w) == 0, "replica %d at [%d, %d, %d, %d]", i, tc.coords[0],
                  tc.coords[1], tc.coords[2], tc.coords[3]);
    }
    /* host 1's chips are x 2..3, y 0..1: its device 3 is [3, 0, 0, 1] */
    int c3[4] = {3, 0, 0, 1};
    char name[128];
    cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, c3, "worker", name, sizeof name), TPU_OK);
    cr_assert_str_eq(name, "/job:worker/task:1/device:TPU:3");
    cr_assert_eq(tpu_topology_cpu_device_name_at_coordinates(t, c3, "worker", name, sizeof name), TPU_OK);
    cr_assert_str_eq(name, "/job:worker/task:1/device:CPU:0");

    cr_assert_eq(tpu_topology_serialized(t, &ser, &n), TPU_OK, "%s", tpu_last_error());
    python_check(c, ser, n, "4,4,1,2", "4", "8", "2,2,1");
    done(c, r, cc, t);
}

Test(topology, v4_hosts_own_2x2x1_chips, .timeout = 60)
{
    /* A v4-16: 8 chips of one device each (megacore), mesh [2, 2, 2, 1]; a
     * v4 host has 4 chips, 2x2x1 (Cloud TPU v4 system architecture page), so
     * host 0 is z = 0 and host 1 is z = 1. */
    cluster_opts o = {.hosts = 2, .cores_per_host = 4, .tpu_type = "v4"};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_topology *t = init_ok(c, &r, &cc);
    const int mesh[4] = {2, 2, 2, 1}, block[3] = {2, 2, 1};
    const uint8_t *ser;
    size_t n;

    check_full(t, mesh, 2, 4, block);
    int z1[4] = {1, 1, 1, 0}, v;
    cr_assert_eq(tpu_topology_task_ordinal_at_coordinates(t, z1, &v), TPU_OK);
    cr_assert_eq(v, 1);
    cr_assert_eq(tpu_topology_tpu_device_ordinal_at_coordinates(t, z1, &v), TPU_OK);
    cr_assert_eq(v, 3);
    cr_assert_eq(tpu_topology_serialized(t, &ser, &n), TPU_OK, "%s", tpu_last_error());
    python_check(c, ser, n, "2,2,2,1", "2", "4", "2,2,1");
    done(c, r, cc, t);
}

Test(topology, serialized_round_trip, .timeout = 60)
{
    /* Topology(serialized=topology.serialized()) is the same topology
     * (tensorflow/python/tpu/topology.py: _parse_topology), and a parsed
     * Topology's serialized() gives back the bytes it was parsed from. One
     * v3-8 host: 4 chips, 2x2. */
    cluster_opts o = {.hosts = 1, .cores_per_host = 8, .tpu_type = "v3"};
    cluster *c = cluster_start(&o);
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_topology *t = init_ok(c, &r, &cc), *p;
    const int mesh[4] = {2, 2, 1, 2}, block[3] = {2, 2, 1};
    const uint8_t *ser, *ser2;
    const int *dc, *dc2;
    int shape[3], shape2[3];
    size_t n, n2;

    check_full(t, mesh, 1, 8, block);
    cr_assert_eq(tpu_topology_serialized(t, &ser, &n), TPU_OK, "%s", tpu_last_error());
    python_check(c, ser, n, "2,2,1,2", "1", "8", "2,2,1");
    cr_assert_eq(tpu_topology_from_serialized(ser, n, &p), TPU_OK, "%s", tpu_last_error());
    check_full(p, mesh, 1, 8, block);
    cr_assert_eq(tpu_topology_num_tasks(p), 1);
    cr_assert_eq(tpu_topology_num_tpus_per_task(p), 8);
    cr_assert_eq(tpu_topology_num_replicas(p), 8);
    cr_assert_eq(tpu_topology_device_coordinates(t, &dc, shape), TPU_OK);
    cr_assert_eq(tpu_topology_device_coordinates(p, &dc2, shape2), TPU_OK);
    cr_assert(memcmp(shape, shape2, sizeof shape) == 0 && memcmp(dc, dc2, 8 * 4 * sizeof *dc) == 0);
    cr_assert_eq(tpu_topology_serialized(p, &ser2, &n2), TPU_OK);
    cr_assert(n2 == n && memcmp(ser, ser2, n) == 0);
    tpu_topology_free(p);
    done(c, r, cc, t);
}

static tpu_status parse(const char *bytes, size_t n)
{
    tpu_topology *p = NULL;
    tpu_status st = tpu_topology_from_serialized(bytes, n, &p);
    if (st == TPU_OK)
        tpu_topology_free(p);
    else
        cr_assert_null(p);
    return st;
}

Test(topology, malformed_serialized_refused, .timeout = 30)
{
    /* TensorFlow's _parse_topology (tensorflow/python/tpu/topology.py)
     * raises for bytes that are not a TopologyProto (the protobuf parse
     * error) and ValueError for a mesh_shape not of 4 positive entries, a
     * negative num_tasks or num_tpu_devices_per_task, a device_coordinates of
     * the wrong length, or a negative coordinate; numpy refuses a coordinate
     * outside the mesh. The messages are TensorFlow's. Hand-encoded
     * TopologyProtos (tensorflow/core/protobuf/tpu/topology.proto field
     * numbers: 1 mesh_shape, 2 num_tasks, 3 num_tpu_devices_per_task, 4
     * device_coordinates). */
    /* one device at [0,0,0,0] of a [1,1,1,1] mesh: the well-formed base */
    static const char ok[] = "\x0a\x04\x01\x01\x01\x01\x10\x01\x18\x01\x22\x04\x00\x00\x00\x00";
    cr_assert_eq(parse(ok, sizeof ok - 1), TPU_OK, "%s", tpu_last_error());

    cr_assert_eq(parse("\x0a\x7f\x01", 3), TPU_INVALID_ARGUMENT, "a length past the end");
    cr_assert(strstr(tpu_last_error(), "Error parsing message"), "%s", tpu_last_error());
    cr_assert_eq(parse("\xff\xff\xff", 3), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "Error parsing message"), "%s", tpu_last_error());
    cr_assert_eq(parse("", 0), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "empty"), "%s", tpu_last_error());

    static const char mesh2[] = "\x0a\x02\x02\x02\x10\x01\x18\x01\x22\x02\x00\x00";
    cr_assert_eq(parse(mesh2, sizeof mesh2 - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(),
                     "`mesh_shape` must be a vector of size 4 with positive entries; got [2 2]");
    static const char mesh0[] = "\x0a\x04\x01\x00\x01\x01\x10\x01\x18\x01\x22\x04\x00\x00\x00\x00";
    cr_assert_eq(parse(mesh0, sizeof mesh0 - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(),
                     "`mesh_shape` must be a vector of size 4 with positive entries; got [1 0 1 1]");
    /* num_tasks -1: a 10-byte varint */
    static const char ntask[] = "\x0a\x04\x01\x01\x01\x01\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    cr_assert_eq(parse(ntask, sizeof ntask - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(), "`num_tasks` must be >= 0; got -1");
    static const char nper[] = "\x0a\x04\x01\x01\x01\x01\x10\x01\x18\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    cr_assert_eq(parse(nper, sizeof nper - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(), "`num_tpu_devices_per_task` must be >= 0; got -2");
    static const char len3[] = "\x0a\x04\x01\x01\x01\x01\x10\x01\x18\x01\x22\x03\x00\x00\x00";
    cr_assert_eq(parse(len3, sizeof len3 - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(), "`device_coordinates` must have shape num_tasks (1) * "
                                       "num_tpu_devices_per_task (1) * len(mesh_shape) ([1, 1, 1, 1]); "
                                       "got shape 3");
    static const char neg[] = "\x0a\x04\x01\x01\x01\x01\x10\x01\x18\x01\x22\x0d\x00\x00\x00"
                              "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    cr_assert_eq(parse(neg, sizeof neg - 1), TPU_INVALID_ARGUMENT);
    cr_assert_str_eq(tpu_last_error(), "`device_coordinates` must be >= 0");
    static const char outside[] = "\x0a\x04\x01\x01\x01\x01\x10\x01\x18\x01\x22\x04\x00\x02\x00\x00";
    cr_assert_eq(parse(outside, sizeof outside - 1), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "outside the mesh"), "%s", tpu_last_error());
    /* 2^30 tasks of no device: TensorFlow would hold that; no slice has it */
    static const char tasks[] = "\x0a\x04\x01\x01\x01\x01\x10\x80\x80\x80\x80\x04";
    cr_assert_eq(parse(tasks, sizeof tasks - 1), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "more than any slice has"), "%s", tpu_last_error());
    /* a mesh no slice has: refused before anything that size is allocated */
    static const char huge[] = "\x0a\x10\xff\xff\xff\xff\x07\xff\xff\xff\xff\x07\xff\xff\xff\xff\x07\x01";
    cr_assert_eq(parse(huge, sizeof huge - 1), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "places"), "%s", tpu_last_error());
}

Test(topology, dead_core_is_a_missing_device, .timeout = 60)
{
    /* TensorFlow's Topology.missing_devices (tensorflow/python/tpu/topology.py)
     * is np.argwhere(tasks < 0): the coordinates of the mesh places no device
     * holds. 2 hosts of 2 v3 cores, h1/1 dead: the 3 devices left are one
     * v3 mesh [2, 1, 1, 2] with one place empty; TensorFlow's
     * task_ordinal_at_coordinates there is -1. device_coordinates (and so
     * serialized()) needs as many devices on every host: refused. */
    cluster_opts o = {.hosts = 2, .cores_per_host = 2, .tpu_type = "v3"};
    cluster *c = cluster_start(&o);
    cluster_kill_worker(c, 3);
    cr_assert(cluster_wait_core_state(c, "h1", 1, TPU_CORE_DEAD, 10000), "h1/1 never marked DEAD");
    tpu_resolver *r;
    tpu_cluster *cc;
    tpu_topology *t = init_ok(c, &r, &cc);
    int mesh[4], m[4], v;
    char name[128];
    const int *dc;
    const uint8_t *ser;
    size_t n;

    cr_assert_eq(tpu_topology_num_replicas(t), 3);
    tpu_topology_mesh_shape(t, mesh);
    cr_assert(mesh[0] == 2 && mesh[1] == 1 && mesh[2] == 1 && mesh[3] == 2, "mesh [%d, %d, %d, %d]",
              mesh[0], mesh[1], mesh[2], mesh[3]);
    cr_assert_eq(tpu_topology_num_missing(t), 1);
    cr_assert(strstr(tpu_topology_missing(t, 0), "h1/1 (dead"), "%s", tpu_topology_missing(t, 0));
    cr_assert_eq(tpu_topology_num_missing_devices(t), 1);
    cr_assert_eq(tpu_topology_missing_device(t, 0, m), TPU_OK);
    cr_assert(m[0] == 1 && m[1] == 0 && m[2] == 0 && m[3] == 1, "missing [%d, %d, %d, %d]", m[0], m[1],
              m[2], m[3]);
    cr_assert_eq(tpu_topology_task_ordinal_at_coordinates(t, m, &v), TPU_OK);
    cr_assert_eq(v, -1);
    cr_assert_eq(tpu_topology_tpu_device_ordinal_at_coordinates(t, m, &v), TPU_OK);
    cr_assert_eq(v, -1);
    cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, m, "worker", name, sizeof name),
                 TPU_NOT_FOUND);
    /* the other places: h0's two cores on chip x 0, h1/0 on chip x 1 */
    int h10[4] = {1, 0, 0, 0};
    cr_assert_eq(tpu_topology_tpu_device_name_at_coordinates(t, h10, "worker", name, sizeof name), TPU_OK);
    cr_assert_str_eq(name, "/job:worker/task:1/device:TPU:0");
    cr_assert_eq(tpu_topology_device_coordinates(t, &dc, NULL), TPU_FAILED_PRECONDITION);
    cr_assert(strstr(tpu_last_error(), "task 1 has 1 TPU devices"), "%s", tpu_last_error());
    cr_assert_null(dc);
    cr_assert_eq(tpu_topology_serialized(t, &ser, &n), TPU_FAILED_PRECONDITION);
    done(c, r, cc, t);
}

Test(topology, tpuctl_init_and_topology, .timeout = 60)
{
    /* `tpuctl init` shows each core's TensorFlow device name and, with
     * --serialized FILE, writes Topology.serialized()'s bytes;
     * `tpuctl topology FILE` reads them back (topology.py's
     * _parse_topology), and refuses a file that is not a TopologyProto with
     * TensorFlow's message. */
    cluster_opts o = {.hosts = 2, .cores_per_host = 4, .tpu_type = "v3"};
    cluster *c = cluster_start(&o);
    char file[400], bad[400];
    run_result r;
    snprintf(file, sizeof file, "%s/init.pb", c->dir);
    snprintf(bad, sizeof bad, "%s/bad.pb", c->dir);

    cluster_tpuctl(c, &r, 20000, "init", "--serialized", file, NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    /* host h1's core 3 is task 1's TPU device 3 */
    cr_assert(strstr(r.out, "/job:worker/task:1/device:TPU:3"), SHOW(r));
    cr_assert(strstr(r.out, "serialized TopologyProto: "), SHOW(r));
    run_result_free(&r);

    cluster_tpuctl(c, &r, 20000, "--json", "init", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    char jerr[200];
    json *j = json_parse(r.out, strlen(r.out), jerr, sizeof jerr);
    cr_assert_not_null(j, "%s: " SHOW(r), jerr);
    const json *dc = json_get(j, "device_coordinates");
    cr_assert_eq(json_len(dc), 2, SHOW(r));
    cr_assert_eq(json_len(json_at(dc, 0)), 4, SHOW(r));
    /* 2 hosts of 2 v3 chips, mesh [2, 2, 1, 2]: host 1 owns y = 1 */
    long long y;
    cr_assert_eq(json_int(json_at(json_at(json_at(dc, 1), 0), 1), &y), 0);
    cr_assert_eq(y, 1, SHOW(r));
    cr_assert_eq(json_len(json_get(j, "missing_devices")), 0, SHOW(r));
    cr_assert(json_is(json_get(j, "serialized"), JSON_STRING), SHOW(r));
    cr_assert_str_eq(json_str(json_get(json_at(json_get(j, "cores"), 7), "device")),
                     "/job:worker/task:1/device:TPU:3");
    json_free(j);
    run_result_free(&r);

    cluster_tpuctl(c, &r, 10000, "topology", file, NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "mesh [2, 2, 1, 2], 2 tasks x 4 TPU devices per task"), SHOW(r));
    cr_assert(strstr(r.out, "[1, 1, 0, 1]"), SHOW(r));
    cr_assert(strstr(r.out, "/job:worker/task:1/device:TPU:3"), SHOW(r));
    cr_assert(strstr(r.out, "/job:worker/task:1/device:CPU:0"), SHOW(r));
    run_result_free(&r);

    FILE *f = fopen(bad, "wb");
    cr_assert_not_null(f);
    fputs("\x0a\x02\x02\x02", f);
    fclose(f);
    cluster_tpuctl(c, &r, 10000, "topology", bad, NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.err, "`mesh_shape` must be a vector of size 4 with positive entries; got [2 2]"),
              SHOW(r));
    run_result_free(&r);
    cluster_free(c);
}
