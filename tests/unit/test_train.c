/* Unit tests of one core's training service (server/worker/train/), linked
 * as the worker links it, with no daemon: the service on a libuv loop with
 * its own HBM, matrix unit and collectives engine (a system of one replica,
 * whose gradient all-reduce is its own), and a client connection to it over
 * loopback TCP that speaks the frames a client sends (COMPILE, STEPS,
 * STATE_GET), routed as the worker's data plane routes them (payload sizes
 * checked by train_check_payload before anything is read). Checks: a compile
 * charges the HBM and an answer carries it; training steps on fixed rows
 * bring the loss down; evaluate does not train; a bad model, a step over
 * the compiled batch and a payload of the wrong size are refused with errors
 * that say what is wrong; the state counts the optimizer's steps. Every loop
 * is bounded by a 20 s timer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "auth.h"
#include "coll.h"
#include "dpconn.h"
#include "frame.h"
#include "hbm.h"
#include "ident.h"
#include "peers.h"
#include "preset.h"
#include "trace.h"
#include "train.h"

#define TOKEN "train-unit-test-token-0123456789abcdef"
#define EPOCH 3
#define IN 4
#define BATCH 16

static uv_loop_t loop;
static uv_tcp_t server;
static uv_timer_t limit;
static int timed_out;
static auth key;
static struct core_ident id;
static hbm mem;
static trace *tr;
static struct peers *peers;
static struct coll *coll;
static struct coll_stats cstats;
static struct train_stats tstats;
static struct train *svc;
static dp_conn *client, *worker;
static int client_ready, client_closed;
static err close_why;

/* the answers, in order */
#define MAX_ANSWERS 16
static struct answer {
    int code;
    char msg[512];
    uint64_t seq, hbm_used;
    size_t nstats;
    double loss[8];
    int64_t rows[8];
    uint64_t iterations;
    int has_state;
} ans[MAX_ANSWERS];
static int nans;

static void on_limit(uv_timer_t *t)
{
    (void)t;
    timed_out = 1;
}

static void run_until(const int *v, int want)
{
    timed_out = 0;
    uv_timer_start(&limit, on_limit, 20000, 0);
    while (!timed_out && *v < want)
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&limit);
    cr_assert(!timed_out, "the training service did not answer within 20 s");
}

/* ---- the worker's side: as the data plane routes training frames ---- */

static void w_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    cr_assert(train_is_frame(h), "a frame of kind %d is not for the training service", (int)h->kind);
    train_on_client_frame(svc, c, h, payload, len);
}

static enum dp_buf w_payload_buf(dp_conn *c, const Tpuemu__FrameHeader *h, void **buf)
{
    err e;
    (void)buf;
    if (train_check_payload(svc, h, &e) != CODE_OK) {
        dp_conn_fail(c, e.code, "%s", e.msg);
        return DP_BUF_FAILED;
    }
    return DP_BUF_MALLOC;
}

static void w_close(dp_conn *c, const err *why)
{
    (void)why;
    train_on_client_close(svc, c);
    if (c == worker)
        worker = NULL;
}

static void on_connection(uv_stream_t *s, int status)
{
    struct dp_conn_cfg cfg;
    err e;
    cr_assert_eq(status, 0);
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = &key;
    cfg.self_name = id.sender;
    cfg.max_payload = FRAME_MAX_PAYLOAD;
    cfg.max_pending_write = DP_MAX_PENDING;
    cfg.handshake_ms = 5000;
    cfg.on_frame = w_frame;
    cfg.on_close = w_close;
    cfg.payload_buf = w_payload_buf;
    cr_assert_eq(dp_conn_accept(s, &cfg, &worker, &e), CODE_OK, "%s", e.msg);
}

/* ---- the client's side ---- */

static void c_ready(dp_conn *c)
{
    (void)c;
    client_ready = 1;
}

static void c_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    struct answer *a = &ans[nans < MAX_ANSWERS ? nans : MAX_ANSWERS - 1];
    (void)c, (void)len;
    free(payload);
    cr_assert_eq(h->kind, TPUEMU__FRAME_KIND__FRAME_MODEL_RESULT);
    memset(a, 0, sizeof *a);
    a->code = h->status ? (int)h->status->code : CODE_OK;
    snprintf(a->msg, sizeof a->msg, "%s", h->status && h->status->message ? h->status->message : "");
    a->seq = h->seq;
    a->hbm_used = h->hbm_used;
    a->nstats = h->n_step_stats;
    for (size_t i = 0; i < h->n_step_stats && i < 8; i++) {
        a->loss[i] = h->step_stats[i]->loss_sum;
        a->rows[i] = h->step_stats[i]->rows;
    }
    if (h->state) {
        a->has_state = 1;
        a->iterations = h->state->iterations;
    }
    nans++;
}

