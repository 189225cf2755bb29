/* Elastic training (tpu_fit_options.elastic) against real daemons: a fit on
 * 4 cores (2 hosts x 2) loses a core in the middle (tpu_inject_fault, killed
 * once it has finished a given step) and goes on by itself: with 3 replicas
 * when the core stays dead (the global batch kept, or the per-replica batch
 * kept and the global batch shrunk), with all 4 again when the core is back
 * within the wait (started again by a supervisor). What a user checks: fit returns TPU_OK having done every
 * epoch, the history's event says what happened (kind, replicas, batch,
 * the step it went on from, the error naming the lost core), the system has
 * the replicas the event says, the model learnt what an undisturbed fit
 * learns, and the caller's dataset keeps its batch. Also: bad elastic
 * options are refused, and a loss beyond max_losses fails naming the core. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include <tpuemu/data.h>
#include <tpuemu/model.h>

#define ROWS 4096
#define DIM 16
#define CLASSES 4
#define BATCH 128 /* 32 steps an epoch */

/* A task a small model learns well: the class is the largest of four sums. */
static float xs[ROWS * DIM];
static int32_t ys[ROWS];

static void make_data(void)
{
    uint64_t s = 12345;
    for (size_t i = 0; i < ROWS; i++) {
        float sum[CLASSES] = {0};
        for (size_t j = 0; j < DIM; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            xs[i * DIM + j] = (float)((s >> 33) % 1000) / 1000.0f;
            sum[j % CLASSES] += xs[i * DIM + j];
        }
        int best = 0;
        for (int k = 1; k < CLASSES; k++)
            if (sum[k] > sum[best])
                best = k;
        ys[i] = best;
    }
}

struct job {
    tpu_resolver *r;
    tpu_cluster *tc;
    tpu_strategy *s;
    tpu_dataset *ds;
    tpu_model *m;
};

static cluster *start4(void)
{
    cluster_opts o = {.hosts = 2, .cores_per_host = 2};
    cluster *c = cluster_start(&o);
    cr_assert_not_null(c, "the cluster did not start");
    return c;
}

static void job_start(cluster *c, struct job *j)
{
    tpu_topology *topo;
    tpu_init_options io = {.expect = 4, .timeout_ms = 10000u * (uint32_t)cl_time_scale()};
    tpu_compile_options co;

    make_data();
    cr_assert_eq(cluster_connect(c, &j->r, &j->tc), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_initialize_system(j->tc, &io, &topo), TPU_OK, "%s", tpu_last_error());
    tpu_topology_free(topo);
    cr_assert_eq(tpu_strategy_new(j->tc, &j->s), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(xs, ROWS, DIM, ys, TPU_LABELS_SPARSE, 1, TPU_BORROW, &j->ds), TPU_OK);
    cr_assert_eq(tpu_dataset_shuffle(j->ds, ROWS, 7), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(j->ds, BATCH, 1), TPU_OK);
    cr_assert_eq(tpu_model_new(j->s, DIM, &j->m), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(j->m, 32, TPU_ACT_RELU), TPU_OK);
    cr_assert_eq(tpu_model_add_dense(j->m, CLASSES, TPU_ACT_SOFTMAX), TPU_OK);
    cr_assert_eq(tpu_model_set_seed(j->m, 3), TPU_OK);
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.01f);
    co.metrics_accuracy = 1;
    co.batch_size = BATCH;
    cr_assert_eq(tpu_model_compile(j->m, &co), TPU_OK, "%s", tpu_last_error());
}

static void job_free(struct job *j)
{
    tpu_model_free(j->m);
    tpu_dataset_free(j->ds);
    tpu_strategy_free(j->s);
    tpu_cluster_free(j->tc);
    tpu_resolver_free(j->r);
}

static double accuracy_of(struct job *j)
{
    double loss, acc;
    cr_assert_eq(tpu_model_evaluate(j->m, j->ds, &loss, &acc), TPU_OK, "%s", tpu_last_error());
    return acc;
}

/* Kills host/core (worker index i) once it has finished training step `step`. */
static void kill_at_step(struct job *j, const char *host, int core, uint64_t step)
{
    tpu_fault f = {.kind = TPU_FAULT_KILL, .at_step = step};
    cr_assert_eq(tpu_inject_fault(j->tc, host, core, &f), TPU_OK, "%s", tpu_last_error());
}

