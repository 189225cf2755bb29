/* Link faults (tpuctl chaos link-delay, link-loss, partition;
 * tpu_inject_link_fault) against real daemons, over shared memory (two cores
 * of one host) and TCP (two hosts): a delay holds every chunk between the two
 * cores, so an all-reduce takes at least the delay, and none once the fault
 * is over; a loss of every transmission makes each chunk wait for at least
 * one retransmission timeout (200 ms), and a loss of some never changes a
 * result; a partition fails the all-reduce that needs the link, naming both
 * cores, and after it a re-initialized system runs again. Each fault is
 * logged by both ends and counted in their /metrics. Every refusal (a core
 * that is not there, a link from a core to itself, a field out of range)
 * names what is wrong, and nothing is injected.
 *
 * Timing: only lower bounds, which the scheduler cannot fake (a held chunk
 * cannot arrive early), and upper bounds with a wide margin (a small
 * all-reduce takes milliseconds; the bound after a fault is the fault's own
 * delay, ten times more and more). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <criterion/criterion.h>
#include <tpuemu/model.h>

#include "calls.h"
#include "cluster.h"
#include "raw.h"

QUIET_WARNINGS()

/* Heartbeats of 500 ms x 3: a peer silent for 750 ms is probed, a live one
 * given up on after 15 s; a partition fails a collective after 750 ms. */
#define HB_MS 500
#define COUNT 4096

typedef struct lt {
    cluster *c;
    tpu_resolver *r;
    tpu_cluster *tc;
    int mport[2]; /* the workers' metrics ports */
    const char *host1; /* the host of the second core: "h0" (shared memory) or "h1" (TCP) */
} lt;

/* Two cores, h0/0 and host1/0 or h0/1, each with a metrics port; a system of both. */
static lt *lt_start(int two_hosts)
{
    static char rp[16];
    lt *t = calloc(1, sizeof *t);
    cluster_opts o;
    memset(&o, 0, sizeof o);
    snprintf(rp, sizeof rp, "%d", cl_free_port());
    o.heartbeat_ms = HB_MS;
    o.no_wait = 1;
    t->c = cluster_start(&o);
    t->host1 = two_hosts ? "h1" : "h0";
    for (int i = 0; i < 2; i++) {
        char wp[16];
        t->mport[i] = cl_free_port();
        snprintf(wp, sizeof wp, "%d", t->mport[i]);
        const char *wargs[] = {"--metrics-port", wp, NULL};
        cluster_add_worker(t->c, i ? t->host1 : "h0", two_hosts ? 0 : i, wargs);
    }
    cr_assert(cluster_wait_count(t->c, CL_ALIVE, 2, 15000 * cl_time_scale()), "only %d of 2 workers registered",
              cluster_count(t->c, CL_ALIVE));
    CALL_OK(cluster_connect(t->c, &t->r, &t->tc));
    return t;
}

static void lt_init(lt *t)
{
    tpu_topology *tp;
    tpu_init_options io = {.expect = 2, .timeout_ms = 15000, .allow_partial = 0};
    CALL_OK(tpu_initialize_system(t->tc, &io, &tp));
    cr_assert_eq(tpu_topology_num_replicas(tp), 2);
    tpu_topology_free(tp);
}

static void lt_free(lt *t)
{
    tpu_cluster_free(t->tc);
    tpu_resolver_free(t->r);
    cluster_free(t->c);
    free(t);
}

/* One all-reduce (sum) of known inputs: its status, its time in *ms, and
 * whether every element came out right (a loss must never change a byte). */
static tpu_status allreduce(lt *t, int64_t *ms, int *right)
{
    float *b[2];
    tpu_status st;
    int64_t t0;

    for (int r = 0; r < 2; r++) {
        b[r] = malloc(COUNT * sizeof(float));
        for (int i = 0; i < COUNT; i++)
            b[r][i] = (float)(i % 1000) + (float)r * 0.5f;
    }
    t0 = cl_now_ms();
    st = tpu_all_reduce(t->tc, (void *const *)b, COUNT, TPU_F32, TPU_SUM, NULL);
    *ms = cl_now_ms() - t0;
    *right = 1;
    for (int r = 0; st == TPU_OK && r < 2; r++)
        for (int i = 0; i < COUNT; i++)
            if (b[r][i] != 2.0f * (float)(i % 1000) + 0.5f)
                *right = 0;
    free(b[0]);
    free(b[1]);
    return st;
}

