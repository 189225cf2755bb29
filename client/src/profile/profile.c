/* The profiler's capture, trace file and overview (tpuemu/profile.h).
 *
 * Clock offsets: each worker answers PROFILE at once with its CLOCK_MONOTONIC
 * reading. Of PROF_PROBES round trips t0 -> (worker w) -> t1 the one with the
 * shortest round trip gives offset = w - (t0 + t1) / 2, which is right to
 * within (t1 - t0) / 2 whatever the split of the round trip between the two
 * directions (NTP's bound). On one machine the clocks are the same and the
 * offset comes out within that bound of 0. */
#include "tpuemu/profile.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "client.h"
#include "safefile.h"
#include "dpio.h"
#include "frame.h"
#include "profile_int.h"
#include "tfevents.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k
#define TK(k) TPUEMU__TRACE_KIND__TRACE_##k
#define PROF_PROBES 8
#define PROF_POLL_MS 200u
#define PROF_MAX_ROUNDS 64            /* fetches of one read before giving up on a flood */
#define PROF_MAX_PAYLOAD (64u << 20)
#define PROF_IO_MS 5000u
#define PROF_HBM_TIGHT 0.9            /* HBM peak over capacity that makes memory the bottleneck */
#define PROF_STRAGGLER_STEPS 4       /* all-reduces compared before a core is called a straggler */
#define PROF_MXU_GOOD 0.9             /* utilization below which a layer's padding is named */

struct pev {
    uint32_t kind, layer, op, cstep, chunk;
    int32_t peer;
    int64_t t0;                       /* client clock, ns */
    uint64_t dur, step, m, n, k, bytes, seq;
    char algo[16];
};

struct pcore {
    struct dpio_conn peer;            /* its data connection, open while capturing */
    int replica;
    char tpu_type[16];
    int64_t offset;                   /* worker - client, ns */
    uint64_t hbm_used, hbm_peak, hbm_cap;
    double peak_flops, hbm_bw, ici_bw; /* the real generation's, per device */
    unsigned mxu_dim;
    unsigned host_cpus;               /* CPUs it may run on; 0: not said */
    char boot_id[40];                 /* its kernel's; "": not said */
    uint64_t err_ns, dropped, since_w, seq;
    struct pev *ev;
    size_t n, cap;
    const struct cli_cancel *cancel;  /* the capturing cluster handle's (tpu_cancel) */
    char missing[300];                /* why its events are not in the capture (it did not answer); "": they are */
};

struct tpu_profile {
    struct pcore *c;
    size_t n;
    int64_t start, end;               /* client clock, ns */
    time_t wall;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One PROFILE request and its answer on one core's connection (dpio.h). */
struct ask {
    struct pcore *pc;
    uint64_t seq;
    Tpuemu__ProfileInfo *info; /* taken out of the answer's header */
    uint8_t *pl;               /* the answer's payload: packed TraceEvents */
    uint64_t pl_len;
    int64_t t_got;
    int done, rc;
    err *e;
};

static int ask_header(void *arg, size_t i, Tpuemu__FrameHeader *a, void **dst)
{
    struct ask *k = arg;
    struct pcore *pc = k->pc;
    (void)i;
    k->t_got = now_ns();
    if (a->kind == KIND(ERROR)) {
        k->rc = err_set(k->e, a->status && a->status->code ? (int)a->status->code : CODE_UNKNOWN,
                        "core %s/%d refused the profile request: %s", pc->peer.host, pc->peer.core,
                        a->status && a->status->message ? a->status->message : "");
        return DPIO_LOST;
    }
    if (a->kind != KIND(PROFILE_RESULT) || a->seq != k->seq || !a->profile_info) {
        /* anything else on this connection is not ours to read */
        k->rc = err_set(k->e, CODE_INTERNAL, "core %s/%d answered a profile request with a frame of kind %d",
                        pc->peer.host, pc->peer.core, (int)a->kind);
        return DPIO_LOST;
    }
    if (a->payload_bytes && !(k->pl = malloc(a->payload_bytes))) {
        k->rc = err_set(k->e, CODE_RESOURCE_EXHAUSTED, "out of memory for a profile of %" PRIu64 " bytes",
                        a->payload_bytes);
        return DPIO_LOST;
    }
    k->pl_len = a->payload_bytes;
    k->info = a->profile_info;
    a->profile_info = NULL;
    *dst = k->pl;
    return DPIO_PAYLOAD;
}

static int ask_frame(void *arg, size_t i, uint64_t got)
{
    (void)i;
    (void)got;
    ((struct ask *)arg)->done = 1;
    return 1;
}

static void ask_lost(void *arg, size_t i, int code, const char *msg)
{
    struct ask *k = arg;
    (void)i;
    (void)code;
    if (k->rc == CODE_OK)
        k->rc = err_set(k->e, CODE_UNAVAILABLE, "%s", msg);
}

static int ask_state(void *arg)
{
    const struct ask *k = arg;
    return k->done || k->rc != CODE_OK ? DPIO_DONE : DPIO_MORE;
}

/* *info gets the answer's ProfileInfo, *ev the unpacked events (or NULL). */
static int ask(struct pcore *pc, uint64_t since, uint64_t until, uint32_t max, Tpuemu__ProfileInfo **info,
               Tpuemu__TraceEvents **ev, int64_t *t_sent, int64_t *t_got, err *e)
{
    static const struct dpio_ops ops = {ask_header, ask_frame, ask_lost, ask_state};
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ProfileRequest rq = TPUEMU__PROFILE_REQUEST__INIT;
    struct ask k = {pc, 0, NULL, NULL, 0, 0, 0, CODE_OK, e};
    struct dpio_run run = {&ops, &k, "the profile request", wire_now_ms() + PROF_IO_MS, 0, 0, pc->cancel};
    enum dpio_end end;
    int rc;

    *info = NULL;
    *ev = NULL;
    rq.since_ns = since;
    rq.until_ns = until;
    rq.max_events = max;
    h.kind = KIND(PROFILE);
    h.seq = k.seq = ++pc->seq;
    h.profile = &rq;
    if ((rc = dpio_send(&pc->peer, &h, NULL, 0)) != CODE_OK)
        return err_set(e, rc == CODE_INVALID_ARGUMENT ? CODE_INTERNAL : rc, "%s",
                       rc == CODE_INVALID_ARGUMENT ? "profile request does not fit a frame" : "out of memory");
    *t_sent = now_ns();
    pc->peer.reading = 1;
    pc->peer.max_payload = PROF_MAX_PAYLOAD;
    end = dpio_run(&pc->peer, 1, &run);
    pc->peer.reading = 0;
    if (k.rc == CODE_OK && !k.done)
        k.rc = end == DPIO_END_NOMEM      ? err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory")
               : end == DPIO_END_CANCELLED ? cli_cancelled("the profile capture", e)
                   : err_set(e, CODE_UNAVAILABLE, "core %s/%d at %s: profile: the data-plane peer did not answer in time",
                             pc->peer.host, pc->peer.core, pc->peer.addr);
    if (k.rc == CODE_OK && k.pl_len &&
        !(*ev = tpuemu__trace_events__unpack(NULL, k.pl_len, k.pl)))
        k.rc = err_set(e, CODE_DATA_LOSS, "core %s/%d sent a profile that does not decode", pc->peer.host,
                       pc->peer.core);
    free(k.pl);
    if (k.rc != CODE_OK) {
        if (k.info)
            tpuemu__profile_info__free_unpacked(k.info, NULL);
        return k.rc;
    }
    *info = k.info;
    *t_got = k.t_got;
    return CODE_OK;
}

static void keep_info(struct pcore *pc, const Tpuemu__ProfileInfo *pi)
{
    pc->replica = pi->replica;
    snprintf(pc->tpu_type, sizeof pc->tpu_type, "%s", pi->tpu_type ? pi->tpu_type : "");
    pc->hbm_used = pi->hbm_used;
    pc->hbm_peak = pi->hbm_peak;
    pc->hbm_cap = pi->hbm_capacity;
    pc->peak_flops = pi->peak_bf16_flops;
    pc->hbm_bw = pi->hbm_bandwidth;
    pc->ici_bw = pi->ici_bandwidth;
    pc->mxu_dim = pi->mxu_dim ? pi->mxu_dim : 128;
    pc->host_cpus = pi->host_cpus;
    snprintf(pc->boot_id, sizeof pc->boot_id, "%s", pi->boot_id ? pi->boot_id : "");
}

/* The machine whose cores most outnumber its CPUs (tpu_profile_summary). */
static void shared_cpus(const tpu_profile *p, tpu_profile_summary *out)
{
    for (size_t i = 0; i < p->n; i++) {
        unsigned cores = 0, cpus = 0;
        int first = 1;
        if (!p->c[i].boot_id[0])
            continue;
        for (size_t j = 0; j < p->n; j++)
            if (strcmp(p->c[j].boot_id, p->c[i].boot_id) == 0) {
                first &= j >= i;
                cores++;
                if (p->c[j].host_cpus > cpus)
                    cpus = p->c[j].host_cpus;
            }
        if (!first || !cpus || cores <= cpus)
            continue;
        if (!out->shared_cpus || (double)cores / cpus > (double)out->shared_cores / out->shared_cpus) {
            out->shared_cores = cores;
            out->shared_cpus = cpus;
        }
    }
}

static int sync_clock(struct pcore *pc, err *e)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < PROF_PROBES; i++) {
        Tpuemu__ProfileInfo *pi;
        Tpuemu__TraceEvents *ev;
        int64_t t0, t1;
        int rc = ask(pc, 0, 0, 0, &pi, &ev, &t0, &t1, e);
        if (rc != CODE_OK)
            return rc;
        if ((uint64_t)(t1 - t0) < best) {
            best = (uint64_t)(t1 - t0);
            pc->offset = (int64_t)pi->now_ns - (t0 + (t1 - t0) / 2);
        }
        keep_info(pc, pi);
        tpuemu__profile_info__free_unpacked(pi, NULL);
        if (ev)
            tpuemu__trace_events__free_unpacked(ev, NULL);
    }
    pc->err_ns = best / 2;
    return CODE_OK;
}

