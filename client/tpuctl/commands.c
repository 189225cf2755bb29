/* tpuctl commands: cluster, init, shutdown, forget, health, version (bench: bench.c). Each parses its
 * own flags from a settings table, talks to the resolver through
 * libtpuclient only, and prints text or (--json) one JSON object. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "addr.h"
#include "auth.h"
#include "config.h"
#include "httpd.h"
#include "json.h"
#include "scenario.h"
#include "select.h"
#include "table.h"
#include "topo.h"
#include "tpuctl.h"
#include "tpuemu/profile.h"
#include "wire.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Parses a command's flags; returns -1 to go on, else the exit status. */
static int cmd_flags(const struct opt *t, size_t n, int argc, char **argv, const char *usage,
                     const char *about)
{
    int first = argc;
    err e;
    int rc = opt_parse(t, n, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(t, n, usage, about);
        return EXIT_OK;
    }
    if (rc != CODE_OK) {
        fprintf(stderr, "tpuctl %s: %s (see tpuctl %s --help)\n", argv[0], e.msg, argv[0]);
        return EXIT_USAGE;
    }
    if (first < argc) {
        fprintf(stderr, "tpuctl %s: unexpected argument '%s' (see tpuctl %s --help)\n", argv[0],
                argv[first], argv[0]);
        return EXIT_USAGE;
    }
    return -1;
}

static int fail(void)
{
    fprintf(stderr, "%s: %s\n", tpu_status_name(tpu_last_status()), tpu_last_error());
    return EXIT_ERROR;
}

/* Resolver + connection, or an error printed and the exit status. */
static int connect_cluster(const struct tpuctl *g, tpu_resolver **r, tpu_cluster **c)
{
    *r = NULL;
    *c = NULL;
    if (tpu_resolver_new(g->tpu, r) != TPU_OK) {
        /* a bad --tpu is the user's command line; a bad $TPUEMU_TPU_API the
         * environment's, which the message names */
        fprintf(stderr, "tpuctl: %s%s\n", strncmp(tpu_last_error(), "$TPUEMU_TPU_API", 15) ? "--tpu: " : "",
                tpu_last_error());
        return EXIT_USAGE;
    }
    if ((g->token_file && *g->token_file && tpu_resolver_set_token_file(*r, g->token_file) != TPU_OK) ||
        tpu_resolver_set_timeout_ms(*r, (uint32_t)g->timeout_ms) != TPU_OK ||
        tpu_connect_to_cluster(*r, c) != TPU_OK) {
        int rc = fail();
        tpu_resolver_free(*r);
        *r = NULL;
        return rc;
    }
    return -1;
}

static void disconnect(tpu_resolver *r, tpu_cluster *c)
{
    tpu_cluster_free(c);
    tpu_resolver_free(r);
}

/* connect_cluster() and a fresh cluster spec; -1 on success, else the exit
 * status (the error printed, nothing left open). */
static int connect_spec(const struct tpuctl *g, tpu_resolver **r, tpu_cluster **c, tpu_cluster_spec **s)
{
    int rc = connect_cluster(g, r, c);
    if (rc >= 0)
        return rc;
    if (tpu_cluster_spec_get(*c, s) != TPU_OK) {
        rc = fail();
        disconnect(*r, *c);
        return rc;
    }
    return -1;
}

static size_t count_hosts(const tpu_cluster_spec *s)
{
    size_t hosts = 0;
    const char *prev = NULL;
    tpu_core_info ci;
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++) {
        tpu_cluster_spec_core(s, i, &ci);
        if (!prev || strcmp(prev, ci.host_id) != 0)
            hosts++;
        prev = ci.host_id;
    }
    return hosts;
}

/* ---- cluster ---- */

/* --host and --state of cluster and health: parsed into *sel; -1 to go on,
 * else the exit status (the error printed). */
static int parse_select(const char *cmd, const char *hosts, const char *states, core_select *sel)
{
    char msg[256];
    if (select_parse(sel, hosts, states, msg, sizeof msg) < 0) {
        fprintf(stderr, "tpuctl %s: %s (see tpuctl %s --help)\n", cmd, msg, cmd);
        return EXIT_USAGE;
    }
    return -1;
}

#define SELECT_FLAGS(hosts, states)                                                                   \
    {"host", NULL, OPT_STRING, NULL, 0, 0, "H[,H...]",                                                \
     "only cores of these hosts; shell patterns work ('h1*')", &(hosts)},                             \
    {"state", NULL, OPT_STRING, NULL, 0, 0, "S[,S...]", "only cores in these states: READY, IDLE, DEAD, PREEMPTED, MAINTENANCE", \
     &(states)}

/* "showing 8 of 1024 cores" when a selection hides some. */
static void print_shown(size_t shown, size_t n, const char *hosts, const char *states)
{
    if (shown == n)
        return;
    printf("showing %zu of %zu cores (%s%s%s%s%s)\n", shown, n, hosts ? "--host " : "", hosts ? hosts : "",
           hosts && states ? ", " : "", states ? "--state " : "", states ? states : "");
}

static void cluster_json_head(json *j, tpu_cluster *c, const tpu_cluster_spec *s, size_t n,
                              const size_t cnt[TPU_CORE_STATES])
{
    json_init(j, stdout);
    json_obj(j, NULL);
    json_str(j, "resolver", tpu_cluster_endpoint(c));
    json_uint(j, "num_cores", n);
    json_uint(j, "ready", cnt[TPU_CORE_READY]);
    json_uint(j, "idle", cnt[TPU_CORE_IDLE]);
    json_uint(j, "dead", cnt[TPU_CORE_DEAD]);
    json_uint(j, "preempted", cnt[TPU_CORE_PREEMPTED]);
    json_uint(j, "maintenance", cnt[TPU_CORE_MAINTENANCE]);
    json_uint(j, "num_hosts", count_hosts(s));
    json_uint(j, "epoch", tpu_cluster_spec_epoch(s));
    json_bool(j, "initialized", tpu_cluster_spec_initialized(s));
    json_uint(j, "heartbeat_ms", tpu_cluster_spec_heartbeat_ms(s));
    json_uint(j, "dead_after", tpu_cluster_spec_dead_after(s));
    json_str(j, "owner", tpu_cluster_spec_owner(s));
    json_str(j, "resolver_version", tpu_cluster_spec_resolver_version(s));
    json_str(j, "tpu_name", tpu_cluster_spec_tpu_name(s));
    /* TensorFlow's ClusterSpec.as_dict(): {"worker": ["HOST:PORT", ...]}, a task per host */
    json_obj(j, "cluster_spec");
    json_arr(j, tpu_cluster_spec_job_name(s));
    for (size_t i = 0; i < tpu_cluster_spec_num_tasks(s); i++)
        json_str(j, NULL, tpu_cluster_spec_task_address(s, i));
    json_end(j);
    json_end(j);
}

/* "cluster spec: {'worker': ['10.0.0.2:40001', '10.0.0.3:40001']}", as TensorFlow prints one */
static void print_cluster_spec(const tpu_cluster_spec *s)
{
    const char *name = tpu_cluster_spec_tpu_name(s);
    printf("cluster spec: {'%s': [", tpu_cluster_spec_job_name(s));
    for (size_t i = 0; i < tpu_cluster_spec_num_tasks(s); i++)
        printf("%s'%s'", i ? ", " : "", tpu_cluster_spec_task_address(s, i));
    printf("]}%s%s\n", name && *name ? ", TPU name " : "", name ? name : "");
}

static void cluster_json_core(json *j, const tpu_core_info *ci)
{
    json_obj(j, NULL);
    json_str(j, "host", ci->host_id);
    json_int(j, "core", ci->core);
    json_str(j, "state", tpu_core_state_name(ci->state));
    if (ci->replica_id >= 0)
        json_int(j, "replica", ci->replica_id);
    else
        json_null(j, "replica");
    json_str(j, "tpu_type", ci->tpu_type);
    json_uint(j, "hbm_used", ci->hbm_used);
    json_uint(j, "hbm_peak", ci->hbm_peak);
    json_uint(j, "hbm_capacity", ci->hbm_capacity);
    json_uint(j, "heartbeat_age_ms", ci->heartbeat_age_ms);
    json_uint(j, "pid", ci->pid);
    json_str(j, "control_addr", ci->control_addr);
    json_str(j, "data_addr", ci->data_addr);
    json_str(j, "version", ci->version);
    json_end(j);
}