/* tpuemu_worker_faults_injected_total{kind="KIND"} of worker i; -1 if missing. */
static double injected(lt *t, int i, const char *kind)
{
    char labels[64];
    int status;
    snprintf(labels, sizeof labels, "kind=\"%s\"", kind);
    double v = http_metric(t->mport[i], "tpuemu_worker_faults_injected_total", labels, &status);
    cr_assert_eq(status, 200, "no metrics on port %d (status %d)", t->mport[i], status);
    return v;
}

static void tpuctl_ok(lt *t, run_result *rr, const char *want, const char *const *args)
{
    const char *a[12];
    int n = 0;
    a[n++] = "chaos";
    while (*args && n < 11)
        a[n++] = *args++;
    a[n] = NULL;
    cluster_tpuctl(t->c, rr, 10000 * cl_time_scale(), a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                   a[10], NULL);
    cr_assert_eq(rr->code, 0, "tpuctl chaos %s: %s", a[1], rr->err);
    cr_assert(strstr(rr->out, want), "tpuctl said: %s", rr->out);
}

Test(link, delay_holds_every_chunk_both_ways_then_ends, .timeout = 120)
{
    lt *t = lt_start(0); /* one host: shared memory */
    run_result rr;
    int64_t ms;
    int right, scale = cl_time_scale();

    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error()); /* connections made */
    tpuctl_ok(t, &rr, "injected link-delay on the link h0/0 <-> h0/1, both ways, for 8000 ms",
              (const char *const[]){"link-delay", "h0/0", "h0/1", "1500", "8000", NULL});
    run_result_free(&rr);
    /* a held chunk cannot arrive early: at least the delay, whatever the load */
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    cr_assert(right, "the all-reduce under a delay gave a wrong sum");
    cr_assert_geq(ms, 1500, "an all-reduce over a link delayed by 1500 ms took %lld ms", (long long)ms);
    for (int i = 0; i < 2; i++) {
        cr_assert(cl_wait_log(&t->c->workers[i], "fault injected: the chunks this core sends on the link are held back",
                              2000 * scale), "see %s", t->c->workers[i].log);
        cr_assert(cl_wait_log(&t->c->workers[i], "latency_ms=1500 duration_ms=8000", 1000));
        cr_assert_eq(injected(t, i, "link-delay"), 1, "worker %d counted %g link delays", i,
                     injected(t, i, "link-delay"));
        cr_assert_eq(injected(t, i, "partition"), 0);
    }
    cr_assert(cl_log_contains(&t->c->workers[0], "h0/1") && cl_log_contains(&t->c->workers[1], "h0/0"),
              "each end names the other; see %s", t->c->workers[0].log);
    /* over by itself; then the link is as before: milliseconds, far below the delay */
    for (int i = 0; i < 2; i++)
        cr_assert(cl_wait_log(&t->c->workers[i], "fault over: the link works again", 20000 * scale),
                  "the delay did not end; see %s", t->c->workers[i].log);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    cr_assert(right);
    cr_assert_lt(ms, 1500, "an all-reduce after the delay took %lld ms", (long long)ms);
    lt_free(t);
}

Test(link, loss_is_a_retransmission_delay_never_a_wrong_byte, .timeout = 120)
{
    lt *t = lt_start(1); /* two hosts: TCP */
    run_result rr;
    int64_t ms;
    int right, scale = cl_time_scale();

    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    /* every transmission lost: each chunk waits at least one timeout (200 ms) */
    tpuctl_ok(t, &rr, "injected link-loss on the link h0/0 <-> h1/0, both ways, for 3000 ms",
              (const char *const[]){"--seed", "7", "link-loss", "h0/0", "h1/0", "100", "3000", NULL});
    run_result_free(&rr);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    cr_assert(right, "an all-reduce under loss gave a wrong sum");
    cr_assert_geq(ms, 200, "an all-reduce with every chunk lost once took %lld ms", (long long)ms);
    for (int i = 0; i < 2; i++) {
        cr_assert(cl_wait_log(&t->c->workers[i], "fault injected: the chunks this core sends on the link are lost "
                              "and sent again", 2000 * scale), "see %s", t->c->workers[i].log);
        cr_assert(cl_wait_log(&t->c->workers[i], "percent=100 duration_ms=3000 seed=7", 1000));
        cr_assert_eq(injected(t, i, "link-loss"), 1);
        cr_assert(cl_wait_log(&t->c->workers[i], "fault over: the link works again", 20000 * scale),
                  "see %s", t->c->workers[i].log);
    }
    /* some lost: results stay exact, round after round */
    tpuctl_ok(t, &rr, "injected link-loss", (const char *const[]){"link-loss", "h0/0", "h1/0", "50", "2000", NULL});
    run_result_free(&rr);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "round %d: %s", k, tpu_last_error());
        cr_assert(right, "round %d under 50 %% loss gave a wrong sum", k);
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(injected(t, i, "link-loss"), 2);
    lt_free(t);
}

