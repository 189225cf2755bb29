/* Unit tests of the worker's data-plane connections (server/worker/net/
 * dpconn.h), both ends in this process on one libuv loop over loopback TCP,
 * linked as the worker links them and with no daemon: the handshake under the
 * cluster token, frames of every size crossing whole and in order, the
 * zero-copy receive, and the refusals (another token, a payload over the
 * receiver's bound). Every loop is bounded by a 10 s timer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "auth.h"
#include "dpconn.h"

#define BIG (1u << 20)

struct side {
    auth a;
    dp_conn *conn;
    int ready, closed;
    err why;
    /* frames received, in order */
    int nframes;
    uint64_t seq[8];
    size_t len[8];
    int intact[8]; /* payload bytes as sent */
    int32_t peer_replica;
    uint64_t peer_epoch;
    uint8_t *into; /* zero-copy destination; NULL: let dp_conn allocate */
};

struct pair {
    uv_loop_t loop;
    uv_tcp_t server;
    uv_timer_t limit;
    struct side acc, dial;
    struct dp_conn_cfg acc_cfg, dial_cfg;
    int want_frames; /* stop once the accepting side has this many */
    int timed_out;
};

static uint8_t pattern(size_t i, uint64_t seq)
{
    return (uint8_t)(i * 31u + seq * 7u + 1u);
}

static int intact(const uint8_t *p, size_t len, uint64_t seq)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern(i, seq))
            return 0;
    return 1;
}

static void stop_if_done(struct pair *pr)
{
    if (pr->acc.nframes >= pr->want_frames || (pr->dial.closed && pr->want_frames > 0 && !pr->acc.conn))
        uv_stop(&pr->loop);
}

static void on_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    struct pair *pr = dp_conn_data(c);
    struct side *s = c == pr->acc.conn ? &pr->acc : &pr->dial;
    if (s->nframes < 8) {
        const uint8_t *got = payload ? payload : s->into;
        s->seq[s->nframes] = h->seq;
        s->len[s->nframes] = len;
        s->intact[s->nframes] = len == 0 || (got && intact(got, len, h->seq));
        s->peer_replica = dp_conn_auth_replica(c);
        s->peer_epoch = dp_conn_auth_epoch(c);
    }
    s->nframes++;
    free(payload);
    stop_if_done(pr);
}

static enum dp_buf payload_buf(dp_conn *c, const Tpuemu__FrameHeader *h, void **buf)
{
    struct pair *pr = dp_conn_data(c);
    struct side *s = c == pr->acc.conn ? &pr->acc : &pr->dial;
    (void)h;
    if (!s->into)
        return DP_BUF_MALLOC;
    *buf = s->into;
    return DP_BUF_INTO;
}

static void on_ready(dp_conn *c)
{
    struct pair *pr = dp_conn_data(c);
    (c == pr->dial.conn ? &pr->dial : &pr->acc)->ready = 1;
    if (c == pr->dial.conn && pr->want_frames == 0)
        uv_stop(&pr->loop);
}

static void on_close(dp_conn *c, const err *why)
{
    struct pair *pr = dp_conn_data(c);
    struct side *s = c == pr->acc.conn ? &pr->acc : &pr->dial;
    s->closed = 1;
    s->why = *why;
    s->conn = NULL;
    if (s == &pr->dial)
        uv_stop(&pr->loop);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct pair *pr = server->data;
    err e;
    cr_assert_eq(status, 0);
    cr_assert_eq(dp_conn_accept(server, &pr->acc_cfg, &pr->acc.conn, &e), CODE_OK, "%s", e.msg);
}

static void on_limit(uv_timer_t *t)
{
    struct pair *pr = t->data;
    pr->timed_out = 1;
    uv_stop(&pr->loop);
}

static void cfg_for(struct pair *pr, struct side *s, struct dp_conn_cfg *cfg, uint64_t max_payload)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->auth = &s->a;
    cfg->self_name = s == &pr->dial ? "worker h0/1" : "worker h0/0";
    cfg->max_payload = max_payload;
    cfg->max_pending_write = DP_MAX_PENDING;
    cfg->handshake_ms = 5000;
    cfg->on_ready = on_ready;
    cfg->on_frame = on_frame;
    cfg->on_close = on_close;
    cfg->payload_buf = payload_buf;
    cfg->data = pr;
    cfg->replica = s == &pr->dial ? 5 : -1;
    cfg->epoch = s == &pr->dial ? 9 : 0;
}

/* Starts the accepting side on 127.0.0.1 and dials it; runs the loop until
 * the dialing side's handshake ends (ready or closed). */