static int add_events(struct pcore *pc, const Tpuemu__TraceEvents *te, int64_t end)
{
    for (size_t i = 0; i < te->n_events; i++) {
        const Tpuemu__TraceEvent *s = te->events[i];
        struct pev *d;
        int64_t t0 = (int64_t)s->t0_ns - pc->offset;
        if (s->t0_ns + s->dur_ns + 1 > pc->since_w)
            pc->since_w = s->t0_ns + s->dur_ns + 1;
        if (end && t0 >= end)
            continue;
        if (pc->n == pc->cap) {
            size_t cap = pc->cap ? 2 * pc->cap : 4096;
            struct pev *nv = realloc(pc->ev, cap * sizeof *nv);
            if (!nv)
                return CODE_RESOURCE_EXHAUSTED;
            pc->ev = nv;
            pc->cap = cap;
        }
        d = &pc->ev[pc->n++];
        memset(d, 0, sizeof *d);
        d->kind = (uint32_t)s->kind;
        d->t0 = t0;
        d->dur = s->dur_ns;
        d->step = s->step;
        d->layer = s->layer;
        d->op = s->op;
        d->m = s->m;
        d->n = s->n;
        d->k = s->k;
        d->bytes = s->bytes;
        d->seq = s->seq;
        d->cstep = s->coll_step;
        d->chunk = s->chunk;
        d->peer = s->peer;
        snprintf(d->algo, sizeof d->algo, "%s", s->algo ? s->algo : "");
    }
    return CODE_OK;
}

/* Reads what core pc recorded since the last read (until `end`, client clock; 0: now). */
static int drain(struct pcore *pc, int64_t end, err *e)
{
    for (int round = 0; round < PROF_MAX_ROUNDS; round++) {
        Tpuemu__ProfileInfo *pi;
        Tpuemu__TraceEvents *ev;
        int64_t t0, t1;
        int rc = ask(pc, pc->since_w, end ? (uint64_t)(end + pc->offset) : 0, 65536, &pi, &ev, &t0, &t1, e);
        int more;
        if (rc != CODE_OK)
            return rc;
        more = pi->truncated;
        if (pi->oldest_ns > pc->since_w && pi->dropped)
            pc->dropped = pi->dropped; /* the ring overwrote some of what we asked for */
        keep_info(pc, pi);
        tpuemu__profile_info__free_unpacked(pi, NULL);
        if (ev) {
            rc = add_events(pc, ev, end);
            tpuemu__trace_events__free_unpacked(ev, NULL);
            if (rc != CODE_OK)
                return err_set(e, rc, "out of memory for the profile of core %s/%d", pc->peer.host,
                               pc->peer.core);
        }
        if (!more)
            return CODE_OK;
    }
    return CODE_OK;
}

void tpu_profile_free(tpu_profile *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        dpio_close(&p->c[i].peer);
        free(p->c[i].ev);
    }
    free(p->c);
    free(p);
}

static int by_replica(const void *a, const void *b)
{
    const struct pcore *x = a, *y = b;
    if (x->replica != y->replica)
        return x->replica < 0 ? 1 : y->replica < 0 ? -1 : x->replica - y->replica;
    int h = strcmp(x->peer.host, y->peer.host);
    return h ? h : x->peer.core - y->peer.core;
}

static int in_hosts(const char *host, const char *const *hosts, size_t nhosts)
{
    if (!hosts)
        return 1;
    for (size_t i = 0; i < nhosts; i++)
        if (strcmp(hosts[i], host) == 0)
            return 1;
    return 0;
}

/* Core i did not answer (rc, e): it is left out of the capture, named, and
 * the others go on; a cancel or running out of memory ends the capture. */
static int core_lost(tpu_profile *p, size_t i, int rc, err *e)
{
    if (rc == CODE_CANCELLED || rc == CODE_RESOURCE_EXHAUSTED)
        return rc;
    snprintf(p->c[i].missing, sizeof p->c[i].missing, "%s: %.250s", code_name(rc), e->msg);
    dpio_close(&p->c[i].peer);
    p->c[i].n = 0;
    return CODE_OK;
}

/* The capture of the cores of c's cluster on hosts[0..nhosts) (NULL: every
 * host). */
static tpu_status capture_cores(tpu_cluster *c, const char *const *hosts, size_t nhosts, uint32_t duration_ms,
                                tpu_profile **out)
{
    tpu_cluster_spec *spec = NULL;
    tpu_profile *p;
    size_t n, ready = 0;
    err e;
    int rc = CODE_OK;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    *out = NULL;
    if ((rc = tpu_cluster_spec_get(c, &spec)) != TPU_OK)
        return rc;
    n = tpu_cluster_spec_num_cores(spec);
    for (size_t i = 0; i < n; i++) {
        tpu_core_info ci;
        if (tpu_cluster_spec_core(spec, i, &ci) == TPU_OK && ci.state == TPU_CORE_READY &&
            in_hosts(ci.host_id, hosts, nhosts))
            ready++;
    }
    if (!(p = calloc(1, sizeof *p)) || !(p->c = calloc(n ? n : 1, sizeof *p->c))) {
        free(p);
        tpu_cluster_spec_free(spec);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        tpu_core_info ci;
        struct pcore *pc = &p->c[p->n];
        if (tpu_cluster_spec_core(spec, i, &ci) != TPU_OK || ci.state == TPU_CORE_DEAD ||
            (ready && ci.state != TPU_CORE_READY) || !ci.data_addr || !*ci.data_addr ||
            !in_hosts(ci.host_id, hosts, nhosts))
            continue;
        snprintf(pc->peer.host, sizeof pc->peer.host, "%s", ci.host_id);
        pc->peer.core = ci.core;
        snprintf(pc->peer.addr, sizeof pc->peer.addr, "%s", ci.data_addr);
        pc->peer.fd = -1;
        pc->replica = ci.replica_id;
        pc->cancel = &c->cancel;
        p->n++;
    }
    tpu_cluster_spec_free(spec);
    for (size_t h = 0; hosts && h < nhosts; h++) {
        size_t k = 0;
        while (k < p->n && strcmp(p->c[k].peer.host, hosts[h]) != 0)
            k++;
        if (k == p->n) {
            tpu_profile_free(p);
            return cli_failf(TPU_NOT_FOUND, "profile: host %s has no live core in the cluster", hosts[h]);
        }
    }
    if (!p->n) {
        tpu_profile_free(p);
        return cli_failf(TPU_NOT_FOUND, "profile: the cluster has no live core to profile");
    }
    for (size_t i = 0; i < p->n && rc == CODE_OK; i++)
        if ((rc = dpio_dial(&p->c[i].peer, &c->r->auth, c->r->sender, wire_now_ms() + DPIO_CONNECT_MS, &e)) ==
            CODE_OK)
            rc = sync_clock(&p->c[i], &e);
        else
            rc = core_lost(p, i, rc, &e);
    p->wall = time(NULL);
    p->start = now_ns();
    p->end = p->start + (int64_t)duration_ms * 1000000;
    for (size_t i = 0; i < p->n && rc == CODE_OK; i++) /* only what happens from now on */
        p->c[i].since_w = duration_ms ? (uint64_t)(p->start + p->c[i].offset) : 0;
    /* bounded: one read of every core per PROF_POLL_MS until the end */
    for (uint32_t round = 0; rc == CODE_OK && duration_ms && round <= duration_ms / PROF_POLL_MS + 1; round++) {
        int64_t left = p->end - now_ns();
        if (left <= 0)
            break;
        if ((rc = cli_sleep(c, (uint64_t)(left < PROF_POLL_MS * 1000000ll ? left : PROF_POLL_MS * 1000000ll) / 1000000,
                            "the profile capture", &e)) != CODE_OK)
            break;
        for (size_t i = 0; i < p->n && rc == CODE_OK; i++)
            if (!p->c[i].missing[0] && (rc = drain(&p->c[i], 0, &e)) != CODE_OK)
                rc = core_lost(p, i, rc, &e);
    }
    if (!duration_ms)
        p->end = now_ns();
    for (size_t i = 0; i < p->n && rc == CODE_OK; i++)
        if (!p->c[i].missing[0] && (rc = drain(&p->c[i], p->end, &e)) != CODE_OK)
            rc = core_lost(p, i, rc, &e);
    if (rc == CODE_OK) { /* one core that did not answer is named; every core's is the capture's failure */
        size_t lost = 0;
        for (size_t i = 0; i < p->n; i++)
            if (p->c[i].missing[0]) {
                lost++;
                cli_warn("profile: core %s/%d is not in the capture (%s); the other cores' events are kept",
                         p->c[i].peer.host, p->c[i].peer.core, p->c[i].missing);
            }
        if (lost == p->n)
            rc = err_set(&e, CODE_UNAVAILABLE, "profile: no core answered: %s/%d: %s", p->c[0].peer.host,
                         p->c[0].peer.core, p->c[0].missing);
    }
    if (duration_ms && rc == CODE_OK) /* events already under way when the capture began are not in it */
        for (size_t i = 0; i < p->n; i++) {
            size_t k = 0;
            for (size_t j = 0; j < p->c[i].n; j++)
                if (p->c[i].ev[j].t0 >= p->start)
                    p->c[i].ev[k++] = p->c[i].ev[j];
            p->c[i].n = k;
        }
    if (!duration_ms && rc == CODE_OK) { /* the capture spans what the rings held */
        int64_t lo = p->end;
        for (size_t i = 0; i < p->n; i++)
            for (size_t j = 0; j < p->c[i].n; j++)
                if (p->c[i].ev[j].t0 < lo)
                    lo = p->c[i].ev[j].t0;
        p->start = lo;
    }
    if (rc != CODE_OK) {
        tpu_profile_free(p);
        return cli_fail(&e);
    }
    for (size_t i = 0; i < p->n; i++)
        dpio_close(&p->c[i].peer);
    qsort(p->c, p->n, sizeof *p->c, by_replica);
    *out = p;
    return TPU_OK;
}

