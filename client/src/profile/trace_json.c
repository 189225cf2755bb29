/* The trace file (tpu_profile_write): the capture as Chrome's trace-event
 * JSON, gzip'd, in TensorBoard's profile plugin layout
 * (LOGDIR/plugins/profile/RUN/HOST.trace.json.gz), one process per core and
 * one thread per kind of event, the collectives' sends tied to their receives
 * by flow arrows. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "capture.h"
#include "safefile.h"
#include "tfevents.h"

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

static void jstr(gzFile f, const char *s)
{
    char q[1024];
    gzputs(f, profile_json_quote(s, q, sizeof q));
}

/* microseconds since the capture's start, with ns precision */
static double us(const tpu_profile *p, int64_t t)
{
    return (double)(t - p->start) / 1e3;
}

static const char *const mm_ops[] = {"forward", "weight gradient", "input gradient"};

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
    char name[96], ln[48];
    const char *cat = "step";
    switch (e->kind) {
    case TK(STEP): snprintf(name, sizeof name, "step %" PRIu64, e->step); break;
    case TK(INFEED_WAIT): snprintf(name, sizeof name, "infeed wait"); cat = "input"; break;
    case TK(OPTIMIZER): snprintf(name, sizeof name, "optimizer"); cat = "optimizer"; break;
    case TK(FORWARD):
        snprintf(name, sizeof name, "%s forward", profile_layer_name(p, e->layer, ln, sizeof ln));
        cat = "compute"; break;
    case TK(BACKWARD):
        snprintf(name, sizeof name, "%s backward", profile_layer_name(p, e->layer, ln, sizeof ln));
        cat = "compute"; break;
    case TK(MATMUL):
        snprintf(name, sizeof name, "%s matmul %" PRIu64 "x%" PRIu64 "x%" PRIu64,
                 profile_layer_name(p, e->layer, ln, sizeof ln), e->m, e->k, e->n);
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