static void pair_open(struct pair *pr, const char *acc_token, const char *dial_token, uint64_t acc_max)
{
    struct sockaddr_in sa;
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    err e;

    memset(pr, 0, sizeof *pr);
    auth_global_init();
    cr_assert_eq(auth_from_token(&pr->acc.a, acc_token, strlen(acc_token), &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(auth_from_token(&pr->dial.a, dial_token, strlen(dial_token), &e), CODE_OK, "%s", e.msg);
    cfg_for(pr, &pr->acc, &pr->acc_cfg, acc_max);
    cfg_for(pr, &pr->dial, &pr->dial_cfg, 64u << 20);
    cr_assert_eq(uv_loop_init(&pr->loop), 0);
    uv_timer_init(&pr->loop, &pr->limit);
    pr->limit.data = pr;
    uv_timer_start(&pr->limit, on_limit, 10000, 0);
    uv_tcp_init(&pr->loop, &pr->server);
    pr->server.data = pr;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    cr_assert_eq(uv_tcp_bind(&pr->server, (const struct sockaddr *)&sa, 0), 0);
    cr_assert_eq(uv_listen((uv_stream_t *)&pr->server, 8, on_connection), 0);
    cr_assert_eq(uv_tcp_getsockname(&pr->server, (struct sockaddr *)&bound, &blen), 0);
    cr_assert_eq(dp_conn_connect(&pr->loop, (const struct sockaddr *)&bound, &pr->dial_cfg, &pr->dial.conn, &e),
                 CODE_OK, "%s", e.msg);
    uv_run(&pr->loop, UV_RUN_DEFAULT);
    cr_assert(!pr->timed_out, "the handshake did not end within 10 s");
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

static void pair_close(struct pair *pr)
{
    if (pr->dial.conn)
        dp_conn_close(pr->dial.conn, NULL);
    if (pr->acc.conn)
        dp_conn_close(pr->acc.conn, NULL);
    uv_close((uv_handle_t *)&pr->server, close_cb);
    uv_close((uv_handle_t *)&pr->limit, close_cb);
    for (int i = 0; i < 300 && uv_run(&pr->loop, UV_RUN_NOWAIT); i++)
        usleep(10000); /* at most 3 s for the closes to finish */
    cr_assert_eq(uv_loop_close(&pr->loop), 0, "a handle was left open");
}

static void send_frame(struct pair *pr, uint64_t seq, const uint8_t *buf, size_t len)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    h.seq = seq;
    cr_assert_eq(dp_conn_send_ref(pr->dial.conn, &h, buf, len, NULL, NULL), CODE_OK);
}

static uint8_t *filled(size_t len, uint64_t seq)
{
    uint8_t *p = malloc(len ? len : 1);
    cr_assert_not_null(p);
    for (size_t i = 0; i < len; i++)
        p[i] = pattern(i, seq);
    return p;
}

Test(dpconn, frames_of_every_size_cross_whole_and_in_order)
{
    struct pair pr;
    static const size_t lens[] = {0, 1, 1000, 40000, BIG};
    uint8_t *bufs[5];

    pair_open(&pr, "token-of-this-cluster-0123456789", "token-of-this-cluster-0123456789", 64u << 20);
    cr_assert(pr.dial.ready, "the handshake failed: %s", pr.dial.why.msg);
    pr.want_frames = 5;
    for (int i = 0; i < 5; i++) {
        bufs[i] = filled(lens[i], (uint64_t)i + 100);
        send_frame(&pr, (uint64_t)i + 100, bufs[i], lens[i]);
    }
    uv_run(&pr.loop, UV_RUN_DEFAULT);
    cr_assert(!pr.timed_out, "only %d of 5 frames arrived within 10 s", pr.acc.nframes);
    cr_assert_eq(pr.acc.nframes, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(pr.acc.seq[i], (uint64_t)i + 100, "frame %d out of order", i);
        cr_assert_eq(pr.acc.len[i], lens[i]);
        cr_assert(pr.acc.intact[i], "frame %d (%zu bytes) arrived changed", i, lens[i]);
    }
    cr_assert_eq(pr.acc.peer_replica, 5, "the accepting side knows the dialer's replica from its AUTH");
    cr_assert_eq(pr.acc.peer_epoch, 9);
    cr_assert_str_eq(dp_conn_peer_name(pr.acc.conn), "worker h0/1");
    pair_close(&pr);
    for (int i = 0; i < 5; i++)
        free(bufs[i]);
}

Test(dpconn, a_payload_lands_straight_in_the_posted_buffer)
{
    struct pair pr;
    uint8_t *src = filled(BIG, 7);

    pair_open(&pr, "token-of-this-cluster-0123456789", "token-of-this-cluster-0123456789", 64u << 20);
    cr_assert(pr.dial.ready);
    cr_assert_not_null(pr.acc.into = calloc(1, BIG));
    pr.want_frames = 1;
    send_frame(&pr, 7, src, BIG);
    uv_run(&pr.loop, UV_RUN_DEFAULT);
    cr_assert_eq(pr.acc.nframes, 1);
    cr_assert_eq(pr.acc.len[0], BIG);
    cr_assert(intact(pr.acc.into, BIG, 7), "the posted buffer does not hold the payload");
    pair_close(&pr);
    free(pr.acc.into);
    free(src);
}

Test(dpconn, another_clusters_token_is_refused)
{
    struct pair pr;

    pair_open(&pr, "token-of-this-cluster-0123456789", "token-of-another-cluster-9876543", 64u << 20);
    cr_assert(!pr.dial.ready, "a dialer with another token finished the handshake");
    cr_assert(pr.dial.closed);
    cr_assert_neq(pr.dial.why.code, CODE_OK);
    cr_assert_eq(pr.acc.nframes, 0);
    pair_close(&pr);
}

Test(dpconn, a_payload_over_the_receivers_bound_closes_the_connection)
{
    struct pair pr;
    uint8_t *src = filled(4096, 3);

    pair_open(&pr, "token-of-this-cluster-0123456789", "token-of-this-cluster-0123456789", 1024);
    cr_assert(pr.dial.ready);
    pr.want_frames = 1;
    send_frame(&pr, 3, src, 4096);
    uv_run(&pr.loop, UV_RUN_DEFAULT);
    cr_assert(!pr.timed_out, "the oversized frame was neither taken nor refused within 10 s");
    cr_assert_eq(pr.acc.nframes, 0, "a payload over max_payload was delivered");
    cr_assert(pr.dial.closed, "the sender's connection stays open");
    cr_assert_neq(pr.dial.why.code, CODE_OK, "the sender is told why: %s", pr.dial.why.msg);
    pair_close(&pr);
    free(src);
}
