/* The model math of one emulated core (contract in model.h): Dense layers on
 * the matrix unit, activations, losses and their gradients, SGD and Adam.
 *
 * Every buffer a step needs is allocated at model_new for max_rows rows; a
 * step never allocates. Results depend on the inputs and the seed only: no
 * threads, no fast-math, every float sum runs in a fixed order, so replicas
 * given the same reduced gradients stay bitwise identical. */
#include "model.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "bf16.h"
#include "detmath.h"
#include "norm.h"

#define MODEL_MAX_ROWS (1 << 20)
#define CLIP_LO 1e-7f           /* Keras' backend epsilon */
#define CLIP_HI (1.0f - 1e-7f)

struct layer {
    enum lkind kind;
    int in, units;              /* the matmul's K and N: Dense inputs and units; Conv2D kh*kw*channels and filters */
    int outer;                  /* matmul rows per example: Dense positions (1 on a (features) input); Conv2D
                                   output pixels */
    enum model_act act;
    size_t w, b;                /* offsets of kernel and bias in the parameter array */
    struct lshape ish, osh;     /* input and output shape per example */
    size_t isz, osz;            /* their sizes */
    struct lspec spec;
    struct lgeom g;
    int alias;                  /* Flatten, Reshape: a is the input itself (no copy) */
    int ckpt;                   /* its output is kept for the backward pass (always, without remat) */
    float *a;                   /* activations of the last forward, max_rows x osz */
    float *col;                 /* Conv2D: the last forward's patches (im2col), max_rows*outer x in */
    float *mask;                /* Dropout: the last training forward's mask (0 or 1/(1-rate)) */
    uint32_t *arg;              /* MaxPooling2D: which input element each output took, per example */
    float *pre;                 /* gelu, softplus, swish: the pre-activations, max_rows x osz */
    attn *att;                  /* MultiHeadAttention: its buffers (attention.c) */
    float *dskip;               /* Add: the gradient its other operand gets, kept until the backward pass
                                   reaches that operand's layer */
    size_t s;                   /* offset of the non-trainable statistics (BatchNormalization) */
    int nc;                     /* LayerNormalization, BatchNormalization: features on the last axis */
    float *xhat;                /* their normalized inputs, max_rows x osz */
    float *nst;                 /* LN: 1/sqrt(var + eps) per position; BN: mean, variance and that per channel,
                                   then (synchronized) the count over the replicas */
    float *sbuf;                /* synchronized BN: what it sums over the replicas (2 x channels + 2) */
    /* The last forward's bfloat16-rounded input (max_rows x in) and kernel
     * (in x units), kept for the backward matmuls when the model rounds its
     * operands itself (see preround); NULL in float32 models. */
    float *ar, *wr;
};

struct model {
    struct model_cfg cfg;
    mxu *u;
    mxu_precision prec;
    unsigned tile;
    struct layer layer[MODEL_MAX_LAYERS];
    size_t nparams;
    float *params, *grads;
    float *slots;               /* nslots x nparams */
    int nslots;
    uint64_t iterations;
    const float *x;             /* the last forward's input (the caller's, borrowed) */
    float *d0, *d1;             /* backward ping-pong, max_rows x widest layer */
    float *dcol;                /* Conv2D backward: the patches' gradient, the largest col */
    int training;               /* Dropout drops */
    uint64_t pass;              /* the Dropout pass of the last forward (a recompute redraws its masks) */
    uint64_t remat_calls;       /* layer forwards recomputed in backward passes */
    uint64_t drop_calls;        /* training forward passes: Dropout's masks differ per pass */
    int out_rows;               /* rows of the last forward's outputs, -1 if none */
    int fresh;                  /* that forward ran on the current weights */
    int rounded;                /* that forward kept its rounded operands (preround) */
    double mm_seconds;
    uint64_t mm_calls;
    struct model_rec *rec;      /* the profiler's records of this pass, or NULL */
    model_allreduce_fn sync_fn; /* synchronized BatchNormalization's sums over the replicas */
    void *sync_ctx;
    size_t rec_cap, rec_n;
};

static void bn_stats_out(model *m, const struct layer *L, int rows);

static const char *const act_names[] = {"linear", "relu", "softmax", "tanh", "sigmoid", "gelu", "softplus", "swish"};
static const char *const loss_names[] = {"sparse_categorical_crossentropy", "categorical_crossentropy",
                                         "mean_squared_error"};
static const char *const opt_names[] = {"sgd", "adam"};

const char *model_act_name(enum model_act a)
{
    return (unsigned)a < sizeof act_names / sizeof *act_names ? act_names[a] : "unknown";
}

const char *model_loss_name(enum model_loss l)
{
    return (unsigned)l < sizeof loss_names / sizeof *loss_names ? loss_names[l] : "unknown";
}

const char *model_opt_name(enum model_opt o)
{
    return (unsigned)o < sizeof opt_names / sizeof *opt_names ? opt_names[o] : "unknown";
}

static int positive_finite(float v)
{
    return v > 0.0f && isfinite(v);
}

static struct lshape in_shape(const struct model_cfg *c)
{
    struct lshape s = {1, {c->in_dim, 0, 0}};
    return c->in_shape.rank ? c->in_shape : s;
}