tpu_status tpu_profile_capture(tpu_cluster *c, uint32_t duration_ms, tpu_profile **out)
{
    return capture_cores(c, NULL, 0, duration_ms, out);
}

#define PROF_MAX_SERVICES 64

tpu_status tpu_profile_capture_hosts(tpu_resolver *r, const char *service_addr, uint32_t duration_ms,
                                     tpu_profile **out)
{
    char hosts[PROF_MAX_SERVICES][DPIO_HOST_MAX], resolver[ADDR_HOST_MAX + 16] = "";
    const char *hp[PROF_MAX_SERVICES];
    char list[4096], *save = NULL, *tok;
    size_t n = 0;
    tpu_resolver *r2 = NULL;
    tpu_cluster *c2 = NULL;
    tpu_status st;
    err e;

    *out = NULL;
    if (!r)
        return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: no resolver handle (it holds the cluster token)");
    if (!service_addr || !*service_addr)
        return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: --service_addr is empty: give a host's profiler "
                                               "address, HOST:PORT (port 8466 by default), or a comma list");
    if (strlen(service_addr) >= sizeof list)
        return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: --service_addr is too long (%zu bytes)",
                         strlen(service_addr));
    snprintf(list, sizeof list, "%s", service_addr);
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct pcore pc;
        addr a;
        Tpuemu__ProfileInfo *pi;
        Tpuemu__TraceEvents *ev;
        int64_t t0, t1;
        int rc;
        if (strncmp(tok, "grpc://", 7) == 0) /* TensorFlow's form; profiler_client strips it too */
            tok += 7;
        if (n == PROF_MAX_SERVICES)
            return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: more than %d addresses in --service_addr",
                             PROF_MAX_SERVICES);
        if (addr_parse(tok, 8466, &a, &e) != CODE_OK)
            return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: --service_addr '%s': %s", tok, e.msg);
        memset(&pc, 0, sizeof pc);
        pc.peer.fd = -1;
        addr_format(a.host, a.port, pc.peer.addr, sizeof pc.peer.addr);
        snprintf(pc.peer.host, sizeof pc.peer.host, "%.*s", (int)sizeof pc.peer.host - 1, pc.peer.addr);
        if ((rc = dpio_dial(&pc.peer, &r->auth, r->sender, wire_now_ms() + DPIO_CONNECT_MS, &e)) != CODE_OK) {
            dpio_close(&pc.peer);
            return cli_failf(rc, "capture_tpu_profile: the profiler service at %s: %s (a host's profiler port is "
                                 "tpu-worker --profiler-port, 8466 by default, served by the host's core 0)",
                             pc.peer.addr, e.msg);
        }
        rc = ask(&pc, 0, 0, 0, &pi, &ev, &t0, &t1, &e);
        dpio_close(&pc.peer);
        if (rc != CODE_OK)
            return cli_failf(rc, "capture_tpu_profile: the profiler service at %s: %s", pc.peer.addr, e.msg);
        if (ev)
            tpuemu__trace_events__free_unpacked(ev, NULL);
        if (!pi->host_service || !pi->host_id || !*pi->host_id || !pi->resolver || !*pi->resolver) {
            tpuemu__profile_info__free_unpacked(pi, NULL);
            return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: %s is a core's data port, not a host's "
                             "profiler port (tpu-worker --profiler-port)", pc.peer.addr);
        }
        if (*resolver && strcmp(resolver, pi->resolver) != 0) {
            st = cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: the hosts of --service_addr register with "
                           "different resolvers (%s and %s at %s): capture each cluster on its own", resolver,
                           pi->resolver, pc.peer.addr);
            tpuemu__profile_info__free_unpacked(pi, NULL);
            return st;
        }
        snprintf(resolver, sizeof resolver, "%s", pi->resolver);
        snprintf(hosts[n], sizeof hosts[n], "%s", pi->host_id);
        hp[n] = hosts[n];
        n++;
        tpuemu__profile_info__free_unpacked(pi, NULL);
    }
    if (!n)
        return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: --service_addr '%s' names no address",
                         service_addr);
    /* the hosts' cores, as their resolver lists them, with r's token */
    if ((st = tpu_resolver_new(resolver, &r2)) != TPU_OK)
        return st;
    r2->auth = r->auth;
    r2->timeout_ms = r->timeout_ms;
    if ((st = tpu_connect_to_cluster(r2, &c2)) == TPU_OK)
        st = capture_cores(c2, hp, n, duration_ms, out);
    tpu_cluster_free(c2);
    tpu_resolver_free(r2);
    return st;
}

size_t tpu_profile_num_cores(const tpu_profile *p)
{
    return p ? p->n : 0;
}

size_t tpu_profile_num_events(const tpu_profile *p)
{
    size_t n = 0;
    for (size_t i = 0; p && i < p->n; i++)
        n += p->c[i].n;
    return n;
}

tpu_status tpu_profile_core_info(const tpu_profile *p, size_t i, tpu_profile_core *out)
{
    if (!p || i >= p->n)
        return cli_failf(TPU_OUT_OF_RANGE, "profile: core %zu of %zu", i, p ? p->n : 0);
    const struct pcore *pc = &p->c[i];
    out->host_id = pc->peer.host;
    out->core = pc->peer.core;
    out->replica_id = pc->replica;
    out->clock_offset_ns = pc->offset;
    out->clock_error_ns = pc->err_ns;
    out->events = pc->n;
    out->dropped = pc->dropped;
    out->tpu_type = pc->tpu_type;
    out->hbm_used = pc->hbm_used;
    out->hbm_peak = pc->hbm_peak;
    out->hbm_capacity = pc->hbm_cap;
    return TPU_OK;
}

/* ---- the trace file ---- */

