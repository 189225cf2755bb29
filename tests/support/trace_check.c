/* Trace Event Format checks on a parsed trace file: each event's fields, then
 * per thread B/E matching and slice nesting, then flows, then the names. */
#include "trace_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define TOL 0.001 /* us: float rounding allowed at slice edges */

typedef struct slice {
    long long pid, tid;
    double start, end;
    size_t idx; /* the X (or B) event */
    const char *name;
} slice;

typedef struct mark {
    long long pid, tid;
    double ts;
    size_t idx;
    char ph;
    const char *name;
} mark;

typedef struct flow {
    char *key; /* cat + id, for grouping */
    char idtxt[96];
    long long pid, tid;
    double ts;
    size_t idx;
    char ph;
    int bp_e;
} flow;

typedef struct thr {
    long long pid, tid;
    size_t idx;
} thr;

typedef struct ctx {
    char *why;
    size_t whyn;
    slice *sl;
    size_t nsl, csl;
    mark *mk;
    size_t nmk, cmk;
    flow *fl;
    size_t nfl, cfl;
    thr *used_p, *used_t, *named_p, *named_t, *all_p, *all_t;
    size_t n_used_p, n_used_t, n_named_p, n_named_t, n_all_p, n_all_t;
    size_t c_used_p, c_used_t, c_named_p, c_named_t, c_all_p, c_all_t;
    size_t timed; /* events with a ts so far */
} ctx;

__attribute__((format(printf, 2, 3))) static int bad(ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c->why && c->whyn)
        vsnprintf(c->why, c->whyn, fmt, ap);
    va_end(ap);
    return -1;
}

/* Appends one element to a growable array; -1 when out of memory. */
static int grow(void **arr, size_t *n, size_t *cap, size_t sz)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        void *a = realloc(*arr, nc * sz);
        if (!a)
            return -1;
        *arr = a;
        *cap = nc;
    }
    (*n)++;
    return 0;
}

#define APPEND(c, arr, n, cap, val)                                                     \
    do {                                                                                \
        if (grow((void **)&(c)->arr, &(c)->n, &(c)->cap, sizeof *(c)->arr))             \
            return bad((c), "out of memory");                                           \
        (c)->arr[(c)->n - 1] = (val);                                                   \
    } while (0)

static int cmp_thr(const void *a, const void *b)
{
    const thr *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Sorts and keeps the first (lowest event index) of each (pid, tid). */
static size_t uniq(thr *t, size_t n)
{
    if (!n)
        return 0;
    if (n > 1)
        qsort(t, n, sizeof *t, cmp_thr);
    size_t k = 1;
    for (size_t i = 1; i < n; i++)
        if (t[i].pid != t[k - 1].pid || t[i].tid != t[k - 1].tid)
            t[k++] = t[i];
    return k;
}

static int has(const thr *t, size_t n, long long pid, long long tid)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (t[m].pid < pid || (t[m].pid == pid && t[m].tid < tid))
            lo = m + 1;
        else
            hi = m;
    }
    return lo < n && t[lo].pid == pid && t[lo].tid == tid;
}

