/* Unit tests of the SP request link (common/sp/spreq.c) against the SP reply
 * port (common/sp/sprep.c), both on one libuv loop on loopback: a large request
 * sent before its connection is made arrives whole; spreq_connect calls
 * on_open once the connection is made, and a request sent from there goes
 * out from the caller's memory and arrives whole; many large requests sent
 * in one loop turn on open connections all arrive; a connection that cannot
 * be made is reported through on_lost, naming the address. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "sprep.h"
#include "spreq.h"

#define BIG (300 * 1024) /* several times a loopback socket's first send buffer */
#define HUGE (6 << 20)    /* more than a socket's largest send buffer (tcp_wmem): never written whole at once */
#define LINKS 8

struct server {
    sprep *s;
    int port;
    int requests;
    size_t last_len;
    int intact; /* every request so far held the pattern of its length */
};

static uint8_t pattern(size_t i, size_t len)
{
    return (uint8_t)(i * 131 + len);
}

static int vouch_all(void *data, const uint8_t *buf, size_t len)
{
    (void)data, (void)buf, (void)len;
    return 1;
}

/* Replies with the request's length (8 bytes) after checking its bytes. */
static void on_request(sprep *s, const uint8_t *buf, size_t len, void *ctl)
{
    struct server *sv = sprep_data(s);
    uint8_t rep[8];
    err e;

    sv->requests++;
    sv->last_len = len;
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(i, len)) {
            sv->intact = 0;
            break;
        }
    for (int k = 0; k < 8; k++)
        rep[k] = (uint8_t)((uint64_t)len >> (8 * k));
    cr_assert_eq(sprep_reply(s, ctl, rep, sizeof rep, &e), CODE_OK, "%s", e.msg);
}

static void server_start(uv_loop_t *loop, struct server *sv)
{
    struct sprep_cfg cfg = {.name = "test", .max_msg = 2 * HUGE, .max_pending = 1 << 20, .max_trusted = 64,
                            .max_untrusted = 64, .untrusted_ms = 10000, .idle_ms = 60000,
                            .on_msg = on_request, .vouch = vouch_all, .data = sv};
    err e;
    memset(sv, 0, sizeof *sv);
    sv->intact = 1;
    cr_assert_eq(sprep_start(loop, "127.0.0.1", 0, &cfg, &sv->s, &sv->port, &e), CODE_OK, "%s", e.msg);
}

/* The client side: one link and what its callbacks saw. */
struct client {
    spreq *q;
    int opened, replies, lost;
    size_t reply_len; /* the length the server said it got */
    char lost_msg[ERR_MSG_MAX];
    uint8_t *body;    /* sent from on_open, when set */
    size_t body_len;
    int send_rc;
};

static void on_reply(spreq *q, const uint8_t *body, size_t len)
{
    struct client *c = spreq_data(q);
    c->replies++;
    c->reply_len = 0;
    if (len == 8)
        for (int k = 0; k < 8; k++)
            c->reply_len |= (size_t)body[k] << (8 * k);
}

static void on_lost(spreq *q, const err *e)
{
    struct client *c = spreq_data(q);
    c->lost++;
    snprintf(c->lost_msg, sizeof c->lost_msg, "%s", e->msg);
}

static void on_open(spreq *q)
{
    struct client *c = spreq_data(q);
    err e;
    c->opened++;
    if (c->body) {
        cr_assert(spreq_is_open(q));
        c->send_rc = spreq_send(q, c->body, c->body_len, &e);
        memset(c->body, 0xee, c->body_len); /* the caller's memory is its own again */
    }
}

static void client_new(uv_loop_t *loop, struct client *c, int port)
{
    char url[64];
    struct spreq_cfg cfg = {.max_msg = 1024, .on_reply = on_reply, .on_lost = on_lost, .on_open = on_open,
                            .data = c};
    err e;
    memset(c, 0, sizeof *c);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    cr_assert_not_null(c->q = spreq_new(loop, url, &cfg, &e), "%s", e.msg);
}

static uint8_t *make_body(size_t len)
{
    uint8_t *b = malloc(len);
    cr_assert_not_null(b);
    for (size_t i = 0; i < len; i++)
        b[i] = pattern(i, len);
    return b;
}

/* Runs the loop until done(arg) or 10 s. */
static void run_until(uv_loop_t *loop, int (*done)(void *), void *arg)
{
    uint64_t end = uv_now(loop) + 10000;
    while (!done(arg) && uv_now(loop) < end) {
        uv_run(loop, UV_RUN_ONCE);
        uv_update_time(loop);
    }
}

static int has_reply(void *arg)
{
    return ((struct client *)arg)->replies > 0;
}

static int has_lost(void *arg)
{
    return ((struct client *)arg)->lost > 0;
}

static void teardown_loop(uv_loop_t *loop)
{
    for (int i = 0; i < 100 && uv_run(loop, UV_RUN_NOWAIT); i++)
        ;
}

