/* Unit tests of the worker's network (server/worker/net/): two workers' peers
 * in this process on one libuv loop, linked as the worker links them, with
 * no daemon: each has a data-plane listener on 127.0.0.1 that hands worker
 * links to peers_accept as the daemon's does, and a system of the two (a
 * packed peer table in a ResetCore). Over TCP (two hosts): chunks of every
 * size in order, a receive posted after its chunk arrived, a reducing
 * receive, a chunk the receiver did not expect, and a peer that goes away.
 * Over shared memory (one host): the same through the memfd rings, chunks
 * larger than a ring and many rounds of the ring (wrap-around), and a peer
 * that goes away. The collectives engine sees the transport only through
 * xport.h, as here. Every loop is bounded by a 10 s timer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "auth.h"
#include "dpconn.h"
#include "frame.h"
#include "ident.h"
#include "peers.h"
#include "peertab.h"
#include "trace.h"

#define TOKEN "net-unit-test-token-0123456789abcdef"
#define EPOCH 7

struct node {
    struct core_ident id;
    struct peers *p;
    struct xport x;
    uv_tcp_t server;
    char data_addr[64];
    trace *tr;
    int stopped;
};

static uv_loop_t loop;
static uv_timer_t limit;
static int timed_out;
static auth key;
static struct node nodes[2];

/* One operation's outcome. */
struct done {
    int n; /* callbacks so far (exactly one expected) */
    err e;
};

static int ndone; /* callbacks of every operation so far */

static void on_done(void *arg, const err *e)
{
    struct done *d = arg;
    d->n++;
    d->e = *e;
    ndone++;
}

static void on_limit(uv_timer_t *t)
{
    (void)t;
    timed_out = 1;
}

/* Runs the loop until *a and *b (when given) are >= want, at most 10 s. */
static void run_until(const int *a, const int *b, int want)
{
    timed_out = 0;
    uv_timer_start(&limit, on_limit, 10000, 0);
    while (!timed_out && (*a < want || (b && *b < want)))
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&limit);
    cr_assert(!timed_out, "the transport did not complete within 10 s");
}

/* ---- the data-plane listener, as the daemon's hands worker links over ---- */

static void acc_ready(dp_conn *c)
{
    struct node *n = dp_conn_data(c);
    peers_accept(n->p, c); /* takes it over, or refuses it */
}

static void acc_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    (void)h, (void)len;
    free(payload);
    dp_conn_fail(c, CODE_INVALID_ARGUMENT, "not a worker link");
}

static void acc_close(dp_conn *c, const err *why)
{
    (void)c, (void)why;
}

static void on_connection(uv_stream_t *server, int status)
{
    struct node *n = server->data;
    struct dp_conn_cfg cfg;
    dp_conn *c;
    err e;

    if (status != 0)
        return;
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = &key;
    cfg.self_name = n->id.sender;
    cfg.max_payload = FRAME_MAX_PAYLOAD;
    cfg.max_pending_write = DP_MAX_PENDING;
    cfg.handshake_ms = 5000;
    cfg.on_ready = acc_ready;
    cfg.on_frame = acc_frame;
    cfg.on_close = acc_close;
    cfg.data = n;
    cr_assert_eq(dp_conn_accept(server, &cfg, &c, &e), CODE_OK, "%s", e.msg);
}

/* Two workers, replicas 0 and 1: on hosts h0 and h1 (TCP), or both on h0
 * (shared memory between them). */