static int mkdirs(char *path)
{
    for (char *s = path + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                *s = '/';
                return -1;
            }
            *s = '/';
        }
    return mkdir(path, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* s as a quoted JSON string in out (cut short, still quoted, when it does
 * not fit; the names written are far shorter than the buffers). */
static const char *json_quote(const char *s, char *out, size_t n)
{
    size_t k = 0;
    out[k++] = '"';
    for (; s && *s && k + 8 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            k += (size_t)snprintf(out + k, n - k, "\\%c", ch);
        else if (ch < 0x20)
            k += (size_t)snprintf(out + k, n - k, "\\u%04x", ch);
        else
            out[k++] = (char)ch;
    }
    out[k++] = '"';
    out[k] = '\0';
    return out;
}

static void jstr(gzFile f, const char *s)
{
    char q[1024];
    gzputs(f, json_quote(s, q, sizeof q));
}

/* microseconds since the capture's start, with ns precision */
static double us(const tpu_profile *p, int64_t t)
{
    return (double)(t - p->start) / 1e3;
}

static const char *const mm_ops[] = {"forward", "weight gradient", "input gradient"};

static double pad(uint64_t v, uint64_t to)
{
    return (double)((v + to - 1) / to * to);
}

/* FLOPs of an m x k . k x n matmul and of its shape padded to the MXU (rows
 * of the left operand to 8, the rest to 128), as the worker's mxu counts them. */
static double mm_flops(const struct pev *e, double *padded)
{
    *padded = 2.0 * pad(e->m, 8) * pad(e->n, 128) * pad(e->k, 128);
    return 2.0 * (double)e->m * (double)e->n * (double)e->k;
}

/* Hosts are numbered in the order their first core appears. */
static int first_of_host(const tpu_profile *p, size_t i)
{
    for (size_t k = 0; k < i; k++)
        if (strcmp(p->c[k].peer.host, p->c[i].peer.host) == 0)
            return 0;
    return 1;
}

static int host_index(const tpu_profile *p, size_t i)
{
    int h = 0;
    for (size_t j = 0; j <= i; j++)
        if (first_of_host(p, j)) {
            if (strcmp(p->c[j].peer.host, p->c[i].peer.host) == 0)
                return h;
            h++;
        }
    return h;
}

static int cmp_t0(const void *a, const void *b)
{
    const struct pev *x = a, *y = b;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* The flow id of a chunk: (collective, step, chunk, from, to). */
static uint64_t flow_id(uint64_t seq, uint32_t cstep, uint32_t chunk, int from, int to)
{
    uint64_t h = 1469598103934665603ull;
    uint64_t v[5] = {seq, cstep, chunk, (uint64_t)(uint32_t)from, (uint64_t)(uint32_t)to};
    for (int i = 0; i < 5; i++) {
        h ^= v[i];
        h *= 1099511628211ull;
    }
    return h >> 12; /* exact as a JSON number */
}

static const struct pev *find_recv(const tpu_profile *p, int to, int from, const struct pev *s)
{
    for (size_t i = 0; i < p->n; i++) {
        if (p->c[i].replica != to)
            continue;
        for (size_t j = 0; j < p->c[i].n; j++) {
            const struct pev *r = &p->c[i].ev[j];
            if (r->kind == TK(RECV) && r->peer == from && r->seq == s->seq && r->cstep == s->cstep &&
                r->chunk == s->chunk)
                return r;
        }
    }
    return NULL;
}

static void write_event(gzFile f, const tpu_profile *p, const struct pev *e, int pid, int tid, int64_t t0,
                        uint64_t dur, int *first)
{
    char name[64];
    const char *cat = "step";
    switch (e->kind) {
    case TK(STEP): snprintf(name, sizeof name, "step %" PRIu64, e->step); break;
    case TK(INFEED_WAIT): snprintf(name, sizeof name, "infeed wait"); cat = "input"; break;
    case TK(OPTIMIZER): snprintf(name, sizeof name, "optimizer"); cat = "optimizer"; break;
    case TK(FORWARD): snprintf(name, sizeof name, e->layer ? "dense_%u forward" : "dense forward", e->layer);
        cat = "compute"; break;
    case TK(BACKWARD): snprintf(name, sizeof name, e->layer ? "dense_%u backward" : "dense backward", e->layer);
        cat = "compute"; break;
    case TK(MATMUL): snprintf(name, sizeof name, "matmul %" PRIu64 "x%" PRIu64 "x%" PRIu64, e->m, e->k, e->n);
        cat = "mxu"; break;
    case TK(ALLREDUCE): snprintf(name, sizeof name, "all-reduce"); cat = "allreduce"; break;
    case TK(SEND): snprintf(name, sizeof name, "send to replica %d", e->peer); cat = "chunk"; break;
    case TK(RECV): snprintf(name, sizeof name, "recv from replica %d", e->peer); cat = "chunk"; break;
    case TK(EVAL): snprintf(name, sizeof name, "eval step %" PRIu64, e->step); break;
    case TK(CLIENT_INPUT): snprintf(name, sizeof name, "dataset wait"); cat = "input"; break;
    case TK(CLIENT_INFEED): snprintf(name, sizeof name, "infeed from step %" PRIu64, e->step); cat = "infeed"; break;
    case TK(FAULT): snprintf(name, sizeof name, "chaos: %s", e->algo); cat = "fault"; break;
    default: snprintf(name, sizeof name, "event %u", e->kind); cat = "other"; break;
    }
    if (e->kind == TK(FAULT)) { /* an instant on the core's thread: what hit it, and when */
        gzprintf(f, "%s\n{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"%s\",\"name\":", *first ? "" : ",", cat);
        jstr(f, name);
        gzprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{\"fault\":", pid, tid, us(p, t0));
        jstr(f, e->algo);
        gzprintf(f, ",\"duration_ms\":%" PRIu64 ",\"percent\":%" PRIu64 "}}", e->n, e->m);
        *first = 0;
        return;
    }
    gzprintf(f, "%s\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", *first ? "" : ",", cat);
    jstr(f, name);
    gzprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%" PRIu64, pid, tid,
             us(p, t0), (double)dur / 1e3, e->step);
    if (e->kind == TK(MATMUL)) {
        double padded, fl = mm_flops(e, &padded);
        gzprintf(f, ",\"op\":\"%s\",\"m\":%" PRIu64 ",\"n\":%" PRIu64 ",\"k\":%" PRIu64
                    ",\"flops\":%.0f,\"padded_flops\":%.0f,\"mxu_utilization\":%.4f",
                 e->op < 3 ? mm_ops[e->op] : "?", e->m, e->n, e->k, fl, padded, fl / padded);
    } else if (e->kind == TK(ALLREDUCE)) {
        gzprintf(f, ",\"bytes\":%" PRIu64 ",\"collective\":%" PRIu64 ",\"replicas\":%d", e->bytes, e->seq, e->peer);
    } else if (e->kind == TK(CLIENT_INFEED)) {
        gzprintf(f, ",\"bytes\":%" PRIu64 ",\"to_replica\":0", e->bytes);
    } else if (e->kind == TK(SEND) || e->kind == TK(RECV)) {
        gzprintf(f, ",\"bytes\":%" PRIu64 ",\"collective\":%" PRIu64 ",\"algorithm_step\":%u,\"chunk\":%u,"
                    "\"peer_replica\":%d,\"transport\":\"%s\"",
                 e->bytes, e->seq, e->cstep, e->chunk, e->peer, e->algo);
    }
    gzprintf(f, "}}");
    *first = 0;
}

static void write_meta(gzFile f, const char *what, int pid, int tid, const char *name, int sort, int *first)
{
    gzprintf(f, "%s\n{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d", *first ? "" : ",", what, pid);
    if (tid >= 0)
        gzprintf(f, ",\"tid\":%d", tid);
    if (name) {
        gzprintf(f, ",\"args\":{\"name\":");
        jstr(f, name);
        gzprintf(f, "}}");
    } else {
        gzprintf(f, ",\"args\":{\"sort_index\":%d}}", sort);
    }
    *first = 0;
}

/* The training client's thread, as the first replica's core saw it: its
 * waits for the dataset and each request's way from posting to the core,
 * each drawn from when the previous one was done, as the chunks are. */
static void write_client(gzFile f, const tpu_profile *p, int *first)
{
    int pid = 1, named = 0;
    int64_t last[2] = {INT64_MIN, INT64_MIN};
    for (size_t i = 0; i < p->n; i++)
        if (host_index(p, i) + 2 > pid)
            pid = host_index(p, i) + 2;
    for (size_t i = 0; i < p->n; i++)
        for (size_t j = 0; j < p->c[i].n; j++) {
            const struct pev *e = &p->c[i].ev[j];
            int d = e->kind == TK(CLIENT_INFEED);
            if (e->kind != TK(CLIENT_INPUT) && !d)
                continue;
            if (!named) {
                char nm[64];
                snprintf(nm, sizeof nm, "client (pid %d)", e->peer);
                write_meta(f, "process_name", pid, -1, nm, 0, first);
                write_meta(f, "process_sort_index", pid, -1, NULL, pid, first);
                write_meta(f, "thread_name", pid, 1, "dataset", 0, first);
                write_meta(f, "thread_sort_index", pid, 1, NULL, 1, first);
                write_meta(f, "thread_name", pid, 2, "infeed", 0, first);
                write_meta(f, "thread_sort_index", pid, 2, NULL, 2, first);
                named = 1;
            }
            int64_t t0 = e->t0 > last[d] ? e->t0 : last[d], end = e->t0 + (int64_t)e->dur;
            if (end < t0)
                end = t0;
            write_event(f, p, e, pid, 1 + d, t0, (uint64_t)(end - t0), first);
            last[d] = end;
        }
}

tpu_status tpu_profile_write(const tpu_profile *p, const char *logdir, char *path, size_t pathn)
{
    char dir[4096], run[64], host[256] = "localhost", file[4400];
    struct tm tm;
    gzFile f;
    int first = 1;

    if (!logdir || !*logdir)
        return cli_failf(TPU_INVALID_ARGUMENT, "profile: no log directory");
    localtime_r(&p->wall, &tm); /* TensorFlow's GetCurrentTimeStampAsString: local time */
    strftime(run, sizeof run, "%Y_%m_%d_%H_%M_%S", &tm);
    gethostname(host, sizeof host - 1);
    {
        err e;
        if (tfevents_profile_empty(logdir, &e) != CODE_OK)
            return cli_fail(&e);
    }
    snprintf(dir, sizeof dir, "%s/plugins/profile/%s", logdir, run);
    if (mkdirs(dir) < 0)
        return cli_failf((tpu_status)safefile_errno_code(errno), "profile: cannot create %s: %s", dir,
                         strerror(errno));
    snprintf(file, sizeof file, "%s/%s.trace.json.gz", dir, host);
    struct safefile sf;
    err werr;
    if (safefile_open(&sf, "profile", file, &werr) != CODE_OK)
        return cli_fail(&werr);
    if (!(f = gzdopen(sf.fd, "wb6"))) {
        safefile_abort(&sf);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "profile: cannot write %s: out of memory", file);
    }
    sf.fd = -1; /* gzclose closes it */
    gzprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"tpuemu\",\"capture_ns\":%" PRId64
                ",\"cores\":%zu},\"traceEvents\":[",
             p->end - p->start, p->n);
    for (size_t i = 0; i < p->n; i++) {
        const struct pcore *pc = &p->c[i];
        int pid = host_index(p, i) + 1, tid = 1 + 3 * pc->peer.core;
        char nm[160];
        int64_t last[2] = {INT64_MIN, INT64_MIN};
        if (first_of_host(p, i)) {
            snprintf(nm, sizeof nm, "host %s", pc->peer.host);
            write_meta(f, "process_name", pid, -1, nm, 0, &first);
            write_meta(f, "process_sort_index", pid, -1, NULL, pid, &first);
        }
        snprintf(nm, sizeof nm, "core %d (replica %d, %s)", pc->peer.core, pc->replica, pc->tpu_type);
        write_meta(f, "thread_name", pid, tid, nm, 0, &first);
        write_meta(f, "thread_sort_index", pid, tid, NULL, tid, &first);
        snprintf(nm, sizeof nm, "core %d sends", pc->peer.core);
        write_meta(f, "thread_name", pid, tid + 1, nm, 0, &first);
        write_meta(f, "thread_sort_index", pid, tid + 1, NULL, tid + 1, &first);
        snprintf(nm, sizeof nm, "core %d receives", pc->peer.core);
        write_meta(f, "thread_name", pid, tid + 2, nm, 0, &first);
        write_meta(f, "thread_sort_index", pid, tid + 2, NULL, tid + 2, &first);
        qsort(pc->ev, pc->n, sizeof *pc->ev, cmp_t0); /* the events are ours; sorting keeps them */
        for (size_t j = 0; j < pc->n; j++) {
            struct pev *e = &pc->ev[j];
            if (e->kind == TK(SEND) || e->kind == TK(RECV)) {
                /* a track of its own per direction, each chunk from when the
                 * previous one was done (or it was posted) to its own end */
                int d = e->kind == TK(RECV);
                int64_t end = e->t0 + (int64_t)e->dur, t0 = e->t0 > last[d] ? e->t0 : last[d];
                if (end < t0)
                    end = t0;
                write_event(f, p, e, pid, tid + 1 + d, t0, (uint64_t)(end - t0), &first);
                last[d] = end;
                e->t0 = t0; /* where it was drawn: the flows bind there */
                e->dur = (uint64_t)(end - t0);
            } else if (e->kind != TK(CLIENT_INPUT) && e->kind != TK(CLIENT_INFEED)) {
                write_event(f, p, e, pid, tid, e->t0, e->dur, &first);
            }
        }
    }
    write_client(f, p, &first);
    /* flows: each chunk's send to its receive */
    for (size_t i = 0; i < p->n; i++) {
        const struct pcore *pc = &p->c[i];
        for (size_t j = 0; j < pc->n; j++) {
            const struct pev *s = &pc->ev[j], *r;
            size_t ri;
            if (s->kind != TK(SEND) || !(r = find_recv(p, s->peer, pc->replica, s)))
                continue;
            for (ri = 0; ri < p->n && p->c[ri].replica != s->peer; ri++)
                ;
            int64_t fe = r->t0 + (int64_t)r->dur;
            if (fe < s->t0)
                continue; /* clocks further apart than the estimate's bound: no arrow backwards */
            uint64_t id = flow_id(s->seq, s->cstep, s->chunk, pc->replica, s->peer);
            gzprintf(f, ",\n{\"ph\":\"s\",\"cat\":\"chunk\",\"name\":\"chunk\",\"id\":%" PRIu64
                        ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                     id, host_index(p, i) + 1, 2 + 3 * pc->peer.core, us(p, s->t0));
            gzprintf(f, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"chunk\",\"name\":\"chunk\",\"id\":%" PRIu64
                        ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                     id, host_index(p, ri) + 1, 3 + 3 * p->c[ri].peer.core, us(p, fe));
        }
    }
    gzprintf(f, "\n]}\n");
    if (gzclose(f) != Z_OK) {
        safefile_abort(&sf);
        return cli_failf(TPU_UNAVAILABLE, "profile: writing %s failed", file);
    }
    if (safefile_commit(&sf, 0, &werr) != CODE_OK)
        return cli_fail(&werr);
    snprintf(path, pathn, "%s", file);
    {
        char ov[4400];
        FILE *o;
        tpu_status st;
        snprintf(ov, sizeof ov, "%s/%s.overview.json", dir, host);
        if (safefile_open(&sf, "profile overview", ov, &werr) != CODE_OK)
            return cli_fail(&werr);
        if (!(o = fdopen(sf.fd, "w"))) {
            safefile_abort(&sf);
            return cli_failf(TPU_RESOURCE_EXHAUSTED, "profile: cannot write %s: %s", ov, strerror(errno));
        }
        sf.fd = -1;
        st = tpu_profile_write_overview_json(p, o);
        if (fclose(o) != 0 && st == TPU_OK)
            st = cli_failf(TPU_UNAVAILABLE, "profile: writing %s failed", ov);
        if (st != TPU_OK) {
            safefile_abort(&sf);
            return st;
        }
        if (safefile_commit(&sf, 0, &werr) != CODE_OK)
            return cli_fail(&werr);
    }
    return TPU_OK;
}