static void cluster_row(table *t, const tpu_core_info *ci)
{
    table_cell(t, "%s", ci->host_id);
    table_cell(t, "%d", ci->core);
    table_cell(t, "%s", tpu_core_state_name(ci->state));
    if (ci->replica_id >= 0)
        table_cell(t, "%d", ci->replica_id);
    else
        table_cell(t, "-");
    table_cell(t, "%s", ci->tpu_type);
    table_cell(t, "%.2f", (double)ci->hbm_used / GIB);
    table_cell(t, "%.2f", (double)ci->hbm_peak / GIB);
    table_cell(t, "%.2f", (double)ci->hbm_capacity / GIB);
    table_cell(t, "%.1fs", (double)ci->heartbeat_age_ms / 1000.0);
    table_cell(t, "%u", ci->pid);
    table_cell(t, "%s", ci->control_addr);
    table_cell(t, "%s", ci->data_addr);
}

/* --summary: one row (or JSON object) per host. */
static void cluster_hosts(const struct tpuctl *g, json *j, const core_select *sel, const tpu_cluster_spec *s)
{
    static const char *const head[] = {"HOST", "CORES", "READY", "IDLE", "DEAD", "HBM_USED", "HBM_CAP",
                                       "MAX_HEARTBEAT_AGE"};
    host_sum *h;
    size_t nh = select_by_host(sel, s, &h);

    if (g->json) {
        json_arr(j, "hosts");
        for (size_t i = 0; i < nh; i++) {
            json_obj(j, NULL);
            json_str(j, "host", h[i].host);
            json_uint(j, "cores", h[i].cores);
            json_uint(j, "ready", h[i].state[TPU_CORE_READY]);
            json_uint(j, "idle", h[i].state[TPU_CORE_IDLE]);
            json_uint(j, "dead", h[i].state[TPU_CORE_DEAD]);
            json_uint(j, "hbm_used", h[i].hbm_used);
            json_uint(j, "hbm_capacity", h[i].hbm_capacity);
            json_uint(j, "max_heartbeat_age_ms", h[i].max_heartbeat_age_ms);
            json_end(j);
        }
        json_end(j);
    } else if (nh) {
        table t;
        table_init(&t, sizeof head / sizeof head[0], head);
        for (size_t i = 0; i < nh; i++) {
            table_cell(&t, "%s", h[i].host);
            table_cell(&t, "%zu", h[i].cores);
            table_cell(&t, "%zu", h[i].state[TPU_CORE_READY]);
            table_cell(&t, "%zu", h[i].state[TPU_CORE_IDLE]);
            table_cell(&t, "%zu", h[i].state[TPU_CORE_DEAD]);
            table_cell(&t, "%.2f", (double)h[i].hbm_used / GIB);
            table_cell(&t, "%.2f", (double)h[i].hbm_capacity / GIB);
            table_cell(&t, "%.1fs", (double)h[i].max_heartbeat_age_ms / 1000.0);
        }
        table_print(&t, stdout);
        table_free(&t);
    }
    free(h);
}

static int cmd_cluster(const struct tpuctl *g, int argc, char **argv)
{
    /* HBM figures in GiB */
    static const char *const head[] = {"HOST", "CORE", "STATE", "REPLICA", "TYPE", "HBM_USED",
                                       "HBM_PEAK", "HBM_CAP", "HEARTBEAT_AGE", "PID", "CONTROL", "DATA"};
    const char *hosts = NULL, *states = NULL;
    int summary = 0;
    struct opt flags[] = {
        SELECT_FLAGS(hosts, states),
        {"summary", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "one row per host (cores by state, HBM, oldest heartbeat) instead of one per core", &summary},
    };
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_cluster_spec *s;
    tpu_core_info ci;
    core_select sel;
    size_t n, shown = 0, cnt[TPU_CORE_STATES] = {0};
    int rc = cmd_flags(flags, sizeof flags / sizeof flags[0], argc, argv,
                       "tpuctl cluster [--host H[,H...]] [--state S[,S...]] [--summary]",
                       "Every core the resolver knows: state, replica, HBM, heartbeat age. The first "
                       "line counts the whole cluster; --host and --state pick the cores listed.");

    if (rc >= 0 || (rc = parse_select("cluster", hosts, states, &sel)) >= 0 ||
        (rc = connect_spec(g, &r, &c, &s)) >= 0)
        return rc;
    n = tpu_cluster_spec_num_cores(s);
    for (size_t i = 0; i < n; i++) {
        tpu_cluster_spec_core(s, i, &ci);
        cnt[(unsigned)ci.state < TPU_CORE_STATES ? ci.state : TPU_CORE_UNKNOWN]++;
        shown += select_match(&sel, &ci);
    }
    if (g->json) {
        json j;
        cluster_json_head(&j, c, s, n, cnt);
        if (summary) {
            cluster_hosts(g, &j, &sel, s);
        } else {
            json_arr(&j, "cores");
            for (size_t i = 0; i < n; i++) {
                tpu_cluster_spec_core(s, i, &ci);
                if (select_match(&sel, &ci))
                    cluster_json_core(&j, &ci);
            }
            json_end(&j);
        }
        json_end(&j);
    } else {
        char more[64] = "";
        if (cnt[TPU_CORE_PREEMPTED] || cnt[TPU_CORE_MAINTENANCE])
            snprintf(more, sizeof more, ", %zu preempted, %zu in maintenance", cnt[TPU_CORE_PREEMPTED],
                     cnt[TPU_CORE_MAINTENANCE]);
        printf("cluster: %zu cores (%zu ready, %zu idle, %zu dead%s) on %zu hosts, epoch %llu, "
               "initialized %s, heartbeat %u ms, dead after %u missed (%.1f s; the heartbeat follows the cores per CPU "
               "of the busiest machine)\n",
               n, cnt[TPU_CORE_READY], cnt[TPU_CORE_IDLE], cnt[TPU_CORE_DEAD], more, count_hosts(s),
               (unsigned long long)tpu_cluster_spec_epoch(s),
               tpu_cluster_spec_initialized(s) ? "yes" : "no", tpu_cluster_spec_heartbeat_ms(s),
               tpu_cluster_spec_dead_after(s),
               tpu_cluster_spec_heartbeat_ms(s) * (double)tpu_cluster_spec_dead_after(s) / 1000.0);
        print_cluster_spec(s);
        print_shown(shown, n, hosts, states);
        if (!n) {
            printf("no cores have registered; start workers with tpu-worker --resolver %s\n",
                   tpu_cluster_endpoint(c));
        } else if (summary) {
            cluster_hosts(g, NULL, &sel, s);
        } else if (shown) {
            table t;
            table_init(&t, sizeof head / sizeof head[0], head);
            for (size_t i = 0; i < n; i++) {
                tpu_cluster_spec_core(s, i, &ci);
                if (select_match(&sel, &ci))
                    cluster_row(&t, &ci);
            }
            table_print(&t, stdout);
            table_free(&t);
        }
    }
    tpu_cluster_spec_free(s);
    disconnect(r, c);
    return EXIT_OK;
}

/* ---- init ---- */