/* The history's one event (the test fails if it has another number). */
static tpu_elastic_event only_event(const tpu_history *h)
{
    tpu_elastic_event ev;
    cr_assert_eq(tpu_history_num_events(h), 1, "the history has %zu events", tpu_history_num_events(h));
    cr_assert_eq(tpu_history_event(h, 0, &ev), TPU_OK);
    return ev;
}

static void fit_options(tpu_fit_options *fo, int epochs, uint32_t wait_ms)
{
    memset(fo, 0, sizeof *fo);
    fo->epochs = epochs;
    fo->elastic.max_losses = 3;
    fo->elastic.wait_ms = wait_ms;
    fo->elastic.snapshot_steps = 10;
}

static const char *messages[16];
static size_t nmessages;
static void on_warning(const char *msg, void *user)
{
    (void)user;
    if (nmessages < 16)
        messages[nmessages++] = strdup(msg);
}

static int warned(const char *s)
{
    for (size_t i = 0; i < nmessages; i++)
        if (strstr(messages[i], s))
            return 1;
    return 0;
}

static void warnings_reset(void)
{
    for (size_t i = 0; i < nmessages; i++)
        free((void *)messages[i]);
    nmessages = 0;
    tpu_set_warning_handler(on_warning, NULL);
}

Test(elastic, a_lost_core_is_left_behind_keeping_the_global_batch, .timeout = 240)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    tpu_elastic_event ev;

    warnings_reset();
    job_start(c, &j);
    kill_at_step(&j, "h1", 1, 40); /* in epoch 2 */
    fit_options(&fo, 5, 1000);
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, &h), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_history_num_epochs(h), 5, "the history has %zu epochs", tpu_history_num_epochs(h));
    ev = only_event(h);
    cr_assert_eq(ev.kind, TPU_ELASTIC_SHRUNK, "event %s", tpu_elastic_event_kind_name(ev.kind));
    cr_assert_eq(ev.replicas_before, 4);
    cr_assert_eq(ev.replicas_after, 3);
    cr_assert_eq(ev.global_batch_before, BATCH);
    cr_assert_eq(ev.global_batch_after, BATCH);
    cr_assert(strstr(ev.cause, "h1/1"), "the event does not name h1/1: %s", ev.cause);
    cr_assert(ev.step >= 30 && ev.restored_step >= 30 && ev.restored_step <= ev.step,
              "lost at step %llu, went on from %llu (snapshots every 10 steps)", (unsigned long long)ev.step,
              (unsigned long long)ev.restored_step);
    cr_assert_str_eq(ev.from, "memory");
    cr_assert(warned("went on with 3 replicas (was 4)"), "no warning said so");
    /* it initialized the system again knowing it restores the state: not
     * TensorFlow's warning that re-initializing loses the variables
     * (tensorflow/python/tpu/tpu_strategy_util.py), which a user's own
     * initialize earns */
    cr_assert_not(warned("Reinitializing the TPU"), "elastic fit warned that it loses the variables it restores");
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(j.s), 3);
    cr_assert(cluster_wait_exit(&c->workers[3], 10000), "h1/1 still runs");
    /* every epoch's steps were done, and the model learnt */
    cr_assert_eq(tpu_model_step(j.m), 5 * (ROWS / BATCH), "%llu steps", (unsigned long long)tpu_model_step(j.m));
    double acc = accuracy_of(&j);
    cr_assert_gt(acc, 0.8, "accuracy %.3f after 5 epochs on 3 survivors", acc);
    tpu_history_free(h);
    job_free(&j);
    cluster_free(c);
}

/* A supervisor, from the warning fit gives when it begins to wait: starts
 * the lost worker again (in the test's one thread: a fork while another
 * thread of the test allocates could hang the child). */
static cluster *restart_c;
static int restart_i = -1, restarted;

static void restart_on_wait(const char *msg, void *user)
{
    on_warning(msg, user);
    if (restart_i >= 0 && strstr(msg, "waiting up to") &&
        cluster_wait_exit(&restart_c->workers[restart_i], 10000 * cl_time_scale())) {
        cluster_restart_worker(restart_c, restart_i);
        restarted++;
        restart_i = -1;
    }
}

