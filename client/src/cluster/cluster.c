/* tpu_cluster: the connection to the resolver (the first endpoint that
 * answers) and cluster-spec snapshots read from it. */
#include "cluster_int.h"
#include "spec_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
        rc = spec_msg_fetch(c, &m, &e);
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
    size_t ncores = spec_ncores(s), n = r->n > 1 ? r->n : ncores;
    const char *prev = NULL;

    s->tasks = calloc(n ? n : 1, sizeof *s->tasks);
    if (!s->tasks)
        return TPU_RESOURCE_EXHAUSTED;
    if (r->n > 1) {
        for (size_t i = 0; i < r->n; i++)
            snprintf(s->tasks[i], sizeof s->tasks[i], "%s", r->ep_str[i]);
        s->ntasks = r->n;
        return TPU_OK;
    }
    for (size_t i = 0; i < ncores; i++) {
        struct spec_worker w;
        const char *a;
        spec_worker_at(s, i, &w);
        a = w.control_addr;
        if (prev && strcmp(prev, w.host_id) == 0)
            continue;
        prev = w.host_id;
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
    if (spec_msg_fetch(c, &m, &e) != CODE_OK)
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

#define SPEC(s) CHECK_HANDLE((s), MAGIC_SPEC, "tpu_cluster_spec")

static struct spec_system sys_of(const tpu_cluster_spec *s)
{
    struct spec_system y;
    spec_system(s, &y);
    return y;
}

size_t tpu_cluster_spec_num_cores(const tpu_cluster_spec *s)
{
    SPEC(s);
    return spec_ncores(s);
}

tpu_status tpu_cluster_spec_core(const tpu_cluster_spec *s, size_t i, tpu_core_info *out)
{
    size_t n;
    SPEC(s);
    n = spec_ncores(s);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_cluster_spec_core: out is NULL");
    if (i >= n)
        return cli_failf(TPU_OUT_OF_RANGE, "core %zu is out of range: the spec has %zu cores", i, n);
    spec_core_info(s, i, out);
    return TPU_OK;
}

uint64_t tpu_cluster_spec_epoch(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).epoch;
}

int tpu_cluster_spec_initialized(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).initialized ? 1 : 0;
}

uint32_t tpu_cluster_spec_heartbeat_ms(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).heartbeat_ms;
}

uint32_t tpu_cluster_spec_dead_after(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).dead_after;
}

const char *tpu_cluster_spec_owner(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).owner;
}

const char *tpu_cluster_spec_resolver_version(const tpu_cluster_spec *s)
{
    SPEC(s);
    return sys_of(s).resolver_version;
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
    for (size_t i = 0; i < spec_ncores(s); i++) {
        struct spec_worker w;
        spec_worker_at(s, i, &w);
        if (!w.live)
            continue;
        if (!md->num_cores)
            snprintf(md->tpu_type, sizeof md->tpu_type, "%s", w.tpu_type);
        md->num_cores++;
        if (!prev || strcmp(prev, w.host_id) != 0) {
            md->num_hosts++;
            on_host = 0;
            prev = w.host_id;
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
    SPEC(s);
    return sys_of(s).tpu_name;
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
    for (size_t i = 0, n = spec_ncores(s); i <= n; i++) {
        struct spec_worker w, *ci = NULL;
        if (i < n) {
            spec_worker_at(s, i, &w);
            ci = &w;
        }
        if (ci && !ci->live)
            continue;
        if (prev && (!ci || strcmp(prev, ci->host_id) != 0)) {
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
            dl += (size_t)snprintf(devs + dl, sizeof devs - dl, "%s'%s': ['%d'", dl ? ", " : "", ci->host_id, ci->core);
        else if (dl < sizeof devs)
            dl += (size_t)snprintf(devs + dl, sizeof devs - dl, ", '%d'", ci->core);
        prev = ci->host_id;
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