static int cmd_init(const struct tpuctl *g, int argc, char **argv)
{
    static const char *const head[] = {"REPLICA", "HOST", "CORE", "TASK", "COORDS", "DEVICE", "DATA"};
    long long expect = 0, timeout = 0;
    int partial = 0, keep = 0;
    const char *serialized = NULL;
    char dev[256];
    struct opt flags[] = {
        {"expect", NULL, OPT_INT, "0", 0, 4096, "N", "cores to wait for; 0: the cores alive now (dead ones left out)",
         &expect},
        {"timeout-ms", NULL, OPT_INT, "10000", 0, 600000, "MS", "how long to wait for them", &timeout},
        {"allow-partial", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "at the deadline, go on with the cores that are there", &partial},
        {"keep-faults", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "the cores keep the faults waiting for a step (tpuctl chaos --at-step); by default a new system cancels "
         "them", &keep},
        {"serialized", NULL, OPT_STRING, NULL, 0, 0, "FILE",
         "write TensorFlow's TopologyProto bytes (Topology.serialized()) to FILE", &serialized},
    };
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_topology *t;
    tpu_init_options o = {0};
    tpu_topology_core tc;
    int mesh[4] = {0}, nrep;
    size_t nmesh;
    int rc = cmd_flags(flags, sizeof flags / sizeof flags[0], argc, argv,
                       "tpuctl init [--expect N] [--timeout-ms MS] [--allow-partial] [--keep-faults] [--serialized FILE]",
                       "Initialize the TPU system: wait for the cores, start a new epoch, reset "
                       "them, print the topology.");

    if (rc >= 0 || (rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    o.expect = (uint32_t)expect;
    o.timeout_ms = (uint32_t)timeout;
    o.allow_partial = partial;
    o.keep_scheduled_faults = keep;
    if (tpu_initialize_system(c, &o, &t) != TPU_OK) {
        rc = fail();
        disconnect(r, c);
        return rc;
    }
    nmesh = tpu_topology_mesh_shape(t, mesh);
    nrep = tpu_topology_num_replicas(t);
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_uint(&j, "epoch", tpu_topology_epoch(t));
        json_str(&j, "tpu_type", tpu_topology_tpu_type(t));
        json_int(&j, "num_cores", nrep);
        json_int(&j, "num_hosts", tpu_topology_num_tasks(t));
        json_int(&j, "num_tasks", tpu_topology_num_tasks(t));
        json_int(&j, "num_tpus_per_task", tpu_topology_num_tpus_per_task(t));
        json_arr(&j, "mesh_shape");
        for (size_t i = 0; i < nmesh; i++)
            json_int(&j, NULL, mesh[i]);
        json_end(&j);
        json_str(&j, "owner", tpu_topology_owner(t));
        json_arr(&j, "cores");
        for (int i = 0; i < nrep; i++) {
            if (tpu_topology_core_get(t, i, &tc) != TPU_OK)
                continue;
            json_obj(&j, NULL);
            json_int(&j, "replica", tc.replica_id);
            json_str(&j, "host", tc.host_id);
            json_int(&j, "core", tc.core);
            json_int(&j, "task", tc.task_id);
            json_arr(&j, "coords");
            for (int k = 0; k < 4; k++)
                json_int(&j, NULL, tc.coords[k]);
            json_end(&j);
            json_str(&j, "device", tpuctl_topo_device(t, tc.coords, dev, sizeof dev));
            json_str(&j, "data_addr", tc.data_addr);
            json_str(&j, "control_addr", tpu_topology_control_addr(t, i));
            json_end(&j);
        }
        json_end(&j);
        json_arr(&j, "missing");
        for (size_t i = 0; i < tpu_topology_num_missing(t); i++)
            json_str(&j, NULL, tpu_topology_missing(t, i));
        json_end(&j);
        tpuctl_topo_json(&j, t);
        json_end(&j);
    } else {
        table tb;
        printf("TPU system initialized: epoch %llu, %s, %d cores on %d hosts (%d tasks x %d cores per "
               "task), mesh [%d, %d, %d, %d]\n",
               (unsigned long long)tpu_topology_epoch(t), tpu_topology_tpu_type(t), nrep,
               tpu_topology_num_tasks(t), tpu_topology_num_tasks(t), tpu_topology_num_tpus_per_task(t),
               mesh[0], mesh[1], mesh[2], mesh[3]);
        table_init(&tb, sizeof head / sizeof head[0], head);
        for (int i = 0; i < nrep; i++) {
            if (tpu_topology_core_get(t, i, &tc) != TPU_OK)
                continue;
            table_cell(&tb, "%d", tc.replica_id);
            table_cell(&tb, "%s", tc.host_id);
            table_cell(&tb, "%d", tc.core);
            table_cell(&tb, "%d", tc.task_id);
            table_cell(&tb, "[%d, %d, %d, %d]", tc.coords[0], tc.coords[1], tc.coords[2], tc.coords[3]);
            table_cell(&tb, "%s", tpuctl_topo_device(t, tc.coords, dev, sizeof dev));
            table_cell(&tb, "%s", tc.data_addr);
        }
        table_print(&tb, stdout);
        table_free(&tb);
        for (size_t i = 0; i < tpu_topology_num_missing(t); i++)
            printf("missing: %s\n", tpu_topology_missing(t, i));
        tpuctl_topo_text(t);
    }
    rc = serialized ? tpuctl_topo_save(t, serialized) : EXIT_OK;
    tpu_topology_free(t);
    disconnect(r, c);
    return rc;
}

/* ---- shutdown ---- */

static int cmd_shutdown(const struct tpuctl *g, int argc, char **argv)
{
    struct opt none[1] = {{0}};
    tpu_resolver *r;
    tpu_cluster *c;
    int rc = cmd_flags(none, 0, argc, argv, "tpuctl shutdown",
                       "Shut the TPU system down: every core leaves it and is reset; a new epoch "
                       "starts with nothing initialized.");

    if (rc >= 0 || (rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    if (tpu_shutdown_system(c) != TPU_OK) {
        rc = fail();
        disconnect(r, c);
        return rc;
    }
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_bool(&j, "shutdown", 1);
        json_uint(&j, "epoch", tpu_cluster_system_epoch(c));
        json_end(&j);
    } else {
        printf("TPU system shut down (epoch %llu)\n", (unsigned long long)tpu_cluster_system_epoch(c));
    }
    disconnect(r, c);
    return EXIT_OK;
}

/* ---- forget ---- */

/* s as HOST/CORE (like h0/3) into host and *core; -1 with a message naming
 * the command otherwise. */
static int parse_core(const char *cmd, const char *s, char *host, size_t n, long *core)
{
    const char *slash = strrchr(s, '/');
    char *end = NULL;

    *core = slash ? strtol(slash + 1, &end, 10) : -1;
    if (!slash || slash == s || (size_t)(slash - s) >= n || !slash[1] || *end || *core < 0 || *core > 1023) {
        fprintf(stderr, "tpuctl %s: '%s' is not HOST/CORE (like h0/3)\n", cmd, s);
        return -1;
    }
    snprintf(host, n, "%.*s", (int)(slash - s), s);
    return 0;
}

static int cmd_forget(const struct tpuctl *g, int argc, char **argv)
{
    static const char usage[] = "tpuctl forget HOST/CORE";
    struct opt none[1] = {{0}};
    tpu_resolver *r;
    tpu_cluster *c;
    char host[128];
    long core;
    uint64_t silent = 0;
    int first = argc, rc;
    err e;

    rc = opt_parse(none, 0, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(none, 0, usage, "Make the resolver forget a dead core now: it is no longer listed, nor "
                  "named as missing by an initialize. A worker stopped with SIGTERM "
                  "leaves by itself; a dead core is forgotten after the resolver's --forget-after-ms.");
        return EXIT_OK;
    }
    if (rc != CODE_OK || first + 1 != argc) {
        fprintf(stderr, "tpuctl forget: %s (usage: %s)\n", rc != CODE_OK ? e.msg : "give one HOST/CORE",
                usage);
        return EXIT_USAGE;
    }
    if (parse_core("forget", argv[first], host, sizeof host, &core) != 0)
        return EXIT_USAGE;
    if ((rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    if (tpu_forget_core(c, host, (int)core, &silent) != TPU_OK) {
        rc = fail();
        disconnect(r, c);
        return rc;
    }
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "forgotten", argv[first]);
        json_uint(&j, "silent_ms", silent);
        json_end(&j);
    } else {
        printf("forgot core %s/%ld (last heartbeat %.1f s ago)\n", host, core, (double)silent / 1000.0);
    }
    disconnect(r, c);
    return EXIT_OK;
}

/* ---- chaos ---- */

/* s as a whole number in [lo, hi] (digits only: no sign, no blank); -1 if
 * it is not one. */
static long long parse_whole(const char *s, long long lo, long long hi)
{
    long long v = 0;
    if (!s || !*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 18)
        return -1;
    for (; *s; s++)
        v = v * 10 + (*s - '0');
    return v >= lo && v <= hi ? v : -1;
}

/* The cores a chaos TARGET names: HOST/CORE, HOST (its every core: a host's
 * preemption or maintenance) or "all" (every core not dead: the slice's).
 * Fills keys (host, core) from the spec; the count, or -1 with the error
 * printed. */
#define CHAOS_MAX_TARGETS 4096
struct chaos_target {
    char host[128];
    int core;
};
static int chaos_targets(tpu_cluster *c, const char *target, struct chaos_target *out, int max)
{
    tpu_cluster_spec *s;
    tpu_core_info ci;
    char host[128];
    long core = -1;
    int n = 0, all = !strcmp(target, "all");

    if (strchr(target, '/') && parse_core("chaos", target, host, sizeof host, &core) != 0)
        return -1;
    if (!strchr(target, '/'))
        snprintf(host, sizeof host, "%s", target);
    if (tpu_cluster_spec_get(c, &s) != TPU_OK) {
        fail();
        return -1;
    }
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s) && n < max; i++) {
        tpu_cluster_spec_core(s, i, &ci);
        if (ci.state != TPU_CORE_IDLE && ci.state != TPU_CORE_READY && (all || core < 0))
            continue; /* a host's or the slice's: the cores alive */
        if (all || (!strcmp(ci.host_id, host) && (core < 0 || ci.core == core))) {
            snprintf(out[n].host, sizeof out[n].host, "%s", ci.host_id);
            out[n++].core = ci.core;
        }
    }
    if (!n)
        fprintf(stderr, "NOT_FOUND: %s%s%s matches no %score of the %zu the resolver knows\n",
                all ? "" : core < 0 ? "host " : "core ", all ? "the target all" : target, "",
                core < 0 ? "live " : "", tpu_cluster_spec_num_cores(s));
    tpu_cluster_spec_free(s);
    return n ? n : -1;
}

/* One fault of a scenario on one core (a link fault: one per end). */
struct scen_hit {
    char core[160];   /* HOST/CORE */
    size_t line;      /* index into the scenario */
    int waits;        /* by delay or step: takes one of the core's waiting slots */
};