static void two_workers(int same_host)
{
    struct peertab_row rows[2];
    char ctl[2][64];
    uint8_t *tab;
    size_t tablen;
    err e;

    memset(nodes, 0, sizeof nodes);
    auth_global_init();
    cr_assert_eq(auth_from_token(&key, TOKEN, strlen(TOKEN), &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &limit);
    for (int i = 0; i < 2; i++) {
        struct node *n = &nodes[i];
        struct sockaddr_in sa;
        struct sockaddr_storage bound;
        int blen = sizeof bound;
        struct peers_env env = {&loop, &key, &n->id, NULL, !same_host};

        ident_init(&n->id, same_host ? "h0" : (i ? "h1" : "h0"), i);
        n->id.incarnation = auth_random64(); /* names its shared-memory socket: unique on the machine */
        n->tr = trace_new(1024);
        env.trace = n->tr;
        cr_assert_eq(peers_new(&env, &n->p, &e), CODE_OK, "%s", e.msg);
        if (same_host)
            cr_assert_str_neq(peers_shm_name(n->p), "", "no shared-memory listener");
        uv_tcp_init(&loop, &n->server);
        n->server.data = n;
        uv_ip4_addr("127.0.0.1", 0, &sa);
        cr_assert_eq(uv_tcp_bind(&n->server, (const struct sockaddr *)&sa, 0), 0);
        cr_assert_eq(uv_listen((uv_stream_t *)&n->server, 8, on_connection), 0);
        cr_assert_eq(uv_tcp_getsockname(&n->server, (struct sockaddr *)&bound, &blen), 0);
        snprintf(n->data_addr, sizeof n->data_addr, "127.0.0.1:%d", ntohs(((struct sockaddr_in *)&bound)->sin_port));
        /* the probe of a silent peer goes here: nothing listens (port 1) */
        snprintf(ctl[i], sizeof ctl[i], "tcp://127.0.0.1:1");
        rows[i] = (struct peertab_row){n->id.host_id, i, n->data_addr, ctl[i], peers_shm_name(n->p), n->id.incarnation};
    }
    cr_assert_eq(peertab_pack(rows, 2, &tab, &tablen, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 2; i++) {
        Tpuemu__ResetCore r = TPUEMU__RESET_CORE__INIT;
        r.epoch = EPOCH;
        r.replica_id = i;
        r.num_replicas = 2;
        r.peer_table.data = tab;
        r.peer_table.len = tablen;
        peers_reset(nodes[i].p, &r);
        nodes[i].x = peers_xport(nodes[i].p);
    }
    free(tab);
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

static void stop_worker(struct node *n)
{
    if (n->stopped)
        return;
    n->stopped = 1;
    peers_stop(n->p);
    uv_close((uv_handle_t *)&n->server, close_cb);
}

static void teardown_workers(void)
{
    for (int i = 0; i < 2; i++)
        stop_worker(&nodes[i]);
    uv_close((uv_handle_t *)&limit, close_cb);
    for (int i = 0; i < 300 && uv_run(&loop, UV_RUN_NOWAIT); i++)
        usleep(10000); /* at most 3 s for the closes to finish */
    cr_assert_eq(uv_loop_close(&loop), 0, "a handle was left open");
    for (int i = 0; i < 2; i++) {
        peers_free(nodes[i].p);
        trace_free(nodes[i].tr);
    }
}

/* The channel from worker i to worker j. */
static struct xport_chan *chan(int i, int j)
{
    err e;
    struct xport_chan *ch = nodes[i].x.ops->chan(nodes[i].x.self, j, &e);
    cr_assert_not_null(ch, "%s", e.msg);
    return ch;
}

static uint8_t pattern(size_t i, uint64_t salt)
{
    return (uint8_t)(i * 31u + salt * 7u + 1u);
}

static uint8_t *filled(size_t len, uint64_t salt)
{
    uint8_t *b = malloc(len ? len : 1);
    cr_assert_not_null(b);
    for (size_t i = 0; i < len; i++)
        b[i] = pattern(i, salt);
    return b;
}

static int intact(const uint8_t *b, size_t len, uint64_t salt)
{
    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern(i, salt))
            return 0;
    return 1;
}

static struct xport_chunk chunk(uint64_t seq, uint32_t step, uint32_t c, uint64_t offset)
{
    return (struct xport_chunk){seq, step, c, offset, "all-reduce"};
}

/* Sends chunks of the sizes given from worker 0 to worker 1, receives them
 * there (posted before or after they arrive), and checks every byte. */
static void send_sizes(const size_t *sizes, int n, int recv_late)
{
    struct xport_chan *tx = chan(0, 1), *rx = chan(1, 0);
    uint8_t **out = calloc((size_t)n, sizeof *out), **in = calloc((size_t)n, sizeof *in);
    struct done *sd = calloc((size_t)n, sizeof *sd), *rd = calloc((size_t)n, sizeof *rd);
    int want = ndone + 2 * n;

    for (int i = 0; i < n; i++) {
        struct xport_chunk c = chunk(1, 0, (uint32_t)i, 0);
        out[i] = filled(sizes[i], (uint64_t)i);
        in[i] = calloc(1, sizes[i] ? sizes[i] : 1);
        cr_assert_eq(nodes[0].x.ops->send(tx, &c, out[i], sizes[i], on_done, &sd[i]), CODE_OK);
        if (!recv_late)
            cr_assert_eq(nodes[1].x.ops->recv(rx, &c, in[i], sizes[i], on_done, &rd[i]), CODE_OK);
    }
    if (recv_late) {
        /* every chunk that fits the pipe is on its way before a receive is posted */
        for (int i = 0; i < 20; i++)
            uv_run(&loop, UV_RUN_NOWAIT);
        for (int i = 0; i < n; i++) {
            struct xport_chunk c = chunk(1, 0, (uint32_t)i, 0);
            cr_assert_eq(rd[i].n, 0, "a receive completed before it was posted");
            cr_assert_eq(nodes[1].x.ops->recv(rx, &c, in[i], sizes[i], on_done, &rd[i]), CODE_OK);
        }
    }
    run_until(&ndone, NULL, want);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(sd[i].n, 1, "send %d completed %d times", i, sd[i].n);
        cr_assert_eq(rd[i].n, 1, "receive %d completed %d times", i, rd[i].n);
        cr_assert_eq(sd[i].e.code, CODE_OK, "send %d: %s", i, sd[i].e.msg);
        cr_assert_eq(rd[i].e.code, CODE_OK, "receive %d: %s", i, rd[i].e.msg);
        cr_assert(intact(in[i], sizes[i], (uint64_t)i), "chunk %d (%zu bytes) arrived altered", i, sizes[i]);
        free(out[i]);
        free(in[i]);
    }
    free(out), free(in), free(sd), free(rd);
}

static void run_some(void)
{
    for (int i = 0; i < 20; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
}

static void add_bytes(void *arg, uint8_t *dst, const uint8_t *src, size_t len)
{
    int *calls = arg;
    (*calls)++;
    for (size_t i = 0; i < len; i++)
        dst[i] = (uint8_t)(dst[i] + src[i]);
}

/* A reducing receive: the chunk is added into what the buffer holds. */
static void reduce_one(size_t len)
{
    struct xport_chan *tx = chan(0, 1), *rx = chan(1, 0);
    struct xport_chunk c = chunk(2, 0, 0, 0);
    uint8_t *out = filled(len, 3), *acc = filled(len, 5);
    struct done sd = {0}, rd = {0};
    int calls = 0;

    cr_assert_eq(nodes[1].x.ops->recv_reduce(rx, &c, acc, len, add_bytes, &calls, on_done, &rd), CODE_OK);
    cr_assert_eq(nodes[0].x.ops->send(tx, &c, out, len, on_done, &sd), CODE_OK);
    run_until(&sd.n, &rd.n, 1);
    cr_assert_eq(rd.e.code, CODE_OK, "%s", rd.e.msg);
    cr_assert_gt(calls, 0, "the reduce never ran");
    for (size_t i = 0; i < len; i++)
        cr_assert_eq(acc[i], (uint8_t)(pattern(i, 3) + pattern(i, 5)), "byte %zu not reduced", i);
    free(out);
    free(acc);
}

/* Worker 1 goes away while worker 0 waits for its chunk: the receive fails,
 * naming the core and the chunk. */
static void peer_gone(void)
{
    struct xport_chan *rx = chan(0, 1);
    struct xport_chunk w = chunk(8, 0, 0, 0), c = chunk(9, 0, 4, 0);
    uint8_t buf[64], *out = filled(sizeof buf, 1);
    struct done sd = {0}, wd = {0}, rd = {0};

    /* a first chunk from 1 to 0 sets up 1's sending half (a TCP connection,
     * or a ring), which is then lost */
    cr_assert_eq(nodes[0].x.ops->recv(rx, &w, buf, sizeof buf, on_done, &wd), CODE_OK);
    cr_assert_eq(nodes[1].x.ops->send(chan(1, 0), &w, out, sizeof buf, on_done, &sd), CODE_OK);
    run_until(&sd.n, &wd.n, 1);
    cr_assert_eq(wd.e.code, CODE_OK, "%s", wd.e.msg);
    cr_assert(intact(buf, sizeof buf, 1));
    free(out);
    cr_assert_eq(nodes[0].x.ops->recv(rx, &c, buf, sizeof buf, on_done, &rd), CODE_OK);
    stop_worker(&nodes[1]);
    run_until(&rd.n, NULL, 1);
    cr_assert_eq(rd.e.code, CODE_UNAVAILABLE, "%d: %s", rd.e.code, rd.e.msg);
    cr_assert(strstr(rd.e.msg, "core h") &&
                  strstr(rd.e.msg, "/1 closed its connection during chunk 4 of all-reduce #9"),
              "the failure does not name the link and the chunk: %s", rd.e.msg);
    cr_assert_eq(nodes[0].x.ops->failed(nodes[0].x.self, 9, NULL), CODE_UNAVAILABLE,
                 "the collective is not recorded as failed");
}

/* Worker 0 sends chunk 2 of collective #3 where worker 1 waits for chunk 1 of
 * it: the cores disagree about the collective (INTERNAL), naming both. */
static void unexpected_chunk(void)
{
    struct xport_chunk sent = chunk(3, 1, 2, 0), want = chunk(3, 1, 1, 0);
    uint8_t out[32] = {0}, in[32];
    struct done sd = {0}, rd = {0};

    cr_assert_eq(nodes[1].x.ops->recv(chan(1, 0), &want, in, sizeof in, on_done, &rd), CODE_OK);
    cr_assert_eq(nodes[0].x.ops->send(chan(0, 1), &sent, out, sizeof out, on_done, &sd), CODE_OK);
    run_until(&rd.n, NULL, 1);
    cr_assert_eq(rd.e.code, CODE_INTERNAL, "%d: %s", rd.e.code, rd.e.msg);
    cr_assert(strstr(rd.e.msg, "core h0/0 sent chunk 2 (step 1") && strstr(rd.e.msg, "where chunk 1 (step 1") &&
                  strstr(rd.e.msg, "the cores disagree about the collective"),
              "%s", rd.e.msg);
}

/* Worker 0 sends a chunk of collective #5 where worker 1 waits for one of #3:
 * 0 is done with #3, so what it sent for it was lost on the way (a cut
 * connection, a ring left behind). #3 fails UNAVAILABLE, naming the link and
 * both chunks, not INTERNAL: the cores agree about every collective. */
static void later_collective(void)
{
    struct xport_chunk sent = chunk(5, 1, 0, 0), want = chunk(3, 1, 0, 0);
    uint8_t out[32] = {0}, in[32];
    struct done sd = {0}, rd = {0};

    cr_assert_eq(nodes[1].x.ops->recv(chan(1, 0), &want, in, sizeof in, on_done, &rd), CODE_OK);
    cr_assert_eq(nodes[0].x.ops->send(chan(0, 1), &sent, out, sizeof out, on_done, &sd), CODE_OK);
    run_until(&rd.n, NULL, 1);
    cr_assert_eq(rd.e.code, CODE_UNAVAILABLE, "%d: %s", rd.e.code, rd.e.msg);
    cr_assert(strstr(rd.e.msg, "chunk 0 (step 1) of all-reduce #3 from core h0/0 to core h") &&
                  strstr(rd.e.msg, "was lost on the way: core h0/0 went on to #5"),
              "%s", rd.e.msg);
    cr_assert_eq(nodes[1].x.ops->failed(nodes[1].x.self, 3, NULL), CODE_UNAVAILABLE,
                 "the collective is not recorded as failed");
    cr_assert_eq(nodes[1].x.ops->failed(nodes[1].x.self, 5, NULL), CODE_OK, "the later collective failed too");
}

/* ---- TCP: two hosts ---- */

Test(net_tcp, chunks_of_every_size_arrive_whole_and_in_order)
{
    size_t sizes[] = {0, 1, 7, 4096, 65536, 3u << 20, 5};
    two_workers(0);
    send_sizes(sizes, (int)(sizeof sizes / sizeof *sizes), 0);
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 0, "two hosts talk over TCP");
    cr_assert_eq(nodes[1].x.ops->is_shm(chan(1, 0)), 0);
    teardown_workers();
}

Test(net_tcp, a_chunk_waits_for_its_receive)
{
    size_t sizes[] = {100, 1u << 20, 3};
    two_workers(0);
    send_sizes(sizes, (int)(sizeof sizes / sizeof *sizes), 1);
    teardown_workers();
}

Test(net_tcp, reducing_receive_adds_into_the_buffer)
{
    two_workers(0);
    reduce_one(300000);
    teardown_workers();
}

Test(net_tcp, an_unexpected_chunk_fails_the_collective_naming_both)
{
    two_workers(0);
    unexpected_chunk();
    teardown_workers();
}

Test(net_tcp, a_later_collectives_chunk_is_a_lost_chunk_not_a_disagreement)
{
    two_workers(0);
    later_collective();
    teardown_workers();
}

Test(net_tcp, a_peer_that_goes_away_fails_the_receive_naming_it)
{
    two_workers(0);
    peer_gone();
    teardown_workers();
}

Test(net_tcp, refuses_chunks_over_the_bound)
{
    struct xport_chunk c = chunk(1, 0, 0, 0);
    uint8_t b = 0;
    struct done d = {0};
    two_workers(0);
    cr_assert_eq(nodes[0].x.ops->send(chan(0, 1), &c, &b, (size_t)XPORT_MAX_CHUNK + 1, on_done, &d),
                 CODE_INVALID_ARGUMENT);
    cr_assert_eq(nodes[0].x.ops->recv(chan(0, 1), &c, NULL, 8, on_done, &d), CODE_INVALID_ARGUMENT);
    run_some();
    cr_assert_eq(d.n, 0, "a refused operation called back");
    teardown_workers();
}

/* ---- shared memory: one host ---- */

Test(net_shm, chunks_go_through_the_ring_whole_and_in_order)
{
    size_t sizes[] = {0, 1, 4096, 256u * 1024u, 256u * 1024u + 1, 5};
    two_workers(1);
    send_sizes(sizes, (int)(sizeof sizes / sizeof *sizes), 0);
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 1, "two cores of one host talk over shared memory");
    cr_assert_eq(nodes[1].x.ops->is_shm(chan(1, 0)), 1);
    teardown_workers();
}