Test(elastic, a_core_back_in_time_is_taken_back, .timeout = 240)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    tpu_elastic_event ev;

    warnings_reset();
    tpu_set_warning_handler(restart_on_wait, NULL);
    restart_c = c;
    restart_i = 1;
    job_start(c, &j);
    kill_at_step(&j, "h0", 1, 20);
    fit_options(&fo, 3, 60000u * (uint32_t)cl_time_scale());
    tpu_status st = tpu_model_fit(j.m, j.ds, &fo, &h);
    cr_assert_eq(st, TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(restarted, 1, "h0/1 was never killed and started again");
    ev = only_event(h);
    cr_assert_eq(ev.kind, TPU_ELASTIC_RESTORED, "event %s: %s", tpu_elastic_event_kind_name(ev.kind), ev.cause);
    cr_assert_eq(ev.replicas_before, 4);
    cr_assert_eq(ev.replicas_after, 4);
    cr_assert(strstr(ev.cause, "h0/1"), "the event does not name h0/1: %s", ev.cause);
    cr_assert(warned("restored with 4 replicas"), "no warning said so");
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(j.s), 4);
    cr_assert_eq(tpu_model_step(j.m), 3 * (ROWS / BATCH), "%llu steps", (unsigned long long)tpu_model_step(j.m));
    tpu_history_free(h);
    job_free(&j);
    cluster_free(c);
}

/* A supervisor that is late: once fit has shrunk (3 replicas), a callback
 * starts the lost worker again and holds fit (bounded) until the resolver
 * lists the core live again; fit takes it back at its next snapshot step. */
struct late_supervisor {
    cluster *c;
    struct job *j;
    int worker; /* index of the lost worker */
    const char *host;
    int core;
    int restarted;
};

static tpu_status restart_once_shrunk(tpu_model *m, int epoch, size_t batch, const tpu_logs *logs, void *user)
{
    struct late_supervisor *ls = user;
    (void)m, (void)epoch, (void)batch, (void)logs;
    if (tpu_strategy_num_replicas_in_sync(ls->j->s) != 3)
        return TPU_OK;
    if (!ls->restarted) {
        cr_assert(cluster_wait_exit(&ls->c->workers[ls->worker], 10000 * cl_time_scale()), "the lost worker runs");
        cluster_restart_worker(ls->c, ls->worker);
        ls->restarted = 1;
        cr_assert(cluster_wait_core_state(ls->c, ls->host, ls->core, TPU_CORE_IDLE, 30000 * cl_time_scale()),
                  "%s/%d did not come back IDLE", ls->host, ls->core);
    }
    return TPU_OK;
}

/* Kills h1/1 at step 20 of a 4-epoch fit on 4 cores, lets fit shrink, starts
 * the worker again: the history says SHRUNK then GREW (3 -> 4, naming the
 * core), with batch the global batch the events name. */