static int check_cfg(const struct model_cfg *c, err *e)
{
    const struct model_opt_cfg *o = &c->opt;
    int last;

    if (c->in_dim < 1 || c->in_dim > MODEL_MAX_UNITS)
        return err_set(e, CODE_INVALID_ARGUMENT, "in_dim %d is outside 1..%d", c->in_dim, MODEL_MAX_UNITS);
    if (c->nlayers < 1 || c->nlayers > MODEL_MAX_LAYERS)
        return err_set(e, CODE_INVALID_ARGUMENT, "nlayers %d is outside 1..%d", c->nlayers, MODEL_MAX_LAYERS);
    if (c->in_shape.rank != 0) {
        if (c->in_shape.rank < 1 || c->in_shape.rank > LSHAPE_MAX_RANK)
            return err_set(e, CODE_INVALID_ARGUMENT, "in_shape has %d dimensions, not 1..%d", c->in_shape.rank,
                           LSHAPE_MAX_RANK);
        for (int i = 0; i < c->in_shape.rank; i++)
            if (c->in_shape.d[i] < 1 || c->in_shape.d[i] > MODEL_MAX_UNITS)
                return err_set(e, CODE_INVALID_ARGUMENT, "in_shape dimension %d is %d, outside 1..%d", i,
                               c->in_shape.d[i], MODEL_MAX_UNITS);
        if (lshape_size(&c->in_shape) != (size_t)c->in_dim)
            return err_set(e, CODE_INVALID_ARGUMENT, "in_shape holds %zu floats, but in_dim is %d",
                           lshape_size(&c->in_shape), c->in_dim);
    }
    for (int l = 0; l < c->nlayers; l++) {
        enum lkind k = c->kind[l].kind;
        if ((unsigned)k > LK_LAST)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: kind %d is unknown", l, (int)k);
        if (k == LK_EMBEDDING && l != 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: Embedding takes token ids: it must be the first layer",
                           l);
        if (k == LK_ADD && !(c->kind[l].from >= 0 && c->kind[l].from < l))
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "layer %d: Add takes the input of a layer before it, not of layer "
                           "%d",
                           l, c->kind[l].from);
        if (k != LK_DENSE && k != LK_CONV2D) {
            if (c->act[l] != ACT_LINEAR)
                return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: %s takes no activation", l, lkind_name(k));
            continue;
        }
        if (c->units[l] < 1 || c->units[l] > MODEL_MAX_UNITS)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: units %d is outside 1..%d", l, c->units[l],
                           MODEL_MAX_UNITS);
        if ((unsigned)c->act[l] > ACT_LAST)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "layer %d: activation %d is not linear (0), relu (1), softmax (2), tanh (3), "
                           "sigmoid (4), gelu (5), softplus (6) or swish (7)",
                           l, (int)c->act[l]);
    }
    for (int l = 0; l < c->nlayers; l++)
        if (c->kind[l].synchronized && (c->kind[l].kind != LK_BATCH_NORM || c->remat))
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: %s", l,
                           c->kind[l].kind != LK_BATCH_NORM
                               ? "only BatchNormalization is synchronized"
                               : "synchronized BatchNormalization does not run with gradient checkpointing (its "
                                 "recomputed statistics would need the replicas' sums again)");
    if ((unsigned)c->loss > LOSS_MSE)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "loss %d is not sparse_categorical_crossentropy (0), categorical_crossentropy (1) or "
                       "mean_squared_error (2)", (int)c->loss);
    {
        struct lshape sh = in_shape(c), ins[MODEL_MAX_LAYERS];
        struct lgeom g;
        char why[200];
        for (int l = 0; l < c->nlayers; l++) {
            struct lspec sp = c->kind[l];
            sp.units = c->units[l];
            sp.act = (int)c->act[l];
            ins[l] = sh;
            if (lshape_apply(&sp, &sh, &g, why, sizeof why) != 0)
                return err_set(e, CODE_INVALID_ARGUMENT, "layer %d: %s", l, why);
            if (sp.kind == LK_ADD && memcmp(&ins[sp.from], &sh, sizeof sh) != 0) {
                char a[64], b[64];
                lshape_format(&ins[sp.from], a, sizeof a);
                lshape_format(&sh, b, sizeof b);
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "layer %d: Add needs inputs of one shape, but layer %d "
                               "takes %s and this one %s",
                               l, sp.from, a, b);
            }
            sh = g.out;
        }
        if (c->kind[c->nlayers - 1].kind != LK_DENSE || sh.rank != 1) {
            char os[64];
            lshape_format(&sh, os, sizeof os);
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "the last layer (%d) must be a Dense with a (units) output, not %s with output %s: add "
                           "Flatten or GlobalAveragePooling2D and a Dense", c->nlayers - 1,
                           lkind_name(c->kind[c->nlayers - 1].kind), os);
        }
    }
    last = c->units[c->nlayers - 1];
    if (c->loss != LOSS_MSE && last < 2)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "loss %s needs at least 2 classes, but the last layer (%d) has %d unit(s)",
                       model_loss_name(c->loss), c->nlayers - 1, last);
    if ((unsigned)o->kind > OPT_ADAM)
        return err_set(e, CODE_INVALID_ARGUMENT, "opt.kind %d is not sgd (0) or adam (1)", (int)o->kind);
    if (o->sched.kind != LRS_CONSTANT) {
        char why[160];
        if (lrs_check(&o->sched, why, sizeof why) != 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "opt.sched: %s", why);
    } else if (!positive_finite(o->learning_rate))
        return err_set(e, CODE_INVALID_ARGUMENT, "opt.learning_rate %g is not a finite number above 0",
                       (double)o->learning_rate);
    if (o->kind == OPT_SGD && !(o->momentum >= 0.0f && o->momentum <= 1.0f))
        return err_set(e, CODE_INVALID_ARGUMENT, "opt.momentum %g is outside [0, 1]", (double)o->momentum);
    if (o->kind == OPT_ADAM) {
        if (!(o->beta_1 >= 0.0f && o->beta_1 < 1.0f))
            return err_set(e, CODE_INVALID_ARGUMENT, "opt.beta_1 %g is outside [0, 1)", (double)o->beta_1);
        if (!(o->beta_2 >= 0.0f && o->beta_2 < 1.0f))
            return err_set(e, CODE_INVALID_ARGUMENT, "opt.beta_2 %g is outside [0, 1)", (double)o->beta_2);
        if (!positive_finite(o->epsilon))
            return err_set(e, CODE_INVALID_ARGUMENT, "opt.epsilon %g is not a finite number above 0",
                           (double)o->epsilon);
    }
    if ((unsigned)c->precision > MODEL_MIXED_BF16)
        return err_set(e, CODE_INVALID_ARGUMENT, "precision %d is not float32 (0) or mixed_bfloat16 (1)",
                       (int)c->precision);
    if (c->max_rows < 1 || c->max_rows > MODEL_MAX_ROWS)
        return err_set(e, CODE_INVALID_ARGUMENT, "max_rows %d is outside 1..%d", c->max_rows, MODEL_MAX_ROWS);
    if (c->mxu_tile > 4096)
        return err_set(e, CODE_INVALID_ARGUMENT, "mxu_tile %u is outside 1..4096 (0 means 128)", c->mxu_tile);
    return CODE_OK;
}

/* calloc of a x b floats, NULL on overflow too */
static float *floats(size_t a, size_t b)
{
    if (b && a > SIZE_MAX / sizeof(float) / b)
        return NULL;
    return calloc(a * b > 0 ? a * b : 1, sizeof(float));
}

int model_new(model **out, const struct model_cfg *cfg, mxu *u, err *e)
{
    model *m;
    size_t rows, widest = 0, off = 0, dcol = 0;
    int rc;

    *out = NULL;
    if (!cfg || !u)
        return err_set(e, CODE_INVALID_ARGUMENT, "model: missing %s", cfg ? "matrix unit" : "config");
    if ((rc = check_cfg(cfg, e)) != CODE_OK)
        return rc;
    if (!(m = calloc(1, sizeof *m)))
        goto oom;
    m->cfg = *cfg;
    m->u = u;
    m->prec = cfg->precision == MODEL_MIXED_BF16 ? MXU_DEFAULT : MXU_HIGHEST;
    m->tile = cfg->mxu_tile ? cfg->mxu_tile : 128;
    rows = (size_t)cfg->max_rows;
    struct lshape sh = in_shape(cfg);
    for (int l = 0; l < cfg->nlayers; l++) {
        struct layer *L = &m->layer[l];
        char why[200];
        L->spec = cfg->kind[l];
        L->spec.units = cfg->units[l];
        L->spec.act = (int)cfg->act[l];
        L->kind = L->spec.kind;
        (void)lshape_apply(&L->spec, &sh, &L->g, why, sizeof why);   /* checked above */
        L->ish = sh;
        L->osh = L->g.out;
        L->isz = lshape_size(&L->ish);
        L->osz = lshape_size(&L->osh);
        sh = L->osh;
        L->act = cfg->act[l];
        L->units = cfg->units[l];
        L->w = off;
        L->b = off + L->g.kernel;
        L->s = L->b + L->g.bias;
        off = L->s + L->g.stats;
        if (L->isz > widest)
            widest = L->isz;
        if (L->osz > widest)
            widest = L->osz;
        switch (L->kind) {
        case LK_DENSE:
            L->in = L->ish.d[L->ish.rank - 1];
            L->outer = (int)(L->isz / (size_t)L->in);
            break;
        case LK_CONV2D:
            L->in = L->spec.kh * L->spec.kw * L->ish.d[2];
            L->outer = L->osh.d[0] * L->osh.d[1];
            if (!(L->col = floats(rows * (size_t)L->outer, (size_t)L->in)))
                goto oom;
            if ((size_t)L->outer * (size_t)L->in > dcol)
                dcol = (size_t)L->outer * (size_t)L->in;
            break;
        case LK_FLATTEN:
        case LK_RESHAPE:
            L->alias = 1;
            break;
        case LK_DROPOUT:
            if (!(L->mask = floats(rows, L->osz)))
                goto oom;
            break;
        case LK_MAX_POOL2D:
            if (!(L->arg = calloc(rows * L->osz, sizeof *L->arg)))
                goto oom;
            break;
        case LK_EMBEDDING:
            L->in = L->spec.vocab;
            L->outer = L->ish.d[0];
            break;
        case LK_MULTI_HEAD_ATTENTION:
            L->in = L->units = L->ish.d[1];
            L->outer = L->ish.d[0];
            if (!(L->att = attn_new(&L->spec, &L->ish, cfg->max_rows)))
                goto oom;
            break;
        case LK_ADD:
            if (!(L->dskip = floats(rows, L->osz)))
                goto oom;
            break;
        case LK_LAYER_NORM:
        case LK_BATCH_NORM:
            L->nc = L->ish.d[L->ish.rank - 1];
            if (!(L->xhat = floats(rows, L->osz)) ||
                !(L->nst = L->kind == LK_LAYER_NORM ? floats(rows, L->osz / (size_t)L->nc)
                                                    : floats(3 * (size_t)L->nc + 1, 1)) ||
                (L->spec.synchronized && !(L->sbuf = floats(2 * (size_t)L->nc + 2, 1))))
                goto oom;
            break;
        default:
            break;
        }
        if (!L->alias && !(L->a = floats(rows, L->osz)))
            goto oom;
        if (L->act >= ACT_GELU && !(L->pre = floats(rows, L->osz)))
            goto oom;
        if (L->kind == LK_DENSE && m->prec == MXU_DEFAULT &&
            (!(L->ar = floats(rows, L->isz)) || !(L->wr = floats((size_t)L->in, (size_t)L->units))))
            goto oom;
        if (L->kind == LK_CONV2D && m->prec == MXU_DEFAULT && !(L->wr = floats((size_t)L->in, (size_t)L->units)))
            goto oom;
    }
    /* gradient checkpointing: segments of ceil(sqrt(n)) layers; each one's
     * last output is kept, the others are recomputed in the backward pass */
    {
        int seg = 1;
        while (seg * seg < cfg->nlayers)
            seg++;
        for (int l = 0; l < cfg->nlayers; l++)
            m->layer[l].ckpt = !cfg->remat || (l + 1) % seg == 0 || l == cfg->nlayers - 1;
    }
    m->nparams = off;
    m->nslots = cfg->opt.kind == OPT_ADAM ? 2 : cfg->opt.momentum != 0.0f ? 1 : 0;
    if (!(m->params = floats(off, 1)) || !(m->grads = floats(off, 1)) ||
        (m->nslots && !(m->slots = floats(off, (size_t)m->nslots))) ||
        !(m->d0 = floats(rows, widest)) ||
        !(m->d1 = floats(rows, widest)) || (dcol && !(m->dcol = floats(rows, dcol))))
        goto oom;
    model_init_weights(m, cfg->seed);
    *out = m;
    return CODE_OK;
oom:
    model_free(m);
    return err_set(e, CODE_RESOURCE_EXHAUSTED,
                   "out of host memory for a model of %d layers at max_rows %d (parameters, optimizer "
                   "slots and activations); use a smaller model or per-core batch",
                   cfg->nlayers, cfg->max_rows);
}

