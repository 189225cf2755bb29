/* The daemons' Prometheus metrics and health checks (--metrics-port,
 * /metrics, /healthz, --probe) on real daemons on loopback: what an operator
 * who scrapes them, or a container health check, relies on.
 *
 *  - every scrape parses strictly as the text format (each sample has its
 *    family's TYPE, values are numbers, counters end in _total, families are
 *    not interleaved, histogram buckets are cumulative and end with +Inf equal
 *    to _count);
 *  - the numbers move as they should before, during and after a short
 *    training run: steps, their histogram and the bytes all-reduced grow
 *    together, HBM is in use and within capacity, the cores by state add up
 *    to the registered cores, the epoch goes up by one with an initialize,
 *    heartbeats keep coming;
 *  - bad input on the metrics port (garbage, an oversize head, a slow client,
 *    too many connections, unknown paths, other methods, a body) gets the
 *    right status or a close, and the daemons keep training;
 *  - --probe (liveness, /healthz) exits 0 while the daemon's loop answers,
 *    registered or not, 1 when nothing listens, 2 without a metrics port;
 *    --probe-ready (/readyz) exits 1 while a worker is not registered or its
 *    resolver does not answer; a taken metrics port stops the daemon. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "cluster.h"
#include "raw.h"

#define HB_MS 200
#define DIM 32
#define CLASSES 4
#define ROWS 256
#define BATCH 64 /* 4 steps per epoch */


QUIET_WARNINGS()

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- HTTP by hand ---- */

typedef struct answer {
    int status;     /* 0: no status line */
    int closed;     /* the server closed the connection */
    char head[4096];
    char *body;     /* into raw */
    size_t blen;
    char raw[1 << 17];
    size_t len;
} answer;

/* Reads until the server closes or timeout_ms passes; parses what came. */
static void read_answer(int fd, int timeout_ms, answer *a)
{
    int64_t end = cl_now_ms() + timeout_ms;
    a->len = 0;
    a->closed = 0;
    a->status = 0;
    a->body = NULL;
    a->blen = 0;
    a->head[0] = '\0';
    while (cl_now_ms() < end && a->len < sizeof a->raw - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, (int)(end - cl_now_ms()));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            break;
        ssize_t n = read(fd, a->raw + a->len, sizeof a->raw - 1 - a->len);
        if (n <= 0) {
            a->closed = 1;
            break;
        }
        a->len += (size_t)n;
    }
    a->raw[a->len] = '\0';
    char *sep = strstr(a->raw, "\r\n\r\n");
    if (sep) {
        size_t hl = (size_t)(sep - a->raw);
        if (hl >= sizeof a->head)
            hl = sizeof a->head - 1;
        memcpy(a->head, a->raw, hl);
        a->head[hl] = '\0';
        a->body = sep + 4;
        a->blen = a->len - (size_t)(a->body - a->raw);
    }
    int st;
    if (sscanf(a->raw, "HTTP/1.1 %3d ", &st) == 1)
        a->status = st;
}

static int http_connect(int port)
{
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    int fd = tcp_connect_addr(hp, 2000);
    cr_assert_geq(fd, 0, "cannot connect to the metrics port %d", port);
    return fd;
}

/* Sends req (len bytes; a send cut short by the server is fine) and reads the answer. */
static void http_raw(int port, const void *req, size_t len, int timeout_ms, answer *a)
{
    int fd = http_connect(port);
    (void)tcp_send_all(fd, req, len);
    read_answer(fd, timeout_ms, a);
    close(fd);
}

static answer *http_get(int port, const char *method, const char *path)
{
    static answer a;
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUser-Agent: it_metrics\r\n\r\n",
                     method, path, port);
    http_raw(port, req, (size_t)n, 5000, &a);
    return &a;
}

/* The value of header name in a's head, or "". */
static const char *header(const answer *a, const char *name)
{
    static char v[256];
    const char *p = a->head;
    size_t n = strlen(name);
    v[0] = '\0';
    while ((p = strstr(p, "\r\n")) != NULL) {
        p += 2;
        if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *s = p + n + 1;
            while (*s == ' ')
                s++;
            size_t k = strcspn(s, "\r\n");
            if (k >= sizeof v)
                k = sizeof v - 1;
            memcpy(v, s, k);
            v[k] = '\0';
            break;
        }
    }
    return v;
}

/* ---- the text format, strictly ---- */

#define MAX_SAMPLES 512
#define MAX_FAMILIES 64

typedef struct sample {
    char name[128];
    char labels[384]; /* as written between the braces */
    char key[384];    /* the labels without le, for grouping histogram series */
    char le[32];
    double v;
} sample;

typedef struct scrape {
    sample s[MAX_SAMPLES];
    size_t n;
    struct {
        char name[128];
        char type[16];
        int help, samples, done;
    } fam[MAX_FAMILIES];
    size_t nfam;
} scrape;