static void shrink_then_grow(tpu_elastic_batch batch, size_t shrunk_batch)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    tpu_elastic_event ev[2];
    struct late_supervisor ls = {.c = c, .j = &j, .worker = 3, .host = "h1", .core = 1};
    tpu_callback cb = {.on_batch_end = restart_once_shrunk, .user = &ls};

    warnings_reset();
    job_start(c, &j);
    kill_at_step(&j, "h1", 1, 20);
    fit_options(&fo, 4, 1000);
    fo.elastic.batch = batch;
    fo.callbacks = &cb;
    fo.num_callbacks = 1;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, &h), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(ls.restarted, 1, "fit never went on with 3 replicas");
    cr_assert_eq(tpu_history_num_events(h), 2, "the history has %zu events", tpu_history_num_events(h));
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(tpu_history_event(h, i, &ev[i]), TPU_OK);
    for (size_t i = 0; i < 2; i++)
        cr_log_info("event %zu: %s at step %llu: %d -> %d replicas, global batch %zu -> %zu, from step %llu: %s", i + 1,
                    tpu_elastic_event_kind_name(ev[i].kind), (unsigned long long)ev[i].step, ev[i].replicas_before,
                    ev[i].replicas_after, ev[i].global_batch_before, ev[i].global_batch_after,
                    (unsigned long long)ev[i].restored_step, ev[i].cause);
    cr_assert_eq(ev[0].kind, TPU_ELASTIC_SHRUNK, "event 1 %s", tpu_elastic_event_kind_name(ev[0].kind));
    cr_assert_eq(ev[1].kind, TPU_ELASTIC_GREW, "event 2 %s: %s", tpu_elastic_event_kind_name(ev[1].kind), ev[1].cause);
    cr_assert_str_eq(tpu_elastic_event_kind_name(ev[1].kind), "GREW");
    cr_assert_eq(ev[1].replicas_before, 3);
    cr_assert_eq(ev[1].replicas_after, 4);
    cr_assert_eq(ev[1].global_batch_before, shrunk_batch);
    cr_assert_eq(ev[1].global_batch_after, BATCH);
    cr_assert(strstr(ev[1].cause, "h1/1"), "GREW does not name h1/1: %s", ev[1].cause);
    /* after steps on 3 replicas, at a step boundary: no step trained again */
    cr_assert(ev[1].step > ev[0].restored_step && ev[1].restored_step == ev[1].step,
              "shrank to step %llu, grew at step %llu going on from %llu", (unsigned long long)ev[0].restored_step,
              (unsigned long long)ev[1].step, (unsigned long long)ev[1].restored_step);
    cr_assert(warned("grew back to 4 replicas (was 3)"), "no warning said so");
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(j.s), 4);
    cr_assert_eq(tpu_dataset_batch_size(j.ds), BATCH);
    cr_assert_eq(tpu_history_num_epochs(h), 4, "the history has %zu epochs", tpu_history_num_epochs(h));
    double acc = accuracy_of(&j);
    cr_assert_gt(acc, 0.8, "accuracy %.3f", acc);
    if (batch == TPU_ELASTIC_KEEP_GLOBAL_BATCH)
        cr_assert_eq(tpu_model_step(j.m), 4 * (ROWS / BATCH), "%llu steps", (unsigned long long)tpu_model_step(j.m));
    else /* epochs of 96 rows a step while on 3 replicas: more steps */
        cr_assert_gt(tpu_model_step(j.m), 4 * (ROWS / BATCH), "%llu steps", (unsigned long long)tpu_model_step(j.m));
    tpu_history_free(h);
    job_free(&j);
    cluster_free(c);
}

Test(elastic, lost_cores_that_come_back_are_taken_back, .timeout = 240)
{
    shrink_then_grow(TPU_ELASTIC_KEEP_GLOBAL_BATCH, BATCH);
}

Test(elastic, growing_back_restores_the_per_replica_batch, .timeout = 240)
{
    shrink_then_grow(TPU_ELASTIC_KEEP_PER_REPLICA_BATCH, BATCH / 4 * 3);
}

Test(elastic, keeping_the_per_replica_batch_shrinks_the_global_batch, .timeout = 240)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    tpu_elastic_event ev;

    warnings_reset();
    job_start(c, &j);
    kill_at_step(&j, "h1", 0, 40);
    fit_options(&fo, 4, 1000);
    fo.elastic.batch = TPU_ELASTIC_KEEP_PER_REPLICA_BATCH;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, &h), TPU_OK, "%s", tpu_last_error());
    ev = only_event(h);
    cr_assert_eq(ev.kind, TPU_ELASTIC_SHRUNK);
    cr_assert_eq(ev.global_batch_before, BATCH);
    cr_assert_eq(ev.global_batch_after, BATCH / 4 * 3, "global batch %zu", ev.global_batch_after);
    cr_assert(strstr(ev.cause, "h1/0"), "the event does not name h1/0: %s", ev.cause);
    /* the caller's pipeline as it was */
    cr_assert_eq(tpu_dataset_batch_size(j.ds), BATCH);
    /* epochs of 42 steps of 96 rows after the loss: more steps than 4 x 32 */
    cr_assert_gt(tpu_model_step(j.m), 4 * (ROWS / BATCH), "%llu steps", (unsigned long long)tpu_model_step(j.m));
    double acc = accuracy_of(&j);
    cr_assert_gt(acc, 0.8, "accuracy %.3f", acc);
    tpu_history_free(h);
    job_free(&j);
    cluster_free(c);
}

/* The same fit undisturbed and through three losses (two kills and a
 * preemption, at seeded steps) end with the same accuracy within a point,
 * on the one core left. */
