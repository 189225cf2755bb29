/* tpu_cancel from another thread, as a GUI or another language's runtime
 * (a Ctrl-C handler) calls it, against calls that would otherwise block for
 * many seconds:
 *
 *  - an initialize waiting for cores that never come;
 *  - an all-reduce with one core stopped (SIGSTOP);
 *  - a fit with one core stopped;
 *  - a fit on healthy cores (Ctrl-C in the middle of training);
 *
 * each returns TPU_CANCELLED, long before it would have ended by itself, and
 * the same handle then works: the system initializes, the all-reduce gives
 * the right sums, the model trains and its replicas agree. The healthy fit
 * stops at a step boundary on every replica alike and trains on without a
 * re-initialize; the fit whose core is stopped says to re-initialize, and
 * after that the model trains again. A cancel while no
 * call is in progress is forgotten; tpu_cancel refuses what is not a cluster.
 *
 * Timing: the heartbeat is 5 s (a stopped core is declared dead after 15 s),
 * so a blocked call cannot end by itself within 15 s; the canceller fires
 * every 50 ms from 300 ms after it starts (a cancel before the call began is
 * forgotten, so the first one after it is what counts), and the test asks for
 * the call to end within 10 s: several times the noise either way. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "colltest.h"

#define HB_MS 5000         /* x 3: a stopped core is dead after 15 s */
#define NATURAL_END_MS 15000 /* the earliest a blocked call could end by itself */
#define CANCELLED_WITHIN_MS 10000
#define DIM 16
#define CLASSES 4

QUIET_WARNINGS()

/* ---- a canceller thread: tpu_cancel every 50 ms until stopped (bounded) ---- */

typedef struct canceller {
    pthread_t th;
    tpu_cluster *c;
    atomic_int stop;
    int fired;
    atomic_int *go; /* non-NULL: cancel once, as soon as *go is set */
} canceller;

static void *cancel_loop(void *arg)
{
    canceller *k = arg;
    if (k->go) {
        struct timespec ts = {0, 10 * 1000000L};
        for (int i = 0; i < 6000 && !atomic_load(k->go) && !atomic_load(&k->stop); i++) /* 60 s at most */
            nanosleep(&ts, NULL);
        if (atomic_load(k->go)) {
            cr_assert_eq(tpu_cancel(k->c), TPU_OK);
            k->fired++;
        }
        return NULL;
    }
    struct timespec first = {0, 300 * 1000000L}, ts = {0, 50 * 1000000L};
    nanosleep(&first, NULL); /* the call is under way (a cancel before it began would be forgotten anyway) */
    for (int i = 0; i < 600 && !atomic_load(&k->stop); i++) { /* 30 s at most */
        cr_assert_eq(tpu_cancel(k->c), TPU_OK);
        k->fired++;
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void canceller_start(canceller *k, tpu_cluster *c, atomic_int *go)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    k->go = go;
    cr_assert_eq(pthread_create(&k->th, NULL, cancel_loop, k), 0);
}

static void canceller_stop(canceller *k)
{
    atomic_store(&k->stop, 1);
    pthread_join(k->th, NULL);
    cr_assert_gt(k->fired, 0);
}

/* The call's status must be CANCELLED, its message must say so, and it must
 * have ended well before it could have by itself. */
static void assert_cancelled(tpu_status st, int64_t took_ms, const char *what)
{
    fprintf(stderr, "%s: %s after %lld ms: %s\n", what, tpu_status_name(st), (long long)took_ms, tpu_last_error());
    cr_assert_eq(st, TPU_CANCELLED, "%s: %s: %s", what, tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "cancelled"), "%s: the message should say it was cancelled: %s", what,
              tpu_last_error());
    cr_assert_lt(took_ms, CANCELLED_WITHIN_MS, "%s took %lld ms to give way (a blocked call ends after %d ms)",
                 what, (long long)took_ms, NATURAL_END_MS);
}

/* ---- tests ---- */