Test(net_shm, the_ring_wraps_around_and_pushes_back)
{
    /* the ring holds 4 MiB: a 9 MiB chunk and 40 of 300 KiB (2 slots each)
     * go round it several times; the receives are posted late, so the full
     * ring holds the sender back meanwhile */
    size_t sizes[41];
    sizes[0] = 9u << 20;
    for (int i = 1; i < 41; i++)
        sizes[i] = 300u * 1024u + (size_t)i;
    two_workers(1);
    send_sizes(sizes, 41, 1);
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 1);
    teardown_workers();
}

Test(net_shm, reducing_receive_reads_straight_from_the_ring)
{
    two_workers(1);
    cr_assert_eq(nodes[1].x.ops->fuse(nodes[1].x.self, 0, 1u << 20), 1, "a same-host 1 MiB chunk is fused");
    reduce_one(1u << 20);
    teardown_workers();
}

Test(net_shm, a_later_collectives_chunk_is_a_lost_chunk_not_a_disagreement)
{
    two_workers(1);
    later_collective();
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 1, "the chunk did not go through the ring");
    teardown_workers();
}

Test(net_shm, an_unexpected_chunk_fails_the_collective_naming_both)
{
    two_workers(1);
    unexpected_chunk();
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 1, "the chunk did not go through the ring");
    teardown_workers();
}