Test(link, partition_fails_the_collective_naming_both_cores_then_heals, .timeout = 120)
{
    lt *t = lt_start(0);
    run_result rr;
    int64_t ms;
    int right, scale = cl_time_scale();

    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    tpuctl_ok(t, &rr, "injected partition on the link h0/0 <-> h0/1, both ways, for 6000 ms",
              (const char *const[]){"partition", "h0/0", "h0/1", "6000", NULL});
    run_result_free(&rr);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_UNAVAILABLE, "%s", tpu_last_error());
    const char *msg = tpu_last_error();
    cr_assert(strstr(msg, "partition") && strstr(msg, "h0/0") && strstr(msg, "h0/1"),
              "the error does not name the partition and both cores: %s", msg);
    cr_assert(strstr(msg, "cut off"), "%s", msg);
    for (int i = 0; i < 2; i++) {
        cr_assert(cl_wait_log(&t->c->workers[i], "fault injected: nothing this core sends on the link passes",
                              2000 * scale), "see %s", t->c->workers[i].log);
        cr_assert_eq(injected(t, i, "partition"), 1);
    }
    /* after the window the link works: a new system runs */
    for (int i = 0; i < 2; i++)
        cr_assert(cl_wait_log(&t->c->workers[i], "fault over: the link works again", 20000 * scale),
                  "the partition did not end; see %s", t->c->workers[i].log);
    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    cr_assert(right);
    lt_free(t);
}

/* One way only (tpu_inject_fault): the core whose sends are cut fails the
 * collective and tells the other, which would otherwise wait for its stall
 * time (ten times heartbeat x dead-after: 15 s here) before giving up. */
Test(link, one_way_partition_fails_both_ends_with_its_cause, .timeout = 120)
{
    lt *t = lt_start(1); /* TCP */
    int64_t ms;
    int right, scale = cl_time_scale();
    tpu_fault cut = {.kind = TPU_FAULT_PARTITION, .duration_ms = 6000, .peer_host = "h1", .peer_core = 0};

    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    CALL_OK(tpu_inject_fault(t->tc, "h0", 0, &cut));
    cr_assert_eq(allreduce(t, &ms, &right), TPU_UNAVAILABLE, "%s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), "core h1/0 is cut off from core h0/0 by a partition"), "%s",
              tpu_last_error());
    cr_assert_lt(ms, 10000, "the all-reduce failed after %lld ms, as if h1/0 had waited for its stall time",
                 (long long)ms);
    cr_assert_eq(injected(t, 0, "partition"), 1);
    cr_assert_eq(injected(t, 1, "partition"), 0, "the other end got the fault too");
    cr_assert(cl_wait_log(&t->c->workers[0], "fault over: the link works again", 20000 * scale), "see %s",
              t->c->workers[0].log);
    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    cr_assert(right);
    lt_free(t);
}