void model_free(model *m)
{
    if (!m)
        return;
    for (int l = 0; l < MODEL_MAX_LAYERS; l++) {
        if (!m->layer[l].alias)
            free(m->layer[l].a);
        free(m->layer[l].col);
        free(m->layer[l].mask);
        free(m->layer[l].arg);
        free(m->layer[l].pre);
        attn_free(m->layer[l].att);
        free(m->layer[l].dskip);
        free(m->layer[l].xhat);
        free(m->layer[l].nst);
        free(m->layer[l].sbuf);
        free(m->layer[l].ar);
        free(m->layer[l].wr);
    }
    free(m->params);
    free(m->grads);
    free(m->slots);
    free(m->d0);
    free(m->d1);
    free(m->dcol);
    free(m);
}

const struct model_cfg *model_config(const model *m)
{
    return &m->cfg;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void model_init_weights(model *m, uint64_t seed)
{
    for (int l = 0; l < m->cfg.nlayers; l++) {
        const struct layer *L = &m->layer[l];
        size_t n = L->g.kernel;
        if (L->kind == LK_LAYER_NORM || L->kind == LK_BATCH_NORM) {
            /* gamma 1, beta 0; moving mean 0, moving variance 1 */
            for (size_t i = 0; i < n; i++)
                m->params[L->w + i] = 1.0f;
            memset(m->params + L->b, 0, L->g.bias * sizeof(float));
            for (size_t i = 0; i < L->g.stats; i++)
                m->params[L->s + i] = i < L->g.stats / 2 ? 0.0f : 1.0f;
            continue;
        }
        /* glorot's fans: Dense in, units; Conv2D receptive field x in and x out channels */
        double fan_in = L->in, fan_out = L->kind == LK_CONV2D ? (double)L->spec.kh * L->spec.kw * L->units : L->units;
        double lim = sqrt(6.0 / (fan_in + fan_out));
        /* value i of layer l is a function of (seed, l, i) alone */
        uint64_t key = splitmix64(seed ^ splitmix64((uint64_t)l << 56));
        float *w = m->params + L->w;
        if (L->kind == LK_EMBEDDING) {
            embed_init(w, n, key);
            continue;
        }
        if (L->kind == LK_MULTI_HEAD_ATTENTION) {
            attn_init(&L->spec, &L->ish, w, key);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            double r = (double)(splitmix64(key ^ (uint64_t)i) >> 11) * 0x1p-53;   /* [0, 1) */
            w[i] = (float)((2.0 * r - 1.0) * lim);
        }
        memset(m->params + L->b, 0, L->g.bias * sizeof(float));
    }
    m->drop_calls = 0;
    memset(m->grads, 0, m->nparams * sizeof(float));
    if (m->nslots)
        memset(m->slots, 0, (size_t)m->nslots * m->nparams * sizeof(float));
    m->iterations = 0;
    m->out_rows = -1;
    m->fresh = 0;
}

size_t model_num_params(const model *m)
{
    return m->nparams;
}

float *model_params(model *m)
{
    return m->params;
}

float *model_grads(model *m)
{
    return m->grads;
}

size_t model_kernel_offset(const model *m, int l)
{
    return m->layer[l].w;
}

size_t model_bias_offset(const model *m, int l)
{
    return m->layer[l].b;
}

int model_opt_num_slots(const model *m)
{
    return m->nslots;
}

float *model_opt_slot(model *m, int i)
{
    return i >= 0 && i < m->nslots ? m->slots + (size_t)i * m->nparams : NULL;
}

uint64_t model_opt_iterations(const model *m)
{
    return m->iterations;
}

void model_set_opt_iterations(model *m, uint64_t it)
{
    m->iterations = it;
}

uint64_t model_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void model_set_recorder(model *m, struct model_rec *buf, size_t cap)
{
    m->rec = buf;
    m->rec_cap = buf ? cap : 0;
    m->rec_n = 0;
}

size_t model_recorded(const model *m)
{
    return m->rec_n;
}

static void rec_add(model *m, enum model_rec_kind kind, int layer, int op, int64_t M, int64_t N, int64_t K,
                    uint64_t t0, uint64_t t1)
{
    struct model_rec *r;
    if (m->rec_n >= m->rec_cap)
        return;
    r = &m->rec[m->rec_n++];
    r->kind = kind;
    r->layer = layer;
    r->op = op;
    r->m = M;
    r->n = N;
    r->k = K;
    r->t0 = t0;
    r->t1 = t1;
    r->bytes = 0;
}

/* exact_a, exact_b: that operand is already rounded to bfloat16 (mxu.h) */
static int matmul(model *m, int layer, int which, int64_t M, int64_t N, int64_t K, int ta, int tb,
                  const float *a, int exact_a, const float *b, int exact_b, float *c, err *e)
{
    struct mxu_op op = {M, N, K, ta, tb, 0, exact_a, exact_b};
    struct mxu_stats st;
    uint64_t t0 = m->rec ? model_now_ns() : 0;
    int rc = m->cfg.deterministic ? mxu_matmul_fixed(m->u, m->prec, &op, a, b, c, &st, e)
                                  : mxu_matmul(m->u, m->prec, &op, a, b, c, &st, e);
    if (rc == CODE_OK) {
        m->mm_seconds += st.seconds;
        m->mm_calls++;
        if (m->rec)
            rec_add(m, MODEL_REC_MATMUL, layer, which, M, N, K, t0, model_now_ns());
    }
    return rc;
}

/* The sequence layers' matmuls (attention.h's seq_mm): batch products,
 * timed and counted each, recorded as one matmul of batch*M rows. */
struct seq_ctx {
    model *m;
    int layer;
};

static int seq_matmul(void *ctx, int op, int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb, const float *a,
                      int64_t sa, const float *b, int64_t sb, float *c, int64_t sc, int acc, err *e)
{
    struct seq_ctx *x = ctx;
    model *m = x->m;
    struct mxu_op mo = {M, N, K, ta, tb, acc, 0, 0};
    struct mxu_stats st;
    uint64_t t0 = m->rec ? model_now_ns() : 0;
    for (int64_t i = 0; i < batch; i++) {
        int rc = m->cfg.deterministic ? mxu_matmul_fixed(m->u, m->prec, &mo, a + i * sa, b + i * sb, c + i * sc, &st, e)
                                      : mxu_matmul(m->u, m->prec, &mo, a + i * sa, b + i * sb, c + i * sc, &st, e);
        if (rc != CODE_OK) {
            err_prefix(e, "layer %d (%s)", x->layer, lkind_name(m->layer[x->layer].kind));
            return rc;
        }
        m->mm_seconds += st.seconds;
        m->mm_calls++;
    }
    if (m->rec)
        rec_add(m, MODEL_REC_MATMUL, x->layer, op, batch * M, N, K, t0, model_now_ns());
    return CODE_OK;
}

/* z = act(z + b), row by row: one pass over the matmul's output. */
static void activate(float *z, const float *b, int rows, int n, enum model_act act, int det)
{
    float (*ex)(float) = det ? det_expf : expf, (*th)(float) = det ? det_tanhf : tanhf;
    for (int r = 0; r < rows; r++) {
        float *restrict v = z + (size_t)r * (size_t)n;
        switch (act) {
        case ACT_LINEAR:
            for (int j = 0; j < n; j++)
                v[j] += b[j];
            break;
        case ACT_RELU:
            for (int j = 0; j < n; j++) {
                float s = v[j] + b[j];
                v[j] = s < 0.0f ? 0.0f : s;   /* NaN stays NaN */
            }
            break;
        case ACT_TANH:
            for (int j = 0; j < n; j++)
                v[j] = th(v[j] + b[j]);
            break;
        case ACT_SIGMOID:
            for (int j = 0; j < n; j++)
                v[j] = 1.0f / (1.0f + ex(-(v[j] + b[j])));
            break;
        case ACT_SOFTMAX: {
            float mx, sum = 0.0f;
            for (int j = 0; j < n; j++)
                v[j] += b[j];
            mx = v[0];
            for (int j = 1; j < n; j++)
                mx = v[j] > mx ? v[j] : mx;
            for (int j = 0; j < n; j++) {
                v[j] = ex(v[j] - mx);
                sum += v[j];
            }
            for (int j = 0; j < n; j++)
                v[j] /= sum;
            break;
        }
        default: /* the others: actx_forward */
            break;
        }
    }
}

/* d = dL/da -> dL/dz in place, from the activations a = act(z). */
static void act_backward(float *d, const float *a, int rows, int n, enum model_act act)
{
    size_t len = (size_t)rows * (size_t)n;
    float *restrict g = d;
    const float *restrict y = a;

    switch (act) {
    case ACT_LINEAR:
        break;
    case ACT_RELU:
        for (size_t i = 0; i < len; i++)
            g[i] = y[i] > 0.0f ? g[i] : 0.0f;
        break;
    case ACT_TANH:
        for (size_t i = 0; i < len; i++)
            g[i] *= 1.0f - y[i] * y[i];
        break;
    case ACT_SIGMOID:
        for (size_t i = 0; i < len; i++)
            g[i] *= y[i] * (1.0f - y[i]);
        break;
    case ACT_SOFTMAX:
        for (int r = 0; r < rows; r++) {
            float *restrict gr = g + (size_t)r * (size_t)n;
            const float *restrict yr = y + (size_t)r * (size_t)n;
            float s = 0.0f;
            for (int j = 0; j < n; j++)
                s += gr[j] * yr[j];
            for (int j = 0; j < n; j++)
                gr[j] = (gr[j] - s) * yr[j];
        }
        break;
    default: /* the others: actx_backward */
        break;
    }
}

static float clip(float p)
{
    return p < CLIP_LO ? CLIP_LO : p > CLIP_HI ? CLIP_HI : p;
}

static int in_clip(float p)
{
    return p >= CLIP_LO && p <= CLIP_HI;   /* tf.clip_by_value passes the gradient at the bounds */
}

static int argmax(const float *v, int n)
{
    int k = 0;
    for (int j = 1; j < n; j++)
        if (v[j] > v[k])
            k = j;
    return k;
}

/* One row's loss of output p against its label, and with g (not NULL) the
 * gradient: dL/dz when fused (softmax last layer, cross-entropy), dL/dp
 * otherwise. */
static float row_loss(enum model_loss loss, int fused, const float *restrict p, int n, const float *restrict y,
                      int cls, float *restrict g, int det)
{
    float (*lg)(float) = det ? det_logf : logf;
    float s = 0.0f;

    switch (loss) {
    case LOSS_SPARSE_CCE: {
        float cy = clip(p[cls]);
        for (int j = 0; j < n; j++)
            s += clip(p[j]);
        if (g && fused) {
            for (int j = 0; j < n; j++)
                g[j] = p[j];
            g[cls] -= 1.0f;
        } else if (g) {
            float inv = 1.0f / s;
            for (int j = 0; j < n; j++)
                g[j] = in_clip(p[j]) ? inv : 0.0f;
            if (in_clip(p[cls]))
                g[cls] -= 1.0f / cy;
        }
        return lg(s) - lg(cy);
    }
    case LOSS_CCE: {
        float l = 0.0f, h = 0.0f;
        for (int j = 0; j < n; j++)
            s += p[j];
        for (int j = 0; j < n; j++) {
            float q = p[j] / s, c = clip(q);
            l -= y[j] * lg(c);
            if (g && !fused) {
                g[j] = in_clip(q) ? -y[j] / c : 0.0f;   /* dL/dq */
                h += g[j] * q;
            }
        }
        if (g && fused) {
            for (int j = 0; j < n; j++)
                g[j] = p[j] - y[j];
        } else if (g) {
            for (int j = 0; j < n; j++)   /* through q = p / sum(p) */
                g[j] = (g[j] - h) / s;
        }
        return l;
    }
    case LOSS_MSE: {
        float inv = 1.0f / (float)n;
        for (int j = 0; j < n; j++) {
            float d = p[j] - y[j];
            s += d * d;
            if (g)
                g[j] = 2.0f * d * inv;
        }
        return s / (float)n;
    }
    }
    return 0.0f;
}

/* The loss over the last forward's outputs; with dz, the last layer's dL/dz. */
static int loss_pass(model *m, const void *y, int rows, struct model_metrics *out, float *dz, err *e)
{
    const struct layer *L = &m->layer[m->cfg.nlayers - 1];
    enum model_loss loss = m->cfg.loss;
    int logits = m->cfg.from_logits && loss != LOSS_MSE;
    int n = L->units, fused = loss != LOSS_MSE && L->act == ACT_SOFTMAX && !logits;
    const int32_t *ids = y;
    const float *yf = y;
    struct model_metrics mt = {0, 0, rows};

    if (m->out_rows < 0)
        return err_set(e, CODE_FAILED_PRECONDITION, "model: no forward pass since the weights were initialized");
    if (rows != m->out_rows)
        return err_set(e, CODE_INVALID_ARGUMENT, "model: %d rows of labels for a forward pass over %d rows", rows,
                       m->out_rows);
    if (dz && !m->fresh)
        return err_set(e, CODE_FAILED_PRECONDITION,
                       "model: backward needs a forward pass on the current weights (they changed since)");
    if (rows > 0 && !y)
        return err_set(e, CODE_INVALID_ARGUMENT, "model: missing labels for %d rows", rows);
    if (loss == LOSS_SPARSE_CCE)
        for (int r = 0; r < rows; r++)
            if (ids[r] < 0 || ids[r] >= n)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "row %d: class id %d is outside 0..%d (the last layer has %d units)", r,
                               (int)ids[r], n - 1, n);
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * (size_t)n;
        const float *p = L->a + o, *yr = loss == LOSS_SPARSE_CCE ? NULL : yf + o;
        int cls = loss == LOSS_SPARSE_CCE ? ids[r] : 0;
        if (logits)
            mt.loss_sum += (double)logits_row_loss(loss, p, n, yr, cls, dz ? dz + o : NULL, m->cfg.deterministic);
        else
            mt.loss_sum += (double)row_loss(loss, fused, p, n, yr, cls, dz ? dz + o : NULL, m->cfg.deterministic);
        if (loss == LOSS_SPARSE_CCE)
            mt.correct += argmax(p, n) == cls;
        else if (loss == LOSS_CCE)
            mt.correct += argmax(p, n) == argmax(yr, n);
    }
    if (dz && !fused && L->act >= ACT_GELU)
        actx_backward(dz, L->pre, (size_t)rows * (size_t)n, L->act, m->cfg.deterministic);
    else if (dz && !fused)
        act_backward(dz, L->a, rows, n, L->act);
    if (out)
        *out = mt;
    return CODE_OK;
}