/* ---- the overview ---- */

enum { CAT_INPUT, CAT_COMPUTE, CAT_ALLREDUCE, CAT_OPT, CAT_IDLE, NCAT };
static const char *const cat_names[NCAT] = {"input", "compute", "all-reduce", "optimizer", "idle"};

struct csum {
    double cat[NCAT];   /* ns, summed over the steps that have a period */
    double period;      /* ns, summed */
    size_t steps;
    double flops, padded;
    uint64_t first, last;
    /* the roofline estimate on the real generation, summed over the rows */
    size_t rows;
    double est_mm, est_opt, est_ar; /* ns */
    size_t est_ops, est_hbm_ops;
};

struct srow {
    uint64_t step;
    int64_t end, ar_start, ar_end;
    double cat[NCAT - 1];
};

static int cmp_step(const void *a, const void *b)
{
    const struct srow *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n-1], n >= 1 (sorts v). */
static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n & 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static struct srow *find_row(struct srow *rows, size_t n, uint64_t step)
{
    struct srow key = {.step = step};
    return bsearch(&key, rows, n, sizeof *rows, cmp_step);
}

/* The roofline time of one matmul on core c's real generation, ns; *hbm
 * says whether its bytes take longer than its FLOPs. */
static double est_matmul(const struct pcore *c, const struct pev *e, int *hbm)
{
    double flops = 2.0 * pad(e->m, 8) * pad(e->n, c->mxu_dim) * pad(e->k, c->mxu_dim);
    double bytes = 2.0 * ((double)e->m * (double)e->k + (double)e->k * (double)e->n + (double)e->m * (double)e->n);
    double tf = c->peak_flops > 0 ? flops / c->peak_flops * 1e9 : 0;
    double tb = c->hbm_bw > 0 ? bytes / c->hbm_bw * 1e9 : 0;
    *hbm = tb > tf;
    return tb > tf ? tb : tf;
}

/* The step rows of core c (of n in the capture), sorted by step; NULL when
 * it trained none. */
static struct srow *core_rows(const struct pcore *c, size_t ncores, struct csum *cs, size_t *nrows)
{
    size_t n = 0;
    struct srow *rows;
    memset(cs, 0, sizeof *cs);
    *nrows = 0;
    for (size_t i = 0; i < c->n; i++)
        n += c->ev[i].kind == TK(STEP);
    if (!n || !(rows = calloc(n, sizeof *rows)))
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (c->ev[i].kind == TK(STEP)) {
            rows[*nrows].step = c->ev[i].step;
            rows[*nrows].end = c->ev[i].t0 + (int64_t)c->ev[i].dur;
            rows[*nrows].ar_start = INT64_MIN;
            (*nrows)++;
        }
    qsort(rows, *nrows, sizeof *rows, cmp_step);
    for (size_t i = 0; i < c->n; i++) {
        const struct pev *e = &c->ev[i];
        struct srow *r = find_row(rows, *nrows, e->step);
        if (e->kind == TK(MATMUL)) {
            double padded;
            cs->flops += mm_flops(e, &padded);
            cs->padded += padded;
        }
        if (!r)
            continue;
        if (e->kind == TK(MATMUL)) {
            int hbm;
            cs->est_mm += est_matmul(c, e, &hbm);
            cs->est_ops++;
            cs->est_hbm_ops += (size_t)hbm;
        } else if (e->kind == TK(ALLREDUCE)) {
            /* f32 weights, gradients and a slot read, weights and slot written */
            if (c->hbm_bw > 0)
                cs->est_opt += 5.0 * (double)e->bytes / c->hbm_bw * 1e9;
            if (c->ici_bw > 0 && ncores > 1)
                cs->est_ar += (double)e->bytes * 2.0 * (double)(ncores - 1) / (double)ncores / c->ici_bw * 1e9;
        }
        if (e->kind == TK(INFEED_WAIT))
            r->cat[CAT_INPUT] += (double)e->dur;
        else if (e->kind == TK(FORWARD) || e->kind == TK(BACKWARD))
            r->cat[CAT_COMPUTE] += (double)e->dur;
        else if (e->kind == TK(ALLREDUCE)) {
            r->cat[CAT_ALLREDUCE] += (double)e->dur;
            r->ar_start = e->t0;
            r->ar_end = e->t0 + (int64_t)e->dur;
        } else if (e->kind == TK(OPTIMIZER))
            r->cat[CAT_OPT] += (double)e->dur;
    }
    cs->first = rows[0].step;
    cs->last = rows[*nrows - 1].step;
    cs->rows = *nrows;
    for (size_t i = 1; i < *nrows; i++) {
        double period, busy = 0;
        if (rows[i].step != rows[i - 1].step + 1)
            continue;
        period = (double)(rows[i].end - rows[i - 1].end);
        for (int k = 0; k < NCAT - 1; k++) {
            cs->cat[k] += rows[i].cat[k];
            busy += rows[i].cat[k];
        }
        cs->cat[CAT_IDLE] += period > busy ? period - busy : 0;
        cs->period += period;
        cs->steps++;
    }
    return rows;
}