static int cmp_slice(const void *a, const void *b)
{
    const slice *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1; /* the enclosing one first */
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int cmp_mark(const void *a, const void *b)
{
    const mark *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int cmp_flow(const void *a, const void *b)
{
    const flow *x = a, *y = b;
    int k = strcmp(x->key, y->key);
    if (k)
        return k;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int is_ts(const json *v, double *out)
{
    return !json_num(v, out) && isfinite(*out) && *out >= 0 ? 0 : -1;
}

static const char PHASES[] = "XBEiIMstfCbenONDPRc";

/* The checks of one event on its own; what the later passes need is recorded. */
static int check_event(ctx *c, size_t i, const json *e, struct trace_check_stats *st)
{
    if (!json_is(e, JSON_OBJECT))
        return bad(c, "event %zu: not an object", i);
    const json *jph = json_get(e, "ph");
    if (!jph)
        return bad(c, "event %zu: missing \"ph\"", i);
    const char *ph = json_str(jph);
    if (!ph)
        return bad(c, "event %zu: \"ph\" is not a string", i);
    if (strlen(ph) != 1 || !strchr(PHASES, ph[0]))
        return bad(c, "event %zu: unknown phase \"ph\":\"%s\"", i, ph);
    char p = ph[0];
    const json *jname = json_get(e, "name");
    const char *name = json_str(jname);
    if (jname && !name)
        return bad(c, "event %zu: \"name\" is not a string", i);
    if (!jname && p != 'E')
        return bad(c, "event %zu: missing \"name\" (ph %c)", i, p);
    const json *cat = json_get(e, "cat");
    if (cat && !json_is(cat, JSON_STRING))
        return bad(c, "event %zu: \"cat\" is not a string", i);
    const json *args = json_get(e, "args");
    if (args && !json_is(args, JSON_OBJECT))
        return bad(c, "event %zu: \"args\" is not an object", i);
    long long pid, tid = 0;
    const json *jpid = json_get(e, "pid"), *jtid = json_get(e, "tid");
    if (!jpid)
        return bad(c, "event %zu: missing \"pid\"", i);
    if (json_int(jpid, &pid))
        return bad(c, "event %zu: \"pid\" is not an integer", i);
    int process_md = p == 'M' && name && !strncmp(name, "process_", 8);
    if (jtid && json_int(jtid, &tid))
        return bad(c, "event %zu: \"tid\" is not an integer", i);
    if (!jtid && !process_md)
        return bad(c, "event %zu: missing \"tid\" (only process_* M events may omit it)", i);
    APPEND(c, all_p, n_all_p, c_all_p, ((thr){pid, 0, i}));
    if (jtid)
        APPEND(c, all_t, n_all_t, c_all_t, ((thr){pid, tid, i}));

    double ts = 0;
    const json *jts = json_get(e, "ts");
    if (p != 'M' || jts) {
        if (!jts)
            return bad(c, "event %zu: missing \"ts\" (ph %c)", i, p);
        if (is_ts(jts, &ts))
            return bad(c, "event %zu: \"ts\" is not a finite number >= 0 (microseconds)", i);
    }
    if (p != 'M') {
        if (st->ts_min > ts || !c->timed)
            st->ts_min = ts;
        if (st->ts_max < ts || !c->timed)
            st->ts_max = ts;
        c->timed++;
        APPEND(c, used_p, n_used_p, c_used_p, ((thr){pid, 0, i}));
    }

    switch (p) {
    case 'M': {
        static const char *const md[] = {"process_name", "process_labels", "process_sort_index",
                                         "thread_name", "thread_sort_index"};
        size_t k = 0;
        while (k < 5 && strcmp(name, md[k]))
            k++;
        if (k == 5)
            return bad(c, "event %zu: unknown metadata event name \"%s\"", i, name);
        if (k >= 3 && !jtid)
            return bad(c, "event %zu: %s without \"tid\"", i, name);
        const char *field = k == 1 ? "labels" : (k == 0 || k == 3) ? "name" : "sort_index";
        const json *a = json_get(args, field);
        long long si;
        int want_int = k == 2 || k == 4;
        if (want_int ? json_int(a, &si) != 0 : !json_is(a, JSON_STRING))
            return bad(c, "event %zu: %s needs args.%s (%s)", i, name, field, want_int ? "an integer" : "a string");
        if (k == 0)
            APPEND(c, named_p, n_named_p, c_named_p, ((thr){pid, 0, i}));
        if (k == 3)
            APPEND(c, named_t, n_named_t, c_named_t, ((thr){pid, tid, i}));
        break;
    }
    case 'X': {
        double dur;
        const json *jd = json_get(e, "dur");
        if (!jd)
            return bad(c, "event %zu: X event \"%s\" without \"dur\"", i, name);
        if (json_num(jd, &dur) || !isfinite(dur) || dur < 0)
            return bad(c, "event %zu: X event \"%s\" has a negative or non-finite \"dur\"", i,
                       name);
        APPEND(c, sl, nsl, csl, ((slice){pid, tid, ts, ts + dur, i, name}));
        APPEND(c, used_t, n_used_t, c_used_t, ((thr){pid, tid, i}));
        break;
    }
    case 'B':
    case 'E':
        APPEND(c, mk, nmk, cmk, ((mark){pid, tid, ts, i, p, name}));
        APPEND(c, used_t, n_used_t, c_used_t, ((thr){pid, tid, i}));
        break;
    case 's':
    case 't':
    case 'f': {
        const json *id = json_get(e, "id");
        flow f = {.pid = pid, .tid = tid, .ts = ts, .idx = i, .ph = p};
        if (json_is(id, JSON_STRING))
            snprintf(f.idtxt, sizeof f.idtxt, "\"%s\"", id->str);
        else if (json_is(id, JSON_NUMBER))
            snprintf(f.idtxt, sizeof f.idtxt, "%.17g", id->num);
        else
            return bad(c, "event %zu: flow event (ph %c) without a string or number \"id\"", i,
                       p);
        const json *bp = json_get(e, "bp");
        if (bp && !(json_str(bp) && !strcmp(bp->str, "e")))
            return bad(c, "event %zu: \"bp\" must be \"e\"", i);
        f.bp_e = bp != NULL;
        const char *cs = json_str(cat) ? cat->str : "";
        size_t kn = strlen(cs) + strlen(f.idtxt) + 3;
        f.key = malloc(kn);
        if (!f.key)
            return bad(c, "out of memory");
        snprintf(f.key, kn, "%s\x1f%c%s", cs, json_is(id, JSON_STRING) ? 's' : 'n', f.idtxt);
        if (grow((void **)&c->fl, &c->nfl, &c->cfl, sizeof *c->fl)) {
            free(f.key);
            return bad(c, "out of memory");
        }
        c->fl[c->nfl - 1] = f;
        break;
    }
    default:
        break;
    }
    return 0;
}

/* B/E: matched in LIFO order per thread (in ts order, file order on ties);
 * each pair becomes a slice. */
static int check_begin_end(ctx *c)
{
    if (c->nmk > 1)
        qsort(c->mk, c->nmk, sizeof *c->mk, cmp_mark);
    size_t *stack = malloc((c->nmk + 1) * sizeof *stack), depth = 0;
    if (!stack)
        return bad(c, "out of memory");
    int rc = 0;
    for (size_t i = 0; i <= c->nmk && !rc; i++) {
        int new_thread = i == c->nmk || (i > 0 && (c->mk[i].pid != c->mk[i - 1].pid ||
                                                   c->mk[i].tid != c->mk[i - 1].tid));
        if (new_thread && depth) {
            const mark *b = &c->mk[stack[depth - 1]];
            rc = bad(c, "event %zu: B \"%s\" on pid %lld tid %lld is never closed by an E "
                        "(unbalanced B/E)", b->idx, b->name, b->pid, b->tid);
            break;
        }
        if (i == c->nmk)
            break;
        const mark *m = &c->mk[i];
        if (m->ph == 'B') {
            stack[depth++] = i;
            continue;
        }
        if (!depth) {
            rc = bad(c, "event %zu: E on pid %lld tid %lld at ts %.3f has no open B "
                        "(unbalanced B/E)", m->idx, m->pid, m->tid, m->ts);
            break;
        }
        const mark *b = &c->mk[stack[--depth]];
        if (m->name && strcmp(m->name, b->name)) {
            rc = bad(c, "event %zu: E \"%s\" does not match the innermost open B \"%s\" "
                        "(event %zu) on pid %lld tid %lld", m->idx, m->name, b->name, b->idx,
                     m->pid, m->tid);
            break;
        }
        if (grow((void **)&c->sl, &c->nsl, &c->csl, sizeof *c->sl)) {
            rc = bad(c, "out of memory");
            break;
        }
        c->sl[c->nsl - 1] = (slice){b->pid, b->tid, b->ts, m->ts, b->idx, b->name};
    }
    free(stack);
    return rc;
}

/* Slices on one thread are disjoint or nested. */
static int check_nesting(ctx *c)
{
    if (c->nsl > 1)
        qsort(c->sl, c->nsl, sizeof *c->sl, cmp_slice);
    size_t *stack = malloc((c->nsl + 1) * sizeof *stack), depth = 0;
    if (!stack)
        return bad(c, "out of memory");
    for (size_t i = 0; i < c->nsl; i++) {
        const slice *s = &c->sl[i];
        if (i > 0 && (s->pid != c->sl[i - 1].pid || s->tid != c->sl[i - 1].tid))
            depth = 0;
        while (depth) {
            const slice *t = &c->sl[stack[depth - 1]];
            if (t->end <= s->start + TOL || (s->end > t->end + TOL && t->start >= s->start - TOL)) {
                depth--; /* t ended before s, or t inside s (starts equal within TOL) */
                continue;
            }
            if (s->end <= t->end + TOL)
                break; /* s inside t */
            free(stack);
            return bad(c, "event %zu: slice \"%s\" [%.3f, %.3f] partially overlaps slice \"%s\" "
                          "[%.3f, %.3f] (event %zu) on pid %lld tid %lld (slices on a thread "
                          "must nest)",
                       s->idx, s->name, s->start, s->end, t->name, t->start, t->end, t->idx,
                       s->pid, s->tid);
        }
        stack[depth++] = i;
    }
    free(stack);
    return 0;
}

/* Slices of (pid, tid) are c->sl[*lo .. *hi), sorted by start. */
static void thread_range(const ctx *c, long long pid, long long tid, size_t *lo, size_t *hi)
{
    size_t a = 0, b = c->nsl;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (c->sl[m].pid < pid || (c->sl[m].pid == pid && c->sl[m].tid < tid))
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    for (b = a; b < c->nsl && c->sl[b].pid == pid && c->sl[b].tid == tid; b++)
        ;
    *hi = b;
}

/* 1 if ts lies inside a slice of (pid, tid) (or, with next, one begins at or after it). */
static int bound(const ctx *c, long long pid, long long tid, double ts, int next)
{
    size_t lo, hi;
    thread_range(c, pid, tid, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        const slice *s = &c->sl[i];
        if (s->start - TOL <= ts && ts <= s->end + TOL)
            return 1;
        if (next && s->start >= ts - TOL)
            return 1;
    }
    return 0;
}

static int check_flows(ctx *c, struct trace_check_stats *st)
{
    if (c->nfl > 1)
        qsort(c->fl, c->nfl, sizeof *c->fl, cmp_flow);
    for (size_t g = 0; g < c->nfl;) {
        size_t e = g;
        while (e < c->nfl && !strcmp(c->fl[e].key, c->fl[g].key))
            e++;
        st->flows++;
        const flow *s = NULL, *f = NULL;
        const char *id = c->fl[g].idtxt;
        for (size_t i = g; i < e; i++) {
            const flow *x = &c->fl[i];
            if (x->ph == 's') {
                if (s)
                    return bad(c, "event %zu: flow id %s has two starts (s events %zu and %zu)",
                               x->idx, id, s->idx, x->idx);
                s = x;
            } else if (x->ph == 'f') {
                if (f)
                    return bad(c, "event %zu: flow id %s has two ends (f events %zu and %zu)",
                               x->idx, id, f->idx, x->idx);
                f = x;
            }
        }
        if (!s)
            return bad(c, "event %zu: flow id %s has no start (s)", c->fl[g].idx, id);
        for (size_t i = g; i < e; i++) {
            const flow *x = &c->fl[i];
            if (x != s && x->ts < s->ts)
                return bad(c, "event %zu: flow id %s: %c at ts %.3f is before its start at "
                              "ts %.3f (event %zu)",
                           x->idx, id, x->ph, x->ts, s->ts, s->idx);
            if (x->ph == 't' && f && x->ts > f->ts)
                return bad(c, "event %zu: flow id %s: step at ts %.3f is after its end at "
                              "ts %.3f (event %zu)",
                           x->idx, id, x->ts, f->ts, f->idx);
            int next = x->ph == 'f' && !x->bp_e;
            if (!bound(c, x->pid, x->tid, x->ts, next))
                return bad(c, "event %zu: flow id %s is dangling: its %c at ts %.3f is %s on "
                              "pid %lld tid %lld",
                           x->idx, id, x->ph, x->ts,
                           next ? "neither inside nor before any slice" : "outside any slice",
                           x->pid, x->tid);
        }
        g = e;
    }
    return 0;
}

static int check_names(ctx *c)
{
    c->n_used_p = uniq(c->used_p, c->n_used_p);
    c->n_used_t = uniq(c->used_t, c->n_used_t);
    c->n_named_p = uniq(c->named_p, c->n_named_p);
    c->n_named_t = uniq(c->named_t, c->n_named_t);
    for (size_t i = 0; i < c->n_used_p; i++)
        if (!has(c->named_p, c->n_named_p, c->used_p[i].pid, 0))
            return bad(c, "event %zu: pid %lld has no process_name M event (this project "
                          "requires every process to be named)",
                       c->used_p[i].idx, c->used_p[i].pid);
    for (size_t i = 0; i < c->n_used_t; i++)
        if (!has(c->named_t, c->n_named_t, c->used_t[i].pid, c->used_t[i].tid))
            return bad(c, "event %zu: pid %lld tid %lld has slices but no thread_name M event "
                          "(this project requires every thread with slices to be named)",
                       c->used_t[i].idx, c->used_t[i].pid, c->used_t[i].tid);
    return 0;
}

static int check_top(ctx *c, const json *root, struct trace_check_stats *st)
{
    if (!json_is(root, JSON_OBJECT))
        return bad(c, "top level is %s, not an object with \"traceEvents\"",
                   json_type_name(root->type));
    const json *ev = json_get(root, "traceEvents");
    if (!ev)
        return bad(c, "top level has no \"traceEvents\"");
    if (!json_is(ev, JSON_ARRAY))
        return bad(c, "\"traceEvents\" is not an array");
    const json *u = json_get(root, "displayTimeUnit");
    if (u && !(json_str(u) && (!strcmp(u->str, "ms") || !strcmp(u->str, "ns"))))
        return bad(c, "\"displayTimeUnit\" must be \"ms\" or \"ns\"");
    const json *md = json_get(root, "metadata"), *od = json_get(root, "otherData");
    if (md && !json_is(md, JSON_OBJECT))
        return bad(c, "\"metadata\" is not an object");
    if (od && !json_is(od, JSON_OBJECT))
        return bad(c, "\"otherData\" is not an object");

    for (size_t i = 0; i < ev->n; i++)
        if (check_event(c, i, ev->items[i], st))
            return -1;
    st->events = ev->n;
    st->slices = c->nsl;
    if (check_begin_end(c) || check_nesting(c) || check_flows(c, st) || check_names(c))
        return -1;
    st->processes = uniq(c->all_p, c->n_all_p);
    st->threads = uniq(c->all_t, c->n_all_t);
    return 0;
}

int trace_check_file(const char *path, char *why, size_t whyn, struct trace_check_stats *st)
{
    struct trace_check_stats local;
    ctx c = {.why = why, .whyn = whyn};
    if (why && whyn)
        why[0] = '\0';
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    json *root = json_parse_file(path, why, whyn);
    if (!root)
        return -1;
    int rc = check_top(&c, root, st);
    for (size_t i = 0; i < c.nfl; i++)
        free(c.fl[i].key);
    free(c.fl);
    free(c.sl);
    free(c.mk);
    free(c.used_p);
    free(c.used_t);
    free(c.named_p);
    free(c.named_t);
    free(c.all_p);
    free(c.all_t);
    json_free(root);
    if (rc)
        memset(st, 0, sizeof *st);
    return rc;
}
