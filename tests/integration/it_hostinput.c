/* Input pipelines on the hosts (tpu_strategy_distribute_datasets_from_files),
 * through real workers and the public API:
 *
 *  - training with host-side input (each core's tpu-worker reads the IDX
 *    files, takes its shard, maps, caches, shuffles, batches and prefetches
 *    itself; the client sends no rows: what it sends over TCP during fit,
 *    as the kernel counts it, is under a quarter of the rows' bytes) gives
 *    bitwise the same weights on
 *    every replica and the same losses as the client-fed path with the same
 *    sharding (TPU_INPUT_ON_CLIENT: the client runs the same pipelines and
 *    sends the rows), in deterministic mode, on 3 replicas over 2 hosts
 *    (shards of unequal size), for a pipeline with a cache and one without
 *    (a shuffle of batches, normalize; and validation on a second pipeline
 *    of the same files, which each host keeps open beside the first);
 *  - requests fanned out down a tree of cores (TPUEMU_FANOUT=2 from 2 cores,
 *    7 replicas over 2 hosts, three levels) give bitwise the same losses,
 *    accuracy and weights as a request to every core, while the client
 *    sends a fraction of the bytes; a core that is gone fails fit with an
 *    error that names it, and the others live on;
 *  - bad input gives an error naming what is wrong, and the workers live on:
 *    a missing file, a file that changed after the client read its header
 *    (another shape), labels outside the model's classes, an IDX header
 *    claiming 16 EiB, a bad spec. */
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "colltest.h"
#include "scratch.h"

#define HB_MS 500
#define DIM 24
#define CLASSES 4
#define ROWS 1001 /* 3 pipelines: shards of 334, 334 and 333 rows */
#define BATCH 16  /* per replica: 20 steps an epoch */

QUIET_WARNINGS()

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void put_be32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    cr_assert_eq(fwrite(b, 1, 4, f), 4u);
}

/* An IDX file of unsigned bytes with the given dims. */
static void write_idx(const char *path, const uint32_t *dims, int rank, const unsigned char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    unsigned char h[4] = {0, 0, 0x08, (unsigned char)rank};
    cr_assert_eq(fwrite(h, 1, 4, f), 4u);
    for (int i = 0; i < rank; i++)
        put_be32(f, dims[i]);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* rows images of 4 x 6 pixels and their labels (from the pixels: learnable) */
static void write_data(const char *dir, size_t rows, int max_label, char *img, char *lab, size_t n)
{
    unsigned char *px = malloc(rows * DIM), *l = malloc(rows);
    uint64_t s = 11;
    cr_assert(px && l);
    for (size_t i = 0; i < rows; i++) {
        for (size_t j = 0; j < DIM; j++)
            px[i * DIM + j] = (unsigned char)(sm64(&s) >> 56);
        l[i] = (unsigned char)((px[i * DIM] > 127) * 2 + (px[i * DIM + 1] + px[i * DIM + 2] > 255));
        if ((int)l[i] > max_label)
            l[i] = (unsigned char)max_label;
    }
    if (max_label >= CLASSES)
        l[rows / 2] = (unsigned char)max_label;
    snprintf(img, n, "%s/images-idx3-ubyte", dir);
    snprintf(lab, n, "%s/labels-idx1-ubyte", dir);
    write_idx(img, (uint32_t[]){(uint32_t)rows, 4, 6}, 3, px, rows * DIM);
    write_idx(lab, (uint32_t[]){(uint32_t)rows}, 1, l, rows);
    free(px);
    free(l);
}

static tpu_model *make_model(tpu_strategy *s)
{
    tpu_model *m;
    tpu_compile_options co;
    CALL_OK(tpu_model_new(s, DIM, &m));
    CALL_OK(tpu_model_add_dense(m, 32, TPU_ACT_RELU));
    CALL_OK(tpu_model_add_dense(m, CLASSES, TPU_ACT_SOFTMAX));
    CALL_OK(tpu_model_set_seed(m, 5));
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.01f);
    co.deterministic = 1;
    co.steps_per_execution = 3;
    CALL_OK(tpu_model_compile(m, &co));
    return m;
}

