/* The built-in callbacks of fit: Keras' progress bar, ModelCheckpoint, and
 * TensorBoard (its profile_batch range and its per-epoch scalars). */
#include "model_int.h"
#include "profile_int.h"
#include "tfevents.h"
#include "safefile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void tpu_callback_free(tpu_callback *cb)
{
    tpu_callback_clear(cb);
}

void tpu_callback_clear(tpu_callback *cb)
{
    if (!cb)
        return;
    if (cb->destroy)
        cb->destroy(cb->user);
    memset(cb, 0, sizeof *cb);
}

/* ---- progress ---- */

struct progress {
    FILE *out;
    int tty;
    int epochs;
};

static void fmt_time(double s, char *buf, size_t n)
{
    if (s >= 1 || s <= 0)
        snprintf(buf, n, "%.0fs", s);
    else
        snprintf(buf, n, "%.0fms", s * 1e3);
}

static void progress_line(struct progress *p, const tpu_logs *l, int final)
{
    char bar[31], el[16], per[24];
    size_t width = 30, done = l->batches ? l->batch * width / l->batches : width;
    if (done > width)
        done = width;
    for (size_t i = 0; i < width; i++)
        bar[i] = i < done ? '=' : '.';
    if (done < width && done > 0)
        bar[done - 1] = '>';
    bar[width] = '\0';
    fmt_time(l->elapsed_s, el, sizeof el);
    double ms = l->batch ? l->elapsed_s * 1e3 / (double)l->batch : 0;
    snprintf(per, sizeof per, ms >= 1 ? "%.0fms/step" : "%.0fus/step", ms >= 1 ? ms : ms * 1e3);
    fprintf(p->out, "%s%zu/%zu [%s] - %s %s - loss: %.4f", p->tty ? "\r" : "", l->batch, l->batches, bar, el, per,
            l->loss);
    if (!isnan(l->accuracy))
        fprintf(p->out, " - accuracy: %.4f", l->accuracy);
    if (final && l->has_val) {
        fprintf(p->out, " - val_loss: %.4f", l->val_loss);
        if (!isnan(l->val_accuracy))
            fprintf(p->out, " - val_accuracy: %.4f", l->val_accuracy);
    }
    if (final || !p->tty)
        fputc('\n', p->out);
    fflush(p->out);
}

static tpu_status progress_epoch_begin(tpu_model *m, int epoch, void *user)
{
    struct progress *p = user;
    (void)m;
    if (p->epochs > 0)
        fprintf(p->out, "Epoch %d/%d\n", epoch + 1, p->epochs);
    else
        fprintf(p->out, "Epoch %d\n", epoch + 1);
    fflush(p->out);
    return TPU_OK;
}

static tpu_status progress_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    struct progress *p = user;
    (void)m, (void)epoch, (void)batch;
    if (p->tty && l->batch < l->batches)
        progress_line(p, l, 0);
    return TPU_OK;
}

static tpu_status progress_epoch_end(tpu_model *m, int epoch, const tpu_logs *l, void *user)
{
    (void)m, (void)epoch;
    progress_line(user, l, 1);
    return TPU_OK;
}

static tpu_status progress_train_begin(tpu_model *m, void *user)
{
    struct progress *p = user;
    p->epochs = m->fit_epochs;
    return TPU_OK;
}

tpu_status tpu_callback_progress(FILE *out, tpu_callback *cb)
{
    struct progress *p;
    memset(cb, 0, sizeof *cb);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "progress: no output stream");
    if (!(p = calloc(1, sizeof *p)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    p->out = out;
    p->tty = isatty(fileno(out));
    cb->on_train_begin = progress_train_begin;
    cb->on_epoch_begin = progress_epoch_begin;
    cb->on_batch_end = progress_batch_end;
    cb->on_epoch_end = progress_epoch_end;
    cb->destroy = free;
    cb->user = p;
    return TPU_OK;
}

/* ---- checkpoint ---- */

struct ckpt_cb {
    char *path;
    uint64_t every;
};

static void ckpt_cb_free(void *user)
{
    struct ckpt_cb *k = user;
    free(k->path);
    free(k);
}

static tpu_status ckpt_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    struct ckpt_cb *k = user;
    (void)epoch, (void)batch, (void)l;
    if (k->every && m->step % k->every == 0)
        return tpu_model_save_checkpoint(m, k->path);
    return TPU_OK;
}