Test(spreq, large_request_before_the_connection_is_made_arrives_whole)
{
    uv_loop_t loop;
    struct server sv;
    struct client c;
    uint8_t *body = make_body(BIG);
    err e;

    uv_loop_init(&loop);
    server_start(&loop, &sv);
    client_new(&loop, &c, sv.port);
    cr_assert(!spreq_is_open(c.q));
    cr_assert_eq(spreq_send(c.q, body, BIG, &e), CODE_OK, "%s", e.msg);
    memset(body, 0xee, BIG); /* copied: the caller may reuse its memory at once */
    run_until(&loop, has_reply, &c);
    cr_expect_eq(c.replies, 1);
    cr_expect_eq(c.reply_len, (size_t)BIG);
    cr_expect_eq(sv.requests, 1);
    cr_expect(sv.intact, "the request's bytes changed on the way");
    cr_expect_eq(c.opened, 0, "on_open comes only after spreq_connect");
    cr_expect(spreq_is_open(c.q));
    spreq_close(c.q);
    sprep_close(sv.s);
    teardown_loop(&loop);
    free(body);
}

Test(spreq, connect_then_send_from_on_open)
{
    uv_loop_t loop;
    struct server sv;
    struct client c;
    err e;

    uv_loop_init(&loop);
    server_start(&loop, &sv);
    client_new(&loop, &c, sv.port);
    c.body = make_body(BIG);
    c.body_len = BIG;
    cr_assert_eq(spreq_connect(c.q, &e), CODE_OK, "%s", e.msg);
    run_until(&loop, has_reply, &c);
    cr_expect_eq(c.opened, 1);
    cr_expect_eq(c.send_rc, CODE_OK);
    cr_expect_eq(c.replies, 1);
    cr_expect_eq(c.reply_len, (size_t)BIG);
    cr_expect(sv.intact, "the request's bytes changed on the way (sent from memory the caller reused)");
    /* already open: connect again is a no-op with no second on_open */
    cr_assert_eq(spreq_connect(c.q, &e), CODE_OK, "%s", e.msg);
    for (int i = 0; i < 5; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    cr_expect_eq(c.opened, 1);
    spreq_close(c.q);
    sprep_close(sv.s);
    teardown_loop(&loop);
    free(c.body);
}

struct many {
    struct client c[LINKS];
    int want; /* replies per link */
};

static int all_replied(void *arg)
{
    struct many *m = arg;
    for (int i = 0; i < LINKS; i++)
        if (m->c[i].replies < m->want)
            return 0;
    return 1;
}

Test(spreq, many_large_requests_in_one_turn_on_open_connections)
{
    uv_loop_t loop;
    struct server sv;
    static struct many m;
    uint8_t *small = make_body(100), *body = make_body(HUGE);
    err e;

    uv_loop_init(&loop);
    server_start(&loop, &sv);
    for (int i = 0; i < LINKS; i++) {
        client_new(&loop, &m.c[i], sv.port);
        cr_assert_eq(spreq_send(m.c[i].q, small, 100, &e), CODE_OK, "%s", e.msg);
    }
    m.want = 1;
    run_until(&loop, all_replied, &m);
    for (int i = 0; i < LINKS; i++)
        cr_assert_eq(m.c[i].replies, 1, "link %d: no reply to its first request", i);
    /* every link open: each large request goes from the caller's memory as far
     * as the socket takes it, the rest copied */
    for (int i = 0; i < LINKS; i++) {
        cr_assert(spreq_is_open(m.c[i].q));
        cr_assert_eq(spreq_send(m.c[i].q, body, HUGE, &e), CODE_OK, "%s", e.msg);
    }
    memset(body, 0xee, HUGE);
    m.want = 2;
    run_until(&loop, all_replied, &m);
    for (int i = 0; i < LINKS; i++) {
        cr_expect_eq(m.c[i].replies, 2, "link %d", i);
        cr_expect_eq(m.c[i].reply_len, (size_t)HUGE, "link %d", i);
    }
    cr_expect_eq(sv.requests, 2 * LINKS);
    cr_expect(sv.intact, "a request's bytes changed on the way");
    for (int i = 0; i < LINKS; i++)
        spreq_close(m.c[i].q);
    sprep_close(sv.s);
    teardown_loop(&loop);
    free(small);
    free(body);
}

Test(spreq, a_connection_that_cannot_be_made_is_lost_naming_the_address)
{
    uv_loop_t loop;
    struct server sv;
    struct client c;
    int port;
    err e;

    uv_loop_init(&loop);
    server_start(&loop, &sv); /* a port that was just free: listen, note it, close */
    port = sv.port;
    sprep_close(sv.s);
    teardown_loop(&loop);
    client_new(&loop, &c, port);
    cr_assert_eq(spreq_connect(c.q, &e), CODE_OK, "%s", e.msg);
    run_until(&loop, has_lost, &c);
    cr_expect_eq(c.lost, 1);
    cr_expect_eq(c.opened, 0);
    {
        char want[32];
        snprintf(want, sizeof want, "127.0.0.1:%d", port);
        cr_expect(strstr(c.lost_msg, want) != NULL, "'%s' does not name %s", c.lost_msg, want);
    }
    spreq_close(c.q);
    teardown_loop(&loop);
}