Test(cancel, refuses_what_is_not_a_cluster_and_forgets_an_idle_cancel, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    int not_a_handle = 0;
    cr_assert_eq(tpu_cancel(NULL), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_cancel((tpu_cluster *)&not_a_handle), TPU_INVALID_ARGUMENT);
    /* no call in progress: forgotten when the next call begins */
    for (int i = 0; i < 3; i++)
        CALL_OK(tpu_cancel(t->c));
    void **b = ct_bufs(t->n, 1024, TPU_F32, 1, 0, t->n);
    CALL_OK(tpu_all_reduce(t->c, b, 1024, TPU_F32, TPU_SUM, NULL));
    ct_free_bufs(b, t->n);
    ct_free(t);
}

Test(cancel, initialize_waiting_for_cores, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_init_options io = {.expect = 8, .timeout_ms = 60000}; /* 6 cores that never come */
    tpu_topology *topo = NULL;
    canceller k;

    canceller_start(&k, t->c, NULL);
    int64_t t0 = cl_now_ms();
    tpu_status st = tpu_initialize_system(t->c, &io, &topo);
    int64_t took = cl_now_ms() - t0;
    canceller_stop(&k);
    assert_cancelled(st, took, "initialize expecting 8 cores of 2");
    cr_assert_null(topo);

    /* the same handle initializes the cores there are, and they compute */
    ct_reinit(t);
    cr_assert_eq(t->n, 2);
    void **b = ct_bufs(t->n, 4096, TPU_F32, 2, 0, t->n);
    CALL_OK(tpu_all_reduce(t->c, b, 4096, TPU_F32, TPU_SUM, NULL));
    char why[256];
    for (int r = 0; r < t->n; r++)
        cr_assert(ct_check_reduce(b[r], 4096, 0, TPU_F32, TPU_SUM, 2, 0, (int[]){0, 1}, 2, why, sizeof why),
                  "replica %d: %s", r, why);
    ct_free_bufs(b, t->n);
    ct_free(t);
}

Test(cancel, all_reduce_with_a_stopped_core, .timeout = 120)
{
    colltest *t = ct_start(1, (int[]){3}, NULL, HB_MS);
    int members[3] = {0, 1, 2};
    size_t count = 1 << 16;
    char why[256];
    canceller k;

    cr_assert_eq(t->n, 3);
    void **b = ct_bufs(t->n, count, TPU_F32, 3, 0, t->n);
    CALL_OK(tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, NULL)); /* connections open */
    ct_free_bufs(b, t->n);

    cluster_signal_worker(t->cl, t->worker_of[2], SIGSTOP);
    b = ct_bufs(t->n, count, TPU_F32, 4, 0, t->n);
    canceller_start(&k, t->c, NULL);
    int64_t t0 = cl_now_ms();
    tpu_status st = tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, NULL);
    int64_t took = cl_now_ms() - t0;
    canceller_stop(&k);
    cluster_signal_worker(t->cl, t->worker_of[2], SIGCONT);
    assert_cancelled(st, took, "all-reduce with a stopped core");
    tpu_replica_result rr;
    CALL_OK(tpu_last_collective_replica(t->c, 2, &rr));
    cr_assert_eq(rr.status, TPU_CANCELLED, "the stopped core's replica: %s: %s", tpu_status_name(rr.status),
                 rr.message);
    ct_free_bufs(b, t->n);

    /* the core is back: the same handle reduces again, right */
    b = ct_bufs(t->n, count, TPU_F32, 5, 0, t->n);
    CALL_OK(tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, NULL));
    for (int r = 0; r < t->n; r++)
        cr_assert(ct_check_reduce(b[r], count, 0, TPU_F32, TPU_SUM, 5, 0, members, 3, why, sizeof why),
                  "replica %d after the cancel: %s", r, why);
    ct_free_bufs(b, t->n);
    ct_free(t);
}

/* n rows of DIM features in CLASSES separated blobs, fixed seed. */
static tpu_dataset *blobs(size_t n, size_t batch, float **xo, int32_t **yo)
{
    float *x = malloc(n * DIM * sizeof *x);
    int32_t *y = malloc(n * sizeof *y);
    uint64_t s = 99;
    tpu_dataset *ds;
    cr_assert(x && y);
    for (size_t i = 0; i < n; i++) {
        y[i] = (int32_t)(i % CLASSES);
        for (size_t j = 0; j < DIM; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i * DIM + j] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5) + (j % CLASSES == (size_t)y[i]);
        }
    }
    CALL_OK(tpu_dataset_from_tensor_slices(x, n, DIM, y, TPU_LABELS_SPARSE, 1, 0, &ds));
    CALL_OK(tpu_dataset_batch(ds, batch, 1));
    *xo = x;
    *yo = y;
    return ds;
}