size_t profile_core_steps(const tpu_profile *p, size_t i, struct profile_step **out)
{
    struct csum cs;
    size_t n = 0;
    struct srow *rows = i < p->n ? core_rows(&p->c[i], p->n, &cs, &n) : NULL;
    struct profile_step *s = rows ? calloc(n, sizeof *s) : NULL;

    *out = NULL;
    if (!s) {
        free(rows);
        return 0;
    }
    for (size_t j = 0; j < n; j++) {
        double busy = 0;
        s[j].step = rows[j].step;
        for (int k = 0; k < NCAT - 1; k++) {
            s[j].part_ms[k] = rows[j].cat[k] / 1e6;
            busy += rows[j].cat[k];
        }
        s[j].has_period = j > 0 && rows[j].step == rows[j - 1].step + 1;
        if (s[j].has_period) {
            double period = (double)(rows[j].end - rows[j - 1].end);
            s[j].start_ms = (double)(rows[j - 1].end - p->start) / 1e6;
            s[j].part_ms[CAT_IDLE] = period > busy ? (period - busy) / 1e6 : 0;
        } else {
            s[j].start_ms = ((double)(rows[j].end - p->start) - busy) / 1e6;
        }
    }
    free(rows);
    *out = s;
    return n;
}

/* With a MODERATELY input-bound step the overview page says to reduce both the
 * input time and the rest: the fix of the largest other part, and the input's. */
static const char *const cat_fix_moderate[NCAT] = {
    "",
    "compute: use a bigger batch, in multiples of 128 per core, and the mixed_bfloat16 policy; and the input "
    "pipeline (moderately input-bound): cache() the dataset and prefetch(AUTOTUNE)",
    "the all-reduce: use a bigger batch (more compute per byte reduced) or more steps per execution; and the "
    "input pipeline (moderately input-bound): cache() the dataset and prefetch(AUTOTUNE)",
    "",
    "idle time between steps: more steps per execution, and prefetch the input; and the input pipeline "
    "(moderately input-bound): cache() the dataset and prefetch(AUTOTUNE)"};

#define PROF_MODERATELY_INPUT_PCT 5.0 /* kModeratelyInfeedBoundThresholdInPercent */
#define PROF_HIGHLY_INPUT_PCT 20.0    /* kHighlyInfeedBoundThresholdInPercent */

/* TensorFlow's InputAnalysis, with its names and words. */
static void input_analysis(double input_pct, tpu_profile_summary *out)
{
    if (input_pct >= PROF_HIGHLY_INPUT_PCT) {
        out->input_bound = "HIGHLY input-bound";
        out->input_classification = "host";
        snprintf(out->input_statement, sizeof out->input_statement,
                 "Your program is HIGHLY input-bound because %.1f%% of the total step time sampled is waiting for "
                 "input. Therefore, you should first focus on reducing the input time.", input_pct);
    } else if (input_pct >= PROF_MODERATELY_INPUT_PCT) {
        out->input_bound = "MODERATELY input-bound";
        out->input_classification = "both";
        snprintf(out->input_statement, sizeof out->input_statement,
                 "Your program is MODERATELY input-bound because %.1f%% of the total step time sampled is waiting "
                 "for input. Therefore, you would need to reduce both the input time and other time.", input_pct);
    } else {
        out->input_bound = "NOT input-bound";
        out->input_classification = "device";
        snprintf(out->input_statement, sizeof out->input_statement,
                 "Your program is NOT input-bound because only %.1f%% of the total step time sampled is waiting "
                 "for input. Therefore, you should focus on reducing other time.", input_pct);
    }
}

static const char *const cat_fix[NCAT] = {
    "the input pipeline: cache() the dataset and prefetch(AUTOTUNE) so the next batch is ready",
    "compute: use a bigger batch, in multiples of 128 per core, and the mixed_bfloat16 policy",
    "the all-reduce: use a bigger batch (more compute per byte reduced) or more steps per execution",
    "the optimizer", "idle time between steps: more steps per execution, and prefetch the input"};

/* The layers' MXU utilization and what their padding costs, from the shape
 * of their forward matmul: x (batch x inputs) times W (inputs x units). The
 * weight gradient's inner dimension is the batch. */
static void layers_of(const tpu_profile *p, tpu_profile_summary *out)
{
    struct lsum {
        double flops, padded;
        uint64_t batch, in, units;
    } L[TPU_PROFILE_MAX_LAYERS] = {{0}};
    size_t n = 0, used;
    uint64_t small_batch = 0;

    for (size_t i = 0; i < p->n; i++)
        for (size_t j = 0; j < p->c[i].n; j++) {
            const struct pev *e = &p->c[i].ev[j];
            double padded, fl;
            if (e->kind != TK(MATMUL) || e->layer >= TPU_PROFILE_MAX_LAYERS)
                continue;
            fl = mm_flops(e, &padded);
            L[e->layer].flops += fl;
            L[e->layer].padded += padded;
            if (e->op == 0) {
                L[e->layer].batch = e->m;
                L[e->layer].in = e->k;
                L[e->layer].units = e->n;
            }
            if (e->layer + 1 > n)
                n = e->layer + 1;
        }
    out->num_layers = n;
    out->mxu_advice[0] = '\0';
    for (size_t l = 0; l < n; l++) {
        tpu_profile_layer *y = &out->layers[l];
        char *b = y->padding;
        size_t cap = sizeof y->padding;
        y->layer = (unsigned)l;
        y->mxu_utilization = L[l].padded > 0 ? L[l].flops / L[l].padded : 0;
        b[0] = '\0';
        if (!L[l].units)
            continue;
        used = 0;
#define LOSS(cond, ...)                                                                                      \
    if ((cond) && used < cap)                                                                                \
        used += (size_t)snprintf(b + used, cap - used, __VA_ARGS__);
        LOSS(L[l].units % 128, "%s%" PRIu64 " units padded to %.0f (%.0f%%)", used ? "; " : "", L[l].units,
             pad(L[l].units, 128), 100.0 * (double)L[l].units / pad(L[l].units, 128))
        LOSS(L[l].in % 128, "%s%" PRIu64 " inputs padded to %.0f (%.0f%%)", used ? "; " : "", L[l].in,
             pad(L[l].in, 128), 100.0 * (double)L[l].in / pad(L[l].in, 128))
        LOSS(L[l].batch % 128, "%sthe weight gradient's K = per-core batch %" PRIu64 " padded to %.0f (%.0f%%)",
             used ? "; " : "", L[l].batch, pad(L[l].batch, 128), 100.0 * (double)L[l].batch / pad(L[l].batch, 128))
#undef LOSS
        if (L[l].batch % 128 && (!small_batch || L[l].batch < small_batch))
            small_batch = L[l].batch;
    }
    if (out->mxu_utilization >= PROF_MXU_GOOD || !n)
        return;
    if (small_batch && small_batch < 128)
        snprintf(out->mxu_advice, sizeof out->mxu_advice,
                 "the per-core batch of %" PRIu64 " is the weight-gradient matmuls' inner dimension K, padded to "
                 "128: %.0f%% of the MXU does work there; use a per-core batch of 128 or a multiple of it",
                 small_batch, 100.0 * (double)small_batch / 128.0);
    else
        snprintf(out->mxu_advice, sizeof out->mxu_advice,
                 "layer widths and per-core batch in multiples of 128 fill the MXU: see the layers above");
}

