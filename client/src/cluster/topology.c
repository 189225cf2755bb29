/* tpu_topology: read-only views of the Topology an initialize returned (or
 * one parsed from TensorFlow's TopologyProto bytes), and TensorFlow's
 * Topology calls on it (tensorflow/python/tpu/topology.py). */
#include "cluster_int.h"

#include "topo_msg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPO(t) CHECK_HANDLE((t), MAGIC_TOPOLOGY, "tpu_topology")

/* Mesh places a topology may have: above any real slice (a v5p pod has 8960
 * chips), low enough that bytes from a file cannot make us allocate much. */
#define TOPO_PLACES_MAX (1u << 20)

void tpu_topology_free(tpu_topology *t)
{
    if (!t)
        return;
    CHECK_HANDLE(t, MAGIC_TOPOLOGY, "tpu_topology");
    topo_msgs_free(t);
    free(t->dc);
    free(t->at_task);
    free(t->at_dev);
    free(t->ser);
    t->magic = MAGIC_DEAD;
    free(t);
}

static struct topo_info info_of(const tpu_topology *t)
{
    struct topo_info y;
    topo_info(t, &y);
    return y;
}

uint64_t tpu_topology_epoch(const tpu_topology *t)
{
    TOPO(t);
    return topo_epoch(t);
}

size_t tpu_topology_mesh_shape(const tpu_topology *t, int out[4])
{
    TOPO(t);
    struct topo_info y = info_of(t);
    size_t n = y.nmesh < 4 ? y.nmesh : 4;
    for (size_t i = 0; i < n; i++)
        out[i] = (int)y.mesh_shape[i];
    return n;
}

int tpu_topology_num_replicas(const tpu_topology *t)
{
    TOPO(t);
    return (int)topo_ncores(t);
}

int tpu_topology_num_tasks(const tpu_topology *t)
{
    TOPO(t);
    return (int)info_of(t).num_tasks;
}

int tpu_topology_num_tpus_per_task(const tpu_topology *t)
{
    TOPO(t);
    return (int)info_of(t).num_tpus_per_task;
}

const char *tpu_topology_tpu_type(const tpu_topology *t)
{
    TOPO(t);
    return info_of(t).tpu_type;
}

const char *tpu_topology_owner(const tpu_topology *t)
{
    TOPO(t);
    return info_of(t).owner;
}

tpu_status tpu_topology_core_get(const tpu_topology *t, int replica, tpu_topology_core *out)
{
    struct topo_core tc;
    size_t n;
    int found = 0;

    TOPO(t);
    n = topo_ncores(t);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_core_get: out is NULL");
    if (replica < 0 || (size_t)replica >= n)
        return cli_failf(TPU_OUT_OF_RANGE, "replica %d is out of range: the topology has %zu replicas", replica, n);
    /* cores come in replica order; search only if the resolver did otherwise */
    topo_core_at(t, (size_t)replica, &tc);
    found = tc.replica_id == replica;
    for (size_t i = 0; !found && i < n; i++) {
        topo_core_at(t, i, &tc);
        found = tc.replica_id == replica;
    }
    if (!found)
        return cli_failf(TPU_INTERNAL, "the topology has no core with replica id %d", replica);
    memset(out, 0, sizeof *out);
    out->replica_id = tc.replica_id;
    out->host_id = tc.host_id;
    out->core = tc.core;
    out->task_id = (int)tc.task_id;
    for (size_t i = 0; i < tc.ncoords && i < 4; i++)
        out->coords[i] = (int)tc.coords[i];
    out->data_addr = tc.data_addr;
    return TPU_OK;
}

const char *tpu_topology_control_addr(const tpu_topology *t, int replica)
{
    TOPO(t);
    for (size_t i = 0, n = topo_ncores(t); i < n; i++) {
        struct topo_core tc;
        topo_core_at(t, i, &tc);
        if (tc.replica_id == replica)
            return tc.control_addr;
    }
    return NULL;
}

