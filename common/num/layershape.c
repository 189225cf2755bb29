/* Keras' shape rules for the layers of a Sequential model (layershape.h). */
#include "layershape.h"

#include <stdio.h>
#include <string.h>

size_t lshape_size(const struct lshape *s)
{
    size_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= (size_t)s->d[i];
    return n;
}

void lshape_format(const struct lshape *s, char *buf, size_t n)
{
    size_t off = (size_t)snprintf(buf, n, "(None");
    for (int i = 0; i < s->rank && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, ", %d", s->d[i]);
    if (off < n)
        snprintf(buf + off, n - off, ")");
}

const char *lkind_name(enum lkind k)
{
    static const char *const n[LK_LAST + 1] = {"Dense",
                                               "Flatten",
                                               "Conv2D",
                                               "MaxPooling2D",
                                               "AveragePooling2D",
                                               "GlobalAveragePooling2D",
                                               "Dropout",
                                               "Reshape",
                                               "Embedding",
                                               "GlobalAveragePooling1D",
                                               "MultiHeadAttention",
                                               "Add",
                                               "LayerNormalization",
                                               "BatchNormalization"};
    return (unsigned)k <= LK_LAST ? n[k] : "unknown";
}

const char *lkind_prefix(enum lkind k)
{
    static const char *const n[LK_LAST + 1] = {"dense",
                                               "flatten",
                                               "conv2d",
                                               "max_pooling2d",
                                               "average_pooling2d",
                                               "global_average_pooling2d",
                                               "dropout",
                                               "reshape",
                                               "embedding",
                                               "global_average_pooling1d",
                                               "multi_head_attention",
                                               "add",
                                               "layer_normalization",
                                               "batch_normalization"};
    return (unsigned)k <= LK_LAST ? n[k] : "unknown";
}

/* out extent along one axis and the padding before it (TensorFlow's rule) */
static int axis(int in, int k, int s, int same, int *pad)
{
    int out;
    if (same) {
        int total;
        out = (in + s - 1) / s;
        total = (out - 1) * s + k - in;
        *pad = total > 0 ? total / 2 : 0;
    } else {
        out = in >= k ? (in - k) / s + 1 : 0;
        *pad = 0;
    }
    return out;
}