tpu_status tpu_profile_summarize(const tpu_profile *p, tpu_profile_summary *out)
{
    struct srow **rows = calloc(p->n ? p->n : 1, sizeof *rows);
    size_t *nrows = calloc(p->n ? p->n : 1, sizeof *nrows), *last_count = calloc(p->n ? p->n : 1, sizeof(size_t));
    double *late_sum = calloc(p->n ? p->n : 1, sizeof *late_sum);
    struct csum all = {0}, cs;
    size_t compared = 0;
    tpu_status rc = TPU_OK;

    memset(out, 0, sizeof *out);
    out->straggler = -1;
    out->input_bound = "unknown";
    out->input_classification = "unknown";
    snprintf(out->input_statement, sizeof out->input_statement,
             "No step time measured. Therefore we cannot tell where the performance bottleneck is.");
    out->bottleneck = "none";
    out->advice = "capture while the model trains: no training step was in the capture";
    shared_cpus(p, out);
    if (!rows || !nrows || !last_count || !late_sum) {
        rc = cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory for the profile's summary");
        goto done;
    }
    for (size_t i = 0; i < p->n; i++) {
        rows[i] = core_rows(&p->c[i], p->n, &cs, &nrows[i]);
        for (int c = 0; c < NCAT; c++)
            all.cat[c] += cs.cat[c];
        all.period += cs.period;
        all.steps += cs.steps;
        all.flops += cs.flops;
        all.padded += cs.padded;
        all.rows += cs.rows;
        all.est_mm += cs.est_mm;
        all.est_opt += cs.est_opt;
        all.est_ar += cs.est_ar;
        all.est_ops += cs.est_ops;
        all.est_hbm_ops += cs.est_hbm_ops;
        if (p->c[i].hbm_cap && (double)p->c[i].hbm_peak / (double)p->c[i].hbm_cap > out->hbm_peak_fraction) {
            out->hbm_peak_fraction = (double)p->c[i].hbm_peak / (double)p->c[i].hbm_cap;
            out->hbm_core = (int)i;
        }
    }
    out->steps = all.steps;
    out->mxu_utilization = all.padded > 0 ? all.flops / all.padded : 0;
    out->tpu_type = p->n ? p->c[0].tpu_type : "";
    if (all.rows) {
        double r = (double)all.rows;
        out->est_matmul_ms = all.est_mm / r / 1e6;
        out->est_optimizer_ms = all.est_opt / r / 1e6;
        out->est_allreduce_ms = all.est_ar / r / 1e6;
        out->est_step_ms = out->est_matmul_ms + out->est_optimizer_ms + out->est_allreduce_ms;
        out->est_ops = (all.est_ops + all.rows / 2) / all.rows;
        out->est_hbm_bound_ops = (all.est_hbm_ops + all.rows / 2) / all.rows;
    }
    layers_of(p, out);
    if (!all.steps)
        goto done;
    out->step_ms = all.period / (double)all.steps / 1e6;
    for (int c = 0; c < NCAT; c++)
        out->fraction[c] = all.cat[c] / all.period;
    input_analysis(100.0 * out->fraction[CAT_INPUT], out);
    /* who arrives last at each step's all-reduce, and after the next latest by
     * how much; how far apart the cores arrive, and how long it runs after the last */
    double *spread = p->n > 1 && rows[0] ? malloc(sizeof *spread * (2 * nrows[0] + 1)) : NULL;
    for (size_t j = 0; p->n > 1 && rows[0] && j < nrows[0]; j++) {
        int64_t mx = INT64_MIN, second = INT64_MIN, mn = INT64_MAX, end = INT64_MIN;
        size_t who = 0, m = 0;
        for (size_t i = 0; i < p->n; i++) {
            struct srow *r = rows[i] ? find_row(rows[i], nrows[i], rows[0][j].step) : NULL;
            if (!r || r->ar_start == INT64_MIN)
                break;
            if (r->ar_start > mx) {
                second = mx;
                mx = r->ar_start;
                who = i;
            } else if (r->ar_start > second) {
                second = r->ar_start;
            }
            mn = r->ar_start < mn ? r->ar_start : mn;
            end = r->ar_end > end ? r->ar_end : end;
            m++;
        }
        if (m != p->n)
            continue;
        last_count[who]++;
        late_sum[who] += (double)(mx - second);
        if (spread) { /* without it (no memory) only the split is missing */
            spread[compared] = (double)(mx - mn);
            spread[nrows[0] + compared] = (double)(end > mx ? end - mx : 0);
        }
        compared++;
    }
    if (compared && spread) {
        out->ar_spread_ms = median_of(spread, compared) / 1e6;
        out->ar_after_last_ms = median_of(spread + nrows[0], compared) / 1e6;
    }
    free(spread);
    if (compared) {
        size_t worst = 0;
        for (size_t i = 1; i < p->n; i++)
            if (last_count[i] > last_count[worst])
                worst = i;
        out->last_core = (int)worst;
        out->last_share = (double)last_count[worst] / (double)compared;
        out->last_by_ms = late_sum[worst] / (double)last_count[worst] / 1e6;
        /* last in half of the steps and in 1.5 times its fair share (with 2
         * cores one is always last), by a tenth of a step */
        double share = 1.5 / (double)p->n > 0.5 ? 1.5 / (double)p->n : 0.5;
        if (compared >= PROF_STRAGGLER_STEPS && out->last_share >= share && out->last_by_ms >= 0.1 * out->step_ms)
            out->straggler = (int)worst;
    }
    if (out->hbm_peak_fraction >= PROF_HBM_TIGHT) {
        out->bottleneck = "memory";
        out->advice = "memory: HBM is nearly full; use a smaller batch per core, or recompute activations in "
                      "the backward pass instead of keeping them (tpu_model_set_gradient_checkpointing)";
    } else if (strcmp(out->input_classification, "host") == 0) {
        out->bottleneck = cat_names[CAT_INPUT];
        out->advice = cat_fix[CAT_INPUT];
    } else {
        int top = CAT_COMPUTE;
        for (int c = CAT_COMPUTE + 1; c < NCAT; c++)
            if (c != CAT_OPT && all.cat[c] > all.cat[top])
                top = c;
        out->bottleneck = cat_names[top];
        out->advice = strcmp(out->input_classification, "both") == 0 ? cat_fix_moderate[top] : cat_fix[top];
    }
done:
    for (size_t i = 0; rows && i < p->n; i++)
        free(rows[i]);
    free(rows);
    free(nrows);
    free(last_count);
    free(late_sum);
    return rc;
}

#define GIB_D (1024.0 * 1024.0 * 1024.0)

/* Keras's names: dense, dense_1, dense_2, ... */
static const char *layer_name(size_t l)
{
    static _Thread_local char nm[32];
    if (l == 0)
        return "dense";
    snprintf(nm, sizeof nm, "dense_%zu", l);
    return nm;
}

void tpu_profile_print_overview(const tpu_profile *p, FILE *f)
{
    tpu_profile_summary sum;
    fprintf(f, "Profile of %zu cores over %.1f ms (%zu events)\n", p->n, (double)(p->end - p->start) / 1e6,
            tpu_profile_num_events(p));
    fprintf(f, "%-14s %6s %9s %8s %8s %10s %9s %8s %6s %s\n", "core", "steps", "step ms", "input", "compute",
            "all-reduce", "optimizer", "idle", "MXU", "clock offset");
    for (size_t i = 0; i < p->n; i++) {
        char name[96];
        struct csum cs;
        size_t nr;
        free(core_rows(&p->c[i], p->n, &cs, &nr));
        snprintf(name, sizeof name, "%s/%d", p->c[i].peer.host, p->c[i].peer.core);
        if (!cs.steps) {
            fprintf(f, "%-14s %6s   (no training steps in the capture)\n", name, "0");
            continue;
        }
        fprintf(f, "%-14s %6zu %9.3f", name, cs.steps, cs.period / (double)cs.steps / 1e6);
        for (int c = 0; c < NCAT; c++)
            fprintf(f, " %*.1f%%", c == CAT_ALLREDUCE ? 9 : c == CAT_OPT ? 8 : 7, 100.0 * cs.cat[c] / cs.period);
        fprintf(f, " %5.1f%% %+7.0fus +-%.0fus\n", cs.padded > 0 ? 100.0 * cs.flops / cs.padded : 0.0,
                (double)p->c[i].offset / 1e3, (double)p->c[i].err_ns / 1e3);
    }
    if (tpu_profile_summarize(p, &sum) != TPU_OK || !sum.steps) {
        fprintf(f, "No training step was captured: %s.\n", sum.advice);
        return;
    }
    fprintf(f, "%-14s %6zu %9.3f", "all cores", sum.steps, sum.step_ms);
    for (int c = 0; c < NCAT; c++)
        fprintf(f, " %*.1f%%", c == CAT_ALLREDUCE ? 9 : c == CAT_OPT ? 8 : 7, 100.0 * sum.fraction[c]);
    fprintf(f, " %5.1f%%\n", 100.0 * sum.mxu_utilization);
    if (p->n > 1 && sum.last_share > 0)
        fprintf(f, "Last at the all-reduce: core %s/%d in %.0f%% of the steps, %.3f ms after the next latest%s\n",
                p->c[sum.last_core].peer.host, p->c[sum.last_core].peer.core, 100.0 * sum.last_share,
                sum.last_by_ms, sum.straggler >= 0 ? ": a straggler, the other cores wait for it" : "");
    if (p->n > 1 && (sum.ar_spread_ms > 0 || sum.ar_after_last_ms > 0))
        fprintf(f, "All-reduce: the cores reach it %.3f ms apart (first to last, median step) and it ends %.3f ms "
                   "after the last one arrives\n",
                sum.ar_spread_ms, sum.ar_after_last_ms);
    if (sum.shared_cores)
        fprintf(f, "CPUs: %u emulated cores share %u CPU%s of one machine: at most %u compute at once, and the "
                   "others wait for their turn inside the all-reduce (the exchange itself is what runs after the "
                   "last core arrives)\n",
                sum.shared_cores, sum.shared_cpus, sum.shared_cpus == 1 ? "" : "s", sum.shared_cpus);
    for (size_t l = 0; l < sum.num_layers; l++)
        if (sum.layers[l].mxu_utilization < PROF_MXU_GOOD && sum.layers[l].padding[0])
            fprintf(f, "MXU of %-9s %5.1f%%: %s\n", layer_name(l), 100.0 * sum.layers[l].mxu_utilization,
                    sum.layers[l].padding);
    if (sum.mxu_advice[0])
        fprintf(f, "MXU advice: %s\n", sum.mxu_advice);
    if (p->c[sum.hbm_core].hbm_cap)
        fprintf(f, "HBM: peak %.2f of %.2f GiB (%.1f%%) on core %s/%d\n",
                (double)p->c[sum.hbm_core].hbm_peak / GIB_D, (double)p->c[sum.hbm_core].hbm_cap / GIB_D,
                100.0 * sum.hbm_peak_fraction, p->c[sum.hbm_core].peer.host, p->c[sum.hbm_core].peer.core);
    if (sum.est_step_ms > 0)
        fprintf(f, "Estimate on a real %s (roofline, not a measurement): %.4f ms per step = matmuls %.4f ms "
                   "(%zu ops, %zu bound by HBM bandwidth) + optimizer %.4f ms + all-reduce %.4f ms over ICI; "
                   "measured here %.3f ms\n",
                sum.tpu_type, sum.est_step_ms, sum.est_matmul_ms, sum.est_ops, sum.est_hbm_bound_ops,
                sum.est_optimizer_ms, sum.est_allreduce_ms, sum.step_ms);
    fprintf(f, "Input (the overview page's classes): %s. %s\n", sum.input_bound, sum.input_statement);
    if (strcmp(sum.bottleneck, "memory") == 0)
        fprintf(f, "Bottleneck: memory (HBM peak %.0f%% of capacity): %s\n", 100.0 * sum.hbm_peak_fraction,
                sum.advice);
    else
        fprintf(f, "Bottleneck: %s (%.0f%% of the step): %s\n", sum.bottleneck,
                100.0 * sum.fraction[strcmp(sum.bottleneck, "input") == 0        ? CAT_INPUT
                                     : strcmp(sum.bottleneck, "compute") == 0    ? CAT_COMPUTE
                                     : strcmp(sum.bottleneck, "all-reduce") == 0 ? CAT_ALLREDUCE
                                                                                 : CAT_IDLE],
                sum.advice);
}