size_t tpu_topology_num_missing(const tpu_topology *t)
{
    TOPO(t);
    return info_of(t).nmissing;
}

const char *tpu_topology_missing(const tpu_topology *t, size_t i)
{
    TOPO(t);
    return topo_missing(t, i);
}

/* ---- TensorFlow's Topology ---- */

static size_t place_of(const int mesh[4], const int c[4])
{
    return (((size_t)c[0] * (size_t)mesh[1] + (size_t)c[1]) * (size_t)mesh[2] + (size_t)c[2]) *
               (size_t)mesh[3] + (size_t)c[3];
}

static int in_mesh(const int mesh[4], const int c[4])
{
    for (int a = 0; a < 4; a++)
        if (c[a] < 0 || c[a] >= mesh[a])
            return 0;
    return 1;
}

tpu_status cli_topology_build(tpu_topology *t)
{
    struct topo_info y = info_of(t);
    const struct topo_info *tp = &y;
    size_t places = 1;
    int *seen;

    if (tp->nmesh != 4)
        return cli_failf(TPU_INTERNAL, "the topology's mesh_shape has %zu entries, not 4", tp->nmesh);
    for (int a = 0; a < 4; a++) {
        if (tp->mesh_shape[a] < 1 || tp->mesh_shape[a] > TOPO_PLACES_MAX)
            return cli_failf(TPU_INTERNAL, "the topology's mesh_shape[%d] is %" PRIu32, a,
                             tp->mesh_shape[a]);
        t->mesh[a] = (int)tp->mesh_shape[a];
        places *= tp->mesh_shape[a];
        if (places > TOPO_PLACES_MAX)
            return cli_failf(TPU_INVALID_ARGUMENT, "the mesh [%d, %d, %d, %d] has more than %u places",
                             (int)tp->mesh_shape[0], (int)tp->mesh_shape[1], (int)tp->mesh_shape[2],
                             (int)tp->mesh_shape[3], TOPO_PLACES_MAX);
    }
    t->nplaces = places;
    t->ntasks = (int)tp->num_tasks;
    t->per = (int)tp->num_tpus_per_task;
    t->at_task = malloc(places * sizeof *t->at_task);
    t->at_dev = malloc(places * sizeof *t->at_dev);
    seen = calloc(tp->num_tasks ? tp->num_tasks : 1, sizeof *seen); /* devices per task so far */
    if (!t->at_task || !t->at_dev || !seen) {
        free(seen);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory for a mesh of %zu places", places);
    }
    for (size_t i = 0; i < places; i++)
        t->at_task[i] = t->at_dev[i] = -1;
    /* cores come in replica order: a task's devices are its cores in that order */
    for (size_t i = 0; i < tp->ncores; i++) {
        struct topo_core tcore, *tc = &tcore;
        int c[4] = {0};
        topo_core_at(t, i, tc);
        if (tc->task_id >= tp->num_tasks || tc->ncoords != 4) {
            free(seen);
            return cli_failf(TPU_INTERNAL,
                             "the topology's core %zu has task %" PRIu32 " of %" PRIu32 " and %zu coordinates", i,
                             tc->task_id, tp->num_tasks, tc->ncoords);
        }
        for (int a = 0; a < 4; a++)
            c[a] = tc->coords[a] > (uint32_t)TOPO_PLACES_MAX ? -1 : (int)tc->coords[a];
        if (!in_mesh(t->mesh, c)) {
            free(seen);
            return cli_failf(TPU_INTERNAL, "the topology's core %zu is at [%" PRIu32 ", %" PRIu32 ", %"
                             PRIu32 ", %" PRIu32 "], outside the mesh [%d, %d, %d, %d]", i,
                             tc->coords[0], tc->coords[1], tc->coords[2], tc->coords[3], t->mesh[0],
                             t->mesh[1], t->mesh[2], t->mesh[3]);
        }
        t->at_task[place_of(t->mesh, c)] = (int)tc->task_id;
        t->at_dev[place_of(t->mesh, c)] = seen[tc->task_id]++;
    }
    for (size_t i = 0; i < places; i++)
        if (t->at_task[i] < 0)
            t->nmissing_dev++;
    /* device_coordinates when every task has num_tpus_per_task devices */
    for (uint32_t k = 0; k < tp->num_tasks && !t->dc_why[0]; k++)
        if (seen[k] != t->per)
            snprintf(t->dc_why, sizeof t->dc_why,
                     "task %" PRIu32 " has %d TPU devices and another has %d: TensorFlow's "
                     "device_coordinates is a [num_tasks, num_tpus_per_task, 4] array, so every "
                     "host must have as many cores", k, seen[k], t->per);
    free(seen);
    if (t->dc_why[0])
        return TPU_OK;
    t->dc = calloc((size_t)t->ntasks * (size_t)t->per * 4 + 1, sizeof *t->dc);
    if (!t->dc)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory for device_coordinates");
    for (size_t i = 0; i < places; i++) {
        if (t->at_task[i] < 0)
            continue;
        size_t rest = i;
        int *d = &t->dc[((size_t)t->at_task[i] * (size_t)t->per + (size_t)t->at_dev[i]) * 4];
        for (int a = 3; a >= 0; a--) {
            d[a] = (int)(rest % (size_t)t->mesh[a]);
            rest /= (size_t)t->mesh[a];
        }
    }
    return TPU_OK;
}

