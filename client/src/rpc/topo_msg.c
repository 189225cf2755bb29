/* A topology handle's messages read as plain C, and TensorFlow's
 * TopologyProto both ways (topo_msg.h). */
#include "topo_msg.h"

#include "tf_topology.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* Mesh places a topology may have (as topology.c's bound). */
#define TOPO_PLACES_MAX (1u << 20)
#define STR(s) ((s) ? (s) : "")

/* A topology handle's messages: the answer to an initialize, or a Topology
 * of its own built from TopologyProto bytes. */
struct topo_msgs {
    wire_msg *m;                /* body: topology; NULL when parsed from TopologyProto bytes */
    const Tpuemu__Topology *tp; /* m->topology, or own */
    Tpuemu__Topology *own;
};

int topo_msgs_new(tpu_topology *t, wire_msg *m, err *e)
{
    if (!(t->msgs = calloc(1, sizeof *t->msgs)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    t->msgs->m = m;
    t->msgs->tp = m ? m->topology : NULL;
    return CODE_OK;
}

static void own_free(Tpuemu__Topology *o)
{
    if (!o)
        return;
    if (o->n_cores) {
        free(o->cores[0]->coords);
        free(o->cores[0]);
    }
    free(o->cores);
    free(o->mesh_shape);
    free(o);
}

void topo_msgs_free(tpu_topology *t)
{
    if (!t->msgs)
        return;
    wire_msg_free(t->msgs->m);
    own_free(t->msgs->own);
    free(t->msgs);
    t->msgs = NULL;
}

void topo_info(const tpu_topology *t, struct topo_info *out)
{
    const Tpuemu__Topology *tp = t->msgs->tp;
    memset(out, 0, sizeof *out);
    out->epoch = tp->epoch;
    out->nmesh = tp->n_mesh_shape;
    for (size_t i = 0; i < tp->n_mesh_shape && i < 4; i++)
        out->mesh_shape[i] = tp->mesh_shape[i];
    out->ncores = tp->n_cores;
    out->nmissing = tp->n_missing;
    out->num_tasks = tp->num_tasks;
    out->num_tpus_per_task = tp->num_tpus_per_task;
    out->tpu_type = STR(tp->tpu_type);
    out->owner = STR(tp->owner);
}

uint64_t topo_epoch(const tpu_topology *t)
{
    return t->msgs->tp->epoch;
}

size_t topo_ncores(const tpu_topology *t)
{
    return t->msgs->tp->n_cores;
}

void topo_core_at(const tpu_topology *t, size_t i, struct topo_core *out)
{
    const Tpuemu__TopologyCore *tc = t->msgs->tp->cores[i];
    memset(out, 0, sizeof *out);
    out->replica_id = tc->replica_id;
    out->host_id = STR(tc->host_id);
    out->data_addr = STR(tc->data_addr);
    out->control_addr = STR(tc->control_addr);
    out->core = tc->core;
    out->task_id = tc->task_id;
    out->ncoords = tc->n_coords;
    for (size_t k = 0; k < tc->n_coords && k < 4; k++)
        out->coords[k] = tc->coords[k];
}

const char *topo_missing(const tpu_topology *t, size_t i)
{
    return i < t->msgs->tp->n_missing ? t->msgs->tp->missing[i] : NULL;
}

int topo_tf_pack(const int mesh[4], int ntasks, int per, const int *dc, uint8_t **out, size_t *n, err *e)
{
    Tensorflow__Tpu__TopologyProto p = TENSORFLOW__TPU__TOPOLOGY_PROTO__INIT;
    int32_t m[4] = {mesh[0], mesh[1], mesh[2], mesh[3]};
    uint8_t *buf;

    p.n_mesh_shape = 4;
    p.mesh_shape = m;
    p.num_tasks = ntasks;
    p.num_tpu_devices_per_task = per;
    p.n_device_coordinates = (size_t)ntasks * (size_t)per * 4;
    p.device_coordinates = (int32_t *)(uintptr_t)dc;
    *n = tensorflow__tpu__topology_proto__get_packed_size(&p);
    if (!(buf = malloc(*n ? *n : 1)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory serializing the topology");
    tensorflow__tpu__topology_proto__pack(&p, buf);
    *out = buf;
    return CODE_OK;
}

/* "[2, 2, 1, 2]": a repeated field as Python prints it, for messages. */
static const char *list_str(const int32_t *v, size_t n, const char *sep, char *buf, size_t cap)
{
    size_t len = 0;
    int k = snprintf(buf, cap, "[");
    len = k > 0 ? (size_t)k : 0;
    for (size_t i = 0; i < n && len + 16 < cap; i++) {
        k = snprintf(buf + len, cap - len, "%s%" PRId32, i ? sep : "", v[i]);
        len += k > 0 ? (size_t)k : 0;
        if (i + 1 < n && i == 15) {
            snprintf(buf + len, cap - len, "%s...", sep);
            len += strlen(buf + len);
            break;
        }
    }
    snprintf(buf + len, cap - len, "]");
    return buf;
}

int topo_tf_parse(const void *bytes, size_t len, tpu_topology **out, err *e)
{
    Tensorflow__Tpu__TopologyProto *p;
    Tpuemu__Topology *o = NULL;
    tpu_topology *t = NULL;
    char b1[200];
    uint64_t want;
    size_t n;

    *out = NULL;
    if (!bytes || !len)
        return err_set(e, CODE_INVALID_ARGUMENT, "serialized TopologyProto is empty");
    p = tensorflow__tpu__topology_proto__unpack(NULL, len, bytes);
    if (!p)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "Error parsing message with type "
                       "'tensorflow.tpu.TopologyProto' (%zu bytes that are not a TopologyProto)",
                       len);
    /* the checks and messages of Topology._parse_topology */
    for (size_t i = 0; i < p->n_mesh_shape && p->n_mesh_shape == 4; i++)
        if (p->mesh_shape[i] < 1)
            goto bad_mesh;
    if (p->n_mesh_shape != 4)
        goto bad_mesh;
    if (p->num_tasks < 0) {
        err_set(e, CODE_INVALID_ARGUMENT, "`num_tasks` must be >= 0; got %" PRId32, p->num_tasks);
        goto fail;
    }
    if (p->num_tpu_devices_per_task < 0) {
        err_set(e, CODE_INVALID_ARGUMENT, "`num_tpu_devices_per_task` must be >= 0; got %" PRId32,
                p->num_tpu_devices_per_task);
        goto fail;
    }
    if ((uint32_t)p->num_tasks > TOPO_PLACES_MAX || (uint32_t)p->num_tpu_devices_per_task > TOPO_PLACES_MAX) {
        err_set(e, CODE_INVALID_ARGUMENT,
                "num_tasks %" PRId32 " or num_tpu_devices_per_task %" PRId32 " is above %u, more than any slice has",
                p->num_tasks, p->num_tpu_devices_per_task, TOPO_PLACES_MAX);
        goto fail;
    }
    want = (uint64_t)p->num_tasks * (uint64_t)p->num_tpu_devices_per_task * p->n_mesh_shape;
    if (p->n_device_coordinates != want) {
        err_set(e, CODE_INVALID_ARGUMENT,
                "`device_coordinates` must have shape num_tasks (%" PRId32 ") * num_tpu_devices_per_task (%" PRId32
                ") * len(mesh_shape) (%s); got shape %zu",
                p->num_tasks, p->num_tpu_devices_per_task,
                list_str(p->mesh_shape, p->n_mesh_shape, ", ", b1, sizeof b1), p->n_device_coordinates);
        goto fail;
    }
    for (size_t i = 0; i < p->n_device_coordinates; i++)
        if (p->device_coordinates[i] < 0) {
            err_set(e, CODE_INVALID_ARGUMENT, "`device_coordinates` must be >= 0");
            goto fail;
        }
    for (size_t i = 0; i < p->n_device_coordinates; i += 4) {
        const int32_t *c = &p->device_coordinates[i];
        for (int a = 0; a < 4; a++)
            if (c[a] >= p->mesh_shape[a]) {
                err_set(e, CODE_INVALID_ARGUMENT,
                        "`device_coordinates`: task %zu device %zu is at "
                        "[%" PRId32 ", %" PRId32 ", %" PRId32 ", %" PRId32 "], outside the mesh %s",
                        i / 4 / (size_t)p->num_tpu_devices_per_task, i / 4 % (size_t)p->num_tpu_devices_per_task, c[0],
                        c[1], c[2], c[3], list_str(p->mesh_shape, 4, ", ", b1, sizeof b1));
                goto fail;
            }
    }
    if ((uint64_t)p->mesh_shape[0] * (uint64_t)p->mesh_shape[1] * (uint64_t)p->mesh_shape[2] *
            (uint64_t)p->mesh_shape[3] >
        TOPO_PLACES_MAX) {
        err_set(e, CODE_INVALID_ARGUMENT, "mesh_shape %s has more than %u places",
                list_str(p->mesh_shape, 4, ", ", b1, sizeof b1), TOPO_PLACES_MAX);
        goto fail;
    }
    /* a topology of its own: cores in task, device order */
    n = p->n_device_coordinates / 4;
    t = calloc(1, sizeof *t);
    o = calloc(1, sizeof *o);
    if (!t || !o)
        goto oom;
    tpuemu__topology__init(o);
    o->n_mesh_shape = 4;
    o->mesh_shape = calloc(4, sizeof *o->mesh_shape);
    o->cores = calloc(n ? n : 1, sizeof *o->cores);
    if (!o->mesh_shape || !o->cores)
        goto oom;
    if (n) {
        Tpuemu__TopologyCore *tc = calloc(n, sizeof *tc);
        uint32_t *cc = calloc(n * 4, sizeof *cc);
        if (!tc || !cc) {
            free(tc);
            free(cc);
            goto oom;
        }
        for (size_t i = 0; i < n; i++) {
            tpuemu__topology_core__init(&tc[i]);
            tc[i].replica_id = (int32_t)i;
            tc[i].host_id = (char *)"";
            tc[i].core = (int32_t)(i % (size_t)p->num_tpu_devices_per_task);
            tc[i].task_id = (uint32_t)(i / (size_t)p->num_tpu_devices_per_task);
            tc[i].n_coords = 4;
            tc[i].coords = &cc[i * 4];
            for (int a = 0; a < 4; a++)
                cc[i * 4 + (size_t)a] = (uint32_t)p->device_coordinates[i * 4 + (size_t)a];
            tc[i].data_addr = (char *)"";
            tc[i].control_addr = (char *)"";
            o->cores[i] = &tc[i];
        }
        o->n_cores = n;
    }
    for (int a = 0; a < 4; a++)
        o->mesh_shape[a] = (uint32_t)p->mesh_shape[a];
    o->num_tasks = (uint32_t)p->num_tasks;
    o->num_tpus_per_task = (uint32_t)p->num_tpu_devices_per_task;
    o->tpu_type = (char *)"";
    o->owner = (char *)"";
    t->magic = MAGIC_TOPOLOGY;
    if (topo_msgs_new(t, NULL, e) != CODE_OK)
        goto fail;
    t->msgs->own = o;
    t->msgs->tp = o;
    o = NULL;
    /* serialized() of a parsed Topology is the bytes it was parsed from */
    if (!(t->ser = malloc(len)))
        goto oom;
    memcpy(t->ser, bytes, len);
    t->nser = len;
    tensorflow__tpu__topology_proto__free_unpacked(p, NULL);
    *out = t;
    return CODE_OK;
bad_mesh:
    err_set(e, CODE_INVALID_ARGUMENT,
            "`mesh_shape` must be a vector of size 4 with positive entries; "
            "got %s",
            list_str(p->mesh_shape, p->n_mesh_shape, " ", b1, sizeof b1));
    goto fail;
oom:
    err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory parsing a topology");
fail:
    tensorflow__tpu__topology_proto__free_unpacked(p, NULL);
    own_free(o);
    if (t) {
        topo_msgs_free(t);
        free(t->ser);
        free(t);
    }
    return e->code;
}