static void fjstr(FILE *f, const char *s)
{
    char q[1024];
    fputs(json_quote(s, q, sizeof q), f);
}

static void fsplit(FILE *f, const double *part, double whole)
{
    static const char *const key[NCAT] = {"input", "compute", "all_reduce", "optimizer", "idle"};
    fputc('{', f);
    for (int c = 0; c < NCAT; c++)
        fprintf(f, "%s\"%s\":%.6f", c ? "," : "", key[c], whole > 0 ? part[c] / whole : 0.0);
    fputc('}', f);
}

static void fcore(FILE *f, const tpu_profile *p, int i)
{
    char nm[96];
    snprintf(nm, sizeof nm, "%s/%d", p->c[i].peer.host, p->c[i].peer.core);
    fjstr(f, nm);
}

tpu_status tpu_profile_write_overview_json(const tpu_profile *p, FILE *f)
{
    tpu_profile_summary sum;
    tpu_status st = tpu_profile_summarize(p, &sum);
    double one[NCAT];

    if (st != TPU_OK)
        return st;
    fprintf(f, "{\"cores\":%zu,\"capture_ms\":%.3f,\"events\":%zu,\"steps\":%zu,\"step_ms\":%.6f,\"split\":",
            p->n, (double)(p->end - p->start) / 1e6, tpu_profile_num_events(p), sum.steps, sum.step_ms);
    for (int c = 0; c < NCAT; c++)
        one[c] = sum.fraction[c];
    fsplit(f, one, 1.0);
    fprintf(f, ",\"mxu_utilization\":%.6f,\"layers\":[", sum.mxu_utilization);
    for (size_t l = 0; l < sum.num_layers; l++) {
        fprintf(f, "%s{\"name\":", l ? "," : "");
        fjstr(f, layer_name(l));
        fprintf(f, ",\"mxu_utilization\":%.6f,\"padding\":", sum.layers[l].mxu_utilization);
        fjstr(f, sum.layers[l].padding);
        fputc('}', f);
    }
    fprintf(f, "],\"mxu_advice\":");
    fjstr(f, sum.mxu_advice);
    fprintf(f, ",\"last_at_allreduce\":");
    if (p->n > 1 && sum.last_share > 0) {
        fprintf(f, "{\"core\":");
        fcore(f, p, sum.last_core);
        fprintf(f, ",\"share\":%.6f,\"by_ms\":%.6f}", sum.last_share, sum.last_by_ms);
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\"allreduce_spread_ms\":%.6f,\"allreduce_after_last_ms\":%.6f", sum.ar_spread_ms,
            sum.ar_after_last_ms);
    fprintf(f, ",\"shared_cores\":%u,\"shared_cpus\":%u", sum.shared_cores, sum.shared_cpus);
    fprintf(f, ",\"missing\":["); /* cores that did not answer during the capture, and why */
    for (size_t i = 0, k = 0; i < p->n; i++)
        if (p->c[i].missing[0]) {
            fprintf(f, "%s{\"core\":", k++ ? "," : "");
            fcore(f, p, (int)i);
            fprintf(f, ",\"why\":");
            fjstr(f, p->c[i].missing);
            fprintf(f, "}");
        }
    fprintf(f, "]");
    fprintf(f, ",\"straggler\":");
    if (sum.straggler >= 0)
        fcore(f, p, sum.straggler);
    else
        fprintf(f, "null");
    fprintf(f, ",\"hbm\":{\"peak_fraction\":%.6f,\"core\":", sum.hbm_peak_fraction);
    fcore(f, p, sum.hbm_core);
    fprintf(f, "},\"input_bound\":");
    fjstr(f, sum.input_bound);
    fprintf(f, ",\"input_classification\":");
    fjstr(f, sum.input_classification);
    fprintf(f, ",\"input_statement\":");
    fjstr(f, sum.input_statement);
    fprintf(f, ",\"bottleneck\":");
    fjstr(f, sum.bottleneck);
    fprintf(f, ",\"advice\":");
    fjstr(f, sum.advice);
    fprintf(f, ",\"estimate\":{\"what\":\"roofline estimate on the real generation, not a measurement\","
               "\"tpu_type\":");
    fjstr(f, sum.tpu_type);
    fprintf(f, ",\"step_ms\":%.6f,\"matmul_ms\":%.6f,\"optimizer_ms\":%.6f,\"all_reduce_ms\":%.6f,"
               "\"matmuls\":%zu,\"hbm_bound_matmuls\":%zu},\"per_core\":[",
            sum.est_step_ms, sum.est_matmul_ms, sum.est_optimizer_ms, sum.est_allreduce_ms, sum.est_ops,
            sum.est_hbm_bound_ops);
    for (size_t i = 0; i < p->n; i++) {
        const struct pcore *pc = &p->c[i];
        struct csum cs;
        size_t nr;
        free(core_rows(pc, p->n, &cs, &nr));
        fprintf(f, "%s{\"host\":", i ? "," : "");
        fjstr(f, pc->peer.host);
        fprintf(f, ",\"core\":%d,\"replica\":%d,\"steps\":%zu,\"step_ms\":%.6f,\"split\":", pc->peer.core,
                pc->replica, cs.steps, cs.steps ? cs.period / (double)cs.steps / 1e6 : 0.0);
        fsplit(f, cs.cat, cs.period);
        fprintf(f, ",\"mxu_utilization\":%.6f,\"clock_offset_us\":%.3f,\"clock_error_us\":%.3f,"
                   "\"events\":%zu,\"dropped\":%" PRIu64 ",\"hbm_used\":%" PRIu64 ",\"hbm_peak\":%" PRIu64
                   ",\"hbm_capacity\":%" PRIu64 "}",
                cs.padded > 0 ? cs.flops / cs.padded : 0.0, (double)pc->offset / 1e3, (double)pc->err_ns / 1e3,
                pc->n, pc->dropped, pc->hbm_used, pc->hbm_peak, pc->hbm_cap);
    }
    fprintf(f, "]}\n");
    return ferror(f) ? cli_failf(TPU_UNAVAILABLE, "profile: writing the overview failed") : TPU_OK;
}

void profile_keep_steps(tpu_profile *p, uint64_t first, uint64_t last, int64_t since_ns)
{
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (size_t i = 0; i < p->n; i++)
        for (size_t j = 0; j < p->c[i].n; j++) {
            const struct pev *e = &p->c[i].ev[j];
            if (e->step < first || e->step > last || e->t0 < since_ns)
                continue;
            if ((e->kind == TK(STEP) || e->kind == TK(INFEED_WAIT)) && e->t0 < lo)
                lo = e->t0;
            if (e->kind == TK(STEP) && e->t0 + (int64_t)e->dur > hi)
                hi = e->t0 + (int64_t)e->dur;
        }
    if (lo > hi)
        lo = hi = p->end;
    for (size_t i = 0; i < p->n; i++) {
        struct pcore *pc = &p->c[i];
        size_t k = 0;
        for (size_t j = 0; j < pc->n; j++) {
            const struct pev *e = &pc->ev[j];
            if (e->t0 >= lo && e->t0 + (int64_t)e->dur <= hi)
                pc->ev[k++] = *e;
        }
        pc->n = k;
    }
    p->start = lo;
    p->end = hi;
}