/* The two pipelines compared: with a cache before the shuffle (mapped once,
 * reshuffled every epoch) and prefetch, and without a cache (each batch
 * mapped again; normalize; a shuffle of rows and one of batches). */
static tpu_file_dataset *make_files(const char *img, const char *lab, int variant)
{
    tpu_file_dataset *fd;
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    cr_assert_eq(tpu_file_dataset_num_rows(fd), ROWS);
    cr_assert_eq(tpu_file_dataset_x_dim(fd), DIM);
    CALL_OK(tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1 / 255.0f, 0));
    if (variant == 0) {
        CALL_OK(tpu_file_dataset_cache(fd));
        CALL_OK(tpu_file_dataset_shuffle(fd, ROWS, 42));
        CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
        CALL_OK(tpu_file_dataset_prefetch(fd, 2));
    } else {
        CALL_OK(tpu_file_dataset_map(fd, TPU_MAP_NORMALIZE, 0.5f, 0.25f));
        CALL_OK(tpu_file_dataset_shuffle(fd, 100, 7));
        CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
        CALL_OK(tpu_file_dataset_shuffle(fd, 5, 9));
    }
    return fd;
}

struct result {
    float *w[CL_MAX_WORKERS];
    double loss[3], acc[3], val_loss[3];
    uint64_t steps;
    unsigned long long written; /* bytes this process sent over TCP during fit */
};

/* Bytes this process has sent over TCP on the sockets it has open (the
 * kernel's count, TCP_INFO's tcpi_bytes_sent, summed over /proc/self/fd). */
static unsigned long long tcp_sent(void)
{
    unsigned long long v = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    cr_assert_not_null(d);
    while ((de = readdir(d))) {
        int fd = atoi(de->d_name), type = 0;
        socklen_t tl = sizeof type;
        struct tcp_info ti;
        socklen_t il = sizeof ti;
        if (de->d_name[0] == '.' || fd == dirfd(d))
            continue;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
            continue;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &il) == 0)
            v += ti.tcpi_bytes_sent;
    }
    closedir(d);
    return v;
}

static void train(colltest *t, tpu_strategy *s, const char *img, const char *lab, int variant,
                  tpu_input_placement where, struct result *out)
{
    tpu_file_dataset *fd = make_files(img, lab, variant);
    tpu_dataset *ds;
    tpu_history *h;
    tpu_fit_options fo;
    tpu_model *m = make_model(s);

    CALL_OK(tpu_strategy_distribute_datasets_from_files(s, fd, where, &ds));
    tpu_file_dataset_free(fd);
    cr_assert_eq(tpu_dataset_batch_size(ds), (size_t)BATCH * (size_t)t->n);
    cr_assert_eq(tpu_dataset_num_batches(ds), (ROWS / t->n) / BATCH);
    memset(&fo, 0, sizeof fo);
    fo.epochs = 3;
    tpu_dataset *val = NULL;
    if (variant == 1) { /* validation on another pipeline of the same files: each core's host keeps both open */
        CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
        CALL_OK(tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1 / 255.0f, 0));
        CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
        CALL_OK(tpu_strategy_distribute_datasets_from_files(s, fd, where, &val));
        tpu_file_dataset_free(fd);
        fo.validation_data = val;
    }
    unsigned long long w0 = tcp_sent();
    CALL_OK(tpu_model_fit(m, ds, &fo, &h));
    out->written = tcp_sent() - w0;
    for (size_t e = 0; e < 3; e++) {
        tpu_logs l;
        CALL_OK(tpu_history_epoch(h, e, &l));
        out->loss[e] = l.loss;
        out->acc[e] = l.accuracy;
        out->val_loss[e] = l.has_val ? l.val_loss : NAN;
        cr_assert_eq(l.has_val, variant == 1);
    }
    out->steps = tpu_model_step(m);
    size_t np = tpu_model_num_params(m);
    for (int r = 0; r < t->n; r++) {
        out->w[r] = malloc(np * sizeof(float));
        cr_assert_not_null(out->w[r]);
        CALL_OK(tpu_model_get_weights(m, r, out->w[r], np));
    }
    tpu_history_free(h);
    tpu_dataset_free(ds);
    tpu_dataset_free(val);
    tpu_model_free(m);
}

