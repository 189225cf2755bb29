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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "frame.h"
#include "profile_int.h"

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One PROFILE request and its answer (profile_io.h) on pc's connection. */
static int ask(struct pcore *pc, uint64_t since, uint64_t until, uint32_t max, struct prof_info *info,
               struct prof_event **ev, size_t *nev, int64_t *t_sent, int64_t *t_got, err *e)
{
    return profile_io_ask(&pc->peer, ++pc->seq, since, until, max, PROF_IO_MS, PROF_MAX_PAYLOAD, pc->cancel, info, ev,
                          nev, t_sent, t_got, e);
}

static void keep_info(struct pcore *pc, const struct prof_info *pi)
{
    pc->replica = pi->replica;
    snprintf(pc->tpu_type, sizeof pc->tpu_type, "%s", pi->tpu_type);
    pc->hbm_used = pi->hbm_used;
    pc->hbm_peak = pi->hbm_peak;
    pc->hbm_cap = pi->hbm_capacity;
    pc->peak_flops = pi->peak_bf16_flops;
    pc->hbm_bw = pi->hbm_bandwidth;
    pc->ici_bw = pi->ici_bandwidth;
    pc->mxu_dim = pi->mxu_dim ? pi->mxu_dim : 128;
    pc->host_cpus = pi->host_cpus;
    snprintf(pc->boot_id, sizeof pc->boot_id, "%s", pi->boot_id);
}

static int sync_clock(struct pcore *pc, err *e)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < PROF_PROBES; i++) {
        struct prof_info pi;
        struct prof_event *ev;
        size_t nev;
        int64_t t0, t1;
        int rc = ask(pc, 0, 0, 0, &pi, &ev, &nev, &t0, &t1, e);
        if (rc != CODE_OK)
            return rc;
        if ((uint64_t)(t1 - t0) < best) {
            best = (uint64_t)(t1 - t0);
            pc->offset = (int64_t)pi.now_ns - (t0 + (t1 - t0) / 2);
        }
        keep_info(pc, &pi);
        free(ev);
    }
    pc->err_ns = best / 2;
    return CODE_OK;
}

static int add_events(struct pcore *pc, const struct prof_event *v, size_t count, int64_t end)
{
    for (size_t i = 0; i < count; i++) {
        const struct prof_event *s = &v[i];
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
        snprintf(d->algo, sizeof d->algo, "%s", s->algo);
    }
    return CODE_OK;
}

/* Reads what core pc recorded since the last read (until `end`, client clock; 0: now). */
static int drain(struct pcore *pc, int64_t end, err *e)
{
    for (int round = 0; round < PROF_MAX_ROUNDS; round++) {
        struct prof_info pi;
        struct prof_event *ev;
        size_t nev;
        int64_t t0, t1;
        int rc = ask(pc, pc->since_w, end ? (uint64_t)(end + pc->offset) : 0, 65536, &pi, &ev, &nev, &t0, &t1, e);
        int more;
        if (rc != CODE_OK)
            return rc;
        more = pi.truncated;
        if (pi.oldest_ns > pc->since_w && pi.dropped)
            pc->dropped = pi.dropped; /* the ring overwrote some of what we asked for */
        keep_info(pc, &pi);
        if (ev) {
            rc = add_events(pc, ev, nev, end);
            free(ev);
            if (rc != CODE_OK)
                return err_set(e, rc, "out of memory for the profile of core %s/%d", pc->peer.host,
                               pc->peer.core);
        }
        if (!more)
            return CODE_OK;
    }
    return CODE_OK;
}

tpu_status tpu_profile_set_layer_name(tpu_profile *p, size_t layer, const char *name)
{
    if (!p || !name || !*name || layer >= TPU_PROFILE_MAX_LAYERS)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_profile_set_layer_name: layer %zu (0..%d) and a name, please",
                         layer, TPU_PROFILE_MAX_LAYERS - 1);
    snprintf(p->lname[layer], sizeof p->lname[layer], "%s", name);
    return TPU_OK;
}

const char *profile_layer_name(const tpu_profile *p, size_t l, char *buf, size_t n)
{
    if (l < TPU_PROFILE_MAX_LAYERS && p->lname[l][0])
        snprintf(buf, n, "%s", p->lname[l]);
    else if (l == 0)
        snprintf(buf, n, "dense");
    else
        snprintf(buf, n, "dense_%zu", l);
    return buf;
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
        struct prof_info pi;
        struct prof_event *ev;
        size_t nev;
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
        rc = ask(&pc, 0, 0, 0, &pi, &ev, &nev, &t0, &t1, &e);
        dpio_close(&pc.peer);
        if (rc != CODE_OK)
            return cli_failf(rc, "capture_tpu_profile: the profiler service at %s: %s", pc.peer.addr, e.msg);
        free(ev);
        if (!pi.host_service || !*pi.host_id || !*pi.resolver) {
            return cli_failf(TPU_INVALID_ARGUMENT, "capture_tpu_profile: %s is a core's data port, not a host's "
                             "profiler port (tpu-worker --profiler-port)", pc.peer.addr);
        }
        if (*resolver && strcmp(resolver, pi.resolver) != 0)
            return cli_failf(TPU_INVALID_ARGUMENT,
                             "capture_tpu_profile: the hosts of --service_addr register with "
                             "different resolvers (%s and %s at %s): capture each cluster on its own",
                             resolver, pi.resolver, pc.peer.addr);
        snprintf(resolver, sizeof resolver, "%s", pi.resolver);
        snprintf(hosts[n], sizeof hosts[n], "%s", pi.host_id);
        hp[n] = hosts[n];
        n++;
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

/* s as a quoted JSON string in out (cut short, still quoted, when it does
 * not fit; the names written are far shorter than the buffers). */
const char *profile_json_quote(const char *s, char *out, size_t n)
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