tpu_status tpu_topology_device_coordinates(const tpu_topology *t, const int **coords, int shape[3])
{
    TOPO(t);
    if (!coords)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_device_coordinates: coords is NULL");
    *coords = NULL;
    if (!t->dc)
        return cli_failf(TPU_FAILED_PRECONDITION, "device_coordinates: %s", t->dc_why);
    *coords = t->dc;
    if (shape) {
        shape[0] = t->ntasks;
        shape[1] = t->per;
        shape[2] = 4;
    }
    return TPU_OK;
}

/* The place of coords, or TPU_OUT_OF_RANGE naming them. */
static tpu_status place_at(const tpu_topology *t, const int coords[4], const char *fn, size_t *p)
{
    TOPO(t);
    if (!coords)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: coords is NULL", fn);
    if (!in_mesh(t->mesh, coords))
        return cli_failf(TPU_OUT_OF_RANGE, "%s: [%d, %d, %d, %d] is outside the mesh [%d, %d, %d, %d]",
                         fn, coords[0], coords[1], coords[2], coords[3], t->mesh[0], t->mesh[1],
                         t->mesh[2], t->mesh[3]);
    *p = place_of(t->mesh, coords);
    return TPU_OK;
}

tpu_status tpu_topology_task_ordinal_at_coordinates(const tpu_topology *t, const int coords[4],
                                                    int *task)
{
    size_t p;
    tpu_status st = place_at(t, coords, "task_ordinal_at_coordinates", &p);
    if (st != TPU_OK)
        return st;
    if (!task)
        return cli_failf(TPU_INVALID_ARGUMENT, "task_ordinal_at_coordinates: task is NULL");
    *task = t->at_task[p];
    return TPU_OK;
}

tpu_status tpu_topology_tpu_device_ordinal_at_coordinates(const tpu_topology *t, const int coords[4],
                                                          int *device)
{
    size_t p;
    tpu_status st = place_at(t, coords, "tpu_device_ordinal_at_coordinates", &p);
    if (st != TPU_OK)
        return st;
    if (!device)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_device_ordinal_at_coordinates: device is NULL");
    *device = t->at_dev[p];
    return TPU_OK;
}

