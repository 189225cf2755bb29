/* bench_conv: one emulated core's training step of a convolutional network,
 * and where its time goes: the matmuls the convolutions are lowered to
 * (patches x kernel on the matrix unit, forward and both backward ones)
 * against the rest (patches, pooling, activations, loss), next to oneDNN's
 * own direct convolution of the same shapes in this process (float32, one
 * thread, forward only), in GFLOP/s.
 *
 *   bench_conv [--rows N] [--steps N] [--model cnn|small] [--float32]
 *
 * cnn is examples/fashion_mnist --model cnn; small halves its filters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#include "model.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add(struct model_cfg *c, enum lkind k, int units, enum model_act act, int kh, int same)
{
    struct lspec *s = &c->kind[c->nlayers];
    s->kind = k;
    s->kh = s->kw = kh;
    s->same = same;
    c->units[c->nlayers] = units;
    c->act[c->nlayers] = act;
    c->nlayers++;
}

/* oneDNN's direct convolution: rows x (h, w, c) -> f filters, kxk same, NHWC f32 */
static double onednn_conv_gflops(int rows, int h, int w, int c, int f, int k, int reps)
{
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_memory_desc_t src, wei, dst, bia;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t ms, mw, md, mb;
    dnnl_dims_t sd = {rows, c, h, w}, wd = {f, c, k, k}, dd = {rows, f, h, w}, bd = {f};
    dnnl_dims_t strides = {1, 1}, pl = {(k - 1) / 2, (k - 1) / 2}, pr = {k / 2, k / 2};
    double t0, secs, fl;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
        return -1;
    dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_nhwc);
    dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_nhwc);
    dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_x);
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &src, &wei, &bia,
                                           &dst, strides, pl, pr) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success)
        return -1;
    dnnl_primitive_create(&prim, pd);
    dnnl_memory_create(&ms, &src, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mw, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&md, &dst, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mb, &bia, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_BIAS, mb}, {DNNL_ARG_DST, md}};
    dnnl_primitive_execute(prim, st, 4, args);
    dnnl_stream_wait(st);
    t0 = now();
    for (int i = 0; i < reps; i++)
        dnnl_primitive_execute(prim, st, 4, args);
    dnnl_stream_wait(st);
    secs = (now() - t0) / reps;
    fl = 2.0 * rows * h * w * (double)f * k * k * c;
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(md);
    dnnl_memory_destroy(mb);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return fl / secs / 1e9;
}