/* ---- the layers without a matmul of their own, and Conv2D's patches ----
 * Shapes are NHWC per example (layershape.h); every loop runs in a fixed
 * order, so the results do not depend on the host. */

/* Conv2D's patches: col[(r, oy, ox), (ky, kx, c)] = x[r, oy*sh + ky - pt, ox*sw + kx - pl, c]
 * (0 in the padding): the kernel's (kh, kw, in, out) layout read as a
 * (kh*kw*in) x out matrix multiplies it. */
static void im2col(const struct layer *L, const float *x, int rows, float *col)
{
    int H = L->ish.d[0], W = L->ish.d[1], C = L->ish.d[2], OH = L->osh.d[0], OW = L->osh.d[1];
    int kh = L->spec.kh, kw = L->spec.kw;
    size_t rowlen = (size_t)kw * (size_t)C;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * L->isz;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float *p = col + (((size_t)r * (size_t)OH + (size_t)oy) * (size_t)OW + (size_t)ox) * (size_t)L->in;
                for (int ky = 0; ky < kh; ky++) {
                    int iy = oy * L->g.sh + ky - L->g.pad_top;
                    float *q = p + (size_t)ky * rowlen;
                    if (iy < 0 || iy >= H) {
                        memset(q, 0, rowlen * sizeof *q);
                        continue;
                    }
                    for (int kx = 0; kx < kw; kx++) {
                        int ix = ox * L->g.sw + kx - L->g.pad_left;
                        if (ix < 0 || ix >= W)
                            memset(q + (size_t)kx * (size_t)C, 0, (size_t)C * sizeof *q);
                        else
                            memcpy(q + (size_t)kx * (size_t)C, xr + ((size_t)iy * (size_t)W + (size_t)ix) * (size_t)C,
                                   (size_t)C * sizeof *q);
                    }
                }
            }
    }
}

