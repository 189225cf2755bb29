/* Compiled models of the training service and their HBM charges: weights,
 * optimizer slots, gradients, activations and infeed buffers for the
 * per-core batch, charged like XLA reserves them (over capacity is
 * RESOURCE_EXHAUSTED with the numbers). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "train_int.h"

void tm_free(struct tmodel *tm)
{
    if (!tm)
        return;
    model_free(tm->m);
    free(tm->xw);
    tpuemu__model_spec__free_unpacked(tm->spec, NULL);
    free(tm);
}

Tpuemu__ModelSpec *tm_spec_copy(const Tpuemu__ModelSpec *s)
{
    size_t n = tpuemu__model_spec__get_packed_size(s);
    uint8_t *buf = malloc(n ? n : 1);
    Tpuemu__ModelSpec *c;
    if (!buf)
        return NULL;
    tpuemu__model_spec__pack(s, buf);
    c = tpuemu__model_spec__unpack(NULL, n, buf);
    free(buf);
    return c;
}

static void release_blocks(struct train *t, struct tmodel *tm)
{
    err ignored;
    for (size_t i = 0; i < tm->nids; i++)
        hbm_release(t->env.hbm, tm->ids[i], &ignored);
    tm->nids = 0;
}

/* Each request's infeed arrives in a buffer of its own (malloc'd as the
 * frame is read, freed when it is answered). Once glibc's dynamic mmap
 * threshold has risen (heap_prefault in main.c: to 512 KiB, the trim
 * threshold to twice that), those buffers come from the heap; but a batch's
 * infeed near that size made the heap top pass the trim threshold at every
 * free, so every step gave the pages back and faulted them in again (one
 * brk and 44-90 page faults a step at per-core batch 128). Freeing a
 * mapped block of eight times the infeed in flight (twice left a float32
 * infeed of 402 KB still faulting in every step) raises both thresholds above
 * what the steps use, as heap_prefault does for the first initialize; the
 * heap then keeps what training needs, no more. */
static void keep_infeed_heap(const struct tmodel *tm)
{
#ifdef __GLIBC__
    size_t x = (size_t)tm->batch *
               ((size_t)tm->in_dim * sizeof(float) + (size_t)(tm->sparse ? 1 : tm->label_dim) * sizeof(float));
    size_t want = 8 * x * (size_t)tm->spe * (size_t)(tm->depth + 1);
    void *big;
    if (want <= (32u << 20) && (big = malloc(want)) != NULL) /* glibc raises it up to 32 MiB */
        free(big);
#else
    (void)tm;
#endif
}

/* The compiled model's arrays on the core, reserved together (a model that
 * does not fit is refused whole, with XLA's report of all of it). */
