/* tpu_cluster: the connection to the resolver (the first endpoint that
 * answers) and cluster-spec snapshots read from it. */
#include "cluster_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int fetch_spec(tpu_cluster *c, wire_msg **out, err *e)
{
    wire_msg req = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest body = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    int rc;

    req.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    req.cluster_spec_request = &body;
    body.tpu_name = c->r->tpu_name;
    rc = call_do(c, &req, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC, c->r->timeout_ms, out, e);
    if (rc != CODE_OK && c->r->tpu_name[0]) {
        /* as tensorflow/python/tpu/client/client.py words a failed lookup */
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        return err_set(e, rc, "Could not lookup TPU metadata from name '%s'. Please doublecheck the tpu "
                       "argument in the TPUClusterResolver constructor. Exception: %s (the Cloud TPU API: "
                       "the resolver at %s, $TPUEMU_TPU_API)", c->r->tpu_name, why, c->r->ep_str[c->ep]);
    }
    if (rc != CODE_OK)
        return rc;
    if (!(*out)->cluster_spec)
        goto bad;
    for (size_t i = 0; i < (*out)->cluster_spec->n_cores; i++)
        if (!(*out)->cluster_spec->cores[i] || !(*out)->cluster_spec->cores[i]->worker)
            goto bad;
    c->seen_epoch = (*out)->cluster_spec->system_epoch;
    return CODE_OK;
bad:
    wire_msg_free(*out);
    *out = NULL;
    return err_set(e, CODE_INTERNAL, "the resolver at %s sent a cluster spec with a core missing its "
                   "description", c->r->ep_str[c->ep]);
}

tpu_status tpu_connect_to_cluster(tpu_resolver *r, tpu_cluster **out)
{
    tpu_cluster *c;
    wire_msg *m = NULL;
    int rc;
    err e;

    CHECK_HANDLE(r, MAGIC_RESOLVER, "tpu_resolver");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_connect_to_cluster: out is NULL");
    *out = NULL;
    c = calloc(1, sizeof *c);
    if (!c)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    c->r = r;
    spcall_init(&c->call, WIRE_MAX_REPLY);
    c->cancel.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->cancel.fd < 0) {
        free(c);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "tpu_connect_to_cluster: eventfd: %s", strerror(errno));
    }
    c->magic = MAGIC_CLUSTER;
    /* the master: the first address (task 0 of a comma list of hosts, as
     * TPUClusterResolver.master() is), or the Cloud TPU API for a TPU name */
    rc = call_open(c, 0, r->timeout_ms, &e);
    if (rc == CODE_OK)
        rc = fetch_spec(c, &m, &e);
    if (rc == CODE_OK) {
        wire_msg_free(m);
        *out = c;
        return TPU_OK;
    }
    call_close(c);
    c->magic = MAGIC_DEAD;
    close(c->cancel.fd);
    free(c);
    return cli_fail(&e);
}

void tpu_cluster_free(tpu_cluster *c)
{
    if (!c)
        return;
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (c->coll_free)
        c->coll_free(c);
    call_close(c);
    c->magic = MAGIC_DEAD;
    close(c->cancel.fd);
    free(c);
}

const char *tpu_cluster_endpoint(const tpu_cluster *c)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    return c->r->ep_str[c->ep];
}

const char *tpu_cluster_client_id(const tpu_cluster *c)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    return c->r->client_id;
}

uint64_t tpu_cluster_epoch(const tpu_cluster *c)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    return c->epoch;
}

uint64_t tpu_cluster_system_epoch(const tpu_cluster *c)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    return c->seen_epoch;
}

const char *tpu_core_state_name(tpu_core_state s)
{
    switch (s) {
    case TPU_CORE_IDLE:
        return "IDLE";
    case TPU_CORE_READY:
        return "READY";
    case TPU_CORE_DEAD:
        return "DEAD";
    case TPU_CORE_PREEMPTED:
        return "PREEMPTED";
    case TPU_CORE_MAINTENANCE:
        return "MAINTENANCE";
    default:
        return "UNKNOWN";
    }
}

/* TensorFlow's ClusterSpec: job "worker", a task per host. A comma list of
 * hosts in TPU_NAME is taken as given (client.py's network_endpoints from the
 * variable); otherwise each host the resolver knows (the spec is sorted by
 * host, then core) at its lowest core's control address. */