/* The input gradient from the patches' gradient: each patch element adds
 * back into the pixel it came from. dx is overwritten. */
static void col2im(const struct layer *L, const float *dcol, int rows, float *dx)
{
    int H = L->ish.d[0], W = L->ish.d[1], C = L->ish.d[2], OH = L->osh.d[0], OW = L->osh.d[1];
    int kh = L->spec.kh, kw = L->spec.kw;
    memset(dx, 0, (size_t)rows * L->isz * sizeof *dx);
    for (int r = 0; r < rows; r++) {
        float *xr = dx + (size_t)r * L->isz;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                const float *p =
                    dcol + (((size_t)r * (size_t)OH + (size_t)oy) * (size_t)OW + (size_t)ox) * (size_t)L->in;
                for (int ky = 0; ky < kh; ky++) {
                    int iy = oy * L->g.sh + ky - L->g.pad_top;
                    if (iy < 0 || iy >= H)
                        continue;
                    for (int kx = 0; kx < kw; kx++) {
                        int ix = ox * L->g.sw + kx - L->g.pad_left;
                        const float *q = p + ((size_t)ky * (size_t)kw + (size_t)kx) * (size_t)C;
                        float *t = xr + ((size_t)iy * (size_t)W + (size_t)ix) * (size_t)C;
                        if (ix < 0 || ix >= W)
                            continue;
                        for (int c = 0; c < C; c++)
                            t[c] += q[c];
                    }
                }
            }
    }
}

/* Max and average pooling, forward (y; max also records in arg which input
 * element won) or backward (dy -> dx, dx overwritten). Max: the first
 * maximum of the window in scan order takes the gradient (TensorFlow's
 * MaxPoolGrad); padding never wins. Average: over the window's pixels inside
 * the input (TensorFlow's "same" excludes the padding). Channels innermost,
 * as NHWC lays them out. */
static void pool(const struct layer *L, const float *x, int rows, float *y, const float *dy, float *dx)
{
    int H = L->ish.d[0], W = L->ish.d[1], C = L->ish.d[2], OH = L->osh.d[0], OW = L->osh.d[1];
    int mx = L->kind == LK_MAX_POOL2D;
    uint32_t *arg = L->arg;
    if (dx)
        memset(dx, 0, (size_t)rows * L->isz * sizeof *dx);
    if (dx && mx) {   /* scatter to the recorded winners */
        for (int r = 0; r < rows; r++) {
            const float *g = dy + (size_t)r * L->osz;
            const uint32_t *ar = arg + (size_t)r * L->osz;
            float *d = dx + (size_t)r * L->isz;
            for (size_t i = 0; i < L->osz; i++)
                d[ar[i]] += g[i];
        }
        return;
    }
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * L->isz;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                int y0 = oy * L->g.sh - L->g.pad_top, x0 = ox * L->g.sw - L->g.pad_left;
                int y1 = y0 + L->spec.kh, x1 = x0 + L->spec.kw;
                size_t o = (((size_t)r * (size_t)OH + (size_t)oy) * (size_t)OW + (size_t)ox) * (size_t)C;
                y0 = y0 < 0 ? 0 : y0, x0 = x0 < 0 ? 0 : x0;
                y1 = y1 > H ? H : y1, x1 = x1 > W ? W : x1;
                float cnt = (float)((y1 - y0) * (x1 - x0));
                if (y) {
                    float *restrict yo = y + o;
                    uint32_t *restrict ao = mx ? arg + o : NULL;
                    size_t first = ((size_t)y0 * (size_t)W + (size_t)x0) * (size_t)C;
                    memcpy(yo, xr + first, (size_t)C * sizeof *yo);
                    if (mx)
                        for (int c = 0; c < C; c++)
                            ao[c] = (uint32_t)(first + (size_t)c);
                    for (int iy = y0; iy < y1; iy++)
                        for (int ix = x0; ix < x1; ix++) {
                            size_t p = ((size_t)iy * (size_t)W + (size_t)ix) * (size_t)C;
                            const float *restrict xp = xr + p;
                            if (p == first)
                                continue;
                            if (mx) {
                                for (int c = 0; c < C; c++)
                                    if (xp[c] > yo[c])
                                        yo[c] = xp[c], ao[c] = (uint32_t)(p + (size_t)c);
                            } else
                                for (int c = 0; c < C; c++)
                                    yo[c] += xp[c];
                        }
                    if (!mx)
                        for (int c = 0; c < C; c++)
                            yo[c] /= cnt;
                } else {
                    const float *restrict go = dy + o;
                    for (int iy = y0; iy < y1; iy++)
                        for (int ix = x0; ix < x1; ix++) {
                            float *restrict dp = dx + (size_t)r * L->isz + ((size_t)iy * (size_t)W + (size_t)ix) * (size_t)C;
                            for (int c = 0; c < C; c++)
                                dp[c] += go[c] / cnt;
                        }
                }
            }
    }
}

/* GlobalAveragePooling2D: the mean over height and width, forward or backward. */
static void gap(const struct layer *L, const float *x, int rows, float *y, const float *dy, float *dx)
{
    size_t C = (size_t)L->ish.d[L->ish.rank - 1], hw = L->isz / C; /* 2D: h*w pixels; 1D: steps */
    float inv = 1.0f / (float)hw;
    for (int r = 0; r < rows; r++) {
        if (y) {
            const float *xr = x + (size_t)r * L->isz;
            float *yr = y + (size_t)r * C;
            memset(yr, 0, C * sizeof *yr);
            for (size_t p = 0; p < hw; p++)
                for (size_t c = 0; c < C; c++)
                    yr[c] += xr[p * C + c];
            for (size_t c = 0; c < C; c++)
                yr[c] /= (float)hw;
        } else {
            const float *g = dy + (size_t)r * C;
            float *d = dx + (size_t)r * L->isz;
            for (size_t p = 0; p < hw; p++)
                for (size_t c = 0; c < C; c++)
                    d[p * C + c] = g[c] * inv;
        }
    }
}

/* Dropout: a fresh mask per training pass, from (seed, salt, pass, layer,
 * element) alone; kept units scaled by 1/(1 - rate) as Keras does. */