static int metric_name_ok(const char *s, size_t n)
{
    if (!n || !(s[0] == '_' || s[0] == ':' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(s[i] == '_' || s[i] == ':' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9')))
            return 0;
    return 1;
}

static int family_index(scrape *sc, const char *name)
{
    for (size_t i = 0; i < sc->nfam; i++)
        if (!strcmp(sc->fam[i].name, name))
            return (int)i;
    return -1;
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n > k && !strcmp(s + n - k, suf);
}

/* Parses `{...}` at *pp into sm (labels, key, le); advances past it. */
static void parse_labels(const char **pp, sample *sm, int line)
{
    const char *p = *pp + 1;
    size_t kl = 0;
    char *lab = sm->labels;
    size_t ll = 0;
    sm->le[0] = '\0';
    sm->key[0] = '\0';
    for (int first = 1;; first = 0) {
        if (*p == '}' && first) {
            p++;
            break;
        }
        const char *n0 = p;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (p > n0 && *p >= '0' && *p <= '9'))
            p++;
        cr_assert(p > n0 && *p == '=' && p[1] == '"', "line %d: bad label name", line);
        size_t nl = (size_t)(p - n0);
        char lname[64];
        cr_assert_lt(nl, sizeof lname, "line %d: label name too long", line);
        memcpy(lname, n0, nl);
        lname[nl] = '\0';
        p += 2;
        char val[256];
        size_t vl = 0;
        while (*p != '"') {
            cr_assert(*p && *p != '\n', "line %d: unterminated label value", line);
            if (*p == '\\') {
                cr_assert(p[1] == '\\' || p[1] == '"' || p[1] == 'n', "line %d: bad escape in a label value", line);
                p++;
            }
            cr_assert_lt(vl, sizeof val - 1);
            val[vl++] = *p++;
        }
        val[vl] = '\0';
        p++;
        ll += (size_t)snprintf(lab + ll, sizeof sm->labels - ll, "%s%s=\"%s\"", ll ? "," : "", lname, val);
        if (!strcmp(lname, "le"))
            snprintf(sm->le, sizeof sm->le, "%.31s", val);
        else
            kl += (size_t)snprintf(sm->key + kl, sizeof sm->key - kl, "%s%s=\"%s\"", kl ? "," : "", lname, val);
        if (*p == ',') {
            p++;
            continue;
        }
        cr_assert_eq(*p, '}', "line %d: labels not closed", line);
        p++;
        break;
    }
    *pp = p;
}

static double parse_value(const char *s, int line)
{
    char *end;
    double v;
    if (!strcmp(s, "+Inf"))
        return INFINITY;
    if (!strcmp(s, "-Inf"))
        return -INFINITY;
    if (!strcmp(s, "NaN"))
        return NAN;
    errno = 0;
    v = strtod(s, &end);
    cr_assert(end != s && *end == '\0' && errno == 0 && isfinite(v), "line %d: value '%s' is not a number", line, s);
    return v;
}

static void check_histograms(scrape *sc)
{
    for (size_t f = 0; f < sc->nfam; f++) {
        if (strcmp(sc->fam[f].type, "histogram") != 0)
            continue;
        const char *fn = sc->fam[f].name;
        char bucket[160], sum[160], count[160];
        snprintf(bucket, sizeof bucket, "%s_bucket", fn);
        snprintf(sum, sizeof sum, "%s_sum", fn);
        snprintf(count, sizeof count, "%s_count", fn);
        int series = 0;
        for (size_t i = 0; i < sc->n; i++) {
            if (strcmp(sc->s[i].name, bucket) != 0 || strcmp(sc->s[i].le, "+Inf") != 0)
                continue;
            const char *key = sc->s[i].key;
            double prev_le = -INFINITY, prev = 0, inf = -1, cnt = -1;
            int nb = 0, has_sum = 0;
            series++;
            for (size_t k = 0; k < sc->n; k++) {
                const sample *s = &sc->s[k];
                if (strcmp(s->key, key) != 0)
                    continue;
                if (!strcmp(s->name, bucket)) {
                    double le = !strcmp(s->le, "+Inf") ? INFINITY : parse_value(s->le, 0);
                    cr_assert_gt(le, prev_le, "%s{%s}: le %s does not increase", bucket, key, s->le);
                    cr_assert_geq(s->v, prev, "%s{%s}: bucket le=%s (%g) below the one before (%g): not cumulative",
                                  bucket, key, s->le, s->v, prev);
                    cr_assert_lt(inf, 0, "%s{%s}: bucket after +Inf", bucket, key);
                    cr_assert_eq(s->v, floor(s->v), "%s: bucket count %g is not an integer", bucket, s->v);
                    prev_le = le;
                    prev = s->v;
                    nb++;
                    if (isinf(le))
                        inf = s->v;
                } else if (!strcmp(s->name, sum)) {
                    has_sum = 1;
                    cr_assert_geq(s->v, 0);
                } else if (!strcmp(s->name, count)) {
                    cnt = s->v;
                }
            }
            cr_assert_geq(nb, 2, "%s{%s}: %d buckets", fn, key, nb);
            cr_assert(has_sum, "%s{%s}: no _sum", fn, key);
            cr_assert_eq(inf, cnt, "%s{%s}: le=\"+Inf\" is %g, _count %g", fn, key, inf, cnt);
        }
        cr_assert_gt(series, 0, "histogram %s has no series ending in le=\"+Inf\"", fn);
    }
}

/* Parses a /metrics body; fails the test on anything the format does not allow. */
static void parse_scrape(const char *text, size_t len, scrape *sc)
{
    const char *p = text, *end = text + len;
    int line = 0, cur = -1;
    memset(sc, 0, sizeof *sc);
    cr_assert(len > 0 && text[len - 1] == '\n', "the scrape does not end with a newline");
    cr_assert(memchr(text, '\0', len) == NULL, "NUL byte in the scrape");
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        char buf[1024];
        size_t n = (size_t)(nl - p);
        line++;
        cr_assert_lt(n, sizeof buf, "line %d is too long", line);
        memcpy(buf, p, n);
        buf[n] = '\0';
        p = nl + 1;
        cr_assert(n > 0, "line %d is empty", line);
        if (buf[0] == '#') {
            char kw[8], name[128];
            int off = 0;
            if (sscanf(buf, "# %7s %127s %n", kw, name, &off) >= 2 && (!strcmp(kw, "HELP") || !strcmp(kw, "TYPE"))) {
                cr_assert(metric_name_ok(name, strlen(name)), "line %d: bad metric name '%s'", line, name);
                int f = family_index(sc, name);
                if (f < 0) {
                    cr_assert_lt(sc->nfam, MAX_FAMILIES);
                    f = (int)sc->nfam++;
                    snprintf(sc->fam[f].name, sizeof sc->fam[f].name, "%s", name);
                }
                if (cur >= 0 && cur != f)
                    sc->fam[cur].done = 1;
                cr_assert(!sc->fam[f].done, "line %d: family %s comes back after another one", line, name);
                cur = f;
                if (!strcmp(kw, "HELP")) {
                    cr_assert(!sc->fam[f].help, "line %d: second HELP for %s", line, name);
                    cr_assert(off > 0 && buf[off], "line %d: HELP of %s has no text", line, name);
                    sc->fam[f].help = 1;
                } else {
                    const char *t = buf + off;
                    cr_assert(!sc->fam[f].type[0], "line %d: second TYPE for %s", line, name);
                    cr_assert(!sc->fam[f].samples, "line %d: TYPE of %s after its samples", line, name);
                    cr_assert(!strcmp(t, "counter") || !strcmp(t, "gauge") || !strcmp(t, "histogram") ||
                                  !strcmp(t, "summary") || !strcmp(t, "untyped"),
                              "line %d: unknown type '%s'", line, t);
                    snprintf(sc->fam[f].type, sizeof sc->fam[f].type, "%s", t);
                }
            }
            continue; /* other comments are allowed */
        }
        cr_assert_lt(sc->n, MAX_SAMPLES, "too many samples");
        sample *sm = &sc->s[sc->n++];
        const char *q = buf;
        while (*q && *q != '{' && *q != ' ')
            q++;
        cr_assert(metric_name_ok(buf, (size_t)(q - buf)) && (size_t)(q - buf) < sizeof sm->name,
                  "line %d: bad metric name in '%s'", line, buf);
        memcpy(sm->name, buf, (size_t)(q - buf));
        sm->name[q - buf] = '\0';
        if (*q == '{')
            parse_labels(&q, sm, line);
        cr_assert_eq(*q, ' ', "line %d: no value after %s", line, sm->name);
        q++;
        char val[64];
        size_t vl = strcspn(q, " ");
        cr_assert(vl > 0 && vl < sizeof val, "line %d: bad value", line);
        memcpy(val, q, vl);
        val[vl] = '\0';
        sm->v = parse_value(val, line);
        if (q[vl] == ' ') { /* a timestamp: an integer */
            char *e;
            strtoll(q + vl + 1, &e, 10);
            cr_assert(*e == '\0' && e != q + vl + 1, "line %d: bad timestamp", line);
        }
        /* its family: the name itself, or a histogram's _bucket/_sum/_count */
        int f = family_index(sc, sm->name);
        const char *type = f >= 0 ? sc->fam[f].type : "";
        if (f < 0 || !strcmp(type, "histogram")) {
            static const char *const sufs[] = {"_bucket", "_sum", "_count"};
            f = -1;
            for (int k = 0; k < 3 && f < 0; k++)
                if (ends_with(sm->name, sufs[k])) {
                    char base[128];
                    snprintf(base, sizeof base, "%.*s", (int)(strlen(sm->name) - strlen(sufs[k])), sm->name);
                    int g = family_index(sc, base);
                    if (g >= 0 && !strcmp(sc->fam[g].type, "histogram")) {
                        f = g;
                        if (k == 0)
                            cr_assert(sm->le[0], "line %d: %s without le", line, sm->name);
                    }
                }
            type = f >= 0 ? "histogram" : "";
        }
        cr_assert(f >= 0 && sc->fam[f].type[0], "line %d: sample %s has no TYPE line", line, sm->name);
        cr_assert_eq(f, cur, "line %d: sample %s is outside its family's block", line, sm->name);
        sc->fam[f].samples++;
        if (!strcmp(type, "counter")) {
            cr_assert(ends_with(sm->name, "_total"), "line %d: counter %s does not end in _total", line, sm->name);
            cr_assert_geq(sm->v, 0, "line %d: counter %s is negative", line, sm->name);
        }
        for (size_t i = 0; i + 1 < sc->n; i++)
            cr_assert(strcmp(sc->s[i].name, sm->name) || strcmp(sc->s[i].labels, sm->labels),
                      "line %d: sample %s{%s} twice", line, sm->name, sm->labels);
    }
    for (size_t f = 0; f < sc->nfam; f++) {
        cr_assert(sc->fam[f].help, "%s has no HELP", sc->fam[f].name);
        cr_assert(sc->fam[f].type[0], "%s has no TYPE", sc->fam[f].name);
    }
    check_histograms(sc);
}

/* The value of the one sample named name whose labels contain has (NULL: any). */
static double mval(const scrape *sc, const char *name, const char *has)
{
    int found = -1;
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->s[i].name, name) && (!has || strstr(sc->s[i].labels, has))) {
            cr_assert_lt(found, 0, "more than one sample %s with %s", name, has ? has : "any labels");
            found = (int)i;
        }
    cr_assert_geq(found, 0, "no sample %s%s%s", name, has ? " with " : "", has ? has : "");
    return sc->s[found].v;
}