static tpu_status spec_tasks(const tpu_resolver *r, tpu_cluster_spec *s)
{
    const Tpuemu__ClusterSpec *cs = s->m->cluster_spec;
    size_t n = r->n > 1 ? r->n : cs->n_cores;

    s->tasks = calloc(n ? n : 1, sizeof *s->tasks);
    if (!s->tasks)
        return TPU_RESOURCE_EXHAUSTED;
    if (r->n > 1) {
        for (size_t i = 0; i < r->n; i++)
            snprintf(s->tasks[i], sizeof s->tasks[i], "%s", r->ep_str[i]);
        s->ntasks = r->n;
        return TPU_OK;
    }
    for (size_t i = 0; i < cs->n_cores; i++) {
        const Tpuemu__WorkerInfo *w = cs->cores[i]->worker;
        const char *a = w->control_addr ? w->control_addr : "";
        if (i > 0 && strcmp(cs->cores[i - 1]->worker->host_id, w->host_id) == 0)
            continue;
        if (strncmp(a, "tcp://", 6) == 0)
            a += 6;
        snprintf(s->tasks[s->ntasks++], sizeof s->tasks[0], "%s", a);
    }
    return TPU_OK;
}

tpu_status tpu_cluster_spec_get(tpu_cluster *c, tpu_cluster_spec **out)
{
    tpu_cluster_spec *s;
    wire_msg *m;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_cluster_spec_get: out is NULL");
    *out = NULL;
    if (fetch_spec(c, &m, &e) != CODE_OK)
        return cli_fail(&e);
    s = calloc(1, sizeof *s);
    if (!s) {
        wire_msg_free(m);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    s->magic = MAGIC_SPEC;
    s->m = m;
    if (spec_tasks(c->r, s) != TPU_OK) {
        tpu_cluster_spec_free(s);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    *out = s;
    return TPU_OK;
}

void tpu_cluster_spec_free(tpu_cluster_spec *s)
{
    if (!s)
        return;
    CHECK_HANDLE(s, MAGIC_SPEC, "tpu_cluster_spec");
    wire_msg_free(s->m);
    free(s->tasks);
    s->magic = MAGIC_DEAD;
    free(s);
}

#define SPEC(s) (CHECK_HANDLE((s), MAGIC_SPEC, "tpu_cluster_spec"), (s)->m->cluster_spec)

size_t tpu_cluster_spec_num_cores(const tpu_cluster_spec *s)
{
    return SPEC(s)->n_cores;
}

tpu_status tpu_cluster_spec_core(const tpu_cluster_spec *s, size_t i, tpu_core_info *out)
{
    const Tpuemu__ClusterSpec *cs = SPEC(s);
    const Tpuemu__CoreInfo *ci;
    const Tpuemu__WorkerInfo *w;

    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_cluster_spec_core: out is NULL");
    if (i >= cs->n_cores)
        return cli_failf(TPU_OUT_OF_RANGE, "core %zu is out of range: the spec has %zu cores", i,
                         cs->n_cores);
    ci = cs->cores[i];
    w = ci->worker;
    memset(out, 0, sizeof *out);
    out->host_id = w->host_id;
    out->core = w->core;
    out->control_addr = w->control_addr;
    out->data_addr = w->data_addr;
    out->tpu_type = w->tpu_type;
    out->hbm_capacity = w->hbm_capacity;
    out->hbm_used = w->hbm_used;
    out->hbm_peak = w->hbm_peak;
    out->state = ci->state >= TPUEMU__CORE_STATE__CORE_IDLE && ci->state <= TPUEMU__CORE_STATE__CORE_MAINTENANCE
                     ? (tpu_core_state)ci->state
                     : TPU_CORE_UNKNOWN;
    out->heartbeat_age_ms = ci->heartbeat_age_ms;
    out->replica_id = out->state == TPU_CORE_READY ? w->replica_id : -1;
    out->pid = w->pid;
    out->version = w->version;
    out->hbm_ooms = w->hbm_ooms;
    cli_notice_from(w->notice, &out->notice);
    return TPU_OK;
}

uint64_t tpu_cluster_spec_epoch(const tpu_cluster_spec *s)
{
    return SPEC(s)->system_epoch;
}

int tpu_cluster_spec_initialized(const tpu_cluster_spec *s)
{
    return SPEC(s)->initialized ? 1 : 0;
}

uint32_t tpu_cluster_spec_heartbeat_ms(const tpu_cluster_spec *s)
{
    return SPEC(s)->heartbeat_ms;
}

uint32_t tpu_cluster_spec_dead_after(const tpu_cluster_spec *s)
{
    return SPEC(s)->dead_after;
}

const char *tpu_cluster_spec_owner(const tpu_cluster_spec *s)
{
    return SPEC(s)->owner;
}

const char *tpu_cluster_spec_resolver_version(const tpu_cluster_spec *s)
{
    return SPEC(s)->resolver_version;
}

/* Counts live cores, hosts with a live core, and the largest host's count. */
static tpu_status live_counts(tpu_cluster *c, tpu_system_metadata *md)
{
    tpu_cluster_spec *s;
    tpu_status st = tpu_cluster_spec_get(c, &s);
    const char *prev = NULL;
    int on_host = 0;

    if (st != TPU_OK)
        return st;
    memset(md, 0, sizeof *md);
    for (size_t i = 0; i < s->m->cluster_spec->n_cores; i++) {
        const Tpuemu__CoreInfo *ci = s->m->cluster_spec->cores[i];
        if (ci->state != TPUEMU__CORE_STATE__CORE_IDLE && ci->state != TPUEMU__CORE_STATE__CORE_READY)
            continue;
        if (!md->num_cores)
            snprintf(md->tpu_type, sizeof md->tpu_type, "%s", ci->worker->tpu_type);
        md->num_cores++;
        if (!prev || strcmp(prev, ci->worker->host_id) != 0) {
            md->num_hosts++;
            on_host = 0;
            prev = ci->worker->host_id;
        }
        if (++on_host > md->num_of_cores_per_host)
            md->num_of_cores_per_host = on_host;
    }
    tpu_cluster_spec_free(s);
    return TPU_OK;
}

const char *tpu_cluster_spec_job_name(const tpu_cluster_spec *s)
{
    CHECK_HANDLE(s, MAGIC_SPEC, "tpu_cluster_spec");
    return "worker";
}

size_t tpu_cluster_spec_num_tasks(const tpu_cluster_spec *s)
{
    CHECK_HANDLE(s, MAGIC_SPEC, "tpu_cluster_spec");
    return s->ntasks;
}

const char *tpu_cluster_spec_task_address(const tpu_cluster_spec *s, size_t i)
{
    CHECK_HANDLE(s, MAGIC_SPEC, "tpu_cluster_spec");
    return i < s->ntasks ? s->tasks[i] : NULL;
}

const char *tpu_cluster_spec_tpu_name(const tpu_cluster_spec *s)
{
    return SPEC(s)->tpu_name;
}

/* TPUClusterResolver.num_accelerators(): the live cores per host, the same
 * on every host, else the RuntimeError of _verify_and_return_same_core_count
 * with the hosts and their cores. */
tpu_status tpu_num_accelerators(tpu_cluster *c, int *out)
{
    tpu_cluster_spec *s;
    tpu_status st;
    char devs[ERR_MSG_MAX - 160];
    size_t dl = 0;
    const char *prev = NULL;
    int per = -1, on_host = 0, differ = 0;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_num_accelerators: out is NULL");
    if ((st = tpu_cluster_spec_get(c, &s)) != TPU_OK)
        return st;
    devs[0] = '\0';
    for (size_t i = 0; i <= s->m->cluster_spec->n_cores; i++) {
        const Tpuemu__CoreInfo *ci = i < s->m->cluster_spec->n_cores ? s->m->cluster_spec->cores[i] : NULL;
        if (ci && ci->state != TPUEMU__CORE_STATE__CORE_IDLE && ci->state != TPUEMU__CORE_STATE__CORE_READY)
            continue;
        if (prev && (!ci || strcmp(prev, ci->worker->host_id) != 0)) {
            if (per < 0)
                per = on_host;
            else if (per != on_host)
                differ = 1;
            if (dl < sizeof devs)
                dl += (size_t)snprintf(devs + dl, sizeof devs - dl, "]");
            prev = NULL;
            on_host = 0;
        }
        if (!ci)
            break;
        if (dl < sizeof devs && !prev)
            dl += (size_t)snprintf(devs + dl, sizeof devs - dl, "%s'%s': ['%d'", dl ? ", " : "",
                                   ci->worker->host_id, (int)ci->worker->core);
        else if (dl < sizeof devs)
            dl += (size_t)snprintf(devs + dl, sizeof devs - dl, ", '%d'", (int)ci->worker->core);
        prev = ci->worker->host_id;
        on_host++;
    }
    tpu_cluster_spec_free(s);
    if (differ)
        return cli_failf(TPU_FAILED_PRECONDITION, "TPU cores on each device is not the same. This should "
                         "never happen. Devices: {%s}", devs);
    *out = per < 0 ? 0 : per;
    return TPU_OK;
}

tpu_status tpu_system_metadata_get(tpu_cluster *c, tpu_system_metadata *out)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_system_metadata_get: out is NULL");
    return live_counts(c, out);
}