/* A cluster of hosts hosts of cores[h] cores (n replicas), the data's files in
 * a new scratch directory dir[256] (img[512], lab[512]), and a strategy. */
static colltest *start(int hosts, const int *cores, int n, char *dir, char *img, char *lab, tpu_strategy **s)
{
    scratch_make(dir, 256, "it_hostinput");
    write_data(dir, ROWS, CLASSES - 1, img, lab, 512);
    colltest *t = ct_start(hosts, cores, NULL, HB_MS);
    CALL_OK(tpu_strategy_new(t->c, s));
    cr_assert_eq(t->n, n);
    return t;
}

Test(hostinput, same_weights_and_losses_as_client_fed, .timeout = 300)
{
    char dir[256], img[512], lab[512];
    tpu_strategy *s;
    colltest *t = start(2, (int[]){2, 1}, 3, dir, img, lab, &s);

    for (int variant = 0; variant < 2; variant++) {
        struct result hosts, client;
        memset(&hosts, 0, sizeof hosts);
        memset(&client, 0, sizeof client);
        train(t, s, img, lab, variant, TPU_INPUT_ON_HOSTS, &hosts);
        train(t, s, img, lab, variant, TPU_INPUT_ON_CLIENT, &client);
        size_t steps_per_epoch = (ROWS / 3) / BATCH;
        cr_assert_eq(hosts.steps, 3 * steps_per_epoch);
        cr_assert_eq(client.steps, hosts.steps);
        for (int e = 0; e < 3; e++) {
            cr_log_info("pipeline %d epoch %d: loss %.9g (hosts) %.9g (client), accuracy %.4f %.4f", variant, e,
                        hosts.loss[e], client.loss[e], hosts.acc[e], client.acc[e]);
            cr_assert(memcmp(&hosts.val_loss[e], &client.val_loss[e], sizeof(double)) == 0,
                      "pipeline %d epoch %d: validation loss %.17g on the hosts, %.17g client-fed", variant, e,
                      hosts.val_loss[e], client.val_loss[e]);
            cr_assert(memcmp(&hosts.loss[e], &client.loss[e], sizeof(double)) == 0,
                      "pipeline %d epoch %d: loss %.17g on the hosts, %.17g client-fed", variant, e, hosts.loss[e],
                      client.loss[e]);
        }
        /* no training rows through the client: what it wrote during fit with
         * the input on the hosts is a fraction of the rows it sends otherwise */
        unsigned long long rows_bytes = 3ull * hosts.steps * BATCH * (DIM * sizeof(float) + sizeof(int32_t));
        cr_log_info("pipeline %d: the client sent %llu bytes during fit with the input on the hosts, %llu "
                    "client-fed (the rows: %llu)",
                    variant, hosts.written, client.written, rows_bytes);
        cr_assert_geq(client.written, rows_bytes);
        cr_assert_lt(hosts.written, rows_bytes / 4, "the client sent %llu bytes with the input on the hosts",
                     hosts.written);
        /* it learned: the loss fell */
        cr_assert_lt(hosts.loss[2], hosts.loss[0] * 0.9, "pipeline %d: loss %.4f -> %.4f", variant, hosts.loss[0],
                     hosts.loss[2]);
        size_t np = 32 * DIM + 32 + 32 * CLASSES + CLASSES;
        for (int r = 0; r < 3; r++) {
            cr_assert(memcmp(hosts.w[r], client.w[r], np * sizeof(float)) == 0,
                      "pipeline %d: replica %d's weights differ between host-side and client-fed input", variant, r);
            cr_assert(memcmp(hosts.w[r], hosts.w[0], np * sizeof(float)) == 0,
                      "pipeline %d: replica %d's weights differ from replica 0's", variant, r);
        }
        for (int r = 0; r < 3; r++) {
            free(hosts.w[r]);
            free(client.w[r]);
        }
    }
    tpu_strategy_free(s);
    ct_free(t);
    scratch_remove(dir);
}