static void c_close(dp_conn *c, const err *why)
{
    (void)c;
    client_closed = 1;
    close_why = *why;
    client = NULL;
}

static void service_up(void)
{
    struct sockaddr_in sa;
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    struct dp_conn_cfg cfg;
    struct peers_env pe;
    err e;

    auth_global_init();
    cr_assert_eq(auth_from_token(&key, TOKEN, strlen(TOKEN), &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &limit);
    ident_init(&id, "h0", 0);
    id.epoch = EPOCH;
    id.replica_id = 0;
    id.num_replicas = 1;
    id.incarnation = auth_random64();
    hbm_init(&mem, 1ull << 30);
    tr = trace_new(1024);
    /* a system of one: the engine's transport is the worker's own, with no peer */
    pe = (struct peers_env){&loop, &key, &id, tr, 1};
    cr_assert_eq(peers_new(&pe, &peers, &e), CODE_OK, "%s", e.msg);
    coll_stats_init(&cstats);
    struct coll_env ce = {&id, &mem, peers_xport(peers), &cstats};
    cr_assert_not_null(coll = coll_new(&ce));
    train_stats_init(&tstats);
    struct train_env te = {.loop = &loop,
                           .id = &id,
                           .hbm = &mem,
                           .trace = tr,
                           .preset = preset_find("v4"),
                           .throttle_pct = 100,
                           .coll = coll,
                           .stats = &tstats};
    cr_assert_not_null(te.preset);
    cr_assert_eq(train_new(&te, &svc), CODE_OK);

    uv_tcp_init(&loop, &server);
    uv_ip4_addr("127.0.0.1", 0, &sa);
    cr_assert_eq(uv_tcp_bind(&server, (const struct sockaddr *)&sa, 0), 0);
    cr_assert_eq(uv_listen((uv_stream_t *)&server, 4, on_connection), 0);
    cr_assert_eq(uv_tcp_getsockname(&server, (struct sockaddr *)&bound, &blen), 0);
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = &key;
    cfg.self_name = "client";
    cfg.max_payload = FRAME_MAX_PAYLOAD;
    cfg.max_pending_write = DP_MAX_PENDING;
    cfg.handshake_ms = 5000;
    cfg.on_ready = c_ready;
    cfg.on_frame = c_frame;
    cfg.on_close = c_close;
    cfg.replica = -1;
    cr_assert_eq(dp_conn_connect(&loop, (const struct sockaddr *)&bound, &cfg, &client, &e), CODE_OK, "%s", e.msg);
    run_until(&client_ready, 1);
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

static void service_down(void)
{
    if (client)
        dp_conn_close(client, NULL);
    if (worker)
        dp_conn_close(worker, NULL);
    train_reset(svc); /* as at a new system epoch: the model goes */
    train_stop(svc);
    peers_stop(peers);
    uv_close((uv_handle_t *)&server, close_cb);
    uv_close((uv_handle_t *)&limit, close_cb);
    for (int i = 0; i < 300 && uv_run(&loop, UV_RUN_NOWAIT); i++)
        usleep(10000); /* at most 3 s for the closes and the pool to finish */
    cr_assert_eq(uv_loop_close(&loop), 0, "a handle was left open");
    train_free(svc);
    coll_free(coll);
    peers_free(peers);
    trace_free(tr);
    hbm_destroy(&mem);
}

/* A regression model: IN inputs, Dense(8, relu), Dense(1), MSE, SGD. */
static void send_compile(uint64_t seq, uint64_t model_id, uint32_t units)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ModelSpec m = TPUEMU__MODEL_SPEC__INIT;
    Tpuemu__LayerSpec l0 = TPUEMU__LAYER_SPEC__INIT, l1 = TPUEMU__LAYER_SPEC__INIT, *ls[2] = {&l0, &l1};
    Tpuemu__OptimizerSpec o = TPUEMU__OPTIMIZER_SPEC__INIT;

    l0.kind = TPUEMU__LAYER_KIND__LAYER_DENSE;
    l0.units = 8;
    l0.activation = TPUEMU__ACTIVATION__ACTIVATION_RELU;
    l1.kind = TPUEMU__LAYER_KIND__LAYER_DENSE;
    l1.units = units;
    o.kind = 0; /* SGD */
    o.learning_rate = 0.05f;
    m.model_id = model_id;
    m.input_dim = IN;
    m.n_layers = 2;
    m.layers = ls;
    m.loss = TPUEMU__LOSS__LOSS_MEAN_SQUARED_ERROR;
    m.optimizer = &o;
    m.seed = 42;
    m.batch_per_core = BATCH;
    m.infeed_depth = 2;
    m.steps_per_execution = 4;
    m.label_dim = 1;
    m.deterministic = 1;
    h.kind = TPUEMU__FRAME_KIND__FRAME_COMPILE;
    h.epoch = EPOCH;
    h.seq = seq;
    h.model = &m;
    cr_assert_eq(dp_conn_send(client, &h, NULL, 0, NULL, NULL), CODE_OK);
}

/* rows of y = x0 - 2 x1 + 0.5 x2 (x3 is noise-free filler), the same rows each step */
static float *infeed(uint32_t steps, uint32_t rows, int labels, size_t *len)
{
    size_t per = (size_t)rows * IN + (labels ? rows : 0);
    float *b = malloc(per * steps * sizeof *b);
    cr_assert_not_null(b);
    for (uint32_t s = 0; s < steps; s++) {
        float *x = b + s * per, *y = x + (size_t)rows * IN;
        for (uint32_t r = 0; r < rows; r++) {
            for (int j = 0; j < IN; j++)
                x[r * IN + j] = (float)((r * 7 + j * 3) % 11) / 11.0f - 0.5f;
            if (labels)
                y[r] = x[r * IN] - 2.0f * x[r * IN + 1] + 0.5f * x[r * IN + 2];
        }
    }
    *len = per * steps * sizeof *b;
    return b;
}

static void send_steps(uint64_t seq, uint64_t model_id, int mode, uint32_t steps, uint32_t rows, uint64_t coll_seq,
                       float *payload, size_t len)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__StepsSpec s = TPUEMU__STEPS_SPEC__INIT;
    uint32_t r[8], g[8];
    for (uint32_t i = 0; i < steps; i++)
        r[i] = rows, g[i] = rows;
    s.model_id = model_id;
    s.mode = mode;
    s.steps = steps;
    s.n_rows = steps;
    s.rows = r;
    s.n_global_rows = steps;
    s.global_rows = g;
    s.coll_seq = coll_seq;
    s.first_step = coll_seq;
    s.has_labels = mode != TPUEMU__STEP_MODE__STEP_PREDICT;
    h.kind = TPUEMU__FRAME_KIND__FRAME_STEPS;
    h.epoch = EPOCH;
    h.seq = seq;
    h.steps = &s;
    cr_assert_eq(dp_conn_send(client, &h, payload, len, NULL, NULL), CODE_OK);
}