static void assert_replicas_agree(tpu_model *m)
{
    size_t np = tpu_model_num_params(m);
    float *w0 = malloc(np * sizeof *w0), *w1 = malloc(np * sizeof *w1);
    cr_assert(w0 && w1);
    CALL_OK(tpu_model_get_weights(m, 0, w0, np));
    CALL_OK(tpu_model_get_weights(m, 1, w1, np));
    cr_assert_eq(memcmp(w0, w1, np * sizeof *w0), 0, "the replicas' weights differ");
    free(w0);
    free(w1);
}

static tpu_model *small_model(tpu_strategy *s)
{
    tpu_model *m;
    tpu_compile_options co;
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, 16, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 7));
    tpu_compile_options_init(&co);
    co.batch_size = 32;
    CALL_OK(tpu_model_compile(m, &co));
    return m;
}

static tpu_status first_batch_done(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    (void)m, (void)epoch, (void)batch, (void)l;
    atomic_store((atomic_int *)user, 1);
    return TPU_OK;
}

Test(cancel, fit_on_healthy_cores_stops_at_a_step, .timeout = 180)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    float *x;
    int32_t *y;
    tpu_dataset *ds = blobs(384, 32, &x, &y);
    tpu_fit_options fo;
    canceller k;

    static atomic_int trained;
    tpu_callback cb;

    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_model *m = small_model(s);
    memset(&fo, 0, sizeof fo);
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = first_batch_done;
    cb.user = &trained;
    fo.epochs = 100000; /* hours: only a cancel ends it */
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    /* one cancel, once the first step is done (a second one would cut short
     * the steps in flight) */
    canceller_start(&k, t->c, &trained);
    int64_t t0 = cl_now_ms();
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    int64_t took = cl_now_ms() - t0;
    canceller_stop(&k);
    assert_cancelled(st, took, "fit on healthy cores");
    cr_assert(strstr(tpu_last_error(), "every replica stopped there"), "%s", tpu_last_error());
    uint64_t step = tpu_model_step(m);
    cr_assert_gt(step, 0u, "no step ran before the cancel");
    assert_replicas_agree(m);

    /* no re-initialize: the model trains on from where it stopped */
    fo.callbacks = NULL;
    fo.num_callbacks = 0;
    fo.epochs = tpu_model_epoch(m) + 2; /* a cancel may land on an epoch's last batch */
    fo.resume = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    cr_assert_gt(tpu_model_step(m), step);
    assert_replicas_agree(m);
    tpu_model_free(m);
    tpu_strategy_free(s);
    tpu_dataset_free(ds);
    free(x);
    free(y);
    ct_free(t);
}

Test(cancel, fit_with_a_stopped_core, .timeout = 180)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    tpu_model *m;
    float *x;
    int32_t *y;
    tpu_dataset *ds = blobs(384, 32, &x, &y);
    tpu_compile_options co;
    tpu_fit_options fo;
    canceller k;

    CALL_OK(tpu_strategy_new(t->c, &s));
    m = small_model(s);
    tpu_compile_options_init(&co);
    co.batch_size = 32;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* compiled on the cores, connections open */

    cluster_signal_worker(t->cl, t->worker_of[1], SIGSTOP);
    fo.epochs = 50;
    canceller_start(&k, t->c, NULL);
    int64_t t0 = cl_now_ms();
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    int64_t took = cl_now_ms() - t0;
    canceller_stop(&k);
    cluster_signal_worker(t->cl, t->worker_of[1], SIGCONT);
    assert_cancelled(st, took, "fit with a stopped core");

    cr_assert(strstr(tpu_last_error(), "re-initialize"), "the message should say to re-initialize: %s",
              tpu_last_error());

    /* the core is back: re-initialized, the same model compiles and trains
     * on the same handle, and its replicas hold the same weights */
    ct_reinit(t);
    CALL_OK(tpu_model_compile(m, &co));
    fo.epochs = 2;
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    assert_replicas_agree(m);
    tpu_model_free(m);
    tpu_strategy_free(s);
    tpu_dataset_free(ds);
    free(x);
    free(y);
    ct_free(t);
}