static tpu_status fit_hosts(colltest *t, tpu_file_dataset *fd, char *why, size_t n);

/* The test files, pipeline 0's spec, distributed to run on the hosts. */
static tpu_dataset *on_hosts(tpu_strategy *s, const char *img, const char *lab)
{
    tpu_file_dataset *fd = make_files(img, lab, 0);
    tpu_dataset *ds;
    CALL_OK(tpu_strategy_distribute_datasets_from_files(s, fd, TPU_INPUT_ON_HOSTS, &ds));
    tpu_file_dataset_free(fd);
    return ds;
}

/* The client's requests go to every core again. */
static void fanout_off(void)
{
    unsetenv("TPUEMU_FANOUT");
    unsetenv("TPUEMU_FANOUT_MIN");
}

/* From now on the client's requests fan out down a tree of this degree. */
static void fanout(int degree)
{
    char v[16];
    snprintf(v, sizeof v, "%d", degree);
    cr_assert_eq(setenv("TPUEMU_FANOUT", v, 1), 0);
    cr_assert_eq(setenv("TPUEMU_FANOUT_MIN", "2", 1), 0);
}

Test(hostinput, fanned_out_requests_give_the_same_results, .timeout = 300)
{
    char dir[256], img[512], lab[512];
    tpu_strategy *s;
    colltest *t = start(2, (int[]){4, 3}, 7, dir, img, lab, &s);
    struct result tree, each;
    memset(&tree, 0, sizeof tree);
    memset(&each, 0, sizeof each);
    fanout(2); /* replica 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6 */
    train(t, s, img, lab, 1, TPU_INPUT_ON_HOSTS, &tree);
    fanout(0);
    train(t, s, img, lab, 1, TPU_INPUT_ON_HOSTS, &each);
    fanout_off();
    cr_assert_eq(tree.steps, each.steps);
    for (int e = 0; e < 3; e++) {
        cr_log_info("epoch %d: loss %.9g (tree) %.9g (each core), accuracy %.4f %.4f", e, tree.loss[e], each.loss[e],
                    tree.acc[e], each.acc[e]);
        cr_assert(memcmp(&tree.loss[e], &each.loss[e], sizeof(double)) == 0, "epoch %d: loss %.17g, %.17g", e,
                  tree.loss[e], each.loss[e]);
        cr_assert(memcmp(&tree.acc[e], &each.acc[e], sizeof(double)) == 0, "epoch %d: accuracy %.17g, %.17g", e,
                  tree.acc[e], each.acc[e]);
        cr_assert(memcmp(&tree.val_loss[e], &each.val_loss[e], sizeof(double)) == 0,
                  "epoch %d: validation loss %.17g, %.17g", e, tree.val_loss[e], each.val_loss[e]);
    }
    size_t np = 32 * DIM + 32 + 32 * CLASSES + CLASSES;
    for (int r = 0; r < 7; r++) {
        cr_assert(memcmp(tree.w[r], each.w[r], np * sizeof(float)) == 0,
                  "replica %d's weights differ between fanned-out and per-core requests", r);
        free(tree.w[r]);
        free(each.w[r]);
    }
    /* one request an execution instead of seven */
    cr_log_info("the client sent %llu bytes during fit with the requests fanned out, %llu to every core", tree.written,
                each.written);
    cr_assert_lt(tree.written * 3, each.written, "fanned out: %llu bytes; to every core: %llu", tree.written,
                 each.written);

    /* a leaf of the tree is gone: fit fails naming it; the others live on */
    char why[2048];
    int gone = t->worker_of[6];
    char name[72];
    snprintf(name, sizeof name, "%s", t->name[6]);
    tpu_model *m = make_model(s);
    tpu_dataset *ds = on_hosts(s, img, lab);
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fanout(2);
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL)); /* compiled, and the tree's connections open */
    cluster_kill_worker(t->cl, gone);
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    snprintf(why, sizeof why, "%s", tpu_last_error());
    fanout_off();
    cr_log_info("a leaf gone: %s: %s", tpu_status_name(st), why);
    cr_assert_neq(st, TPU_OK);
    cr_assert(strstr(why, name), "the error does not name core %s: %s", name, why);
    for (int i = 0; i < 6; i++)
        cr_assert(cluster_alive(&t->cl->workers[t->worker_of[i]]), "worker %s died", t->name[i]);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
    scratch_remove(dir);
}