Test(link, bad_link_faults_are_refused_and_nothing_is_injected, .timeout = 120)
{
    lt *t = lt_start(0);
    run_result rr;
    char path[512];
    FILE *fp;
    int scale = cl_time_scale();
    const struct {
        tpu_fault f;
        tpu_status st;
        const char *says;
    } bad[] = {
        /* the library: a peer that is not there, none at all */
        {{.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 1000, .latency_ms = 100, .peer_host = "h0", .peer_core = 9},
         TPU_NOT_FOUND, "h0/9 is not in the cluster"},
        {{.kind = TPU_FAULT_PARTITION, .duration_ms = 1000, .peer_host = "h7", .peer_core = 0}, TPU_NOT_FOUND,
         "h7/0 is not in the cluster"},
        {{.kind = TPU_FAULT_PARTITION, .duration_ms = 1000}, TPU_INVALID_ARGUMENT, "needs the core at the other end"},
        /* the worker: the link to itself, fields out of range */
        {{.kind = TPU_FAULT_PARTITION, .duration_ms = 1000, .peer_host = "h0", .peer_core = 0}, TPU_INVALID_ARGUMENT,
         "is this core itself"},
        {{.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 0, .latency_ms = 100, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'link-delay' needs a duration"},
        {{.kind = TPU_FAULT_PARTITION, .duration_ms = 600001, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'partition' needs a duration"},
        {{.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 1000, .latency_ms = 0, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'link-delay' needs a latency"},
        {{.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 1000, .latency_ms = 60001, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'link-delay' needs a latency"},
        {{.kind = TPU_FAULT_LINK_LOSS, .duration_ms = 1000, .percent = 0, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'link-loss' needs a percent"},
        {{.kind = TPU_FAULT_LINK_LOSS, .duration_ms = 1000, .percent = 101, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'link-loss' needs a percent"},
        {{.kind = TPU_FAULT_PARTITION, .duration_ms = 1000, .percent = 5, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'partition' takes no percent"},
        {{.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 1000, .latency_ms = 5, .seed = 3, .peer_host = "h0",
          .peer_core = 1}, TPU_INVALID_ARGUMENT, "takes no seed"},
        {{.kind = TPU_FAULT_SLOW, .duration_ms = 1000, .percent = 50, .peer_host = "h0", .peer_core = 1},
         TPU_INVALID_ARGUMENT, "'slow' takes no peer"},
    };

    lt_init(t);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tpu_inject_fault(t->tc, "h0", 0, &bad[i].f), bad[i].st, "case %zu: %s: %s", i,
                     tpu_status_name(tpu_last_status()), tpu_last_error());
        cr_assert(strstr(tpu_last_error(), bad[i].says), "case %zu: %s", i, tpu_last_error());
    }
    /* both ways: each end is looked up before either gets it */
    tpu_fault d = {.kind = TPU_FAULT_LINK_DELAY, .duration_ms = 1000, .latency_ms = 100};
    cr_assert_eq(tpu_inject_link_fault(t->tc, "h0", 0, "h0", 9, &d), TPU_NOT_FOUND);
    cr_assert(strstr(tpu_last_error(), "h0/9"), "%s", tpu_last_error());
    cr_assert_eq(tpu_inject_link_fault(t->tc, "h0", 1, "h0", 1, &d), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "one core, h0/1"), "%s", tpu_last_error());
    d.latency_ms = 0; /* refused by the first end: nothing anywhere */
    cr_assert_eq(tpu_inject_link_fault(t->tc, "h0", 0, "h0", 1, &d), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "h0/0") && strstr(tpu_last_error(), "latency"), "%s", tpu_last_error());
    tpu_fault k = {.kind = TPU_FAULT_KILL};
    cr_assert_eq(tpu_inject_link_fault(t->tc, "h0", 0, "h0", 1, &k), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "not a link fault"), "%s", tpu_last_error());
    /* the command line */
    const struct {
        const char *a[7];
        int code;
        const char *says;
    } cli[] = {
        {{"link-delay", "h0/0", "h0/1", "0", "1000"}, 2, "not a latency in ms from 1 to 60000"},
        {{"link-delay", "h0/0", "h0/1", "100"}, 2, "link-delay needs PEER MS DURATION"},
        {{"link-loss", "h0/0", "h0/1", "101", "1000"}, 2, "not a percent of chunks lost from 1 to 100"},
        {{"partition", "h0/0", "h0/1", "0"}, 2, "not a duration in ms from 1 to 600000"},
        {{"partition", "h0", "h0/1", "1000"}, 2, "give A as HOST/CORE"},
        {{"partition", "h0/0", "h0", "1000"}, 2, "the peer 'h0' is not HOST/CORE"},
        {{"partition", "h0/0", "h0/9", "1000"}, 1, "h0/9 is not in the cluster"},
        {{"partition", "h0/0", "h0/0", "1000"}, 1, "a link joins two cores"},
        {{"--seed", "3", "partition", "h0/0", "h0/1", "1000"}, 2, "--seed is for --scenario and link-loss"},
    };
    for (size_t i = 0; i < sizeof cli / sizeof cli[0]; i++) {
        const char *const *a = cli[i].a;
        cluster_tpuctl(t->c, &rr, 10000 * scale, "chaos", a[0], a[1], a[2], a[3], a[4], a[5], NULL);
        cr_assert_eq(rr.code, cli[i].code, "case %zu: exit %d: %s", i, rr.code, rr.err);
        cr_assert(strstr(rr.err, cli[i].says), "case %zu: %s", i, rr.err);
        run_result_free(&rr);
    }
    /* a scenario's link fault is one core's, with its peer */
    snprintf(path, sizeof path, "%s/link.txt", cl_tmpdir());
    cr_assert_not_null(fp = fopen(path, "w"));
    fprintf(fp, "at 0ms partition h0 h0/1 1000\n");
    fclose(fp);
    cluster_tpuctl(t->c, &rr, 10000 * scale, "chaos", "--scenario", path, NULL);
    cr_assert_eq(rr.code, 2, "%s", rr.err);
    cr_assert(strstr(rr.err, "partition joins two cores"), "%s", rr.err);
    run_result_free(&rr);
    /* nothing was injected anywhere */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(injected(t, i, "link-delay"), 0, "worker %d", i);
        cr_assert_eq(injected(t, i, "link-loss"), 0, "worker %d", i);
        cr_assert_eq(injected(t, i, "partition"), 0, "worker %d", i);
        cr_assert_not(cl_log_contains(&t->c->workers[i], "fault injected"), "see %s", t->c->workers[i].log);
    }
    /* and a good scenario line faults the link both ways */
    cr_assert_not_null(fp = fopen(path, "w"));
    fprintf(fp, "seed 5\nat 0ms link-loss h0/0 h0/1 20 500\n");
    fclose(fp);
    cluster_tpuctl(t->c, &rr, 10000 * scale, "chaos", "--scenario", path, NULL);
    cr_assert_eq(rr.code, 0, "%s", rr.err);
    cr_assert(strstr(rr.out, "line 2: link-loss on core h0/0, in ms: 0, 500 ms, 20 %, to and from core h0/1"),
              "%s", rr.out);
    run_result_free(&rr);
    for (int i = 0; i < 2; i++)
        cr_assert(cl_wait_log(&t->c->workers[i], "fault over: the link works again", 10000 * scale), "see %s",
                  t->c->workers[i].log);
    lt_free(t);
}

struct held {
    lt *t;
    tpu_status st;
};

static void *allreduce_thread(void *arg)
{
    struct held *h = arg;
    int64_t ms;
    int right;
    h->st = allreduce(h->t, &ms, &right);
    return NULL;
}

/* Workers stopped while chunks are held: they free them (the sanitizer build
 * fails the test on a leak the daemons report) and stop cleanly. */
Test(link, workers_stop_cleanly_with_chunks_held, .timeout = 120)
{
    lt *t = lt_start(1);
    run_result rr;
    pthread_t th;
    struct held h = {t, TPU_OK};
    int64_t ms;
    int right;

    lt_init(t);
    cr_assert_eq(allreduce(t, &ms, &right), TPU_OK, "%s", tpu_last_error());
    tpuctl_ok(t, &rr, "injected link-delay", (const char *const[]){"link-delay", "h0/0", "h1/0", "60000", "60000",
                                                                   NULL});
    run_result_free(&rr);
    cr_assert_eq(pthread_create(&th, NULL, allreduce_thread, &h), 0);
    struct timespec ts = {1, 0}; /* the all-reduce's chunks held by now, most likely; either way they must go */
    nanosleep(&ts, NULL);
    for (int i = 0; i < 2; i++) {
        kill(t->c->workers[i].pid, SIGTERM);
        cr_assert(cluster_wait_exit(&t->c->workers[i], 10000 * cl_time_scale()), "worker %d did not stop", i);
        cr_assert(WIFEXITED(t->c->workers[i].status) && WEXITSTATUS(t->c->workers[i].status) == 0,
                  "worker %d ended with status %#x; see %s", i, t->c->workers[i].status, t->c->workers[i].log);
    }
    pthread_join(th, NULL);
    cr_assert_neq(h.st, TPU_OK, "the all-reduce over the stopped workers succeeded");
    lt_free(t); /* scans the daemons' logs for sanitizer reports */
}