static int charge(struct train *t, struct tmodel *tm, const struct model_cfg *cfg, const Tpuemu__ModelSpec *sp,
                  err *e)
{
    hbm *h = t->env.hbm;
    int64_t b = cfg->max_rows, prev = cfg->in_dim, maxu = 0;
    int nslots = sp->optimizer && sp->optimizer->kind == 1 ? 2 : sp->optimizer && sp->optimizer->momentum > 0 ? 1 : 0;
    const char *optname = sp->optimizer && sp->optimizer->kind == 1 ? "Adam" : "SGD";
    static const char *const slotname[2][2] = {{"momentum", ""}, {"m", "v"}};
    char names[TRAIN_MAX_BLOCKS + 1][HBM_NAME_MAX];
    struct hbm_req req[TRAIN_MAX_BLOCKS + 1];
    uint32_t ids[TRAIN_MAX_BLOCKS + 1];
    char lname[24];
    size_t n = 0;
    int rc;

#define REQ(kind_, dt, rank_, ...)                                                                  \
    do {                                                                                            \
        int64_t d_[] = {__VA_ARGS__};                                                               \
        memset(&req[n], 0, sizeof req[n]);                                                          \
        req[n].kind = (kind_);                                                                      \
        req[n].name = names[n];                                                                     \
        req[n].dtype = (dt);                                                                        \
        req[n].rank = (rank_);                                                                      \
        memcpy(req[n].dims, d_, sizeof d_);                                                         \
        n++;                                                                                        \
    } while (0)
#define NAME(...) snprintf(names[n], sizeof names[n], __VA_ARGS__)

    tm->nids = 0;
    struct lshape sh = cfg->in_shape.rank ? cfg->in_shape : (struct lshape){1, {cfg->in_dim, 0, 0}};
    int seen[LK_LAST + 1] = {0};
    /* gradient checkpointing: what a segment recomputes is live one segment
     * at a time (bytes of the segment being recomputed, and the largest) */
    int64_t seg = 0, seg_max = 0;
    int esz = cfg->precision == MODEL_MIXED_BF16 ? 2 : 4;
    const char *adt = cfg->precision == MODEL_MIXED_BF16 ? "bf16" : "f32";
    for (int l = 0; l < cfg->nlayers; l++) {
        struct lspec ls = cfg->kind[l];
        struct lgeom g;
        char why[200];
        int64_t u = cfg->units[l], kd[4];
        int kr;
        ls.units = cfg->units[l];
        if (lshape_apply(&ls, &sh, &g, why, sizeof why) != 0)   /* model_new checked it */
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: %s", l, why);
        if (seen[ls.kind]++ == 0)
            snprintf(lname, sizeof lname, "%s", lkind_prefix(ls.kind));
        else
            snprintf(lname, sizeof lname, "%s_%d", lkind_prefix(ls.kind), seen[ls.kind] - 1);
        prev = sh.d[sh.rank - 1];
        if (ls.kind == LK_CONV2D)   /* (kh, kw, in, filters) as Keras holds it */
            kd[0] = ls.kh, kd[1] = ls.kw, kd[2] = prev, kd[3] = u, kr = 4;
        else
            kd[0] = prev, kd[1] = u, kd[2] = kd[3] = 0, kr = 2;
        if (ls.kind == LK_LAYER_NORM || ls.kind == LK_BATCH_NORM) {
            /* gamma and beta trained (slots, gradients); BatchNormalization's
             * moving statistics are variables without either */
            static const char *const v[4] = {"gamma", "beta", "moving_mean", "moving_variance"};
            for (int i = 0; i < (ls.kind == LK_BATCH_NORM ? 4 : 2); i++) {
                NAME("%s/%s", lname, v[i]);
                REQ(HBM_WEIGHTS, "f32", 1, prev);
            }
            for (int i = 0; i < 2; i++) {
                for (int s = 0; s < nslots; s++) {
                    NAME("%s/%s/%s/%s", optname, lname, v[i], slotname[nslots == 2][s]);
                    REQ(HBM_OPTIMIZER, "f32", 1, prev);
                }
                NAME("gradients/%s/%s", lname, v[i]);
                REQ(HBM_GRADIENTS, "f32", 1, prev);
            }
        } else if (ls.kind == LK_EMBEDDING || ls.kind == LK_MULTI_HEAD_ATTENTION) {
            /* their variables by Keras' names and shapes, and what they keep for the backward pass */
            struct {
                const char *name;
                int rank;
                int64_t d[3];
            } v[8];
            int nv = 0, H = ls.heads, K = ls.key_dim, V = ls.value_dim ? ls.value_dim : ls.key_dim;
            int64_t S = sh.d[0], F = sh.rank > 1 ? sh.d[1] : 0;
            if (ls.kind == LK_EMBEDDING) {
                v[nv++] = (__typeof__(v[0])){"embeddings", 2, {ls.vocab, u, 0}};
                if (ls.positions)
                    v[nv++] = (__typeof__(v[0])){"position_embeddings", 2, {S, u, 0}};
            } else {
                v[nv++] = (__typeof__(v[0])){"query/kernel", 3, {F, H, K}};
                v[nv++] = (__typeof__(v[0])){"query/bias", 2, {H, K, 0}};
                v[nv++] = (__typeof__(v[0])){"key/kernel", 3, {F, H, K}};
                v[nv++] = (__typeof__(v[0])){"key/bias", 2, {H, K, 0}};
                v[nv++] = (__typeof__(v[0])){"value/kernel", 3, {F, H, V}};
                v[nv++] = (__typeof__(v[0])){"value/bias", 2, {H, V, 0}};
                v[nv++] = (__typeof__(v[0])){"attention_output/kernel", 3, {H, V, F}};
                v[nv++] = (__typeof__(v[0])){"attention_output/bias", 1, {F, 0, 0}};
            }
            for (int i = 0; i < nv; i++) {
                NAME("%s/%s", lname, v[i].name);
                REQ(HBM_WEIGHTS, "f32", v[i].rank, v[i].d[0], v[i].d[1], v[i].d[2]);
                for (int s = 0; s < nslots; s++) {
                    NAME("%s/%s/%s/%s", optname, lname, v[i].name, slotname[nslots == 2][s]);
                    REQ(HBM_OPTIMIZER, "f32", v[i].rank, v[i].d[0], v[i].d[1], v[i].d[2]);
                }
                NAME("gradients/%s/%s", lname, v[i].name);
                REQ(HBM_GRADIENTS, "f32", v[i].rank, v[i].d[0], v[i].d[1], v[i].d[2]);
            }
            if (ls.kind == LK_MULTI_HEAD_ATTENTION) {
                NAME("%s/query_key_value", lname);
                REQ(HBM_ACTIVATIONS, adt, 4, b, S, H, 2 * K + V);
                NAME("%s/attention_scores", lname);
                REQ(HBM_ACTIVATIONS, "f32", 4, b, H, S, S);
                NAME("%s/attention_heads", lname);
                REQ(HBM_ACTIVATIONS, adt, 4, b, S, H, V);
                /* the backward pass's own: the scores' gradient and the projections' */
                NAME("%s/scores_gradient", lname);
                REQ(HBM_ACTIVATIONS, "f32", 4, b, H, S, S);
                NAME("%s/qkv_gradient", lname);
                REQ(HBM_ACTIVATIONS, "f32", 4, b, S, H, 2 * K + V);
            }
        } else if (g.kernel) {
            NAME("%s/kernel", lname);
            REQ(HBM_WEIGHTS, "f32", kr, kd[0], kd[1], kd[2], kd[3]);
            NAME("%s/bias", lname);
            REQ(HBM_WEIGHTS, "f32", 1, u);
            for (int s = 0; s < nslots; s++) {
                NAME("%s/%s/kernel/%s", optname, lname, slotname[nslots == 2][s]);
                REQ(HBM_OPTIMIZER, "f32", kr, kd[0], kd[1], kd[2], kd[3]);
                NAME("%s/%s/bias/%s", optname, lname, slotname[nslots == 2][s]);
                REQ(HBM_OPTIMIZER, "f32", 1, u);
            }
            NAME("gradients/%s/kernel", lname);
            REQ(HBM_GRADIENTS, "f32", kr, kd[0], kd[1], kd[2], kd[3]);
            NAME("gradients/%s/bias", lname);
            REQ(HBM_GRADIENTS, "f32", 1, u);
        }
        int kept = !cfg->remat || model_layer_checkpointed(tm->m, l);
        if (cfg->remat) {
            if (ls.kind == LK_CONV2D)
                seg += b * g.out.d[0] * g.out.d[1] * (int64_t)ls.kh * ls.kw * prev * esz;
            if (!kept && ls.kind != LK_FLATTEN && ls.kind != LK_RESHAPE)
                seg += b * (int64_t)lshape_size(&g.out) * esz;
            if (!kept && (cfg->act[l] >= ACT_GELU || ls.kind == LK_LAYER_NORM || ls.kind == LK_BATCH_NORM))
                seg += b * (int64_t)lshape_size(&g.out) * 4;
            if (ls.kind == LK_DROPOUT)
                seg += b * (int64_t)lshape_size(&g.out);
            if (seg > seg_max)
                seg_max = seg;
            if (model_layer_checkpointed(tm->m, l))
                seg = 0;
        }
        if (ls.kind == LK_CONV2D && !cfg->remat) {   /* the patches the convolution multiplies (XLA's im2col) */
            NAME("%s/patches", lname);
            REQ(HBM_ACTIVATIONS, adt, 3, b * g.out.d[0] * g.out.d[1], (int64_t)ls.kh * ls.kw, prev);
        }
        if (ls.kind != LK_FLATTEN && ls.kind != LK_RESHAPE && kept) {   /* those are views: no copy */
            NAME("%s/activations", lname);
            if (g.out.rank == 1)
                REQ(HBM_ACTIVATIONS, adt, 2, b, g.out.d[0]);
            else if (g.out.rank == 2)
                REQ(HBM_ACTIVATIONS, adt, 3, b, g.out.d[0], g.out.d[1]);
            else
                REQ(HBM_ACTIVATIONS, adt, 4, b, g.out.d[0], g.out.d[1], g.out.d[2]);
        }
        if ((ls.kind == LK_LAYER_NORM || ls.kind == LK_BATCH_NORM) && kept) { /* xhat, for the backward pass */
            NAME("%s/normalized", lname);
            REQ(HBM_ACTIVATIONS, "f32", 2, b, (int64_t)lshape_size(&g.out));
        }
        if (cfg->act[l] >= ACT_GELU && kept) { /* gelu, softplus, swish: their inputs, for the backward pass */
            NAME("%s/preactivations", lname);
            REQ(HBM_ACTIVATIONS, "f32", 2, b, (int64_t)lshape_size(&g.out));
        }
        if (ls.kind == LK_ADD) { /* the other operand's gradient, held until the backward pass reaches it */
            NAME("%s/skip_gradient", lname);
            REQ(HBM_ACTIVATIONS, "f32", 2, b, (int64_t)lshape_size(&g.out));
        }
        if (ls.kind == LK_DROPOUT && !cfg->remat) {
            NAME("%s/mask", lname);
            REQ(HBM_ACTIVATIONS, "u8", 2, b, (int64_t)lshape_size(&g.out));
        }
        if ((int64_t)lshape_size(&sh) > maxu)
            maxu = (int64_t)lshape_size(&sh);
        if ((int64_t)lshape_size(&g.out) > maxu)
            maxu = (int64_t)lshape_size(&g.out);
        sh = g.out;
    }
    if (cfg->remat && seg_max > 0) {
        NAME("rematerialized/segment");   /* recomputed in the backward pass */
        REQ(HBM_ACTIVATIONS, "u8", 1, seg_max);
    }
    NAME("backward/delta");
    REQ(HBM_ACTIVATIONS, "f32", 2, 2 * b, maxu);
    NAME("infeed/x");
    REQ(HBM_INFEED, tm->bf16_in ? "bf16" : "f32", 3, (int64_t)tm->depth * tm->spe, b, cfg->in_dim);
    NAME("infeed/y");
    if (tm->sparse)
        REQ(HBM_INFEED, "s32", 2, (int64_t)tm->depth * tm->spe, b);
    else
        REQ(HBM_INFEED, "f32", 3, (int64_t)tm->depth * tm->spe, b, tm->label_dim);
    size_t kept = n;
    /* the gradient all-reduce's buffers must fit next to all of it (a
     * temporary of the step: checked here, released at once) */
    if (t->env.id->num_replicas > 1) {
        Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
        cs.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
        cs.count = model_num_params(tm->m);
        NAME("all-reduce of gradients (buffers)");
        REQ(HBM_OTHER, "u8", 1, (int64_t)coll_plan_bytes(&cs, (int)t->env.id->num_replicas));
    }
#undef REQ
#undef NAME
    if ((rc = hbm_alloc_program(h, req, n, ids, e)) != CODE_OK)
        return rc;
    for (size_t i = kept; i < n; i++)
        hbm_release(h, ids[i], e);
    memcpy(tm->ids, ids, kept * sizeof ids[0]);
    tm->nids = kept;
    return CODE_OK;
}