/* A core of the tree that stops (SIGSTOP) while its parent passes it steps:
 * the parent waits for it as long as the client would once another core
 * failed, then answers naming it; fit fails with an error that names the
 * stopped core, and every worker serves on once it runs again. */
Test(hostinput, a_stopped_core_of_the_tree_is_named, .timeout = 300)
{
    char dir[256], img[512], lab[512], why[2048], name[72];
    tpu_strategy *s;
    colltest *t = start(2, (int[]){3, 2}, 5, dir, img, lab, &s);
    tpu_model *m = make_model(s);
    tpu_dataset *ds = on_hosts(s, img, lab);
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    fanout(2); /* replica 0 -> 1, 2; 1 -> 3, 4 */
    CALL_OK(tpu_model_fit(m, ds, &fo, NULL));
    snprintf(name, sizeof name, "%s", t->name[4]);
    cluster_signal_worker(t->cl, t->worker_of[4], SIGSTOP);
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    snprintf(why, sizeof why, "%s", tpu_last_error());
    cluster_signal_worker(t->cl, t->worker_of[4], SIGCONT);
    cr_log_info("a leaf stopped: %s: %s", tpu_status_name(st), why);
    cr_assert_neq(st, TPU_OK);
    cr_assert(strstr(why, name), "the error does not name core %s: %s", name, why);
    tpu_dataset_free(ds);
    tpu_model_free(m);
    /* the same cores train again, still fanned out, once the system is
     * initialized anew (each core's connections to its children are the old
     * epoch's: they are made again) */
    tpu_file_dataset *fd = make_files(img, lab, 0);
    st = fit_hosts(t, fd, why, sizeof why);
    fanout_off();
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), why);
    tpu_file_dataset_free(fd);
    tpu_strategy_free(s);
    ct_free(t);
    scratch_remove(dir);
}

/* A preemption notice on a leaf of the tree reaches the client in the merged
 * answer, with whose it is: fit stops every replica at one step boundary,
 * saves the checkpoint and returns TPU_PREEMPTED naming that core, and
 * tpu_model_notice gives its replica. */