/* What the workers would refuse part way through a scenario, checked before
 * anything is injected: a link from a core to itself, two kills or pauses
 * of one core whose times overlap (a pause counts until a second after it
 * ends), and more waiting faults on a core than it holds (with those already
 * waiting there). 0, or -1 with the error printed naming the line. */
static int scenario_check_cores(tpu_cluster *c, const char *path, const struct scenario *sc,
                                char (*picked)[128], struct chaos_target *tg)
{
    size_t cap = 64, n = 0;
    struct scen_hit *h = malloc(cap * sizeof *h);
    int rc = 0;

    for (size_t i = 0; h && i < sc->n && !rc; i++) {
        const tpu_fault *f = &sc->v[i].f;
        int nt = chaos_targets(c, picked[i], tg, CHAOS_MAX_TARGETS);
        for (int k = 0; k < nt && !rc; k++) {
            for (int end = 0; end < (f->peer_host ? 2 : 1); end++) {
                if (n == cap) {
                    struct scen_hit *nh = realloc(h, 2 * cap * sizeof *h);
                    if (!nh) {
                        free(h);
                        h = NULL;
                        break;
                    }
                    h = nh;
                    cap *= 2;
                }
                if (end)
                    snprintf(h[n].core, sizeof h[n].core, "%s/%d", f->peer_host, f->peer_core);
                else
                    snprintf(h[n].core, sizeof h[n].core, "%s/%d", tg[k].host, tg[k].core);
                h[n].line = i;
                h[n].waits = f->delay_ms || f->at_step;
                n++;
            }
            if (h && f->peer_host && !strcmp(h[n - 1].core, h[n - 2].core)) {
                fprintf(stderr, "INVALID_ARGUMENT: %s:%d: %s from core %s to itself: a link joins two cores "
                        "(nothing injected)\n", path, sc->v[i].line, tpu_fault_kind_name(f->kind), h[n - 1].core);
                rc = -1;
            }
        }
        if (!h)
            break;
    }
    if (!h) {
        fprintf(stderr, "tpuctl chaos: out of memory checking %s\n", path);
        return -1;
    }
    /* kills and pauses by time on one core must not overlap */
    for (size_t a = 0; a < n && !rc; a++) {
        const tpu_fault *fa = &sc->v[h[a].line].f;
        if ((fa->kind != TPU_FAULT_KILL && fa->kind != TPU_FAULT_PAUSE) || fa->at_step)
            continue;
        uint64_t a0 = fa->delay_ms, a1 = fa->kind == TPU_FAULT_KILL ? UINT64_MAX : a0 + fa->duration_ms + 1000;
        for (size_t b = a + 1; b < n && !rc; b++) {
            const tpu_fault *fb = &sc->v[h[b].line].f;
            if ((fb->kind != TPU_FAULT_KILL && fb->kind != TPU_FAULT_PAUSE) || fb->at_step ||
                strcmp(h[a].core, h[b].core) != 0)
                continue;
            uint64_t b0 = fb->delay_ms, b1 = fb->kind == TPU_FAULT_KILL ? UINT64_MAX : b0 + fb->duration_ms + 1000;
            if (a0 < b1 && b0 < a1) {
                fprintf(stderr, "FAILED_PRECONDITION: %s:%d: %s of core %s at %llu ms overlaps the %s of line %d at "
                        "%llu ms (a pause counts until a second after it ends; nothing injected)\n", path,
                        sc->v[h[b].line].line, tpu_fault_kind_name(fb->kind), h[b].core, (unsigned long long)b0,
                        tpu_fault_kind_name(fa->kind), sc->v[h[a].line].line, (unsigned long long)a0);
                rc = -1;
            }
        }
    }
    /* waiting slots, with what already waits on each core */
    for (size_t a = 0; a < n && !rc; a++) {
        size_t want = 0, have = 0, first = SIZE_MAX;
        int lastline = 0;
        for (size_t b = 0; b < n; b++)
            if (h[b].waits && !strcmp(h[a].core, h[b].core)) {
                if (b < a)
                    break; /* counted at its first appearance */
                if (first == SIZE_MAX)
                    first = b;
                want++;
                lastline = sc->v[h[b].line].line;
            }
        if (first != a || want == 0)
            continue;
        char host[160];
        snprintf(host, sizeof host, "%s", h[a].core);
        char *slash = strrchr(host, '/');
        *slash = '\0';
        if (tpu_list_faults(c, host, atoi(slash + 1), NULL, 0, sizeof(tpu_scheduled_fault), &have) != TPU_OK) {
            fprintf(stderr, "%s: %s:%d: %s (nothing injected)\n", tpu_status_name(tpu_last_status()), path,
                    sc->v[h[a].line].line, tpu_last_error());
            rc = -1;
        } else if (want + have > 16) {
            fprintf(stderr, "RESOURCE_EXHAUSTED: %s:%d: core %s would have %zu faults waiting, at most 16 (%zu of this "
                    "scenario, %zu waiting there already: tpuctl chaos list, cancel; nothing injected)\n", path,
                    lastline, h[a].core, want + have, want, have);
            rc = -1;
        }
    }
    free(h);
    return rc;
}

/* tpuctl chaos --scenario FILE [--seed N]: the whole file checked, every
 * target resolved (random ones with the seed), the plan printed, then each
 * fault injected (the workers hold the timed ones). */
static int chaos_scenario(const struct tpuctl *g, const char *path, long long seed_opt)
{
    static struct scenario sc;
    static struct chaos_core live[CHAOS_MAX_TARGETS];
    static char picked[SCENARIO_MAX][128];
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_cluster_spec *s;
    tpu_core_info ci;
    struct chaos_target *tg;
    char msg[600];
    int nlive = 0, rc;
    uint32_t seed, rng;
    size_t injected = 0;

    if (scenario_load(path, &sc, msg, sizeof msg) != 0) {
        fprintf(stderr, "tpuctl chaos: %s\n", msg);
        return EXIT_USAGE;
    }
    seed = seed_opt >= 0 ? (uint32_t)seed_opt : sc.has_seed ? sc.seed : (uint32_t)time(NULL);
    if ((rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    if (tpu_cluster_spec_get(c, &s) != TPU_OK) {
        rc = fail();
        disconnect(r, c);
        return rc;
    }
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s) && nlive < CHAOS_MAX_TARGETS; i++) {
        tpu_cluster_spec_core(s, i, &ci);
        if (ci.state == TPU_CORE_IDLE || ci.state == TPU_CORE_READY) {
            snprintf(live[nlive].host, sizeof live[nlive].host, "%s", ci.host_id);
            live[nlive++].core = ci.core;
        }
    }
    tpu_cluster_spec_free(s);
    rng = seed;
    for (size_t i = 0; i < sc.n; i++)
        if (scenario_pick(sc.v[i].target, live, nlive, &rng, picked[i], sizeof picked[i]) != 0) {
            fprintf(stderr, "NOT_FOUND: %s:%d: no live core to pick %s from\n", path, sc.v[i].line, sc.v[i].target);
            disconnect(r, c);
            return EXIT_ERROR;
        }
    /* every target must name live cores before anything is injected */
    if (!(tg = calloc(CHAOS_MAX_TARGETS, sizeof *tg))) {
        disconnect(r, c);
        return EXIT_ERROR;
    }
    for (size_t i = 0; i < sc.n; i++) {
        char peer[160];
        snprintf(peer, sizeof peer, "%s/%d", sc.v[i].peer, sc.v[i].f.peer_core);
        if (chaos_targets(c, picked[i], tg, CHAOS_MAX_TARGETS) < 0 ||
            (sc.v[i].f.peer_host && chaos_targets(c, peer, tg, CHAOS_MAX_TARGETS) < 0)) {
            fprintf(stderr, "  (%s:%d)\n", path, sc.v[i].line);
            free(tg);
            disconnect(r, c);
            return EXIT_ERROR;
        }
    }
    if (scenario_check_cores(c, path, &sc, picked, tg) != 0) {
        free(tg);
        disconnect(r, c);
        return EXIT_ERROR;
    }
    printf("scenario %s, seed %u: %zu faults\n", path, seed, sc.n);
    rc = EXIT_OK;
    for (size_t i = 0; i < sc.n && rc == EXIT_OK; i++) {
        tpu_fault *f = &sc.v[i].f;
        int nt = chaos_targets(c, picked[i], tg, CHAOS_MAX_TARGETS);
        if (f->kind == TPU_FAULT_LINK_LOSS)
            f->seed = seed ^ ((uint32_t)sc.v[i].line * 2654435761u); /* the same seed, the same losses */
        for (int k = 0; k < nt; k++) {
            tpu_status st = f->peer_host ? tpu_inject_link_fault(c, tg[k].host, tg[k].core, f->peer_host,
                                                                 f->peer_core, f)
                                         : tpu_inject_fault(c, tg[k].host, tg[k].core, f);
            if (st != TPU_OK) {
                fprintf(stderr, "%s: %s:%d: %s (%zu faults injected before it)\n",
                        tpu_status_name(tpu_last_status()), path, sc.v[i].line, tpu_last_error(), injected);
                rc = EXIT_ERROR;
                break;
            }
            injected++;
            printf("line %d: %s on core %s/%d, %s %llu", sc.v[i].line, tpu_fault_kind_name(f->kind), tg[k].host,
                   tg[k].core, f->at_step ? "after step" : "in ms:",
                   f->at_step ? (unsigned long long)f->at_step : (unsigned long long)f->delay_ms);
            if (f->duration_ms)
                printf(", %u ms", f->duration_ms);
            if (f->percent)
                printf(", %u %%", f->percent);
            if (f->notice_ms)
                printf(", notice %u ms", f->notice_ms);
            if (f->latency_ms)
                printf(", latency %u ms", f->latency_ms);
            if (f->peer_host)
                printf(", to and from core %s/%d", f->peer_host, f->peer_core);
            printf("\n");
        }
    }
    fflush(stdout);
    free(tg);
    disconnect(r, c);
    return rc;
}