static void dropout(model *m, int l, const float *x, int rows, uint64_t pass)
{
    struct layer *L = &m->layer[l];
    size_t n = (size_t)rows * L->osz;
    float rate = L->spec.rate, keep = 1.0f / (1.0f - rate);
    uint64_t key = splitmix64(m->cfg.seed ^ splitmix64(m->cfg.dropout_salt ^ splitmix64(pass)) ^
                              ((uint64_t)l << 48));
    for (size_t i = 0; i < n; i++) {
        double r = (double)(splitmix64(key ^ (uint64_t)i) >> 11) * 0x1p-53;
        L->mask[i] = r < (double)rate ? 0.0f : keep;
        L->a[i] = x[i] * L->mask[i];
    }
}

void model_set_allreduce(model *m, model_allreduce_fn fn, void *ctx)
{
    m->sync_fn = fn;
    m->sync_ctx = ctx;
}

int model_sync_calls(const model *m)
{
    int n = 0;
    for (int l = 0; l < m->cfg.nlayers; l++)
        n += m->layer[l].kind == LK_BATCH_NORM && m->layer[l].spec.synchronized ? 3 : 0;
    return n;
}

/* A replica without rows in a training step still joins the synchronized
 * layers' sums, with zeros, in the order the others make them: forward
 * (the sums and count, then the squared deviations) layer by layer, or
 * backward (the gradient's sums) from the last layer down. */
static int sync_idle(model *m, int forward, err *e)
{
    for (int k = 0; k < m->cfg.nlayers; k++) {
        int l = forward ? k : m->cfg.nlayers - 1 - k;
        struct layer *L = &m->layer[l];
        size_t C = (size_t)L->nc;
        if (L->kind != LK_BATCH_NORM || !L->spec.synchronized || !m->sync_fn)
            continue;
        for (int call = 0; call < (forward ? 2 : 1); call++) {
            size_t n = !forward ? 2 * C : call == 0 ? C + 2 : C;
            memset(L->sbuf, 0, (2 * C + 2) * sizeof *L->sbuf);
            if (m->sync_fn(m->sync_ctx, L->sbuf, n, e)) {
                err_prefix(e, "layer %d %s (no rows here)", l, forward ? "forward" : "backward");
                return e->code;
            }
        }
    }
    return CODE_OK;
}

void model_set_training(model *m, int training)
{
    m->training = training != 0;
}

uint64_t model_dropout_pass(const model *m)
{
    return m->drop_calls;
}

void model_set_dropout_pass(model *m, uint64_t pass)
{
    m->drop_calls = pass;
}

/* Whether the model rounds its matmuls' operands to bfloat16 itself, once a
 * step, instead of the matrix unit rounding them at every matmul: the layer's
 * input and kernel are each used by two matmuls (forward, then the weight- and
 * input-gradient ones), and a product of the same rounded values has the same
 * bits. Only where the unit rounds in float32 (the widened kernel, the
 * portable one): a native bf16 kernel converts its operands anyway. */
static int preround(const model *m)
{
    return m->prec == MXU_DEFAULT && (m->cfg.deterministic || !mxu_bf16_native(m->u));
}

/* What a layer without matmuls moves through memory in a pass, for the
 * profiler's roofline: its input read and output written (forward), and
 * the output's gradient read and the input's written (backward); views and
 * layers with matmuls 0. */
static uint64_t elementwise_bytes(const struct layer *L, int rows, int forward)
{
    (void)forward;
    if (L->kind == LK_DENSE || L->kind == LK_CONV2D || L->kind == LK_MULTI_HEAD_ATTENTION || L->alias)
        return 0;
    return (uint64_t)rows * (uint64_t)(L->isz + L->osz) * sizeof(float);
}

/* Layer l's forward pass over rows rows of its input in (recompute: again,
 * in a backward pass, with the forward's Dropout masks). */
static int forward_layer(model *m, int l, const float *in, int rows, int recompute, err *e)
{
    struct layer *L = &m->layer[l];
    uint64_t t0 = m->rec ? model_now_ns() : 0;
    const float *a = in, *w;
    int M = rows * L->outer, rc;
    w = m->params + L->w;
    switch (L->kind) {
    case LK_DENSE:
    case LK_CONV2D:
        if (L->kind == LK_CONV2D) {
            im2col(L, in, rows, L->col);
            if (m->rounded)
                bf16_round_n(L->col, L->col, (size_t)M * (size_t)L->in);
            a = L->col;
        } else if (m->rounded) { /* once here, for the backward matmuls too */
            bf16_round_n(L->ar, in, (size_t)M * (size_t)L->in);
            a = L->ar;
        }
        if (m->rounded) {
            bf16_round_n(L->wr, w, (size_t)L->in * (size_t)L->units);
            w = L->wr;
        }
        if ((rc = matmul(m, l, 0, M, L->units, L->in, 0, 0, a, m->rounded, w, m->rounded, L->a, e)) != CODE_OK) {
            err_prefix(e, "layer %d forward", l);
            return rc;
        }
        if (L->act >= ACT_GELU)
            actx_forward(L->a, m->params + L->b, M, L->units, L->act, m->cfg.deterministic, L->pre);
        else
            activate(L->a, m->params + L->b, M, L->units, L->act, m->cfg.deterministic);
        break;
    case LK_FLATTEN:
    case LK_RESHAPE:
        L->a = (float *)(uintptr_t)in;   /* the same floats; never written through */
        break;
    case LK_DROPOUT:
        if (m->training && L->spec.rate > 0.0f)
            dropout(m, l, in, rows, m->pass);
        else
            memcpy(L->a, in, (size_t)rows * L->osz * sizeof *L->a);
        break;
    case LK_MAX_POOL2D:
    case LK_AVG_POOL2D:
        pool(L, in, rows, L->a, NULL, NULL);
        break;
    case LK_GLOBAL_AVG_POOL2D:
    case LK_GLOBAL_AVG_POOL1D:
        gap(L, in, rows, L->a, NULL, NULL);
        break;
    case LK_EMBEDDING:
        if ((rc = embed_forward(&L->spec, &L->ish, w, in, rows, L->a, e)) != CODE_OK)
            return rc;
        break;
    case LK_MULTI_HEAD_ATTENTION: {
        struct seq_ctx cx = {m, l};
        struct seq_mm mm = {seq_matmul, &cx, m->cfg.deterministic};
        if ((rc = attn_forward(L->att, &mm, w, in, rows, L->a, e)) != CODE_OK) {
            err_prefix(e, "layer %d forward", l);
            return rc;
        }
        break;
    }
    case LK_ADD: {
        const float *o = L->spec.from ? m->layer[L->spec.from - 1].a : m->x;
        for (size_t i = 0, n = (size_t)rows * L->osz; i < n; i++)
            L->a[i] = in[i] + o[i];
        break;
    }
    case LK_LAYER_NORM:
        ln_forward(in, (size_t)rows * (L->osz / (size_t)L->nc), L->nc, L->spec.epsilon, w, m->params + L->b, L->a,
                   L->xhat, L->nst);
        break;
    case LK_BATCH_NORM:
        if (L->spec.synchronized && m->training) {
            if (bn_forward_sync(in, (size_t)rows * (L->osz / (size_t)L->nc), L->nc, L->spec.epsilon, w,
                                m->params + L->b, L->a, L->xhat, L->nst, L->sbuf, m->sync_fn, m->sync_ctx, e)) {
                err_prefix(e, "layer %d forward (the batch statistics over the replicas)", l);
                return e->code;
            }
            break;
        }
        bn_forward(in, (size_t)rows * (L->osz / (size_t)L->nc), L->nc, L->spec.epsilon, m->training, w,
                   m->params + L->b, m->params + L->s, m->params + L->s + L->nc, L->a, L->xhat, L->nst);
        break;
    }
    if (recompute)
        m->remat_calls++;
    if (m->rec) {
        size_t n0 = m->rec_n;
        rec_add(m, MODEL_REC_FORWARD, l, recompute, M, L->units, L->in, t0, model_now_ns());
        if (m->rec_n > n0)
            m->rec[n0].bytes = elementwise_bytes(L, rows, 1);
    }
    return CODE_OK;
}