Test(hostinput, a_notice_on_a_leaf_of_the_tree_stops_fit, .timeout = 300)
{
    char dir[256], img[512], lab[512], ckpt[600];
    tpu_strategy *s;
    colltest *t = start(2, (int[]){3, 2}, 5, dir, img, lab, &s);
    tpu_model *m = make_model(s);
    tpu_dataset *ds = on_hosts(s, img, lab);
    /* terminated long after the test: the notice is all it sees */
    tpu_fault f = {.kind = TPU_FAULT_PREEMPT, .notice_ms = 600000};
    char host[72];
    snprintf(host, sizeof host, "%s", t->name[4]);
    char *slash = strchr(host, '/');
    cr_assert_not_null(slash);
    *slash = '\0';
    CALL_OK(tpu_inject_fault(t->c, host, atoi(slash + 1), &f));
    tpu_fit_options fo;
    memset(&fo, 0, sizeof fo);
    fo.epochs = 3;
    snprintf(ckpt, sizeof ckpt, "%s/preempted.ckpt", dir);
    fo.preemption_checkpoint = ckpt;
    fanout(2); /* replica 0 -> 1, 2; 1 -> 3, 4 */
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    fanout_off();
    cr_log_info("a notice on a leaf: %s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert_eq(st, TPU_PREEMPTED, "%s: %s", tpu_status_name(st), tpu_last_error());
    cr_assert(strstr(tpu_last_error(), t->name[4]), "the error does not name core %s: %s", t->name[4],
              tpu_last_error());
    tpu_notice nt;
    int replica = -1;
    CALL_OK(tpu_model_notice(m, &nt, &replica));
    cr_assert_eq(nt.kind, TPU_NOTICE_PREEMPTION);
    cr_assert_eq(replica, 4, "the notice is replica %d's", replica);
    cr_assert_eq(access(ckpt, F_OK), 0, "no checkpoint at %s", ckpt);
    cr_assert_lt(tpu_model_step(m), 3 * ((ROWS / 5) / BATCH), "fit ran to its end");
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    ct_free(t);
    scratch_remove(dir);
}

/* fit's status and message with host-side input over fd, on a system
 * initialized anew (a step that failed leaves the others' all-reduce failed) */
static tpu_status fit_hosts(colltest *t, tpu_file_dataset *fd, char *why, size_t n)
{
    tpu_strategy *s;
    tpu_dataset *ds;
    ct_reinit(t);
    CALL_OK(tpu_strategy_new(t->c, &s));
    tpu_fit_options fo;
    tpu_model *m = make_model(s);
    CALL_OK(tpu_strategy_distribute_datasets_from_files(s, fd, TPU_INPUT_ON_HOSTS, &ds));
    memset(&fo, 0, sizeof fo);
    fo.epochs = 1;
    tpu_status st = tpu_model_fit(m, ds, &fo, NULL);
    snprintf(why, n, "%s", tpu_last_error());
    tpu_dataset_free(ds);
    tpu_model_free(m);
    tpu_strategy_free(s);
    return st;
}

static void assert_workers_alive(colltest *t)
{
    for (int i = 0; i < t->n; i++)
        cr_assert(cluster_alive(&t->cl->workers[t->worker_of[i]]), "worker %s died", t->name[i]);
}

Test(hostinput, bad_input_is_named_and_the_workers_live_on, .timeout = 300)
{
    char dir[256], img[512], lab[512], path[600], why[2048];
    tpu_file_dataset *fd;
    tpu_status st;
    scratch_make(dir, sizeof dir, "it_hostinput");
    colltest *t = ct_start(1, (int[]){2}, NULL, HB_MS);
    tpu_strategy *s;
    CALL_OK(tpu_strategy_new(t->c, &s));

    /* a file that is not there: the client says so before anything is sent */
    snprintf(path, sizeof path, "%s/nothing-here", dir);
    write_data(dir, ROWS, CLASSES - 1, img, lab, sizeof img);
    cr_assert_eq(tpu_file_dataset_from_idx(path, lab, &fd), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), path), "%s", tpu_last_error());
    cr_assert_null(fd);

    /* a header claiming 2^32-1 x 2^32-1 x 2^32-1 bytes */
    snprintf(path, sizeof path, "%s/huge-idx3-ubyte", dir);
    write_idx(path, (uint32_t[]){0xffffffffu, 0xffffffffu, 0xffffffffu}, 3, (const unsigned char *)"x", 1);
    cr_assert_eq(tpu_file_dataset_from_idx(path, lab, &fd), TPU_RESOURCE_EXHAUSTED);
    cr_assert(strstr(tpu_last_error(), path), "%s", tpu_last_error());

    /* bad transformations */
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    cr_assert_eq(tpu_file_dataset_map(fd, TPU_MAP_NORMALIZE, 0.5f, 0.0f), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_file_dataset_map(fd, TPU_MAP_SCALE, NAN, 0), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_file_dataset_shuffle(fd, 0, 1), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_file_dataset_batch(fd, BATCH, 0), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_file_dataset_prefetch(fd, 2), TPU_INVALID_ARGUMENT); /* before batch() */
    tpu_dataset *ds;
    cr_assert_eq(tpu_strategy_distribute_datasets_from_files(s, fd, TPU_INPUT_ON_HOSTS, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "batch"), "%s", tpu_last_error());
    CALL_OK(tpu_file_dataset_batch(fd, 1000, 1)); /* more than a shard holds */
    cr_assert_eq(tpu_strategy_distribute_datasets_from_files(s, fd, TPU_INPUT_ON_HOSTS, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "less than one batch"), "%s", tpu_last_error());
    cr_assert_eq(tpu_file_dataset_map(fd, TPU_MAP_SCALE, 2, 0), TPU_INVALID_ARGUMENT); /* after batch() */
    tpu_file_dataset_free(fd);

    /* the images file disappears after the client read its header: the hosts say which */
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
    cr_assert_eq(unlink(img), 0);
    st = fit_hosts(t, fd, why, sizeof why);
    cr_log_info("missing on the hosts: %s: %s", tpu_status_name(st), why);
    cr_assert_eq(st, TPU_NOT_FOUND, "%s: %s", tpu_status_name(st), why);
    cr_assert(strstr(why, img) && strstr(why, "host-side input pipeline"), "%s", why);
    assert_workers_alive(t);

    /* ... or has another shape there (the hosts read other files than the client did) */
    write_data(dir, ROWS - 1, CLASSES - 1, img, lab, sizeof img);
    st = fit_hosts(t, fd, why, sizeof why);
    cr_log_info("another shape on the hosts: %s: %s", tpu_status_name(st), why);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT, "%s: %s", tpu_status_name(st), why);
    cr_assert(strstr(why, img) && strstr(why, "the spec says"), "%s", why);
    assert_workers_alive(t);
    tpu_file_dataset_free(fd);

    /* a label the model has no class for */
    write_data(dir, ROWS, 9, img, lab, sizeof img);
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
    st = fit_hosts(t, fd, why, sizeof why);
    cr_log_info("a label out of range: %s: %s", tpu_status_name(st), why);
    cr_assert_eq(st, TPU_INVALID_ARGUMENT, "%s: %s", tpu_status_name(st), why);
    cr_assert(strstr(why, lab) && strstr(why, "label 9"), "%s", why);
    assert_workers_alive(t);
    tpu_file_dataset_free(fd);

    /* elastic training re-shards; a dataset distributed from files cannot be */
    write_data(dir, ROWS, CLASSES - 1, img, lab, sizeof img);
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
    {
        tpu_strategy *es;
        tpu_dataset *eds;
        tpu_fit_options fo;
        ct_reinit(t); /* after the failed step above */
        CALL_OK(tpu_strategy_new(t->c, &es));
        tpu_model *m = make_model(es);
        CALL_OK(tpu_strategy_distribute_datasets_from_files(es, fd, TPU_INPUT_ON_HOSTS, &eds));
        memset(&fo, 0, sizeof fo);
        fo.epochs = 1;
        fo.elastic.max_losses = 1;
        cr_assert_eq(tpu_model_fit(m, eds, &fo, NULL), TPU_INVALID_ARGUMENT);
        cr_assert(strstr(tpu_last_error(), "elastic") && strstr(tpu_last_error(), "distributed from files"), "%s",
                  tpu_last_error());
        tpu_dataset_free(eds);
        tpu_model_free(m);
        tpu_strategy_free(es);
    }
    tpu_file_dataset_free(fd);

    /* and the same cores train with good files afterwards */
    write_data(dir, ROWS, CLASSES - 1, img, lab, sizeof img);
    CALL_OK(tpu_file_dataset_from_idx(img, lab, &fd));
    CALL_OK(tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1 / 255.0f, 0));
    CALL_OK(tpu_file_dataset_batch(fd, BATCH, 1));
    st = fit_hosts(t, fd, why, sizeof why);
    cr_assert_eq(st, TPU_OK, "%s: %s", tpu_status_name(st), why);
    tpu_file_dataset_free(fd);
    tpu_strategy_free(s);
    ct_free(t);
    scratch_remove(dir);
}