Test(net_shm, a_peer_that_goes_away_fails_the_receive_naming_it)
{
    two_workers(1);
    peer_gone();
    teardown_workers();
}

Test(net_shm, a_peer_without_shared_memory_is_reached_over_tcp)
{
    /* the same host, but worker 1 offers no shared memory: 0 sends to it
     * over TCP */
    size_t sizes[] = {10, 1u << 20};
    struct peertab_row rows[2];
    uint8_t *tab;
    size_t tablen;
    err e;

    two_workers(1);
    for (int i = 0; i < 2; i++)
        rows[i] = (struct peertab_row){"h0",
                                       i,
                                       nodes[i].data_addr,
                                       "tcp://127.0.0.1:1",
                                       i == 1 ? "" : peers_shm_name(nodes[i].p),
                                       nodes[i].id.incarnation};
    cr_assert_eq(peertab_pack(rows, 2, &tab, &tablen, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 2; i++) {
        Tpuemu__ResetCore r = TPUEMU__RESET_CORE__INIT;
        r.epoch = EPOCH + 1;
        r.replica_id = i;
        r.num_replicas = 2;
        r.peer_table.data = tab;
        r.peer_table.len = tablen;
        peers_reset(nodes[i].p, &r);
    }
    free(tab);
    send_sizes(sizes, 2, 0);
    cr_assert_eq(nodes[0].x.ops->is_shm(chan(0, 1)), 0, "a peer without shared memory is reached over TCP");
    cr_assert_eq(nodes[1].x.ops->is_shm(chan(1, 0)), 0);
    teardown_workers();
}