int model_forward(model *m, const float *x, int rows, float *out, err *e)
{
    const float *in = x;
    const struct layer *L = NULL;
    int rc;

    m->out_rows = -1;
    m->fresh = 0;
    if (rows < 0 || rows > m->cfg.max_rows)
        return err_set(e, CODE_INVALID_ARGUMENT, "model: %d rows is outside 0..%d (max_rows)", rows,
                       m->cfg.max_rows);
    if (rows > 0 && !x)
        return err_set(e, CODE_INVALID_ARGUMENT, "model: missing input for %d rows", rows);
    m->x = x;
    m->rounded = preround(m);
    m->pass = m->drop_calls;
    if (rows == 0 && m->training && (rc = sync_idle(m, 1, e)) != CODE_OK)
        return rc;
    for (int l = 0; l < m->cfg.nlayers && rows > 0; l++) {
        L = &m->layer[l];
        if ((rc = forward_layer(m, l, in, rows, 0, e)) != CODE_OK)
            return rc;
        in = L->a;
    }
    if (m->training)
        m->drop_calls++;
    if (out && L)
        memcpy(out, L->a, (size_t)rows * L->osz * sizeof *out);
    m->out_rows = rows;
    m->fresh = 1;
    return CODE_OK;
}

int model_metrics_of(model *m, const void *y, int rows, struct model_metrics *out, err *e)
{
    return loss_pass(m, y, rows, out, NULL, e);
}

/* db = column sums of d (rows x n), in row order */
static void colsum(const float *d, int rows, int n, float *restrict db)
{
    memcpy(db, d, (size_t)n * sizeof *db);
    for (int r = 1; r < rows; r++) {
        const float *restrict dr = d + (size_t)r * (size_t)n;
        for (int j = 0; j < n; j++)
            db[j] += dr[j];
    }
}

/* Layers a0..b forward again from layer a0's input (a kept output or x). */
static int remat_segment(model *m, int a0, int b, int rows, err *e)
{
    for (int l = a0; l <= b; l++) {
        int rc = forward_layer(m, l, l ? m->layer[l - 1].a : m->x, rows, 1, e);
        if (rc != CODE_OK) {
            err_prefix(e, "recomputing layer %d", l);
            return rc;
        }
    }
    return CODE_OK;
}

int model_layer_checkpointed(const model *m, int l)
{
    return m->layer[l].ckpt;
}

uint64_t model_remat_calls(const model *m)
{
    return m->remat_calls;
}

int model_backward(model *m, const void *y, int rows, struct model_metrics *out, err *e)
{
    float *d = m->d0;
    int rc;

    if ((rc = loss_pass(m, y, rows, out, m->d0, e)) != CODE_OK)
        return rc;
    if (rows == 0) {
        memset(m->grads, 0, m->nparams * sizeof(float));
        return m->training ? sync_idle(m, 0, e) : CODE_OK;
    }
    /* d: the gradient of layer l's output before its activation */
    for (int l = m->cfg.nlayers - 1; l >= 0; l--) {
        const struct layer *L = &m->layer[l];
        const float *xin = l ? m->layer[l - 1].a : m->x;
        const float *w = m->rounded ? L->wr : m->params + L->w;
        float *dn;
        uint64_t t0;
        int M = rows * L->outer;
        if (m->cfg.remat && L->ckpt && l < m->cfg.nlayers - 1) {
            /* rematerialization: this segment's activations were not kept;
             * compute them again from the last kept output */
            int a0 = l;
            while (a0 > 0 && !m->layer[a0 - 1].ckpt)
                a0--;
            if ((rc = remat_segment(m, a0, l, rows, e)) != CODE_OK)
                return rc;
        }
        dn = d == m->d0 ? m->d1 : m->d0;
        t0 = m->rec ? model_now_ns() : 0;
        switch (L->kind) {
        case LK_DENSE: {
            const float *ain = m->rounded ? L->ar : xin;
            /* dW = a_in^T . dZ; db = column sums of dZ; dA_in = dZ . W^T */
            if ((rc = matmul(m, l, 1, L->in, L->units, M, 1, 0, ain, m->rounded, d, 0, m->grads + L->w, e)) !=
                    CODE_OK ||
                (l > 0 && (rc = matmul(m, l, 2, M, L->in, L->units, 0, 1, d, 0, w, m->rounded, dn, e)) != CODE_OK)) {
                err_prefix(e, "layer %d backward", l);
                return rc;
            }
            colsum(d, M, L->units, m->grads + L->b);
            break;
        }
        case LK_CONV2D:
            /* the same three products over the patches; the patches'
             * gradient folds back onto the input pixels */
            if ((rc = matmul(m, l, 1, L->in, L->units, M, 1, 0, L->col, m->rounded, d, 0, m->grads + L->w, e)) !=
                    CODE_OK ||
                (l > 0 && (rc = matmul(m, l, 2, M, L->in, L->units, 0, 1, d, 0, w, m->rounded, m->dcol, e)) != CODE_OK)) {
                err_prefix(e, "layer %d backward", l);
                return rc;
            }
            colsum(d, M, L->units, m->grads + L->b);
            if (l > 0)
                col2im(L, m->dcol, rows, dn);
            break;
        case LK_FLATTEN:
        case LK_RESHAPE:
            dn = d;   /* the same floats in another shape */
            break;
        case LK_DROPOUT:
            if (m->training && L->spec.rate > 0.0f)
                for (size_t i = 0, n = (size_t)rows * L->osz; i < n; i++)
                    d[i] *= L->mask[i];
            dn = d;
            break;
        case LK_MAX_POOL2D:
        case LK_AVG_POOL2D:
            if (l > 0)
                pool(L, xin, rows, NULL, d, dn);
            break;
        case LK_GLOBAL_AVG_POOL2D:
        case LK_GLOBAL_AVG_POOL1D:
            if (l > 0)
                gap(L, xin, rows, NULL, d, dn);
            break;
        case LK_LAYER_NORM:
            ln_backward(d, L->xhat, L->nst, (size_t)rows * (L->osz / (size_t)L->nc), L->nc, m->params + L->w,
                        m->grads + L->w, m->grads + L->b, l > 0 ? dn : NULL);
            break;
        case LK_BATCH_NORM:
            if (L->spec.synchronized && m->training) {
                if (bn_backward_sync(d, L->xhat, L->nst, (size_t)rows * (L->osz / (size_t)L->nc), L->nc,
                                     m->params + L->w, m->grads + L->w, m->grads + L->b, l > 0 ? dn : NULL, L->sbuf,
                                     m->sync_fn, m->sync_ctx, e)) {
                    err_prefix(e, "layer %d backward (the gradient's sums over the replicas)", l);
                    return e->code;
                }
                bn_stats_out(m, L, rows);
                break;
            }
            bn_backward(d, L->xhat, L->nst, (size_t)rows * (L->osz / (size_t)L->nc), L->nc, m->training,
                        m->params + L->w, m->grads + L->w, m->grads + L->b, l > 0 ? dn : NULL);
            bn_stats_out(m, L, rows);
            break;
        case LK_EMBEDDING:
            embed_backward(&L->spec, &L->ish, xin, rows, d, m->grads + L->w);
            break;
        case LK_MULTI_HEAD_ATTENTION: {
            struct seq_ctx cx = {m, l};
            struct seq_mm mm = {seq_matmul, &cx, m->cfg.deterministic};
            if ((rc = attn_backward(L->att, &mm, m->params + L->w, xin, rows, d, m->grads + L->w, l > 0 ? dn : NULL,
                                    e)) != CODE_OK) {
                err_prefix(e, "layer %d backward", l);
                return rc;
            }
            break;
        }
        case LK_ADD: /* both operands get the gradient; the other one when the pass reaches it */
            memcpy(L->dskip, d, (size_t)rows * L->osz * sizeof *d);
            dn = d;
            break;
        }
        /* the gradients of Add layers whose other operand is this layer's input */
        for (int j = l + 1; l > 0 && j < m->cfg.nlayers; j++)
            if (m->layer[j].kind == LK_ADD && m->layer[j].spec.from == l)
                for (size_t i = 0, n = (size_t)rows * L->isz; i < n; i++)
                    dn[i] += m->layer[j].dskip[i];
        if (l > 0) {
            const struct layer *P = &m->layer[l - 1];
            if (P->act >= ACT_GELU)
                actx_backward(dn, P->pre, (size_t)rows * P->osz, P->act, m->cfg.deterministic);
            else
                act_backward(dn, P->a, rows * P->outer, (int)(P->osz / (size_t)(P->outer ? P->outer : 1)), P->act);
            d = dn;
        }
        if (m->rec) {
            size_t n0 = m->rec_n;
            rec_add(m, MODEL_REC_BACKWARD, l, 0, M, L->units, L->in, t0, model_now_ns());
            if (m->rec_n > n0)
                m->rec[n0].bytes = elementwise_bytes(L, rows, 0);
        }
    }
    return CODE_OK;
}