/* The optimizer's learning-rate schedule, checked: a bad one from the network
 * is an error naming the field, never a crash or a NaN update. */
static int sched_from_spec(const Tpuemu__OptimizerSpec *o, struct lr_schedule *s, err *e)
{
    char why[200];
    memset(s, 0, sizeof *s);
    if (o->schedule == 0)
        return CODE_OK;
    if (o->schedule > LRS_COSINE)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "learning-rate schedule %u is not none (0), ExponentialDecay (1), PiecewiseConstantDecay (2) "
                       "or CosineDecay (3)", o->schedule);
    s->kind = (enum lrs_kind)o->schedule;
    s->initial = o->initial_learning_rate;
    s->decay_steps = o->decay_steps;
    s->decay_rate = o->decay_rate;
    s->staircase = o->staircase;
    s->alpha = o->alpha;
    s->has_warmup = o->has_warmup_target;
    s->warmup_target = o->warmup_target;
    s->warmup_steps = o->warmup_steps;
    if (s->kind == LRS_PIECEWISE) {
        if (o->n_boundaries < 1 || o->n_boundaries > LRS_MAX_BOUNDARIES || o->n_values != o->n_boundaries + 1)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "PiecewiseConstantDecay: %zu boundaries and %zu values; give 1 to %d boundaries and one "
                           "value more", o->n_boundaries, o->n_values, LRS_MAX_BOUNDARIES);
        s->nbounds = o->n_boundaries;
        for (size_t i = 0; i < o->n_boundaries; i++)
            s->bounds[i] = o->boundaries[i];
        for (size_t i = 0; i < o->n_values; i++)
            s->values[i] = o->values[i];
    }
    if (lrs_check(s, why, sizeof why) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s", why);
    return CODE_OK;
}