static scrape *scrape_port(int port)
{
    scrape *sc = malloc(sizeof *sc);
    answer *a = http_get(port, "GET", "/metrics");
    cr_assert_eq(a->status, 200, "GET /metrics on port %d: status %d (%.200s)", port, a->status, a->raw);
    cr_assert_str_eq(header(a, "Content-Type"), "text/plain; version=0.0.4");
    cr_assert(a->closed, "the server did not close after the answer");
    cr_assert_eq(strtoull(header(a, "Content-Length"), NULL, 10), (unsigned long long)a->blen);
    parse_scrape(a->body, a->blen, sc);
    return sc;
}

/* ---- a cluster whose daemons serve metrics ---- */

typedef struct mcluster {
    cluster *c;
    int rport;            /* the resolver's metrics port */
    int wport[8];         /* each worker's */
    int n;
    tpu_resolver *r;
    tpu_cluster *cc;
} mcluster;

static mcluster *mc_start(int n)
{
    static char rp[16];
    mcluster *m = calloc(1, sizeof *m);
    cluster_opts o;
    memset(&o, 0, sizeof o);
    m->rport = cl_free_port();
    snprintf(rp, sizeof rp, "%d", m->rport);
    const char *rargs[] = {"--metrics-port", rp, NULL};
    o.resolver_args = rargs;
    o.heartbeat_ms = HB_MS;
    o.no_wait = 1;
    m->c = cluster_start(&o);
    m->n = n;
    for (int i = 0; i < n; i++) {
        char wp[16];
        m->wport[i] = cl_free_port();
        snprintf(wp, sizeof wp, "%d", m->wport[i]);
        const char *wargs[] = {"--metrics-port", wp, NULL};
        cluster_add_worker(m->c, "h0", i, wargs);
    }
    cr_assert(cluster_wait_count(m->c, CL_ALIVE, n, 15000), "only %d of %d workers registered",
              cluster_count(m->c, CL_ALIVE), n);
    cr_assert_eq(cluster_connect(m->c, &m->r, &m->cc), TPU_OK, "connect: %s", tpu_last_error());
    return m;
}

static void mc_init(mcluster *m)
{
    tpu_topology *tp;
    tpu_init_options io = {.expect = (uint32_t)m->n, .timeout_ms = 15000, .allow_partial = 0};
    CALL_OK(tpu_initialize_system(m->cc, &io, &tp));
    cr_assert_eq(tpu_topology_num_replicas(tp), m->n);
    tpu_topology_free(tp);
}

static void mc_free(mcluster *m)
{
    tpu_cluster_free(m->cc);
    tpu_resolver_free(m->r);
    cluster_free(m->c);
    free(m);
}

/* ---- training ---- */

typedef struct during {
    mcluster *m;
    int batches;
    int scraped;
    double steps[8];
} during;

/* At the second batch of the second epoch: every worker's numbers mid-run. */
static tpu_status on_batch(tpu_model *mdl, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    during *d = user;
    (void)mdl, (void)l;
    d->batches++;
    if (epoch != 1 || batch != 1)
        return TPU_OK;
    for (int i = 0; i < d->m->n; i++) {
        scrape *sc = scrape_port(d->m->wport[i]);
        double steps = mval(sc, "tpuemu_worker_train_steps_total", NULL);
        double used = mval(sc, "tpuemu_worker_hbm_used_bytes", NULL);
        double cap = mval(sc, "tpuemu_worker_hbm_capacity_bytes", NULL);
        double peak = mval(sc, "tpuemu_worker_hbm_peak_bytes", NULL);
        cr_assert_geq(steps, 4, "worker %d: %g steps after an epoch", i, steps);
        cr_assert_eq(mval(sc, "tpuemu_worker_step_seconds_count", NULL), steps);
        cr_assert_gt(mval(sc, "tpuemu_worker_allreduce_bytes_total", NULL), 0);
        cr_assert_gt(used, 0, "worker %d: no HBM in use while training", i);
        cr_assert_leq(used, cap);
        cr_assert_geq(peak, used);
        d->steps[i] = steps;
        free(sc);
    }
    d->scraped = 1;
    return TPU_OK;
}