/* tpuctl chaos link-delay|link-loss|partition A B ...: both ways, A then B. */
static int chaos_link(const struct tpuctl *g, tpu_resolver *r, tpu_cluster *c, const char *a, const tpu_fault *f)
{
    char host[128];
    long core;
    int rc = EXIT_OK;

    if (parse_core("chaos", a, host, sizeof host, &core) != 0) {
        disconnect(r, c);
        return EXIT_USAGE;
    }
    if (tpu_inject_link_fault(c, host, (int)core, f->peer_host, f->peer_core, f) != TPU_OK) {
        rc = fail();
    } else if (g->json) {
        json j;
        char b[160];
        snprintf(b, sizeof b, "%s/%d", f->peer_host, f->peer_core);
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "injected", tpu_fault_kind_name(f->kind));
        json_str(&j, "link", a);
        json_str(&j, "peer", b);
        json_uint(&j, "duration_ms", f->duration_ms);
        json_uint(&j, "latency_ms", f->latency_ms);
        json_uint(&j, "percent", f->percent);
        json_uint(&j, "seed", f->seed);
        json_uint(&j, "delay_ms", f->delay_ms);
        json_uint(&j, "at_step", f->at_step);
        json_end(&j);
    } else if (f->delay_ms || f->at_step) {
        printf("scheduled %s on the link %s <-> %s/%d, both ways (%s %llu)\n", tpu_fault_kind_name(f->kind), a,
               f->peer_host, f->peer_core, f->delay_ms ? "in ms:" : "after step",
               f->delay_ms ? (unsigned long long)f->delay_ms : (unsigned long long)f->at_step);
    } else {
        printf("injected %s on the link %s <-> %s/%d, both ways, for %u ms\n", tpu_fault_kind_name(f->kind), a,
               f->peer_host, f->peer_core, f->duration_ms);
    }
    fflush(stdout);
    disconnect(r, c);
    return rc;
}

/* tpuctl chaos list T | cancel T [ID|all]: the faults waiting on each core
 * of T (for --delay-ms or --at-step), or cancel one (its ID, which list
 * shows) or all. Every core of T is asked, an unreachable one reported and
 * the rest still asked. */