static int cfg_from_spec(const Tpuemu__ModelSpec *sp, struct model_cfg *cfg, err *e)
{
    int rc;
    memset(cfg, 0, sizeof *cfg);
    if (sp->n_layers < 1 || sp->n_layers > MODEL_MAX_LAYERS)
        return err_set(e, CODE_INVALID_ARGUMENT, "a model has 1..%d layers, not %zu", MODEL_MAX_LAYERS,
                       sp->n_layers);
    if (!sp->optimizer)
        return err_set(e, CODE_INVALID_ARGUMENT, "the model has no optimizer");
    if (sp->input_dim < 1 || sp->input_dim > MODEL_MAX_UNITS)
        return err_set(e, CODE_INVALID_ARGUMENT, "input_dim %u is outside 1..%d", sp->input_dim, MODEL_MAX_UNITS);
    cfg->in_dim = (int)sp->input_dim;
    cfg->nlayers = (int)sp->n_layers;
    for (size_t l = 0; l < sp->n_layers; l++) {
        const Tpuemu__LayerSpec *ls = sp->layers[l];
        struct lspec *k = &cfg->kind[l];
        if ((unsigned)ls->activation > TPUEMU__ACTIVATION__ACTIVATION_SWISH)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: activation %d is unknown", l, (int)ls->activation);
        if ((unsigned)ls->kind > LK_LAST)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: kind %d is unknown", l, (int)ls->kind);
        if (ls->kernel_h > 64 || ls->kernel_w > 64 || ls->stride_h > 64 || ls->stride_w > 64)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: window (%u, %u) or strides (%u, %u) above 64", l,
                           ls->kernel_h, ls->kernel_w, ls->stride_h, ls->stride_w);
        if (ls->n_target_shape > LSHAPE_MAX_RANK)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: a target shape of %zu dimensions (at most %d)", l,
                           ls->n_target_shape, LSHAPE_MAX_RANK);
        k->kind = (enum lkind)ls->kind;
        k->kh = (int)ls->kernel_h, k->kw = (int)ls->kernel_w;
        k->sh = (int)ls->stride_h, k->sw = (int)ls->stride_w;
        k->same = ls->padding_same;
        k->rate = ls->rate;
        if (ls->input_dim > LSHAPE_MAX_SIZE || ls->num_heads > 256 || ls->key_dim > 4096 || ls->value_dim > 4096 ||
            ls->add_from >= MODEL_MAX_LAYERS)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "layer %zu: input_dim %u, num_heads %u, key_dim %u, value_dim %u or Add's layer %u is out "
                           "of range",
                           l, ls->input_dim, ls->num_heads, ls->key_dim, ls->value_dim, ls->add_from);
        k->vocab = (int)ls->input_dim;
        k->positions = ls->positions;
        k->heads = (int)ls->num_heads;
        k->key_dim = (int)ls->key_dim;
        k->value_dim = (int)ls->value_dim;
        k->from = (int)ls->add_from;
        k->epsilon = ls->epsilon;
        k->synchronized = ls->synchronized;
        k->momentum = ls->momentum;
        k->target.rank = (int)ls->n_target_shape;
        for (size_t i = 0; i < ls->n_target_shape; i++) {
            if (ls->target_shape[i] < 1 || ls->target_shape[i] > LSHAPE_MAX_SIZE)
                return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: target dimension %zu is %u", l, i,
                               ls->target_shape[i]);
            k->target.d[i] = (int)ls->target_shape[i];
        }
        if (k->kind == LK_EMBEDDING)
            cfg->units[l] = (int)(ls->units > MODEL_MAX_UNITS ? 0 : ls->units); /* output_dim; checked by model_new */
        if (k->kind == LK_DENSE || k->kind == LK_CONV2D) {
            if (ls->units < 1 || ls->units > MODEL_MAX_UNITS)
                return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: units %u is outside 1..%d", l, ls->units,
                               MODEL_MAX_UNITS);
            cfg->units[l] = (int)ls->units;
            cfg->act[l] = (enum model_act)ls->activation;
        }
    }
    if (sp->n_input_shape > LSHAPE_MAX_RANK)
        return err_set(e, CODE_INVALID_ARGUMENT, "an input shape of %zu dimensions (at most %d)", sp->n_input_shape,
                       LSHAPE_MAX_RANK);
    cfg->in_shape.rank = (int)sp->n_input_shape;
    for (size_t i = 0; i < sp->n_input_shape; i++) {
        if (sp->input_shape[i] < 1 || sp->input_shape[i] > MODEL_MAX_UNITS)
            return err_set(e, CODE_INVALID_ARGUMENT, "input shape dimension %zu is %u, outside 1..%d", i,
                           sp->input_shape[i], MODEL_MAX_UNITS);
        cfg->in_shape.d[i] = (int)sp->input_shape[i];
    }
    if ((unsigned)sp->loss > TPUEMU__LOSS__LOSS_MEAN_SQUARED_ERROR)
        return err_set(e, CODE_INVALID_ARGUMENT, "loss %d is unknown", (int)sp->loss);
    cfg->loss = (enum model_loss)sp->loss;
    if (sp->optimizer->kind > 1)
        return err_set(e, CODE_INVALID_ARGUMENT, "optimizer %u is neither SGD (0) nor Adam (1)", sp->optimizer->kind);
    cfg->opt.kind = sp->optimizer->kind ? OPT_ADAM : OPT_SGD;
    cfg->opt.learning_rate = sp->optimizer->learning_rate;
    cfg->opt.momentum = sp->optimizer->momentum;
    cfg->opt.nesterov = sp->optimizer->nesterov;
    cfg->opt.beta_1 = sp->optimizer->beta_1;
    cfg->opt.beta_2 = sp->optimizer->beta_2;
    cfg->opt.epsilon = sp->optimizer->epsilon;
    if ((rc = sched_from_spec(sp->optimizer, &cfg->opt.sched, e)) != CODE_OK)
        return rc;
    cfg->deterministic = sp->deterministic;
    cfg->remat = sp->gradient_checkpointing;
    cfg->from_logits = sp->from_logits;
    cfg->precision = sp->mixed_bfloat16 ? MODEL_MIXED_BF16 : MODEL_FLOAT32;
    cfg->seed = sp->seed;
    if (sp->batch_per_core < 1 || sp->batch_per_core > (1u << 20))
        return err_set(e, CODE_INVALID_ARGUMENT, "batch_per_core %u is outside 1..%u", sp->batch_per_core, 1u << 20);
    cfg->max_rows = (int)sp->batch_per_core;
    if (sp->infeed_depth < 1 || sp->infeed_depth > TRAIN_MAX_DEPTH)
        return err_set(e, CODE_INVALID_ARGUMENT, "infeed_depth %u is outside 1..%d", sp->infeed_depth,
                       TRAIN_MAX_DEPTH);
    if (sp->steps_per_execution < 1 || sp->steps_per_execution > TRAIN_MAX_STEPS)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps_per_execution %u is outside 1..%d",
                       sp->steps_per_execution, TRAIN_MAX_STEPS);
    if (sp->loss != TPUEMU__LOSS__LOSS_SPARSE_CATEGORICAL_CROSSENTROPY &&
        sp->label_dim != sp->layers[sp->n_layers - 1]->units)
        return err_set(e, CODE_INVALID_ARGUMENT, "label_dim %u differs from the last layer's %u units",
                       sp->label_dim, sp->layers[sp->n_layers - 1]->units);
    return CODE_OK;
}