/* BatchNormalization's moving statistics ride in the gradient all-reduce:
 * backward writes each channel's batch mean and variance times the shard's
 * rows into their places in model_grads (the moving values themselves after
 * an inference forward), so after the SUM over the replicas and the scale
 * 1/global_rows they hold the replicas' statistics averaged by rows, the
 * same on every replica; the update then moves the moving statistics toward
 * them as Keras does (var -= (var - value) (1 - momentum)) and zeroes those
 * places, so the optimizer leaves the statistics alone (a zero gradient
 * changes no weight under SGD, momentum or Adam). */
static void bn_stats_out(model *m, const struct layer *L, int rows)
{
    float *g = m->grads + L->s;
    for (size_t c = 0; c < 2 * (size_t)L->nc; c++)
        g[c] = (m->training ? L->nst[c] : m->params[L->s + c]) * (float)rows;
}

static void bn_stats_update(model *m, float scale)
{
    for (int l = 0; l < m->cfg.nlayers; l++) {
        const struct layer *L = &m->layer[l];
        float decay = 1.0f - L->spec.momentum;
        if (L->kind != LK_BATCH_NORM)
            continue;
        for (size_t i = L->s; i < L->s + L->g.stats; i++) {
            m->params[i] -= (m->params[i] - m->grads[i] * scale) * decay;
            m->grads[i] = 0.0f;
        }
    }
}

size_t model_stats_count(const model *m, int l, size_t *offset)
{
    if (offset)
        *offset = m->layer[l].s;
    return m->layer[l].g.stats;
}

/* b^t by squaring in double: the same bits on every machine (pow() need not be). */
static double powu(double b, uint64_t t)
{
    double r = 1.0;
    for (; t; t >>= 1, b *= b)
        if (t & 1)
            r *= b;
    return r;
}

/* The update loops, compiled for AVX-512, AVX2 and baseline x86-64 and
 * picked at load time: they only add, multiply, divide and take square
 * roots, each correctly rounded at every vector width, and model.c is built
 * with -ffp-contract=off, so every clone gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define UPDATE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define UPDATE_CLONES
#endif

UPDATE_CLONES
static void sgd(float *restrict w, const float *restrict g, size_t n, float lr, float scale)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * (g[i] * scale);
}

UPDATE_CLONES
static void momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n, float lr,
                     float scale, float mu, int nesterov)
{
    if (nesterov) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * scale, vi = mu * v[i] - lr * gi;
            v[i] = vi;
            w[i] += mu * vi - lr * gi;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float vi = mu * v[i] - lr * (g[i] * scale);
            v[i] = vi;
            w[i] += vi;
        }
    }
}

UPDATE_CLONES
static void adam(float *restrict w, float *restrict mm, float *restrict vv, const float *restrict g, size_t n,
                 float lr_t, float scale, float b1, float b2, float eps)
{
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * scale;
        float mi = b1 * mm[i] + c1 * gi;
        float vi = b2 * vv[i] + c2 * (gi * gi);
        mm[i] = mi;
        vv[i] = vi;
        w[i] -= lr_t * mi / (sqrtf(vi) + eps);
    }
}

float model_learning_rate(const model *m)
{
    const struct model_opt_cfg *o = &m->cfg.opt;
    return o->sched.kind == LRS_CONSTANT ? o->learning_rate : lrs_value(&o->sched, m->iterations);
}

void model_apply_gradients(model *m, float scale)
{
    const struct model_opt_cfg *o = &m->cfg.opt;
    size_t n = m->nparams;
    float lr = model_learning_rate(m);

    bn_stats_update(m, scale);
    if (o->kind == OPT_SGD && m->nslots == 0) {
        sgd(m->params, m->grads, n, lr, scale);
    } else if (o->kind == OPT_SGD) {
        momentum(m->params, m->slots, m->grads, n, lr, scale, o->momentum, o->nesterov);
    } else {
        uint64_t t = m->iterations + 1;
        float lr_t = (float)((double)lr * sqrt(1.0 - powu(o->beta_2, t)) / (1.0 - powu(o->beta_1, t)));
        adam(m->params, m->slots, m->slots + n, m->grads, n, lr_t, scale, o->beta_1, o->beta_2, o->epsilon);
    }
    m->iterations++;
    m->fresh = 0;
}

/* 2*M*N*K, and the same on the shape padded to the MXU (rows of the left
 * operand to 8, the rest to the tile; mxu_utilization's rule). */
static double flops(int64_t M, int64_t N, int64_t K, unsigned tile, double *padded)
{
    int64_t t = (int64_t)tile;
    *padded += 2.0 * (double)((M + 7) / 8 * 8) * (double)((N + t - 1) / t * t) * (double)((K + t - 1) / t * t);
    return 2.0 * (double)M * (double)N * (double)K;
}

/* A sequence layer's matmuls of a forward (train 0) or backward pass. */
static double seq_flops(const model *m, int l, int rows, int train, double *padded)
{
    const struct layer *L = &m->layer[l];
    struct seq_shape sh[16];
    double f = 0.0;
    int n;
    if (L->kind != LK_MULTI_HEAD_ATTENTION)
        return 0.0;
    n = attn_shapes(&L->spec, &L->ish, rows, train, l == 0, sh);
    for (int i = 0; i < n; i++) {
        double p = 0.0;
        f += (double)sh[i].batch * flops(sh[i].m, sh[i].n, sh[i].k, m->tile, &p);
        *padded += (double)sh[i].batch * p;
    }
    return f;
}

double model_forward_flops(const model *m, int rows, double *padded)
{
    double f = 0.0, p = 0.0;
    for (int l = 0; l < m->cfg.nlayers && rows > 0; l++)
        if (m->layer[l].kind == LK_DENSE || m->layer[l].kind == LK_CONV2D)
            f += flops((int64_t)rows * m->layer[l].outer, m->layer[l].units, m->layer[l].in, m->tile, &p);
        else
            f += seq_flops(m, l, rows, 0, &p);
    if (padded)
        *padded = p;
    return f;
}

double model_train_flops(const model *m, int rows, double *padded)
{
    double p = 0.0, f = model_forward_flops(m, rows, &p);
    /* rematerialization: every segment but the last runs forward twice */
    int last_seg = m->cfg.nlayers - 1;
    while (last_seg > 0 && !m->layer[last_seg - 1].ckpt)
        last_seg--;
    for (int l = 0; m->cfg.remat && l < last_seg && rows > 0; l++)
        if (m->layer[l].kind == LK_DENSE || m->layer[l].kind == LK_CONV2D)
            f += flops((int64_t)rows * m->layer[l].outer, m->layer[l].units, m->layer[l].in, m->tile, &p);
        else
            f += seq_flops(m, l, rows, 0, &p);
    for (int l = 0; l < m->cfg.nlayers && rows > 0; l++) {
        const struct layer *L = &m->layer[l];
        int64_t M = (int64_t)rows * L->outer;
        if (L->kind != LK_DENSE && L->kind != LK_CONV2D) {
            f += seq_flops(m, l, rows, 1, &p);
            continue;
        }
        f += flops(L->in, L->units, M, m->tile, &p);          /* dW */
        if (l > 0)
            f += flops(M, L->in, L->units, m->tile, &p);      /* dX */
    }
    if (padded)
        *padded = p;
    return f;
}

double model_matmul_seconds(const model *m)
{
    return m->mm_seconds;
}

uint64_t model_matmul_calls(const model *m)
{
    return m->mm_calls;
}

void model_reset_timers(model *m)
{
    m->mm_seconds = 0.0;
    m->mm_calls = 0;
}
