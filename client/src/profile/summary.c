/* The profile's summary (tpu_profile_summarize): each core's steps split
 * into input, compute, all-reduce, optimizer and idle time, the roofline
 * estimate on the real generation, the layers' matrix-unit use, and the
 * bottleneck with advice. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile_int.h"
#include "summary.h"

static const char *const cat_names[NCAT] = {"input", "compute", "all-reduce", "optimizer", "idle"};

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
struct srow *profile_core_rows(const struct pcore *c, size_t ncores, struct csum *cs, size_t *nrows)
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
        if ((e->kind == TK(FORWARD) || e->kind == TK(BACKWARD)) && e->bytes && c->hbm_bw > 0)
            cs->est_other += (double)e->bytes / c->hbm_bw * 1e9;
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
    struct srow *rows = i < p->n ? profile_core_rows(&p->c[i], p->n, &cs, &n) : NULL;
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
        /* the forward matmul wasting the most of the MXU, when the layer has
         * forward matmuls of more than one shape (attention) */
        int shapes;
        uint64_t wm, wk, wn;
        double waste, wutil;
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
                struct lsum *y = &L[e->layer];
                if (y->units && (y->batch != e->m || y->in != e->k || y->units != e->n))
                    y->shapes = 2;
                else if (!y->units)
                    y->shapes = 1;
                if (padded - fl > y->waste) {
                    y->waste = padded - fl;
                    y->wutil = padded > 0 ? fl / padded : 0;
                    y->wm = e->m, y->wk = e->k, y->wn = e->n;
                }
                y->batch = e->m;
                y->in = e->k;
                y->units = e->n;
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
        /* a layer of several matmuls (attention: the projections, Q K^T and P V) names its least filled one */
        LOSS(L[l].shapes > 1 && L[l].waste > 0,
             "least filled matmul (M x K x N) %" PRIu64 "x%" PRIu64 "x%" PRIu64 ": %.1f%% of the MXU, K and N padded "
             "to %.0f and %.0f",
             L[l].wm, L[l].wk, L[l].wn, 100.0 * L[l].wutil, pad(L[l].wk, 128), pad(L[l].wn, 128))
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
        rows[i] = profile_core_rows(&p->c[i], p->n, &cs, &nrows[i]);
        for (int c = 0; c < NCAT; c++)
            all.cat[c] += cs.cat[c];
        all.period += cs.period;
        all.steps += cs.steps;
        all.flops += cs.flops;
        all.padded += cs.padded;
        all.rows += cs.rows;
        all.est_mm += cs.est_mm;
        all.est_opt += cs.est_opt;
        all.est_other += cs.est_other;
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
        out->est_other_ms = all.est_other / r / 1e6;
        out->est_step_ms = out->est_matmul_ms + out->est_optimizer_ms + out->est_allreduce_ms + out->est_other_ms;
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