/* ROWS rows, BATCH per step, `epochs` epochs of a Dense(64, relu) ->
 * Dense(4, softmax) model; returns the model's parameter count. */
static size_t train(mcluster *m, int epochs, during *d)
{
    static float x[ROWS * DIM];
    static int32_t y[ROWS];
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *mdl;
    tpu_compile_options co;
    tpu_fit_options fo;
    tpu_history *h;
    tpu_callback cb;
    size_t np;

    for (size_t i = 0; i < ROWS; i++) {
        y[i] = (int32_t)(i % CLASSES);
        for (size_t j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((i * 7 + j * 13) % 17) / 17.0f + (float)y[i] * (j == (size_t)y[i]);
    }
    CALL_OK(tpu_strategy_new(m->cc, &s));
    CALL_OK(tpu_dataset_from_tensor_slices(x, ROWS, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, BATCH, 1));
    CALL_OK(tpu_model_new(s, DIM, &mdl));
    CALL_OK(tpu_model_add_dense(mdl, 64, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(mdl, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(mdl, 7));
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f);
    co.batch_size = BATCH;
    CALL_OK(tpu_model_compile(mdl, &co));
    memset(&fo, 0, sizeof fo);
    memset(&cb, 0, sizeof cb);
    fo.epochs = epochs;
    if (d) {
        cb.on_batch_end = on_batch;
        cb.user = d;
        fo.callbacks = &cb;
        fo.num_callbacks = 1;
    }
    CALL_OK(tpu_model_fit(mdl, ds, &fo, &h));
    cr_assert_eq(tpu_model_step(mdl), (uint64_t)(epochs * ROWS / BATCH));
    np = tpu_model_num_params(mdl);
    tpu_history_free(h);
    tpu_model_free(mdl);
    tpu_dataset_free(ds);
    tpu_strategy_free(s);
    return np;
}

/* ---- 1: the numbers ---- */

struct hb_arg {
    int port;
    const char *name;
    double above;
};

static double scraped(const struct hb_arg *a)
{
    scrape *sc = scrape_port(a->port);
    double v = mval(sc, a->name, NULL);
    free(sc);
    return v;
}

static int counter_above(cluster *c, void *arg)
{
    (void)c;
    return scraped(arg) > ((struct hb_arg *)arg)->above;
}

static int gauge_is(cluster *c, void *arg)
{
    (void)c;
    return scraped(arg) == ((struct hb_arg *)arg)->above;
}

Test(metrics, numbers_follow_a_training_run, .timeout = 120)
{
    mcluster *m = mc_start(2);
    scrape *r0, *r1, *w;

    /* the resolver connects to each core's control port when it registers,
     * not at the first initialize */
    struct hb_arg links = {m->rport, "tpuemu_resolver_core_links_open", 2};
    cr_assert(cluster_wait_until(gauge_is, m->c, &links, 10000 * cl_time_scale()),
              "the resolver did not open a control connection to each registered core");

    /* before the system exists */
    r0 = scrape_port(m->rport);
    cr_assert_eq(mval(r0, "tpuemu_resolver_system_initialized", NULL), 0);
    cr_assert_eq(mval(r0, "tpuemu_resolver_system_epoch", NULL), 0);
    cr_assert_eq(mval(r0, "tpuemu_resolver_cores", "state=\"IDLE\""), 2);
    cr_assert_eq(mval(r0, "tpuemu_resolver_cores", "state=\"READY\""), 0);
    cr_assert_eq(mval(r0, "tpuemu_resolver_cores", "state=\"DEAD\""), 0);
    cr_assert_eq(mval(r0, "tpuemu_resolver_registrations_total", NULL), 2);
    cr_assert_eq(mval(r0, "tpuemu_resolver_max_cores", NULL), 1024);
    cr_assert_geq(mval(r0, "tpuemu_resolver_heartbeats_received_total", NULL), 2);
    cr_assert_eq(mval(r0, "tpuemu_build_info", "daemon=\"resolver\""), 1);
    for (int i = 0; i < m->n; i++) {
        char core[32];
        snprintf(core, sizeof core, "core=\"%d\"", i);
        w = scrape_port(m->wport[i]);
        cr_assert_eq(mval(w, "tpuemu_worker_train_steps_total", core), 0);
        cr_assert_eq(mval(w, "tpuemu_worker_step_seconds_count", core), 0);
        cr_assert_eq(mval(w, "tpuemu_worker_allreduce_bytes_total", core), 0);
        cr_assert_eq(mval(w, "tpuemu_worker_hbm_used_bytes", NULL), 0);
        cr_assert_eq(mval(w, "tpuemu_worker_hbm_capacity_bytes", "host=\"h0\""), 16.0 * (1ull << 30)); /* v3 */
        cr_assert_eq(mval(w, "tpuemu_worker_system_epoch", NULL), 0);
        cr_assert_eq(mval(w, "tpuemu_worker_replica_id", NULL), -1);
        cr_assert_eq(mval(w, "tpuemu_worker_registered", NULL), 1);
        cr_assert_geq(mval(w, "tpuemu_worker_heartbeats_sent_total", NULL), 1);
        free(w);
    }
    /* heartbeats keep coming, on both sides */
    struct hb_arg ra = {m->rport, "tpuemu_resolver_heartbeats_received_total",
                        mval(r0, "tpuemu_resolver_heartbeats_received_total", NULL) + 2};
    cr_assert(cluster_wait_until(counter_above, m->c, &ra, 5000), "the resolver's heartbeat count did not grow");
    w = scrape_port(m->wport[0]);
    struct hb_arg wa = {m->wport[0], "tpuemu_worker_heartbeats_acked_total",
                        mval(w, "tpuemu_worker_heartbeats_acked_total", NULL) + 1};
    free(w);
    cr_assert(cluster_wait_until(counter_above, m->c, &wa, 5000), "the worker's heartbeat count did not grow");

    /* initialize: a new epoch, every core READY */
    mc_init(m);
    r1 = scrape_port(m->rport);
    cr_assert_eq(mval(r1, "tpuemu_resolver_system_epoch", NULL), mval(r0, "tpuemu_resolver_system_epoch", NULL) + 1);
    cr_assert_eq(mval(r1, "tpuemu_resolver_system_initialized", NULL), 1);
    cr_assert_eq(mval(r1, "tpuemu_resolver_core_links_open", NULL), 2, "the initialize did not reuse the connections");
    cr_assert_eq(mval(r1, "tpuemu_resolver_cores", "state=\"READY\""), 2);
    tpu_cluster_spec *spec = cluster_spec(m->c);
    cr_assert_not_null(spec);
    double sum = mval(r1, "tpuemu_resolver_cores", "state=\"READY\"") + mval(r1, "tpuemu_resolver_cores", "state=\"IDLE\"") +
                 mval(r1, "tpuemu_resolver_cores", "state=\"DEAD\"");
    cr_assert_eq(sum, (double)tpu_cluster_spec_num_cores(spec), "cores by state add up to %g, %zu are registered", sum,
                 tpu_cluster_spec_num_cores(spec));
    tpu_cluster_spec_free(spec);
    for (int i = 0; i < m->n; i++) {
        w = scrape_port(m->wport[i]);
        cr_assert_eq(mval(w, "tpuemu_worker_system_epoch", NULL), mval(r1, "tpuemu_resolver_system_epoch", NULL));
        cr_assert_geq(mval(w, "tpuemu_worker_replica_id", NULL), 0);
        free(w);
    }

    /* a training run: 3 epochs of 4 steps, scraped in the middle and after */
    during d = {m, 0, 0, {0}};
    size_t np = train(m, 3, &d);
    cr_assert(d.scraped, "the mid-run scrape did not happen (%d batches)", d.batches);
    for (int i = 0; i < m->n; i++) {
        w = scrape_port(m->wport[i]);
        double steps = mval(w, "tpuemu_worker_train_steps_total", NULL);
        cr_assert_eq(steps, 12, "worker %d ran %g steps, the client 12", i, steps);
        cr_assert_gt(steps, d.steps[i], "steps did not grow after the mid-run scrape");
        cr_assert_eq(mval(w, "tpuemu_worker_step_seconds_count", NULL), steps);
        double secs = mval(w, "tpuemu_worker_step_seconds_sum", NULL);
        cr_assert(secs > 0 && secs < 60, "worker %d: steps took %g s in all", i, secs);
        cr_assert_eq(mval(w, "tpuemu_worker_allreduce_bytes_total", NULL), steps * (double)np * 4,
                     "worker %d: all-reduced %g bytes, %g steps of %zu f32 gradients", i,
                     mval(w, "tpuemu_worker_allreduce_bytes_total", NULL), steps, np);
        cr_assert_eq(mval(w, "tpuemu_worker_collectives_total", "kind=\"all-reduce\""), steps);
        cr_assert_eq(mval(w, "tpuemu_worker_collectives_failed_total", NULL), 0);
        double used = mval(w, "tpuemu_worker_hbm_used_bytes", NULL);
        cr_assert_gt(used, 0, "the compiled model holds HBM");
        cr_assert_leq(used, mval(w, "tpuemu_worker_hbm_capacity_bytes", NULL));
        cr_assert_geq(mval(w, "tpuemu_worker_hbm_peak_bytes", NULL), used);
        free(w);
    }
    free(r0);
    free(r1);
    mc_free(m);
}

/* ---- 2: bad input ---- */

static void expect_status(int port, const char *what, const void *req, size_t len, int status)
{
    answer *a = malloc(sizeof *a);
    http_raw(port, req, len, 8000, a);
    cr_assert_eq(a->status, status, "%s: status %d, expected %d (%.200s)", what, a->status, status, a->raw);
    cr_assert(a->closed, "%s: the connection was not closed", what);
    free(a);
}

#define REQ(s) s, sizeof s - 1

/* 1 if p's log sums up refusal lines it left out (kind="http request
 * refused" suppressed=N, N > 0). */
static int log_suppressed(const cl_proc *p)
{
    static const char key[] = "kind=\"http request refused\" suppressed=";
    char *log = cl_read_file(p->log);
    int found = 0;
    for (const char *q = log; (q = strstr(q, key)) != NULL && !found; q++)
        found = q[sizeof key - 1] >= '1' && q[sizeof key - 1] <= '9';
    free(log);
    return found;
}

Test(metrics, bad_input_refused_and_training_goes_on, .timeout = 120)
{
    mcluster *m = mc_start(2);
    int port = m->wport[0];
    answer *buf = malloc(sizeof *buf), *a;
    mc_init(m);

    expect_status(port, "garbage", REQ("\x16\x03\x01\x02\x00garbage\r\n\r\n"), 400);
    expect_status(port, "NUL byte", REQ("GET /metrics\0 HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(port, "no Host", REQ("GET /metrics HTTP/1.1\r\n\r\n"), 400);
    expect_status(port, "two Hosts", REQ("GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    expect_status(port, "folded header", REQ("GET /metrics HTTP/1.1\r\nHost: a\r\n x\r\n\r\n"), 400);
    expect_status(port, "absolute target", REQ("GET http://x/metrics HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(port, "HTTP/2.0", REQ("GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
    expect_status(port, "bad version", REQ("GET /metrics HTTX/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(port, "unknown path", REQ("GET /secret HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    expect_status(port, "POST", REQ("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), 405);
    expect_status(port, "DELETE", REQ("DELETE /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
    expect_status(port, "a body", REQ("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"), 413);
    expect_status(port, "chunked body", REQ("GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"),
                  413);
    expect_status(port, "bad length", REQ("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"), 400);
    expect_status(port, "HTTP/1.0 without Host", REQ("GET /healthz HTTP/1.0\r\n\r\n"), 200);
    expect_status(port, "bare LF lines", REQ("GET /healthz HTTP/1.1\nHost: x\n\n"), 200);
    expect_status(port, "a query string", REQ("GET /metrics?name[]=x HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
    a = http_get(port, "POST", "/metrics");
    cr_assert_str_eq(header(a, "Allow"), "GET, HEAD");
    /* HEAD: the headers of a GET, no body */
    a = http_get(port, "HEAD", "/metrics");
    cr_assert_eq(a->status, 200);
    cr_assert_gt(strtoull(header(a, "Content-Length"), NULL, 10), 100);
    cr_assert_eq(a->blen, 0u, "HEAD answered with a body");
    a = http_get(m->rport, "GET", "/healthz");
    cr_assert_eq(a->status, 200);
    cr_assert_str_eq(a->body, "ok\n");

    /* oversize head: a 16 KiB header, and 9 KiB without a line end */
    {
        size_t n = 16384 + 64;
        char *big = malloc(n);
        int k = snprintf(big, n, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
        memset(big + k, 'a', n - (size_t)k - 4);
        memcpy(big + n - 4, "\r\n\r\n", 4);
        expect_status(port, "16 KiB header", big, n, 431);
        memset(big, 'G', 9216);
        expect_status(port, "9 KiB request line", big, 9216, 431);
        free(big);
    }
    /* a request sent a few bytes at a time, slowly but within the deadline, is served */
    {
        static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        int fd = http_connect(port);
        for (size_t i = 0; i < sizeof req - 1; i += 4) {
            size_t k = sizeof req - 1 - i < 4 ? sizeof req - 1 - i : 4;
            cr_assert_eq(tcp_send_all(fd, req + i, k), 0);
            nap_ms(20);
        }
        read_answer(fd, 5000, buf);
        a = buf;
        close(fd);
        cr_assert_eq(a->status, 200, "a slow but complete request: %d", a->status);
    }
    /* a slow client that never finishes its request gets 408 after 5 s, one
     * that sends nothing is closed; meanwhile others are served */
    int slow = http_connect(port), mute = http_connect(port);
    int64_t t0 = cl_now_ms();
    cr_assert_eq(tcp_send_all(slow, REQ("GET /metrics HTTP/1.1\r\nHost: x\r\n")), 0);
    scrape *sc = scrape_port(port);
    free(sc);
    read_answer(slow, 9000, a = buf);
    int64_t took = cl_now_ms() - t0;
    cr_assert_eq(a->status, 408, "a client that never finished: status %d after %lld ms", a->status, (long long)took);
    cr_assert(a->closed);
    cr_assert(took >= 4500 && took <= 8000, "408 after %lld ms, expected about 5000", (long long)took);
    read_answer(mute, 4000, a = buf);
    cr_assert(a->closed && a->len == 0, "a client that sent nothing: closed %d, %zu bytes", a->closed, a->len);
    close(slow);
    close(mute);

    /* too many connections: past the bound they are answered 503 and closed;
     * the held ones do not stop the core from training */
    enum { HELD = 100 };
    int fds[HELD], refused = 0;
    struct pollfd pf[HELD];
    for (int i = 0; i < HELD; i++)
        fds[i] = http_connect(port);
    /* the refused ones are answered at once, however slow the machine is to
     * get to them; the held ones hear nothing until the server's idle
     * deadline (5 s): wait for the refusals, up to 3 s */
    for (int64_t until = cl_now_ms() + 3000; refused < HELD - 64 && cl_now_ms() < until;) {
        int n = 0;
        for (int i = 0; i < HELD; i++)
            if (fds[i] >= 0)
                pf[n++] = (struct pollfd){fds[i], POLLIN, 0};
        if (poll(pf, (nfds_t)n, 50) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!pf[k].revents)
                continue;
            read_answer(pf[k].fd, 1000, a = buf);
            cr_assert(a->closed, "a connection answered %d and stayed open", a->status);
            cr_assert(a->status == 503 || a->len == 0, "a refused connection got %d", a->status);
            refused++;
            for (int i = 0; i < HELD; i++)
                if (fds[i] == pf[k].fd) {
                    close(fds[i]);
                    fds[i] = -1;
                }
        }
    }
    cr_assert_geq(refused, HELD - 64, "%d of %d connections refused, the bound is 64", refused, HELD);
    cr_assert_lt(refused, HELD, "every connection was refused");
    size_t np = train(m, 1, NULL);
    for (int i = 0; i < HELD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    /* the slots come back once the server sees the closes */
    int ok = 0;
    for (int tries = 0; tries < 100 && !ok; tries++) {
        a = http_get(port, "GET", "/healthz");
        ok = a->status == 200;
        if (!ok)
            nap_ms(20);
    }
    cr_assert(ok, "the metrics port did not recover after the connections closed: %d", a->status);
    sc = scrape_port(port);
    cr_assert_eq(mval(sc, "tpuemu_worker_train_steps_total", NULL), ROWS / BATCH);
    cr_assert_eq(mval(sc, "tpuemu_worker_allreduce_bytes_total", NULL), (double)(ROWS / BATCH) * (double)np * 4);
    free(sc);
    /* the resolver's port takes the same abuse */
    expect_status(m->rport, "garbage to the resolver", REQ("\xff\xfe\r\n\r\n"), 400);
    expect_status(m->rport, "unknown path on the resolver", REQ("GET /secret HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    /* and so do the console's routes */
    expect_status(m->rport, "a body to the console",
                  REQ("GET /api/cluster HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                      "\r\nabc"),
                  413);
    expect_status(m->rport, "POST to the console", REQ("POST /api/cluster HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
    expect_status(m->rport, "a bad since", REQ("GET /api/cluster?since=-1 HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(m->rport, "a huge since",
                  REQ("GET /api/cluster?since=123456789012345678901 HTTP/1.1\r\nHost: x"
                      "\r\n\r\n"),
                  400);
    expect_status(m->rport, "another query", REQ("GET /api/cluster?core=../../x HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(m->rport, "a query to the page", REQ("GET /?<script> HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    expect_status(m->rport, "two Authorizations",
                  REQ("GET /api/cluster HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\n"
                      "Authorization: b\r\n\r\n"),
                  400);
    expect_status(m->rport, "a path under the page",
                  REQ("GET /console.js/../../etc/passwd HTTP/1.1\r\nHost: x\r\n"
                      "\r\n"),
                  404);
    /* both still serve their real work, and logged the refusals */
    cr_assert(cluster_alive(&m->c->workers[0]) && cluster_alive(&m->c->resolver));
    cr_assert_eq(cluster_count(m->c, TPU_CORE_READY), 2);
    cr_assert(cl_log_contains(&m->c->workers[0], "msg=\"http request refused\""));
    cr_assert(cl_log_contains(&m->c->workers[0], "status=400"));
    cr_assert(cl_log_contains(&m->c->resolver, "status=404"));
    /* refusal lines are rate-limited per kind (10 in 10 s): the burst above
     * was counted, not logged, and summed up at the latest when the worker stops */
    cluster_signal_worker(m->c, 0, SIGTERM);
    cr_assert(cluster_wait_exit(&m->c->workers[0], 10000), "the worker did not stop on SIGTERM");
    cr_assert(log_suppressed(&m->c->workers[0]), "no line summed up the refusals left out");
    free(buf);
    mc_free(m);
}

/* ---- 3: --probe ---- */

static int probe_as(const char *bin, const char *flag, const char *const *args, const char *const *env,
                    run_result *r)
{
    const char *argv[16];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = flag;
    for (int i = 0; args && args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    run_cmd(argv, env, 10000, r);
    cr_assert(r->exited, "%s %s did not exit", bin, flag);
    /* its own deadline is 2 s; 3 s more for a loaded machine to start and reap it */
    cr_assert_lt(r->ms, 5000, "%s %s took %lld ms (the deadline is 2 s)", bin, flag, (long long)r->ms);
    return r->code;
}

static int probe(const char *bin, const char *const *args, const char *const *env, run_result *r)
{
    return probe_as(bin, "--probe", args, env, r);
}

static int probe_ready(const char *bin, const char *const *args, const char *const *env, run_result *r)
{
    return probe_as(bin, "--probe-ready", args, env, r);
}

Test(metrics, probe_exit_codes, .timeout = 90)
{
    mcluster *m = mc_start(1);
    run_result r;
    char wp[16], rp[16], free_port[16], env_port[48];
    snprintf(wp, sizeof wp, "%d", m->wport[0]);
    snprintf(rp, sizeof rp, "%d", m->rport);
    snprintf(free_port, sizeof free_port, "%d", cl_free_port());
    snprintf(env_port, sizeof env_port, "TPUEMU_METRICS_PORT=%d", m->wport[0]);

    /* healthy: 0, from the flag or the environment alone */
    cr_assert_eq(probe(CL_WORKER, (const char *const[]){"--metrics-port", wp, NULL}, NULL, &r), 0, "%s", r.err);
    cr_assert_str_eq(r.out, "ok\n");
    run_result_free(&r);
    cr_assert_eq(probe(CL_WORKER, NULL, (const char *const[]){env_port, NULL}, &r), 0, "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe_ready(CL_WORKER, (const char *const[]){"--metrics-port", wp, NULL}, NULL, &r), 0, "%s",
                 r.err);
    cr_assert_str_eq(r.out, "ok\n");
    run_result_free(&r);
    cr_assert_eq(probe_ready(CL_WORKER, NULL, (const char *const[]){env_port, NULL}, &r), 0, "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe_ready(CL_RESOLVER, (const char *const[]){"--listen", m->c->addr, "--metrics-port", rp, NULL},
                             NULL, &r), 0, "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe(CL_RESOLVER, (const char *const[]){"--listen", m->c->addr, "--metrics-port", rp, NULL}, NULL, &r),
                 0, "%s", r.err);
    run_result_free(&r);
    /* no metrics port: 2, saying so */
    cr_assert_eq(probe(CL_WORKER, NULL, NULL, &r), 2);
    cr_assert(strstr(r.err, "no metrics port"), "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe_ready(CL_WORKER, NULL, NULL, &r), 2);
    cr_assert(strstr(r.err, "--probe-ready: no metrics port"), "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe(CL_RESOLVER, (const char *const[]){"--listen", m->c->addr, NULL}, NULL, &r), 2);
    cr_assert(strstr(r.err, "no metrics port"), "%s", r.err);
    run_result_free(&r);
    /* nothing listens there: 1 */
    cr_assert_eq(probe(CL_WORKER, (const char *const[]){"--metrics-port", free_port, NULL}, NULL, &r), 1);
    cr_assert(strstr(r.err, "cannot connect"), "%s", r.err);
    run_result_free(&r);

    /* a worker whose resolver is not there: alive (0), not registered so not ready (1) */
    static cl_proc lone;
    char lp[16], nowhere[32];
    memset(&lone, 0, sizeof lone);
    snprintf(lp, sizeof lp, "%d", cl_free_port());
    snprintf(nowhere, sizeof nowhere, "127.0.0.1:%d", cl_free_port());
    cl_spawn(&lone, CL_WORKER, (const char *const[]){"--resolver", nowhere, "--host-id", "lone", "--core", "0",
                                                     "--metrics-port", lp, NULL},
             NULL);
    answer *a = NULL;
    for (int tries = 0; tries < 100; tries++) {
        int fd;
        char hp[32];
        snprintf(hp, sizeof hp, "127.0.0.1:%s", lp);
        if ((fd = tcp_connect_addr(hp, 500)) >= 0) {
            close(fd);
            a = http_get(atoi(lp), "GET", "/readyz");
            break;
        }
        nap_ms(50);
    }
    cr_assert_not_null(a, "the lone worker never served its metrics port");
    cr_assert_eq(a->status, 503);
    cr_assert(strstr(a->body, "not registered"), "%s", a->body);
    scrape *sc = scrape_port(atoi(lp));
    cr_assert_eq(mval(sc, "tpuemu_worker_registered", NULL), 0);
    free(sc);
    a = http_get(atoi(lp), "GET", "/healthz");
    cr_assert_eq(a->status, 200, "a worker without its resolver is alive: %d %s", a->status, a->body);
    cr_assert_eq(probe(CL_WORKER, (const char *const[]){"--metrics-port", lp, NULL}, NULL, &r), 0, "%s", r.err);
    run_result_free(&r);
    cr_assert_eq(probe_ready(CL_WORKER, (const char *const[]){"--metrics-port", lp, NULL}, NULL, &r), 1);
    cr_assert(strstr(r.err, "503") && strstr(r.err, "not registered"), "%s", r.err);
    run_result_free(&r);

    /* a metrics port that is taken stops the daemon at start (exit 1) */
    static cl_proc clash;
    memset(&clash, 0, sizeof clash);
    cl_spawn(&clash, CL_WORKER, (const char *const[]){"--resolver", m->c->addr, "--host-id", "clash", "--core", "0",
                                                      "--metrics-port", rp, NULL},
             NULL);
    cr_assert(cluster_wait_exit(&clash, 10000), "a worker given a taken metrics port kept running");
    cr_assert(WIFEXITED(clash.status) && WEXITSTATUS(clash.status) == 1, "exit status %d", clash.status);
    cr_assert(cl_log_contains(&clash, "address already in use"));

    /* the resolver goes away: its probe fails, and the worker's readiness does
     * once it misses its heartbeats, while the worker stays alive */
    kill(m->c->resolver.pid, SIGTERM);
    cr_assert(cluster_wait_exit(&m->c->resolver, 5000));
    cr_assert_eq(probe(CL_RESOLVER, (const char *const[]){"--listen", m->c->addr, "--metrics-port", rp, NULL}, NULL, &r),
                 1);
    run_result_free(&r);
    int code = 0;
    for (int tries = 0; tries < 20 && code != 1; tries++) {
        code = probe_ready(CL_WORKER, (const char *const[]){"--metrics-port", wp, NULL}, NULL, &r);
        if (code == 1)
            cr_assert(strstr(r.err, "has not answered"), "%s", r.err);
        run_result_free(&r);
        if (code != 1)
            nap_ms(200);
    }
    cr_assert_eq(code, 1, "the worker stayed ready without its resolver");
    cr_assert_eq(probe(CL_WORKER, (const char *const[]){"--metrics-port", wp, NULL}, NULL, &r), 0,
                 "a resolver outage failed the worker's liveness: %s", r.err);
    run_result_free(&r);
    mc_free(m);
}

/* ---- 4: the cluster console ---- */

/* The number after "key": at or after from in s; -1 if none. */
static long long json_num(const char *s, const char *key, const char **after)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    if (!p)
        return -1;
    if (after)
        *after = p + strlen(k);
    return strtoll(p + strlen(k), NULL, 10);
}

/* The JSON object of core host/core in the console's answer (a copy in buf). */
static const char *console_core(const char *body, const char *host, int core, char *buf, size_t n)
{
    char k[96];
    snprintf(k, sizeof k, "{\"host\":\"%s\",\"core\":%d,", host, core);
    const char *p = strstr(body, k), *e;
    if (!p || !(e = strchr(p, '}')))
        return NULL;
    snprintf(buf, n, "%.*s", (int)(e - p + 1), p);
    return buf;
}

Test(metrics, console_shows_the_cluster_and_its_events, .timeout = 120)
{
    mcluster *m = mc_start(2);
    answer *a;
    char c0[1024], c1[1024];
    mc_init(m);
    size_t np = train(m, 1, NULL);
    cr_assert_gt(np, 0u);

    /* the page and its two files, from the daemon itself */
    a = http_get(m->rport, "GET", "/");
    cr_assert_eq(a->status, 200);
    cr_assert(strstr(header(a, "Content-Type"), "text/html"), "the page is %s", header(a, "Content-Type"));
    cr_assert(strstr(a->body, "<script src=\"/console.js\""), "the page loads no console.js");
    cr_assert(strstr(header(a, "Content-Security-Policy"), "default-src 'self'"));
    a = http_get(m->rport, "GET", "/console.js");
    cr_assert(a->status == 200 && strstr(a->body, "/api/cluster"), "console.js: %d", a->status);
    a = http_get(m->rport, "GET", "/console.css");
    cr_assert(a->status == 200 && strstr(a->body, ".tile"), "console.css: %d", a->status);

    /* every core with its state, HBM and last step; the step comes with the
     * heartbeat after it, so within a few heartbeats */
    int got = 0;
    for (int i = 0; i < 50 && !got; i++) {
        a = http_get(m->rport, "GET", "/api/cluster");
        cr_assert_eq(a->status, 200, "GET /api/cluster: %d %.200s", a->status, a->raw);
        got = console_core(a->body, "h0", 0, c0, sizeof c0) && console_core(a->body, "h0", 1, c1, sizeof c1) &&
              json_num(c0, "step", NULL) == ROWS / BATCH && json_num(c1, "step", NULL) == ROWS / BATCH;
        if (!got)
            nap_ms(100);
    }
    cr_assert(got, "the console does not show both cores at step %d: %.1500s", ROWS / BATCH, a->body);
    cr_assert_str_eq(header(a, "Content-Type"), "application/json");
    for (const char *c = c0; c; c = c == c0 ? c1 : NULL) {
        cr_assert(strstr(c, "\"state\":\"READY\"") && strstr(c, "\"health\":\"HEALTHY\""), "%s", c);
        cr_assert_gt(json_num(c, "hbm_capacity", NULL), 0, "%s", c);
        cr_assert_gt(json_num(c, "hbm_peak", NULL), 0, "no HBM peak after training: %s", c);
        long long us = json_num(c, "step_us", NULL), ar = json_num(c, "allreduce_us", NULL);
        cr_assert(us > 0 && ar > 0 && ar <= us, "step %lld us, all-reduce %lld us: %s", us, ar, c);
        cr_assert(strstr(c, "\"metrics\":\"http://127.0.0.1:"), "no link to the worker's /metrics: %s", c);
    }
    cr_assert_eq(json_num(a->body, "epoch", NULL), 1);
    cr_assert(strstr(a->body, "\"initialized\":true") && strstr(a->body, "\"tpu_type\":\"v3\""));
    cr_assert(strstr(a->body, "\"mesh\":[1,1,1,2]"), "a v3 system of 2 cores is one chip: %.300s", a->body);
    cr_assert(strstr(a->body, "\"kind\":\"registered\",\"core\":\"h0/1\""), "no registration event for h0/1");
    cr_assert(strstr(a->body, "\"kind\":\"init\""), "no initialize event");
    /* the events after a number: none new yet */
    long long next = json_num(a->body, "next", NULL);
    char path[64];
    snprintf(path, sizeof path, "/api/cluster?since=%lld", next - 1);
    a = http_get(m->rport, "GET", path);
    cr_assert(a->status == 200 && strstr(a->body, "\"events\":[]"), "since=%lld: %.300s", next - 1,
              a->body ? strstr(a->body, "\"events\"") : "");

    /* a core killed: DEAD, and an event naming it */
    cluster_kill_worker(m->c, 1);
    got = 0;
    for (int i = 0; i < 100 && !got; i++) {
        a = http_get(m->rport, "GET", path);
        got = a->status == 200 && console_core(a->body, "h0", 1, c1, sizeof c1) && strstr(c1, "\"state\":\"DEAD\"") &&
              strstr(a->body, "\"kind\":\"dead\",\"core\":\"h0/1\"");
        if (!got)
            nap_ms(100);
    }
    cr_assert(got, "the console does not show h0/1 DEAD with an event: %.1500s", a->body);
    cr_assert(strstr(c1, "\"health\":\"TIMEOUT\""), "%s", c1);
    mc_free(m);
}

Test(metrics, console_data_needs_the_console_key_with_a_token, .timeout = 90)
{
    cluster_opts o;
    char rp[16], key[80] = "", hdr[256];
    run_result r;
    answer *a = malloc(sizeof *a);
    memset(&o, 0, sizeof o);
    int port = cl_free_port();
    snprintf(rp, sizeof rp, "%d", port);
    const char *rargs[] = {"--metrics-port", rp, NULL};
    o.resolver_args = rargs;
    o.token = 1;
    o.hosts = 1;
    o.cores_per_host = 1;
    o.heartbeat_ms = HB_MS;
    cluster *c = cluster_start(&o);

    /* the page is public (it holds no data); the data is not */
    cr_assert_eq(http_get(port, "GET", "/")->status, 200);
    answer *g = http_get(port, "GET", "/api/cluster");
    cr_assert_eq(g->status, 401, "without the key: %d", g->status);
    cr_assert(strstr(header(g, "WWW-Authenticate"), "Bearer"));
    cr_assert(!strstr(g->body, "h0"), "a 401 shows the cluster: %s", g->body);
    /* tpuctl console prints the URL with the key */
    cr_assert_eq(cluster_tpuctl(c, &r, 10000, "console", "--port", rp, NULL), 0, "tpuctl console: %s", r.err);
    const char *k = strstr(r.out, "#key=");
    cr_assert(k && strlen(k + 5) >= 64, "tpuctl console printed no key: %s", r.out);
    snprintf(key, sizeof key, "%.64s", k + 5);
    cr_assert(!strstr(r.out, CL_TOKEN), "the URL holds the cluster token itself");
    run_result_free(&r);
    /* a wrong key, a key of another length, another scheme: 401 */
    static const char *const bad[] = {"Bearer 0000000000000000000000000000000000000000000000000000000000000000",
                                      "Bearer abc", "Basic dXNlcjpwYXNz", "Bearer " CL_TOKEN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n = snprintf(hdr, sizeof hdr, "GET /api/cluster HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n\r\n", bad[i]);
        http_raw(port, hdr, (size_t)n, 5000, a);
        cr_assert_eq(a->status, 401, "with \"%s\": %d", bad[i], a->status);
    }
    int n = snprintf(hdr, sizeof hdr, "GET /api/cluster HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", key);
    http_raw(port, hdr, (size_t)n, 5000, a);
    cr_assert_eq(a->status, 200, "with the console key: %d %.200s", a->status, a->raw);
    cr_assert(strstr(a->body, "\"host\":\"h0\",\"core\":0,"), "%.300s", a->body);
    free(a);
    cluster_free(c);
}