static int chaos_waiting(const struct tpuctl *g, int cancel, int argc, char **argv)
{
    const char *target = argc > 0 ? argv[0] : NULL;
    long long id = 0;
    tpu_resolver *r;
    tpu_cluster *c;
    struct chaos_target *tg;
    int nt, rc = EXIT_OK;

    if (!target || !*target || argc > (cancel ? 2 : 1)) {
        fprintf(stderr, "tpuctl chaos: usage: tpuctl chaos list T | tpuctl chaos cancel T [ID|all]  (T: HOST/CORE, "
                        "HOST, all)\n");
        return EXIT_USAGE;
    }
    if (cancel && argc == 2 && strcmp(argv[1], "all") != 0 &&
        ((id = parse_whole(argv[1], 1, UINT32_MAX)) < 0)) {
        fprintf(stderr, "tpuctl chaos cancel: '%s' is not a fault id (1..4294967295, as tpuctl chaos list shows) "
                        "or all\n", argv[1]);
        return EXIT_USAGE;
    }
    if ((rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    rc = EXIT_OK;
    if (!(tg = calloc(CHAOS_MAX_TARGETS, sizeof *tg)) || (nt = chaos_targets(c, target, tg, CHAOS_MAX_TARGETS)) < 0) {
        free(tg);
        disconnect(r, c);
        return EXIT_ERROR;
    }
    json j;
    if (g->json) {
        json_init(&j, stdout);
        json_arr(&j, NULL);
    } else if (!cancel) {
        printf("%-24s %4s  %-12s %s\n", "CORE", "ID", "KIND", "WHEN");
    }
    for (int i = 0; i < nt; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s/%d", tg[i].host, tg[i].core);
        if (cancel) {
            size_t n = 0;
            if (tpu_cancel_faults(c, tg[i].host, tg[i].core, (uint32_t)id, &n) != TPU_OK) {
                fprintf(stderr, "%s: core %s: %s\n", tpu_status_name(tpu_last_status()), name, tpu_last_error());
                rc = EXIT_ERROR;
                continue;
            }
            if (g->json) {
                json_obj(&j, NULL);
                json_str(&j, "core", name);
                json_uint(&j, "cancelled", n);
                json_end(&j);
            } else {
                printf("cancelled %zu waiting fault%s on core %s\n", n, n == 1 ? "" : "s", name);
            }
            continue;
        }
        tpu_scheduled_fault l[16];
        size_t n = 0;
        if (tpu_list_faults(c, tg[i].host, tg[i].core, l, 16, sizeof l[0], &n) != TPU_OK) {
            fprintf(stderr, "%s: core %s: %s\n", tpu_status_name(tpu_last_status()), name, tpu_last_error());
            rc = EXIT_ERROR;
            continue;
        }
        for (size_t k = 0; k < n && k < 16; k++) {
            char when[64];
            if (l[k].at_step)
                snprintf(when, sizeof when, "after step %llu", (unsigned long long)l[k].at_step);
            else
                snprintf(when, sizeof when, "in %u ms", l[k].due_in_ms);
            if (g->json) {
                json_obj(&j, NULL);
                json_str(&j, "core", name);
                json_uint(&j, "id", l[k].id);
                json_str(&j, "kind", tpu_fault_kind_name(l[k].kind));
                json_uint(&j, "at_step", l[k].at_step);
                json_uint(&j, "due_in_ms", l[k].due_in_ms);
                json_uint(&j, "duration_ms", l[k].duration_ms);
                json_uint(&j, "percent", l[k].percent);
                json_uint(&j, "notice_ms", l[k].notice_ms);
                json_end(&j);
            } else {
                printf("%-24s %4u  %-12s %s\n", name, l[k].id, tpu_fault_kind_name(l[k].kind), when);
            }
        }
    }
    if (g->json)
        json_end(&j);
    fflush(stdout);
    free(tg);
    disconnect(r, c);
    return rc;
}

static int cmd_chaos(const struct tpuctl *g, int argc, char **argv)
{
    static const char usage[] = "tpuctl chaos [--delay-ms MS | --at-step N] [--notice-ms MS] kill T | pause T MS | "
                                "list T | cancel T [ID|all] | "
                                "slow T PCT [MS] | hbm T PCT [MS] | preempt T | maintenance T MS | skew T MS [DURATION] | "
                                "link-delay A B MS DURATION | link-loss A B PCT DURATION | partition A B DURATION  "
                                "(T: HOST/CORE, HOST, all; kill and pause also resolver; A, B: HOST/CORE)";
    long long delay = 0, at_step = 0, notice = -1, seed = -1;
    const char *scen = NULL;
    struct opt opts[] = {
        {"delay-ms", NULL, OPT_INT, "0", 0, 3600000, "MS", "inject it MS milliseconds from now", &delay},
        {"at-step", NULL, OPT_INT, "0", 0, LLONG_MAX, "N", "inject it once the core has finished training step N",
         &at_step},
        {"notice-ms", NULL, OPT_INT, NULL, 0, 600000, "MS",
         "preempt, maintenance: from the notice to the event (default 30000 for preempt, 60000 for maintenance, "
         "as Compute Engine gives)", &notice},
        {"scenario", NULL, OPT_STRING, NULL, 0, 0, "FILE",
         "inject the faults a scenario file lists (docs/guide/faults.md: scenario files), all checked first", &scen},
        {"seed", NULL, OPT_INT, NULL, 0, 4294967295LL, "N",
         "the seed for a scenario's random targets and losses (default: its 'seed' line, else one chosen and "
         "printed), or for link-loss's losses (default 0)", &seed},
    };
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_fault f = {0};
    struct chaos_target *tg = NULL;
    const char *target;
    int first = argc, rc, nargs, nt, done = 0;
    err e;

    rc = opt_parse(opts, 5, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(opts, 5, usage,
                  "Inject a fault, for testing what a training job and cluster tooling do about "
                  "it: kill (the worker dies at once, SIGKILL), pause MS (every thread of the worker stops for MS "
                  "milliseconds, as a hung host), slow PCT [MS] (training compute at PCT % of its speed, for MS "
                  "milliseconds or until the next slow; slow T 100 ends it), hbm PCT [MS] (PCT % of the core's "
                  "HBM is taken, for MS milliseconds or until the next initialize), preempt (a preemption notice, "
                  "then, --notice-ms later, the worker terminates and the core is PREEMPTED), maintenance MS (a "
                  "maintenance notice, then the core is down for MS milliseconds and comes back restarted), skew MS "
                  "[DURATION] (the worker's wall clock is MS milliseconds off, negative for slow, for DURATION ms or "
                  "until the next skew; with a cluster token, beyond 60 s its messages are refused), and on the "
                  "link between cores A and B, both ways, for DURATION ms: link-delay MS (each data-plane chunk is "
                  "held MS ms), link-loss PCT (each chunk is lost with probability PCT % and sent again after a "
                  "TCP-like timeout: a delay, never a wrong byte; --seed picks the losses), partition (no chunk "
                  "passes: a collective that waits on the link fails naming both cores). The "
                  "target is one core (HOST/CORE), every live core of a host (HOST) or of the cluster (all); kill and "
                  "pause may also hit the resolver itself (resolver). "
                  "--delay-ms or --at-step make the fault wait (the worker checks it now). Each worker logs the "
                  "fault and counts it in /metrics. Needs the cluster token when the cluster has one.");
        return EXIT_OK;
    }
    nargs = argc - first;
    if (rc == CODE_OK && nargs >= 1 && (!strcmp(argv[first], "list") || !strcmp(argv[first], "cancel"))) {
        if (delay || at_step || notice >= 0 || scen || seed >= 0) {
            fprintf(stderr, "tpuctl chaos %s takes no other option\n", argv[first]);
            return EXIT_USAGE;
        }
        return chaos_waiting(g, !strcmp(argv[first], "cancel"), nargs - 1, argv + first + 1);
    }
    if (rc == CODE_OK && scen) {
        if (nargs || delay || at_step || notice >= 0) {
            fprintf(stderr, "tpuctl chaos: --scenario takes no fault on the command line (the file gives them, "
                    "with their times and notices)\n");
            return EXIT_USAGE;
        }
        return chaos_scenario(g, scen, seed);
    }
    if (rc == CODE_OK && seed >= 0 && (nargs < 1 || strcmp(argv[first], "link-loss") != 0)) {
        fprintf(stderr, "tpuctl chaos: --seed is for --scenario and link-loss\n");
        return EXIT_USAGE;
    }
    if (rc != CODE_OK || nargs < 2) {
        fprintf(stderr, "tpuctl chaos: %s (usage: %s)\n", rc != CODE_OK ? e.msg : "give a fault kind and a target",
                usage);
        return EXIT_USAGE;
    }
    if (tpu_fault_kind_parse(argv[first], &f.kind) != TPU_OK) {
        fprintf(stderr, "tpuctl chaos: %s (usage: %s)\n", tpu_last_error(), usage);
        return EXIT_USAGE;
    }
    target = argv[first + 1];
    if (strchr(target, '/')) {
        char host[128];
        long core;
        if (parse_core("chaos", target, host, sizeof host, &core) != 0)
            return EXIT_USAGE;
    } else if (!*target) {
        fprintf(stderr, "tpuctl chaos: give a target: HOST/CORE, HOST or all (usage: %s)\n", usage);
        return EXIT_USAGE;
    }
    char peer[128];
    {
        char why[300];
        if (chaos_fault_args(&f, argv + first + 2, nargs - 2, peer, sizeof peer, why, sizeof why) != 0) {
            fprintf(stderr, "tpuctl chaos: %s (usage: %s)\n", why, usage);
            return EXIT_USAGE;
        }
    }
    if (delay && at_step) {
        fprintf(stderr, "tpuctl chaos: give --delay-ms or --at-step, not both\n");
        return EXIT_USAGE;
    }
    if (notice >= 0 && f.kind != TPU_FAULT_PREEMPT && f.kind != TPU_FAULT_MAINTENANCE) {
        fprintf(stderr, "tpuctl chaos: --notice-ms is for preempt and maintenance, not %s\n",
                tpu_fault_kind_name(f.kind));
        return EXIT_USAGE;
    }
    if (f.kind == TPU_FAULT_PREEMPT || f.kind == TPU_FAULT_MAINTENANCE)
        f.notice_ms = notice >= 0 ? (uint32_t)notice : f.kind == TPU_FAULT_PREEMPT ? 30000u : 60000u;
    f.delay_ms = (uint32_t)delay;
    f.at_step = (uint64_t)at_step;
    if (f.kind == TPU_FAULT_LINK_LOSS && seed >= 0)
        f.seed = (uint32_t)seed;
    if (f.peer_host && !strchr(target, '/')) {
        fprintf(stderr, "tpuctl chaos: %s joins two cores: give A as HOST/CORE, not '%s' (usage: %s)\n",
                tpu_fault_kind_name(f.kind), target, usage);
        return EXIT_USAGE;
    }
    if ((rc = connect_cluster(g, &r, &c)) >= 0)
        return rc;
    if (f.peer_host)
        return chaos_link(g, r, c, target, &f);
    if (!strcmp(target, "resolver")) { /* the resolver itself: kill or pause */
        if (tpu_inject_resolver_fault(c, &f) != TPU_OK) {
            rc = fail();
        } else {
            printf("injected %s into the resolver\n", tpu_fault_kind_name(f.kind));
            fflush(stdout);
            rc = EXIT_OK;
        }
        disconnect(r, c);
        return rc;
    }
    if (!(tg = calloc(CHAOS_MAX_TARGETS, sizeof *tg)) || (nt = chaos_targets(c, target, tg, CHAOS_MAX_TARGETS)) < 0) {
        free(tg);
        disconnect(r, c);
        return EXIT_ERROR;
    }
    rc = EXIT_OK;
    json j;
    if (g->json) {
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "injected", tpu_fault_kind_name(f.kind));
        json_str(&j, "target", target);
        json_uint(&j, "duration_ms", f.duration_ms);
        json_uint(&j, "percent", f.percent);
        json_uint(&j, "notice_ms", f.notice_ms);
        json_uint(&j, "delay_ms", f.delay_ms);
        json_uint(&j, "at_step", f.at_step);
        json_arr(&j, "cores");
    }
    for (int i = 0; i < nt; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s/%d", tg[i].host, tg[i].core);
        if (tpu_inject_fault(c, tg[i].host, tg[i].core, &f) != TPU_OK) {
            /* that worker refused it whole (or did not answer): nothing of it
             * there; the others are still asked, each outcome reported */
            fprintf(stderr, "%s: core %s: %s\n", tpu_status_name(tpu_last_status()), name, tpu_last_error());
            rc = EXIT_ERROR;
            continue;
        }
        done++;
        if (g->json)
            json_str(&j, NULL, name);
        else if (f.delay_ms || f.at_step)
            printf("scheduled %s on core %s (%s %llu)\n", tpu_fault_kind_name(f.kind), name,
                   f.delay_ms ? "in ms:" : "after step", f.delay_ms ? (unsigned long long)f.delay_ms
                                                                    : (unsigned long long)f.at_step);
        else if (f.notice_ms || f.kind == TPU_FAULT_PREEMPT || f.kind == TPU_FAULT_MAINTENANCE)
            printf("injected %s into core %s (notice %u ms)\n", tpu_fault_kind_name(f.kind), name, f.notice_ms);
        else
            printf("injected %s into core %s\n", tpu_fault_kind_name(f.kind), name);
    }
    if (g->json) {
        json_end(&j);
        json_end(&j);
    }
    fflush(stdout);
    free(tg);
    disconnect(r, c);
    return rc;
}

/* ---- health ---- */

/* What the SYMPTOMS column shows: "SYMPTOM: details", the details alone, or "". */
static const char *symptom_text(const tpu_core_health *h, char *buf, size_t len)
{
    if (h->symptom != TPU_SYMPTOM_NONE)
        snprintf(buf, len, "%s: %s", tpu_symptom_name(h->symptom), h->details);
    else
        snprintf(buf, len, "%s", h->details);
    return buf;
}

static int cmd_health(const struct tpuctl *g, int argc, char **argv)
{
    static const char *const head[] = {"CORE", "STATE", "HEALTH", "SYMPTOMS"};
    const char *hosts = NULL, *states = NULL;
    int only_bad = 0;
    struct opt flags[] = {
        SELECT_FLAGS(hosts, states),
        {"unhealthy", NULL, OPT_BOOL, NULL, 0, 0, NULL, "list only the cores that are not HEALTHY", &only_bad},
    };
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_cluster_spec *s;
    tpu_core_info ci;
    core_select sel;
    size_t n, shown = 0, bad = 0, dead = 0, silent = 0, maint = 0, wl = 0;
    char why[2048] = "", sym[256];
    const char *state, *health;
    tpu_core_health h;
    int rc = cmd_flags(flags, sizeof flags / sizeof flags[0], argc, argv,
                       "tpuctl health [--host H[,H...]] [--state S[,S...]] [--unhealthy]",
                       "Health of the cluster and of every core, shaped like Cloud TPU's. "
                       "Exit 0 when every core (of those --host and --state pick) is healthy, else 1.");

    if (rc >= 0 || (rc = parse_select("health", hosts, states, &sel)) >= 0 ||
        (rc = connect_spec(g, &r, &c, &s)) >= 0)
        return rc;
    n = tpu_cluster_spec_num_cores(s);
    int preempted = 0;
    for (size_t i = 0; i < n; i++) {
        tpu_cluster_spec_core(s, i, &ci);
        preempted |= ci.state == TPU_CORE_PREEMPTED;
        if (!select_match(&sel, &ci))
            continue;
        shown++;
        tpu_cluster_spec_core_health(s, i, &h);
        dead += h.health == TPU_HEALTH_TIMEOUT;
        silent += h.health == TPU_HEALTH_TIMEOUT || h.health == TPU_HEALTH_UNSPECIFIED;
        maint += h.health == TPU_UNHEALTHY_MAINTENANCE;
        if (h.health != TPU_HEALTHY) {
            if (bad < 10 && wl < sizeof why)
                wl += (size_t)snprintf(why + wl, sizeof why - wl, "%s%s/%d (%s: %s)", bad ? ", " : "",
                                       ci.host_id, ci.core, tpu_health_name(h.health), h.details);
            bad++;
        }
    }
    if (bad > 10 && wl < sizeof why)
        snprintf(why + wl, sizeof why - wl, ", and %zu more", bad - 10);
    /* the Node's state and health, as Cloud TPU lists them */
    state = !n ? "CREATING" : preempted ? "PREEMPTED" : "READY";
    /* over the cores picked, as tpu_cluster_spec_health() over all */
    health = !shown ? (n ? "HEALTH_UNSPECIFIED" : "TIMEOUT")
             : silent == shown ? "TIMEOUT"
             : maint          ? "UNHEALTHY_MAINTENANCE"
             : bad            ? "UNHEALTHY_TENSORFLOW"
                              : "HEALTHY";
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "state", state);
        json_str(&j, "health", health);
        json_uint(&j, "epoch", tpu_cluster_spec_epoch(s));
        json_bool(&j, "initialized", tpu_cluster_spec_initialized(s));
        json_uint(&j, "num_cores", shown);
        json_uint(&j, "unhealthy", bad);
        json_arr(&j, "cores");
        for (size_t i = 0; i < n; i++) {
            tpu_cluster_spec_core(s, i, &ci);
            if (!select_match(&sel, &ci))
                continue;
            tpu_cluster_spec_core_health(s, i, &h);
            if (only_bad && h.health == TPU_HEALTHY)
                continue;
            json_obj(&j, NULL);
            json_str(&j, "host", ci.host_id);
            json_int(&j, "core", ci.core);
            json_str(&j, "state", tpu_core_state_name(ci.state));
            json_str(&j, "health", tpu_health_name(h.health));
            json_arr(&j, "symptoms");
            if (h.symptom != TPU_SYMPTOM_NONE)
                json_str(&j, NULL, tpu_symptom_name(h.symptom));
            json_end(&j);
            json_str(&j, "details", h.details);
            if (ci.notice.kind != TPU_NOTICE_NONE) {
                json_obj(&j, "notice");
                json_str(&j, "kind", tpu_notice_kind_name(ci.notice.kind));
                json_uint(&j, "event_in_ms", ci.notice.event_in_ms);
                json_uint(&j, "window_ms", ci.notice.window_ms);
                json_bool(&j, "under_way", ci.notice.under_way);
                json_end(&j);
            }
            json_uint(&j, "heartbeat_age_ms", ci.heartbeat_age_ms);
            json_end(&j);
        }
        json_end(&j);
        json_end(&j);
    } else {
        table t;
        printf("state: %s%s\nhealth: %s\n", state, n ? "" : " (no cores)", health);
        if (n)
            printf("cores: %zu, %zu healthy, %zu unhealthy (%zu TIMEOUT)\n", shown, shown - bad, bad, dead);
        print_shown(shown, n, hosts, states);
        table_init(&t, sizeof head / sizeof head[0], head);
        size_t rows = 0;
        for (size_t i = 0; i < n; i++) {
            tpu_cluster_spec_core(s, i, &ci);
            if (!select_match(&sel, &ci))
                continue;
            tpu_cluster_spec_core_health(s, i, &h);
            if (only_bad && h.health == TPU_HEALTHY)
                continue;
            symptom_text(&h, sym, sizeof sym);
            table_cell(&t, "%s/%d", ci.host_id, ci.core);
            table_cell(&t, "%s", tpu_core_state_name(ci.state));
            table_cell(&t, "%s", tpu_health_name(h.health));
            table_cell(&t, "%s", sym[0] ? sym : "-");
            rows++;
        }
        if (rows)
            table_print(&t, stdout);
        table_free(&t);
    }
    fflush(stdout);
    if (n == 0) {
        fprintf(stderr, "UNAVAILABLE: no cores have registered with the resolver at %s; start "
                        "tpu-worker --resolver %s\n", tpu_cluster_endpoint(c), tpu_cluster_endpoint(c));
        rc = EXIT_ERROR;
    } else if (shown == 0) {
        fprintf(stderr, "NOT_FOUND: none of the %zu cores matches%s%s%s%s\n", n, hosts ? " --host " : "",
                hosts ? hosts : "", states ? " --state " : "", states ? states : "");
        rc = EXIT_ERROR;
    } else if (bad) {
        fprintf(stderr, "UNAVAILABLE: %zu of %zu cores are unhealthy: %s\n", bad, shown, why);
        rc = EXIT_ERROR;
    } else {
        rc = EXIT_OK;
    }
    tpu_cluster_spec_free(s);
    disconnect(r, c);
    return rc;
}