Test(elastic, three_losses_reach_the_undisturbed_accuracy, .timeout = 300)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;
    tpu_history *h = NULL;
    double clean, acc;

    warnings_reset();
    job_start(c, &j);
    memset(&fo, 0, sizeof fo);
    fo.epochs = 6;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_OK, "%s", tpu_last_error());
    clean = accuracy_of(&j);
    job_free(&j);

    /* a fresh model, the same seed; faults at steps drawn from a seed */
    uint64_t s = 2026;
    uint64_t at[3];
    for (int i = 0; i < 3; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        at[i] = 10 + (uint64_t)i * 50 + (s >> 33) % 40; /* one in each of 10..49, 60..99, 110..149 */
    }
    job_start(c, &j);
    kill_at_step(&j, "h1", 1, at[0]);
    tpu_fault pf = {.kind = TPU_FAULT_PREEMPT, .at_step = at[1], .notice_ms = 300};
    cr_assert_eq(tpu_inject_fault(j.tc, "h0", 1, &pf), TPU_OK, "%s", tpu_last_error());
    kill_at_step(&j, "h1", 0, at[2]);
    fit_options(&fo, 6, 1000);
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, &h), TPU_OK, "%s", tpu_last_error());
    /* two of them may come together (the preempted core goes while the
     * next kill lands): count the cores each event left behind */
    int lost = 0;
    for (size_t i = 0; i < tpu_history_num_events(h); i++) {
        tpu_elastic_event ev;
        tpu_history_event(h, i, &ev);
        if (ev.kind == TPU_ELASTIC_SHRUNK)
            lost += ev.replicas_before - ev.replicas_after;
    }
    cr_assert_eq(lost, 3, "the history's events lost %d cores, not 3", lost);
    /* one entry an epoch, however often an epoch was trained again */
    cr_assert_eq(tpu_history_num_epochs(h), 6, "the history has %zu epochs", tpu_history_num_epochs(h));
    for (size_t i = 0; i < 6; i++) {
        tpu_logs lg;
        cr_assert_eq(tpu_history_epoch(h, i, &lg), TPU_OK);
        cr_assert_eq(lg.epoch, (int)i, "history entry %zu is of epoch %d", i, lg.epoch);
    }
    cr_assert_eq(tpu_strategy_num_replicas_in_sync(j.s), 1);
    acc = accuracy_of(&j);
    cr_log_info("accuracy %.4f through three losses, %.4f undisturbed", acc, clean);
    cr_assert(fabs(acc - clean) <= 0.01, "accuracy %.4f through three losses, %.4f undisturbed", acc, clean);
    tpu_history_free(h);
    job_free(&j);
    cluster_free(c);
}

Test(elastic, bad_options_are_refused_and_losses_beyond_the_limit_fail, .timeout = 240)
{
    cluster *c = start4();
    struct job j;
    tpu_fit_options fo;

    job_start(c, &j);
    fit_options(&fo, 1, 1000);
    fo.elastic.max_losses = 1001;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "max_losses 1001"), "%s", tpu_last_error());
    fit_options(&fo, 1, 3600001);
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "wait_ms 3600001"), "%s", tpu_last_error());
    fit_options(&fo, 1, 1000);
    fo.elastic.min_replicas = 5;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "min_replicas 5"), "%s", tpu_last_error());
    fit_options(&fo, 1, 1000);
    fo.elastic.batch = (tpu_elastic_batch)7;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "elastic.batch 7"), "%s", tpu_last_error());
    cr_assert_eq(tpu_model_step(j.m), 0, "a refused fit trained");

    /* one loss allowed, two come: the second fails naming its core */
    kill_at_step(&j, "h1", 1, 10);
    kill_at_step(&j, "h0", 1, 25);
    fit_options(&fo, 3, 1000);
    fo.elastic.max_losses = 1;
    cr_assert_eq(tpu_model_fit(j.m, j.ds, &fo, NULL), TPU_UNAVAILABLE, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "gave up after 1 losses") && strstr(tpu_last_error(), "h0/1"),
              "%s", tpu_last_error());
    /* fewer live cores than min_replicas: fails, saying so */
    job_free(&j);
    cluster_free(c);
}