/* Same layers, input and optimizer: a recompile keeps the variables. */
static int same_shape(const struct model_cfg *a, const struct model_cfg *b)
{
    if (a->in_dim != b->in_dim || a->nlayers != b->nlayers || a->opt.kind != b->opt.kind ||
        (a->opt.momentum > 0) != (b->opt.momentum > 0))
        return 0;
    for (int l = 0; l < a->nlayers; l++)
        if (a->units[l] != b->units[l] || memcmp(&a->kind[l], &b->kind[l], sizeof a->kind[l]))
            return 0;
    if (memcmp(&a->in_shape, &b->in_shape, sizeof a->in_shape))
        return 0;
    return 1;
}

void tm_flush_update(struct tmodel *tm)
{
    if (tm && tm->pending) {
        model_apply_gradients(tm->m, tm->pending_scale);
        tm->pending = 0;
    }
}

int tm_compile(struct train *t, struct treq *r, err *e)
{
    const Tpuemu__ModelSpec *sp = r->spec;
    struct model_cfg cfg;
    struct tmodel *tm, *old = t->tm;
    int rc;

    if ((rc = cfg_from_spec(sp, &cfg, e)) != CODE_OK)
        return rc;
    /* each replica drops its own units, as under TPUStrategy */
    cfg.dropout_salt = (uint64_t)(int64_t)t->env.id->replica_id;
    if (!(tm = calloc(1, sizeof *tm)) || !(tm->spec = tm_spec_copy(sp))) {
        free(tm);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the model");
    }
    tm->id = sp->model_id;
    tm->in_dim = cfg.in_dim;
    tm->nlayers = cfg.nlayers;
    tm->out_dim = cfg.units[cfg.nlayers - 1];   /* the last layer is a Dense on (features) */
    tm->sparse = cfg.loss == LOSS_SPARSE_CCE;
    tm->label_dim = tm->sparse ? 1 : (int)sp->label_dim;
    tm->batch = cfg.max_rows;
    tm->depth = (int)sp->infeed_depth;
    tm->spe = (int)sp->steps_per_execution;
    tm->bf16_in = cfg.precision == MODEL_MIXED_BF16 && lspec_input_bf16(cfg.kind, cfg.nlayers);
    if ((rc = model_new(&tm->m, &cfg, t->u, e)) != CODE_OK) {
        tm_free(tm);
        return rc;
    }
    if (t->env.id->num_replicas >= 2) /* synchronized BatchNormalization's sums */
        model_set_allreduce(tm->m, sync_allreduce, t);
    keep_infeed_heap(tm);
    if (old)
        release_blocks(t, old);
    if ((rc = charge(t, tm, &cfg, sp, e)) != CODE_OK) {
        err ignored;
        if (rc == CODE_RESOURCE_EXHAUSTED && !strncmp(e->msg, "XLA:", 4)) { /* XLA's report leads, as on a TPU */
            char xla[ERR_MSG_MAX];
            snprintf(xla, sizeof xla, "%s", e->msg);
            err_set(e, rc, "%.*s\n(compiling the model on core %s/%d, per-core batch %d)", ERR_MSG_MAX - 96, xla,
                    t->env.id->host_id, t->env.id->core, tm->batch);
        } else
            err_prefix(e, "core %s/%d (per-core batch %d)", t->env.id->host_id, t->env.id->core, tm->batch);
        if (old && charge(t, old, model_config(old->m), old->spec, &ignored) != CODE_OK)
            log_warn("previous model lost its HBM charge", "reason=%s", log_q(ignored.msg));
        tm_free(tm);
        return rc;
    }
    if (old && old->id == tm->id && same_shape(model_config(old->m), &cfg)) {
        /* the same model at a new batch size: its variables carry over */
        size_t np = model_num_params(old->m);
        tm_flush_update(old);
        memcpy(model_params(tm->m), model_params(old->m), np * sizeof(float));
        for (int s = 0; s < model_opt_num_slots(old->m) && s < model_opt_num_slots(tm->m); s++)
            memcpy(model_opt_slot(tm->m, s), model_opt_slot(old->m, s), np * sizeof(float));
        model_set_opt_iterations(tm->m, model_opt_iterations(old->m));
    }
    tm_free(old);
    t->tm = tm;
    log_info("model compiled", "model=%" PRIu64 " layers=%d params=%zu batch_per_core=%d mixed_bf16=%d deterministic=%d "
             "lr_schedule=%s hbm_used=%" PRIu64, tm->id, tm->nlayers, model_num_params(tm->m), tm->batch,
             (int)sp->mixed_bfloat16, (int)sp->deterministic, lrs_name(cfg.opt.sched.kind), t->env.hbm->used);
    return CODE_OK;
}