int lshape_apply(const struct lspec *s, const struct lshape *in, struct lgeom *g, char *why, size_t n)
{
    char is[64];
    size_t sz;
    memset(g, 0, sizeof *g);
    lshape_format(in, is, sizeof is);
    g->out = *in;
    switch (s->kind) {
    case LK_DENSE:
        if (s->units < 1 || s->units > LSHAPE_MAX_DIM)
            return snprintf(why, n, "Dense: units %d is outside 1..%d", s->units, LSHAPE_MAX_DIM), -1;
        g->out.d[in->rank - 1] = s->units;
        g->kernel = (size_t)in->d[in->rank - 1] * (size_t)s->units;
        g->bias = (size_t)s->units;
        break;
    case LK_FLATTEN:
        g->out.rank = 1;
        g->out.d[0] = (int)lshape_size(in);
        g->out.d[1] = g->out.d[2] = 0;
        break;
    case LK_RESHAPE:
        if (s->target.rank < 1 || s->target.rank > LSHAPE_MAX_RANK)
            return snprintf(why, n, "Reshape: a target shape has 1..%d dimensions, not %d", LSHAPE_MAX_RANK,
                            s->target.rank), -1;
        for (int i = 0; i < s->target.rank; i++)
            if (s->target.d[i] < 1 || s->target.d[i] > LSHAPE_MAX_SIZE)
                return snprintf(why, n, "Reshape: target dimension %d is %d, not a positive size", i,
                                s->target.d[i]), -1;
        if (lshape_size(&s->target) != lshape_size(in)) {
            char ts[64];
            lshape_format(&s->target, ts, sizeof ts);
            return snprintf(why, n, "Reshape: total size of the new array must be unchanged, input_shape = %s, "
                            "output_shape = %s", is, ts), -1;
        }
        g->out = s->target;
        break;
    case LK_DROPOUT:
        if (!(s->rate >= 0.0f && s->rate < 1.0f))
            return snprintf(why, n, "Dropout: rate %g is outside [0, 1)", (double)s->rate), -1;
        break;
    case LK_CONV2D:
    case LK_MAX_POOL2D:
    case LK_AVG_POOL2D: {
        int conv = s->kind == LK_CONV2D;
        if (in->rank != 3)
            return snprintf(why, n, "%s needs a (height, width, channels) input, not %s", lkind_name(s->kind), is),
                   -1;
        if (s->kh < 1 || s->kw < 1 || s->kh > 64 || s->kw > 64)
            return snprintf(why, n, "%s: %s (%d, %d) is outside 1..64", lkind_name(s->kind),
                            conv ? "kernel_size" : "pool_size", s->kh, s->kw), -1;
        g->sh = s->sh ? s->sh : conv ? 1 : s->kh;
        g->sw = s->sw ? s->sw : conv ? 1 : s->kw;
        if (g->sh < 1 || g->sw < 1 || g->sh > 64 || g->sw > 64)
            return snprintf(why, n, "%s: strides (%d, %d) are outside 1..64", lkind_name(s->kind), s->sh, s->sw),
                   -1;
        if (conv && (s->units < 1 || s->units > LSHAPE_MAX_DIM))
            return snprintf(why, n, "Conv2D: filters %d is outside 1..%d", s->units, LSHAPE_MAX_DIM), -1;
        g->out.d[0] = axis(in->d[0], s->kh, g->sh, s->same, &g->pad_top);
        g->out.d[1] = axis(in->d[1], s->kw, g->sw, s->same, &g->pad_left);
        if (g->out.d[0] < 1 || g->out.d[1] < 1)
            return snprintf(why, n, "%s: a (%d, %d) window with padding \"valid\" does not fit the input %s: "
                            "use padding \"same\" or a smaller window", lkind_name(s->kind), s->kh, s->kw, is), -1;
        if (conv) {
            g->out.d[2] = s->units;
            g->kernel = (size_t)s->kh * (size_t)s->kw * (size_t)in->d[2] * (size_t)s->units;
            g->bias = (size_t)s->units;
        }
        break;
    }
    case LK_GLOBAL_AVG_POOL2D:
        if (in->rank != 3)
            return snprintf(why, n, "GlobalAveragePooling2D needs a (height, width, channels) input, not %s", is),
                   -1;
        g->out.rank = 1;
        g->out.d[0] = in->d[2];
        g->out.d[1] = g->out.d[2] = 0;
        break;
    case LK_EMBEDDING:
        if (in->rank != 1)
            return snprintf(why, n, "Embedding needs a (sequence_length) input of token ids, not %s", is), -1;
        if (s->vocab < 1 || s->vocab > LSHAPE_MAX_SIZE)
            return snprintf(why, n, "Embedding: input_dim %d is outside 1..%d", s->vocab, LSHAPE_MAX_SIZE), -1;
        if (s->units < 1 || s->units > LSHAPE_MAX_DIM)
            return snprintf(why, n, "Embedding: output_dim %d is outside 1..%d", s->units, LSHAPE_MAX_DIM), -1;
        g->out.rank = 2;
        g->out.d[1] = s->units;
        g->kernel = (size_t)s->vocab * (size_t)s->units + (s->positions ? (size_t)in->d[0] * (size_t)s->units : 0);
        break;
    case LK_GLOBAL_AVG_POOL1D:
        if (in->rank != 2)
            return snprintf(why, n, "GlobalAveragePooling1D needs a (steps, features) input, not %s", is), -1;
        g->out.rank = 1;
        g->out.d[0] = in->d[1];
        g->out.d[1] = g->out.d[2] = 0;
        break;
    case LK_MULTI_HEAD_ATTENTION: {
        size_t f, hk, hv;
        if (in->rank != 2)
            return snprintf(why, n, "MultiHeadAttention needs a (sequence_length, features) input, not %s", is), -1;
        if (s->heads < 1 || s->heads > 256 || s->key_dim < 1 || s->key_dim > 4096 || s->value_dim < 0 ||
            s->value_dim > 4096)
            return snprintf(why, n,
                            "MultiHeadAttention: num_heads %d, key_dim %d or value_dim %d is outside "
                            "1..256, 1..4096 and 0..4096",
                            s->heads, s->key_dim, s->value_dim),
                   -1;
        f = (size_t)in->d[1];
        hk = (size_t)s->heads * (size_t)s->key_dim;
        hv = (size_t)s->heads * (size_t)(s->value_dim ? s->value_dim : s->key_dim);
        /* query, key, value and output kernels; their biases */
        g->kernel = 2 * f * hk + f * hv + hv * f;
        g->bias = 2 * hk + hv + f;
        break;
    }
    case LK_ADD: /* the other operand's shape is the model's to check */
        if (s->from < 0 || s->from >= LSHAPE_MAX_DIM)
            return snprintf(why, n, "Add: layer %d is not a layer before it", s->from), -1;
        break;
    case LK_LAYER_NORM:
    case LK_BATCH_NORM:
        /* over the last axis (Keras' axis=-1): gamma and beta per feature */
        if (!(s->epsilon > 0.0f && s->epsilon < 1e30f))
            return snprintf(why, n, "%s: epsilon %g is not a finite number above 0", lkind_name(s->kind),
                            (double)s->epsilon),
                   -1;
        if (s->kind == LK_BATCH_NORM && !(s->momentum >= 0.0f && s->momentum <= 1.0f))
            return snprintf(why, n, "BatchNormalization: momentum %g is outside [0, 1]", (double)s->momentum), -1;
        g->kernel = g->bias = (size_t)in->d[in->rank - 1];
        g->stats = s->kind == LK_BATCH_NORM ? 2 * g->kernel : 0;
        break;
    default:
        return snprintf(why, n, "layer kind %d is unknown", (int)s->kind), -1;
    }
    sz = lshape_size(&g->out);
    if (sz < 1 || sz > LSHAPE_MAX_SIZE) {
        char os[64];
        lshape_format(&g->out, os, sizeof os);
        return snprintf(why, n, "%s: its output %s holds %zu floats per example, more than %d",
                        lkind_name(s->kind), os, sz, LSHAPE_MAX_SIZE), -1;
    }
    return 0;
}

int lspec_input_bf16(const struct lspec *layers, int n)
{
    for (int l = 0; l < n; l++) {
        if (layers[l].kind == LK_FLATTEN || layers[l].kind == LK_RESHAPE)
            continue;
        return layers[l].kind == LK_DENSE || layers[l].kind == LK_CONV2D;
    }
    return 0;
}