int main(int argc, char **argv)
{
    int rows = 128, steps = 5, small = 0, f32 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            small = !strcmp(argv[++i], "small");
        else if (!strcmp(argv[i], "--float32"))
            f32 = 1;
        else {
            fprintf(stderr, "usage: bench_conv [--rows N] [--steps N] [--model cnn|small] [--float32]\n");
            return 2;
        }
    }
    if (rows < 1 || rows > 4096 || steps < 1 || steps > 1000) {
        fprintf(stderr, "bench_conv: --rows 1..4096, --steps 1..1000\n");
        return 2;
    }
    int f1 = small ? 16 : 32, f2 = small ? 32 : 64;
    struct model_cfg c;
    memset(&c, 0, sizeof c);
    c.in_dim = 784;
    c.in_shape = (struct lshape){3, {28, 28, 1}};
    c.kind[c.nlayers].epsilon = 1e-3f, c.kind[c.nlayers].momentum = 0.99f;
    add(&c, LK_BATCH_NORM, 0, ACT_LINEAR, 0, 0);
    add(&c, LK_CONV2D, f1, ACT_RELU, 3, 1);
    add(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 0);
    c.kind[c.nlayers].epsilon = 1e-3f, c.kind[c.nlayers].momentum = 0.99f;
    add(&c, LK_BATCH_NORM, 0, ACT_LINEAR, 0, 0);
    add(&c, LK_CONV2D, f2, ACT_RELU, 3, 1);
    add(&c, LK_MAX_POOL2D, 0, ACT_LINEAR, 2, 0);
    c.kind[c.nlayers].rate = 0.25f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR, 0, 0);
    add(&c, LK_FLATTEN, 0, ACT_LINEAR, 0, 0);
    add(&c, LK_DENSE, 128, ACT_RELU, 0, 0);
    c.kind[c.nlayers].rate = 0.5f;
    add(&c, LK_DROPOUT, 0, ACT_LINEAR, 0, 0);
    add(&c, LK_DENSE, 10, ACT_SOFTMAX, 0, 0);
    c.loss = LOSS_SPARSE_CCE;
    c.opt = (struct model_opt_cfg){OPT_ADAM, 0.001f, 0, 0, 0.9f, 0.999f, 1e-7f, {0}};
    c.precision = f32 ? MODEL_FLOAT32 : MODEL_MIXED_BF16;
    c.seed = 1;
    c.max_rows = rows;
    mxu *u;
    model *m;
    err e;
    if (mxu_new(&u, 128, &e) != CODE_OK || model_new(&m, &c, u, &e) != CODE_OK) {
        fprintf(stderr, "bench_conv: %s\n", e.msg);
        return 1;
    }
    float *x = malloc((size_t)rows * 784 * sizeof *x);
    int32_t *y = malloc((size_t)rows * sizeof *y);
    for (int i = 0; i < rows * 784; i++)
        x[i] = (float)((i * 7919) % 256) / 255.0f;
    for (int i = 0; i < rows; i++)
        y[i] = i % 10;
    model_set_training(m, 1);
    double best = 1e30, mm = 0, fwd = 0;
    for (int s = 0; s < steps + 1; s++) {
        double t0, t1, t2;
        model_reset_timers(m);
        t0 = now();
        if (model_forward(m, x, rows, NULL, &e) != CODE_OK)
            break;
        t1 = now();
        if (model_backward(m, y, rows, NULL, &e) != CODE_OK)
            break;
        model_apply_gradients(m, 1.0f / (float)rows);
        t2 = now();
        if (s > 0 && t2 - t0 < best)   /* the first step warms the primitive cache */
            best = t2 - t0, mm = model_matmul_seconds(m), fwd = t1 - t0;
    }
    double padded, flops = model_train_flops(m, rows, &padded);
    printf("CNN step on one emulated core: %s, per-core batch %d, %s\n", small ? "small (16, 32 filters)" :
           "fashion_mnist --model cnn (32, 64 filters)", rows, f32 ? "float32" : "mixed_bfloat16");
    printf("%-34s %12s\n", "", "value");
    printf("%-34s %12.1f\n", "step (forward+backward+Adam), ms", best * 1e3);
    printf("%-34s %12.1f\n", "  of which forward, ms", fwd * 1e3);
    printf("%-34s %12.1f\n", "  of which matmuls, ms", mm * 1e3);
    printf("%-34s %11.0f%%\n", "matmul share of the step", 100.0 * mm / best);
    printf("%-34s %12.2f\n", "matmul FLOPs per step, G", flops / 1e9);
    printf("%-34s %12.1f\n", "matmul throughput, GFLOP/s", flops / mm / 1e9);
    printf("%-34s %12.1f\n", "whole step, GFLOP/s", flops / best / 1e9);
    printf("%-34s %11.0f%%\n", "MXU utilization (padded)", 100.0 * flops / padded);
    printf("%-34s %12.0f\n", "examples/s on one core", rows / best);
    printf("\noneDNN direct convolution, same shapes, float32, forward, in this process:\n");
    printf("%-34s %12.1f\n", "conv2d 28x28x1 -> 32, GFLOP/s", onednn_conv_gflops(rows, 28, 28, 1, f1, 3, 3));
    printf("%-34s %12.1f\n", "conv2d_1 14x14x32 -> 64, GFLOP/s", onednn_conv_gflops(rows, 14, 14, f1, f2, 3, 3));
    model_free(m);
    mxu_free(u);
    free(x);
    free(y);
    return 0;
}