static void send_state_get(uint64_t seq, uint64_t model_id)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__StateInfo st = TPUEMU__STATE_INFO__INIT;
    st.model_id = model_id;
    h.kind = TPUEMU__FRAME_KIND__FRAME_STATE_GET;
    h.epoch = EPOCH;
    h.seq = seq;
    h.state = &st;
    cr_assert_eq(dp_conn_send(client, &h, NULL, 0, NULL, NULL), CODE_OK);
}

Test(train, compile_charges_hbm_and_steps_bring_the_loss_down, .timeout = 60)
{
    size_t len;
    float *x;
    double first, last;

    service_up();
    cr_assert_eq(mem.used, 0);
    send_compile(1, 11, 1);
    run_until(&nans, 1);
    cr_assert_eq(ans[0].code, CODE_OK, "%s", ans[0].msg);
    cr_assert_gt(mem.used, 0, "a compiled model charges no HBM");
    cr_assert_eq(ans[0].hbm_used, mem.used, "the answer does not carry the HBM in use");

    /* 3 requests of 4 training steps on the same 16 rows */
    x = infeed(4, BATCH, 1, &len);
    for (int k = 0; k < 3; k++)
        send_steps(2 + (uint64_t)k, 11, TPUEMU__STEP_MODE__STEP_TRAIN, 4, BATCH, 100 + 4 * (uint64_t)k, x, len);
    run_until(&nans, 4);
    for (int k = 1; k < 4; k++) {
        cr_assert_eq(ans[k].code, CODE_OK, "steps %d: %s", k, ans[k].msg);
        cr_assert_eq(ans[k].seq, (uint64_t)k + 1, "answers out of order");
        cr_assert_eq(ans[k].nstats, 4);
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(ans[k].rows[i], BATCH);
            cr_assert(isfinite(ans[k].loss[i]) && ans[k].loss[i] >= 0, "loss %g", ans[k].loss[i]);
        }
    }
    first = ans[1].loss[0];
    last = ans[3].loss[3];
    cr_assert_lt(last, first * 0.8, "12 SGD steps on the same rows did not bring the loss down: %g -> %g", first, last);
    cr_assert_eq(prom_get(&tstats.steps), 12, "the service counted %llu steps",
                 (unsigned long long)prom_get(&tstats.steps));

    /* evaluate twice: the same loss, no training */
    send_steps(5, 11, TPUEMU__STEP_MODE__STEP_EVALUATE, 1, BATCH, 0, x, len / 4);
    send_steps(6, 11, TPUEMU__STEP_MODE__STEP_EVALUATE, 1, BATCH, 0, x, len / 4);
    send_state_get(7, 11);
    run_until(&nans, 7);
    cr_assert_eq(ans[4].code, CODE_OK, "%s", ans[4].msg);
    cr_assert_eq(ans[5].code, CODE_OK, "%s", ans[5].msg);
    cr_assert_float_eq(ans[4].loss[0], ans[5].loss[0], 1e-9, "evaluate changed the model");
    cr_assert_eq(ans[6].code, CODE_OK, "%s", ans[6].msg);
    cr_assert(ans[6].has_state);
    cr_assert_eq(ans[6].iterations, 12, "the optimizer applied %llu steps", (unsigned long long)ans[6].iterations);
    free(x);
    service_down();
}