static tpu_status ckpt_epoch_end(tpu_model *m, int epoch, const tpu_logs *l, void *user)
{
    struct ckpt_cb *k = user;
    (void)epoch, (void)l;
    return k->every ? TPU_OK : tpu_model_save_checkpoint(m, k->path);
}

tpu_status tpu_callback_checkpoint(const char *path, uint64_t save_every_steps, tpu_callback *cb)
{
    struct ckpt_cb *k;
    memset(cb, 0, sizeof *cb);
    if (!path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "checkpoint: no path");
    if (!(k = calloc(1, sizeof *k)) || !(k->path = strdup(path))) {
        free(k);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    k->every = save_every_steps;
    cb->on_batch_end = ckpt_batch_end;
    cb->on_epoch_end = ckpt_epoch_end;
    cb->destroy = ckpt_cb_free;
    cb->user = k;
    return TPU_OK;
}

/* ---- TensorBoard: the profiler hook and the epoch scalars ---- */

struct prof {
    char *logdir;
    char train_dir[4200], val_dir[4200]; /* LOGDIR/train, LOGDIR/validation */
    int profile;                    /* profile_batch given (not 0) */
    uint64_t first, last, seen;     /* executions since train begin, 1-based (Keras' _global_train_batch) */
    tpu_step_stats *steps;
    size_t n, cap;
    uint64_t prev_step;             /* the global step before the current execution */
    uint64_t step_first, step_last; /* the global steps of those executions */
    int64_t t_begin;                /* CLOCK_MONOTONIC ns when training began */
    char dir[4700];
    int written;
    tfevents train_ev, val_ev;      /* the event files, opened when first needed */
    int train_off, val_off;         /* a write to that file failed: it gets nothing more in this fit */
    FILE *report;                   /* tpu_callback_profiler_report; NULL: none */
};

/* A failure to write the logs that must not stop training: the disk or the
 * quota full, an I/O error (a wrong path or permissions still fail the fit
 * when it begins, as Keras' callback does). */
static int soft_failure(int code)
{
    return code == CODE_RESOURCE_EXHAUSTED || code == CODE_UNAVAILABLE || code == CODE_DATA_LOSS;
}

/* Writing event file w failed with e: warned once, the file is closed as it
 * stands (its records up to the failure stay readable) and gets nothing more
 * in this fit; training goes on. A failure that is not soft fails the call. */
static tpu_status events_failed(tfevents *w, int *off, const err *e)
{
    err ce;
    if (!soft_failure(e->code))
        return cli_fail(e);
    cli_warn("TensorBoard: %s; training goes on, without more events in this file", e->msg);
    tfevents_close(w, &ce);
    *off = 1;
    return TPU_OK;
}

static tpu_status events_open(tfevents *w, const char *dir, int *off)
{
    err e;
    if (w->f || *off || tfevents_open(w, dir, &e) == CODE_OK)
        return TPU_OK;
    return events_failed(w, off, &e);
}

static void prof_free(void *user)
{
    struct prof *p = user;
    err e;
    tfevents_close(&p->train_ev, &e);
    tfevents_close(&p->val_ev, &e);
    free(p->logdir);
    free(p->steps);
    free(p);
}

static tpu_status prof_write(struct prof *p, tpu_model *m)
{
    char file[4700 - 32];
    tpu_profile *pr;
    FILE *f;
    double sum[8] = {0};
    char *slash;
    p->written = 1;
    /* every core's events of those steps: the trace, and the overview */
    if (tpu_profile_capture(m->s->c, 0, &pr) != TPU_OK)
        return tpu_last_status();
    for (size_t l = 0; l < m->nlayers && l < TPU_PROFILE_MAX_LAYERS; l++) {
        char lname[48];
        model_layer_name(m, l, lname, sizeof lname);
        tpu_profile_set_layer_name(pr, l, lname);
    }
    profile_keep_steps(pr, p->step_first, p->step_last, p->t_begin);
    if (tpu_profile_write(pr, p->train_dir, file, sizeof file) != TPU_OK) {
        tpu_profile_free(pr);
        return tpu_last_status();
    }
    if (p->report) {
        fprintf(p->report, "Profile of batches %llu-%llu (steps %llu-%llu):\n", (unsigned long long)p->first,
                (unsigned long long)p->last, (unsigned long long)p->step_first, (unsigned long long)p->step_last);
        tpu_profile_print_overview(pr, p->report);
        fprintf(p->report, "Trace: %s\n", file);
    }
    if ((slash = strrchr(file, '/')))
        *slash = '\0';
    snprintf(p->dir, sizeof p->dir, "%s", file);
    if (strlen(file) + 12 > sizeof file) {
        tpu_profile_free(pr);
        return cli_failf(TPU_INVALID_ARGUMENT, "profiler: the log directory's path is too long");
    }
    /* the picture of those steps beside the trace */
    memcpy(file + strlen(file), "/steps.svg", 11);
    if (tpu_profile_plot_svg(pr, file) != TPU_OK) {
        tpu_profile_free(pr);
        return tpu_last_status();
    }
    if (p->report) {
        fprintf(p->report, "Picture: %s\n", file);
        fflush(p->report);
    }
    tpu_profile_free(pr);
    file[strlen(file) - 10] = '\0';
    memcpy(file + strlen(file), "/steps.json", 12);
    struct safefile sf;
    err e;
    if (safefile_open(&sf, "profiler", file, &e) != CODE_OK)
        return cli_fail(&e);
    if (!(f = fdopen(sf.fd, "w"))) {
        safefile_abort(&sf);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "profiler: cannot write %s: %s", file, strerror(errno));
    }
    sf.fd = -1; /* the FILE owns it */
    fprintf(f, "{\"model_params\": %zu, \"replicas\": %zu, \"first_batch\": %llu, \"last_batch\": %llu, \"steps\": [",
            model_nparams(m), m->n, (unsigned long long)p->first, (unsigned long long)p->last);
    for (size_t i = 0; i < p->n; i++) {
        const tpu_step_stats *s = &p->steps[i];
        fprintf(f, "%s\n  {\"step\": %llu, \"rows\": %zu, \"wall_ns\": %llu, \"input_wait_ns\": %llu, \"compute_ns\": %llu, "
                   "\"matmul_ns\": %llu, \"allreduce_ns\": %llu, \"allreduce_min_ns\": %llu, \"optimizer_ns\": %llu, "
                   "\"infeed_wait_ns\": %llu}",
                i ? "," : "", (unsigned long long)s->step, s->rows, (unsigned long long)s->wall_ns,
                (unsigned long long)s->input_wait_ns, (unsigned long long)s->compute_ns,
                (unsigned long long)s->matmul_ns, (unsigned long long)s->allreduce_ns,
                (unsigned long long)s->allreduce_min_ns, (unsigned long long)s->optimizer_ns,
                (unsigned long long)s->infeed_wait_ns);
        sum[0] += (double)s->wall_ns, sum[1] += (double)s->input_wait_ns, sum[2] += (double)s->compute_ns;
        sum[3] += (double)s->matmul_ns, sum[4] += (double)s->allreduce_ns, sum[5] += (double)s->optimizer_ns;
        sum[6] += (double)s->infeed_wait_ns, sum[7] += (double)s->allreduce_min_ns;
    }
    double k = p->n ? 1.0 / (double)p->n : 0;
    fprintf(f, "\n], \"average_ns\": {\"wall\": %.0f, \"input_wait\": %.0f, \"compute\": %.0f, \"matmul\": %.0f, "
               "\"allreduce\": %.0f, \"allreduce_min\": %.0f, \"optimizer\": %.0f, \"infeed_wait\": %.0f}}\n",
            sum[0] * k, sum[1] * k, sum[2] * k, sum[3] * k, sum[4] * k, sum[7] * k, sum[5] * k, sum[6] * k);
    if (fclose(f) != 0) {
        int en = errno;
        safefile_abort(&sf);
        return cli_failf(TPU_UNAVAILABLE, "profiler: writing %s failed: %s", file, strerror(en));
    }
    if (safefile_commit(&sf, 0, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}

/* prof_write, except that a full disk or an I/O error only warns: the
 * profile is not written (its files are whole or absent: each is replaced
 * whole), and training goes on. */
static tpu_status prof_write_soft(struct prof *p, tpu_model *m)
{
    tpu_status st = prof_write(p, m);
    if (st == TPU_OK || !soft_failure((int)st))
        return st;
    cli_warn("profiler: %s; training goes on without this profile", tpu_last_error());
    p->written = 1;
    return TPU_OK;
}

/* Keras' TensorBoard callback counts profile_batch in calls of its batch
 * hooks, which fit makes once per execution (steps_per_execution steps). */
static tpu_status prof_batch_end(tpu_model *m, int epoch, size_t batch, const tpu_logs *l, void *user)
{
    struct prof *p = user;
    uint64_t before = p->prev_step;
    (void)epoch, (void)batch;
    p->seen++;
    p->prev_step = l->step;
    if (!p->profile || p->written || p->seen < p->first)
        return TPU_OK;
    if (!p->step_first)
        p->step_first = before + 1;
    p->step_last = l->step;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        tpu_step_stats *ns = realloc(p->steps, cap * sizeof *ns);
        if (!ns)
            return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
        p->steps = ns;
        p->cap = cap;
    }
    p->steps[p->n++] = m->last;
    return p->seen >= p->last ? prof_write_soft(p, m) : TPU_OK;
}

static tpu_status prof_train_begin(tpu_model *m, void *user)
{
    struct prof *p = user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    p->t_begin = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    p->prev_step = m->step;
    /* Keras' on_train_begin: _global_train_batch = 0, the batches count from there again */
    p->seen = 0;
    if (!p->written) {
        p->n = 0;
        p->step_first = p->step_last = 0;
    }
    /* Keras opens its train writer when training begins; a file that failed
     * in an earlier fit is tried again */
    p->train_off = p->val_off = 0;
    return events_open(&p->train_ev, p->train_dir, &p->train_off);
}

/* Keras' _log_epoch_metrics: epoch_NAME at step epoch in LOGDIR/train, and
 * the validation's under LOGDIR/validation without their val_ prefix; its
 * on_test_end adds evaluation_NAME_vs_iterations at the optimizer's
 * iterations (the global step) there. */
static tpu_status prof_epoch_end(tpu_model *m, int epoch, const tpu_logs *l, void *user)
{
    struct prof *p = user;
    err e;
    if (events_open(&p->train_ev, p->train_dir, &p->train_off) != TPU_OK)
        return tpu_last_status();
    if (p->train_ev.f &&
        (tfevents_scalar(&p->train_ev, "epoch_loss", epoch, (float)l->loss, &e) != CODE_OK ||
         (!isnan(l->accuracy) && tfevents_scalar(&p->train_ev, "epoch_accuracy", epoch, (float)l->accuracy, &e))) &&
        events_failed(&p->train_ev, &p->train_off, &e) != TPU_OK)
        return tpu_last_status();
    if (!l->has_val)
        return TPU_OK;
    if (events_open(&p->val_ev, p->val_dir, &p->val_off) != TPU_OK)
        return tpu_last_status();
    if (p->val_ev.f &&
        (tfevents_scalar(&p->val_ev, "evaluation_loss_vs_iterations", (int64_t)m->step, (float)l->val_loss, &e) ||
         (!isnan(l->val_accuracy) && tfevents_scalar(&p->val_ev, "evaluation_accuracy_vs_iterations", (int64_t)m->step,
                                                     (float)l->val_accuracy, &e)) ||
         tfevents_scalar(&p->val_ev, "epoch_loss", epoch, (float)l->val_loss, &e) ||
         (!isnan(l->val_accuracy) &&
          tfevents_scalar(&p->val_ev, "epoch_accuracy", epoch, (float)l->val_accuracy, &e))) &&
        events_failed(&p->val_ev, &p->val_off, &e) != TPU_OK)
        return tpu_last_status();
    return TPU_OK;
}

static tpu_status prof_train_end(tpu_model *m, const tpu_logs *l, void *user)
{
    struct prof *p = user;
    err e;
    tpu_status st = TPU_OK;
    (void)l;
    if (p->profile && !p->written && p->n)
        st = prof_write_soft(p, m);
    /* Keras closes its writers when training ends */
    if ((tfevents_close(&p->train_ev, &e) != CODE_OK && events_failed(&p->train_ev, &p->train_off, &e) != TPU_OK) ||
        (tfevents_close(&p->val_ev, &e) != CODE_OK && events_failed(&p->val_ev, &p->val_off, &e) != TPU_OK))
        return st == TPU_OK ? tpu_last_status() : st;
    return st;
}

tpu_status tpu_callback_tensorboard(const char *log_dir, uint64_t first, uint64_t last, tpu_callback *cb)
{
    struct prof *p;
    memset(cb, 0, sizeof *cb);
    if (!log_dir || !*log_dir)
        return cli_failf(TPU_INVALID_ARGUMENT, "TensorBoard: no log directory");
    if ((first == 0) != (last == 0) || last < first)
        return cli_failf(TPU_INVALID_ARGUMENT, "TensorBoard: profile_batch '%llu,%llu' is not 0 (no profile) or a "
                         "range of batches counted from 1", (unsigned long long)first, (unsigned long long)last);
    if (strlen(log_dir) > 4000)
        return cli_failf(TPU_INVALID_ARGUMENT, "TensorBoard: the log directory's path is too long (%zu bytes)",
                         strlen(log_dir));
    if (!(p = calloc(1, sizeof *p)) || !(p->logdir = strdup(log_dir))) {
        free(p);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    snprintf(p->train_dir, sizeof p->train_dir, "%s/train", log_dir);
    snprintf(p->val_dir, sizeof p->val_dir, "%s/validation", log_dir);
    p->profile = first != 0;
    p->first = first;
    p->last = last;
    cb->on_train_begin = prof_train_begin;
    cb->on_batch_end = prof_batch_end;
    cb->on_epoch_end = prof_epoch_end;
    cb->on_train_end = prof_train_end;
    cb->destroy = prof_free;
    cb->user = p;
    return TPU_OK;
}

tpu_status tpu_callback_profiler(const char *logdir, uint64_t first, uint64_t last, tpu_callback *cb)
{
    memset(cb, 0, sizeof *cb);
    if (!logdir || !*logdir)
        return cli_failf(TPU_INVALID_ARGUMENT, "profiler: no log directory");
    if (first < 1 || last < first)
        return cli_failf(TPU_INVALID_ARGUMENT, "profiler: profile_batch '%llu,%llu' is not a range of batches "
                         "counted from 1", (unsigned long long)first, (unsigned long long)last);
    return tpu_callback_tensorboard(logdir, first, last, cb);
}

tpu_status tpu_callback_profiler_report(tpu_callback *cb, FILE *out)
{
    if (!cb || cb->destroy != prof_free)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_callback_profiler_report: not a profiler or TensorBoard callback");
    ((struct prof *)cb->user)->report = out;
    return TPU_OK;
}

const char *tpu_callback_profiler_dir(const tpu_callback *cb)
{
    if (!cb || cb->destroy != prof_free)
        return "";
    return ((const struct prof *)cb->user)->dir;
}