/* _tpu_device_name / _tpu_host_device_name of topology.py (dev < 0: the CPU). */
static tpu_status device_name(const tpu_topology *t, const int coords[4], const char *job, int cpu,
                              char *buf, size_t n)
{
    const char *fn = cpu ? "cpu_device_name_at_coordinates" : "tpu_device_name_at_coordinates";
    char name[300];
    size_t p;
    int len;
    tpu_status st = place_at(t, coords, fn, &p);

    if (st != TPU_OK)
        return st;
    if (!buf || !n)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: buf is NULL or empty", fn);
    buf[0] = '\0';
    if (t->at_task[p] < 0)
        return cli_failf(TPU_NOT_FOUND, "%s: no TPU device at [%d, %d, %d, %d] (a missing device of "
                         "the mesh)", fn, coords[0], coords[1], coords[2], coords[3]);
    if (job && strlen(job) > 200)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: job name of %zu bytes is too long", fn, strlen(job));
    if (cpu)
        len = job ? snprintf(name, sizeof name, "/job:%s/task:%d/device:CPU:0", job, t->at_task[p])
                  : snprintf(name, sizeof name, "/task:%d/device:CPU:0", t->at_task[p]);
    else
        len = job ? snprintf(name, sizeof name, "/job:%s/task:%d/device:TPU:%d", job, t->at_task[p],
                             t->at_dev[p])
                  : snprintf(name, sizeof name, "/task:%d/device:TPU:%d", t->at_task[p], t->at_dev[p]);
    if ((size_t)len >= n)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: a buffer of %zu bytes is too small for \"%s\" (%d "
                         "bytes and the NUL)", fn, n, name, len);
    memcpy(buf, name, (size_t)len + 1);
    return TPU_OK;
}

tpu_status tpu_topology_tpu_device_name_at_coordinates(const tpu_topology *t, const int coords[4],
                                                       const char *job, char *buf, size_t n)
{
    return device_name(t, coords, job, 0, buf, n);
}

tpu_status tpu_topology_cpu_device_name_at_coordinates(const tpu_topology *t, const int coords[4],
                                                       const char *job, char *buf, size_t n)
{
    return device_name(t, coords, job, 1, buf, n);
}

size_t tpu_topology_num_missing_devices(const tpu_topology *t)
{
    TOPO(t);
    return t->nmissing_dev;
}

tpu_status tpu_topology_missing_device(const tpu_topology *t, size_t i, int coords[4])
{
    TOPO(t);
    if (!coords)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_missing_device: coords is NULL");
    if (i >= t->nmissing_dev)
        return cli_failf(TPU_OUT_OF_RANGE, "missing device %zu is out of range: the topology has %zu",
                         i, t->nmissing_dev);
    for (size_t p = 0, k = 0; p < t->nplaces; p++) {
        if (t->at_task[p] >= 0 || k++ != i)
            continue;
        for (int a = 3; a >= 0; a--) {
            coords[a] = (int)(p % (size_t)t->mesh[a]);
            p /= (size_t)t->mesh[a];
        }
        return TPU_OK;
    }
    return cli_failf(TPU_INTERNAL, "missing device %zu not found", i);
}

tpu_status tpu_topology_serialized(const tpu_topology *t, const uint8_t **bytes, size_t *len)
{
    TOPO(t);
    if (!bytes || !len)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_serialized: bytes or len is NULL");
    *bytes = NULL;
    *len = 0;
    if (!t->dc)
        return cli_failf(TPU_FAILED_PRECONDITION, "serialized: %s", t->dc_why);
    if (!t->ser) {
        tpu_topology *w = (tpu_topology *)t; /* the cache only */
        err e;
        if (topo_tf_pack(t->mesh, t->ntasks, t->per, t->dc, &w->ser, &w->nser, &e) != CODE_OK)
            return cli_fail(&e);
    }
    *bytes = t->ser;
    *len = t->nser;
    return TPU_OK;
}

tpu_status tpu_topology_from_serialized(const void *bytes, size_t len, tpu_topology **out)
{
    tpu_topology *t;
    err e;

    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_topology_from_serialized: out is NULL");
    *out = NULL;
    if (topo_tf_parse(bytes, len, &t, &e) != CODE_OK)
        return cli_fail(&e);
    if (cli_topology_build(t) != TPU_OK) {
        tpu_status st = (tpu_status)tpu_last_status();
        tpu_topology_free(t);
        return st;
    }
    *out = t;
    return TPU_OK;
}