Test(train, a_bad_model_is_refused_saying_why, .timeout = 60)
{
    service_up();
    /* MSE over 1 label float, but the last layer has 3 units */
    send_compile(1, 12, 3);
    run_until(&nans, 1);
    cr_assert_eq(ans[0].code, CODE_INVALID_ARGUMENT, "%d: %s", ans[0].code, ans[0].msg);
    cr_assert(strstr(ans[0].msg, "label_dim") != NULL, "the error does not say what is wrong: %s", ans[0].msg);
    cr_assert_eq(mem.used, 0, "a refused model is charged");
    /* steps for a model that was never compiled */
    send_steps(2, 12, TPUEMU__STEP_MODE__STEP_TRAIN, 1, 2, 1, NULL, 0);
    run_until(&nans, 2);
    cr_assert_neq(ans[1].code, CODE_OK);
    cr_assert(strstr(ans[1].msg, "12") != NULL, "the error does not name the model: %s", ans[1].msg);
    service_down();
}

Test(train, steps_over_the_compiled_batch_are_refused_saying_why, .timeout = 60)
{
    size_t len;
    float *x;

    service_up();
    send_compile(1, 13, 1);
    run_until(&nans, 1);
    cr_assert_eq(ans[0].code, CODE_OK, "%s", ans[0].msg);
    x = infeed(1, BATCH * 2, 1, &len);
    /* refused before its payload is read: the connection closes with why */
    send_steps(2, 13, TPUEMU__STEP_MODE__STEP_TRAIN, 1, BATCH * 2, 1, x, len);
    run_until(&client_closed, 1);
    cr_assert_eq(close_why.code, CODE_INVALID_ARGUMENT, "%d: %s", close_why.code, close_why.msg);
    cr_assert(strstr(close_why.msg, "32 rows") && strstr(close_why.msg, "at most 16 per core"), "%s", close_why.msg);
    cr_assert_eq(nans, 1, "a refused request was answered too");
    free(x);
    service_down();
}

Test(train, a_payload_of_the_wrong_size_is_refused_before_it_is_read, .timeout = 60)
{
    size_t len;
    float *x;

    service_up();
    send_compile(1, 14, 1);
    run_until(&nans, 1);
    cr_assert_eq(ans[0].code, CODE_OK, "%s", ans[0].msg);
    x = infeed(1, BATCH, 1, &len);
    send_steps(2, 14, TPUEMU__STEP_MODE__STEP_TRAIN, 1, BATCH, 1, x, len - 4); /* one float short */
    run_until(&client_closed, 1);
    cr_assert_eq(close_why.code, CODE_INVALID_ARGUMENT, "%d: %s", close_why.code, close_why.msg);
    cr_assert(strstr(close_why.msg, "were expected") != NULL, "%s", close_why.msg);
    free(x);
    service_down();
}