/* ---- version ---- */

static int cmd_version(const struct tpuctl *g, int argc, char **argv)
{
    struct opt none[1] = {{0}};
    int rc = cmd_flags(none, 0, argc, argv, "tpuctl version",
                       "Versions of tpuctl, the loaded libtpuclient and the wire protocol.");
    if (rc >= 0)
        return rc;
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "tpuctl", TPUEMU_VERSION_STRING);
        json_str(&j, "libtpuclient", tpu_version());
        json_uint(&j, "protocol", WIRE_VERSION);
        json_end(&j);
    } else {
        printf("tpuctl %s (libtpuclient %s, protocol %u)\n", TPUEMU_VERSION_STRING, tpu_version(),
               WIRE_VERSION);
    }
    return EXIT_OK;
}

/* ---- console ---- */

/* tpuctl console --port N [--host H]: the cluster console's URL on the
 * resolver's metrics port, with the console key in its fragment when the
 * cluster has a token (the browser keeps a fragment to itself; the page sends
 * the key as an Authorization header). Checks that the port answers. */
static int cmd_console(const struct tpuctl *g, int argc, char **argv)
{
    long long port = 0;
    const char *host = NULL;
    struct opt flags[] = {
        {"port", NULL, OPT_INT, NULL, 1, 65535, "N", "the resolver's --metrics-port (required)", &port},
        {"host", NULL, OPT_STRING, NULL, 0, 0, "H", "the host in the URL (default: the resolver's, from --tpu)", &host},
    };
    int rc = cmd_flags(flags, 2, argc, argv, "tpuctl console --port N [--host H]",
                       "Print the URL of the cluster console the resolver serves on its metrics port (with the "
                       "console key when the cluster has a token).");
    addr a;
    auth au;
    err e;
    char key[65] = "", url[400], shown[300], body[256];
    int status = 0;

    if (rc >= 0)
        return rc;
    if (!port) {
        fprintf(stderr, "tpuctl console: give --port, the resolver's --metrics-port\n");
        return EXIT_USAGE;
    }
    if (!host)
        host = g->tpu && addr_parse(g->tpu, ADDR_DEFAULT_PORT, &a, &e) == CODE_OK ? a.host : "127.0.0.1";
    auth_global_init();
    if (auth_load(&au, g->token_file, &e) != CODE_OK) {
        fprintf(stderr, "tpuctl console: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (au.enabled)
        auth_console_key_hex(&au, key);
    addr_format(host, (int)port, shown, sizeof shown);
    snprintf(url, sizeof url, "http://%s/%s%s", shown, key[0] ? "#key=" : "", key);
    if (httpd_get(host, (int)port, "/healthz", 2000, &status, body, sizeof body, &e) != CODE_OK || status != 200) {
        fprintf(stderr,
                "tpuctl console: the resolver's metrics port %s does not answer%s%s (is --port its "
                "--metrics-port?)\n",
                shown, status ? "" : ": ", status ? "" : e.msg);
        printf("%s\n", url);
        return EXIT_ERROR;
    }
    printf("%s\n", url);
    return EXIT_OK;
}

/* ---- profile ---- */

/* One capture: through the hosts' profiler ports (--service_addr) or every
 * core of the cluster (--tpu). */
static tpu_status profile_once(const struct tpuctl *g, const char *service_addr, uint32_t duration, tpu_profile **p,
                               int *usage)
{
    tpu_resolver *r;
    tpu_cluster *c;
    tpu_status st;
    *usage = 0;
    if (service_addr) {
        /* the resolver handle carries the token; each service names its resolver */
        if ((st = tpu_resolver_new(g->tpu, &r)) != TPU_OK) {
            *usage = 1;
            return st;
        }
        if (!(g->token_file && *g->token_file && (st = tpu_resolver_set_token_file(r, g->token_file)) != TPU_OK) &&
            (st = tpu_resolver_set_timeout_ms(r, (uint32_t)g->timeout_ms)) == TPU_OK)
            st = tpu_profile_capture_hosts(r, service_addr, duration, p);
        tpu_resolver_free(r);
        return st;
    }
    if (tpu_resolver_new(g->tpu, &r) != TPU_OK) {
        *usage = 1;
        return tpu_last_status();
    }
    if ((g->token_file && *g->token_file && (st = tpu_resolver_set_token_file(r, g->token_file)) != TPU_OK) ||
        (st = tpu_resolver_set_timeout_ms(r, (uint32_t)g->timeout_ms)) != TPU_OK ||
        (st = tpu_connect_to_cluster(r, &c)) != TPU_OK) {
        tpu_resolver_free(r);
        return st;
    }
    st = tpu_profile_capture(c, duration, p);
    tpu_cluster_free(c);
    tpu_resolver_free(r);
    return st;
}

static int cmd_profile(const struct tpuctl *g, int argc, char **argv)
{
    const char *logdir = NULL, *plot = NULL, *service_addr = NULL;
    long long duration = 2000, attempts = 3;
    struct opt t[] = {
        {"logdir", NULL, OPT_STRING, NULL, 0, 0, "DIR",
         "where the trace goes: DIR/plugins/profile/RUN/HOST.trace.json.gz (required)", &logdir},
        {"duration-ms", NULL, OPT_INT, "2000", 0, 600000, "MS",
         "how long to record, from now (0: what the cores' rings hold now)", &duration},
        {"duration_ms", NULL, OPT_INT, NULL, 0, 600000, "MS", "the same (capture_tpu_profile's spelling)",
         &duration},
        {"service_addr", NULL, OPT_STRING, NULL, 0, 0, "ADDR[,ADDR]",
         "profile the hosts whose profiler ports these are (HOST:PORT, grpc://HOST:PORT or a bare HOST for port "
         "8466; tpu-worker --profiler-port) instead of every core of --tpu's cluster", &service_addr},
        {"num_tracing_attempts", NULL, OPT_INT, "3", 1, 100, "N",
         "capture up to N times while a capture has no event (a model not running yet)", &attempts},
        {"plot", NULL, OPT_STRING, NULL, 0, 0, "FILE.svg",
         "also draw the step-time breakdown over the steps and per core as an SVG picture", &plot},
    };
    tpu_profile *p = NULL;
    char path[4600];
    FILE *say = g->json ? stderr : stdout; /* capture_tpu_profile's progress lines */
    tpu_status st = TPU_OK;
    int usage;
    int rc = cmd_flags(t, sizeof t / sizeof t[0], argc, argv,
                       "tpuctl profile --logdir DIR [--duration-ms N] [--service_addr ADDR[,ADDR]] "
                       "[--num_tracing_attempts N] [--plot FILE.svg]",
                       "Record what every core of the cluster (or of the hosts of --service_addr) does for N ms "
                       "(capture_tpu_profile), write it as one trace for chrome://tracing, Perfetto or TensorBoard, "
                       "and print where each step's time went (with --json, the overview as JSON). "
                       "'tpuctl capture_tpu_profile' is the same command.");

    if (rc >= 0)
        return rc;
    if (!logdir || !*logdir) {
        fprintf(stderr, "tpuctl %s: --logdir is required (see tpuctl %s --help)\n", argv[0], argv[0]);
        return EXIT_USAGE;
    }
    if (service_addr && duration <= 0) {
        fprintf(stderr, "tpuctl %s: --duration_ms must be greater than zero with --service_addr (a trace of the "
                        "next N ms, as capture_tpu_profile takes it)\n", argv[0]);
        return EXIT_USAGE;
    }
    /* capture_tpu_profile's loop (tensorflow/core/profiler/rpc/client/capture_profile.cc, Trace): a capture
     * with no event is tried again, up to --num_tracing_attempts in all */
    for (long long left = attempts;;) {
        fprintf(say, "Starting to trace for %lld ms. Remaining attempt(s): %lld\n", duration, --left);
        fflush(say);
        st = profile_once(g, service_addr, (uint32_t)duration, &p, &usage);
        if (st != TPU_OK) {
            if (usage) {
                fprintf(stderr, "tpuctl: --tpu: %s\n", tpu_last_error());
                return EXIT_USAGE;
            }
            return fail();
        }
        if (tpu_profile_num_events(p) > 0)
            break;
        tpu_profile_free(p);
        p = NULL;
        if (left <= 0)
            break;
        fprintf(say, "No trace event is collected. Automatically retrying.\n\n");
    }
    if (!p) {
        fprintf(say, "No trace event is collected after %lld attempt(s). Perhaps, you want to try again (with more "
                     "attempts?).\nTip: increase number of attempts with --num_tracing_attempts.\n", attempts);
        fflush(say);
        fprintf(stderr, "%s: No trace event was collected: no core of %s recorded anything during the %lld ms "
                        "(is a model running?)\n", tpu_status_name(TPU_UNAVAILABLE),
                service_addr ? service_addr : "the cluster", duration);
        return EXIT_ERROR;
    }
    rc = EXIT_OK;
    if (tpu_profile_write(p, logdir, path, sizeof path) != TPU_OK ||
        (plot && tpu_profile_plot_svg(p, plot) != TPU_OK)) {
        rc = fail();
    } else if (g->json) {
        /* {"trace": PATH, "plot": FILE, "overview": the overview.json beside it} */
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "trace", path);
        if (plot)
            json_str(&j, "plot", plot);
        fputs(",\"overview\":", stdout);
        if (tpu_profile_write_overview_json(p, stdout) != TPU_OK)
            rc = fail();
        else
            fputs("}\n", stdout);
    } else {
        tpu_profile_print_overview(p, stdout);
        printf("Trace: %s\n", path);
        if (plot)
            printf("Picture: %s\n", plot);
    }
    tpu_profile_free(p);
    return rc;
}

const struct tpuctl_cmd tpuctl_cmds[] = {
    {"cluster", "list every core: state, replica, HBM, heartbeat age", cmd_cluster},
    {"init", "initialize the TPU system and print its topology", cmd_init},
    {"topology", "print a serialized TopologyProto: topology FILE", tpuctl_cmd_topology},
    {"shutdown", "shut the TPU system down", cmd_shutdown},
    {"forget", "forget a dead core: forget HOST/CORE", cmd_forget},
    {"chaos",
     "inject a fault into a core or a link: chaos kill|pause|slow|hbm HOST/CORE [ARGS], "
     "chaos link-delay|link-loss|partition A B [ARGS]",
     cmd_chaos},
    {"health", "cluster and per-core health; exit 1 if any core is unhealthy", cmd_health},
    {"version", "print versions", cmd_version},
    {"board", "serve a log directory in a browser: board --logdir DIR [--port N] (scalars, profiles)",
     tpuctl_cmd_board},
    {"console", "print the URL of the cluster console (the resolver's metrics port): console --port N", cmd_console},
    {"profile", "record every core for N ms: trace file and step-time breakdown", cmd_profile},
    {"capture_tpu_profile",
     "the same as profile, by TensorFlow's name (--service_addr, --duration_ms, "
     "--num_tracing_attempts, --logdir)",
     cmd_profile},
    {"bench", "benchmark a collective: bench allreduce [--dtype --algo --op --min --max]", tpuctl_cmd_bench},
};
const int tpuctl_ncmds = (int)(sizeof tpuctl_cmds / sizeof tpuctl_cmds[0]);
