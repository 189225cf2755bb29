/* Unit tests of the client's data-plane I/O (client/src/rpc/dpio.c) over real
 * socketpairs: the bytes a queued frame puts on the wire, payloads read
 * straight into the caller's memory, a peer that closes or sends a bad
 * prefix, the deadline and the grace. The far end is the test itself (a
 * thread for the transfers that do not fit the socket's buffers). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "dpauth.h"
#include "dpio.h"
#include "frame.h"
#include "wire.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k

/* The owner side: what the callbacks saw. */
struct owner {
    struct dpio_conn *conns;
    void *dst[2];     /* where each connection's payload goes */
    uint64_t got[2];  /* bytes kept of the last frame */
    int frames[2];    /* frames completed */
    int lost[2], lost_code[2];
    char lost_msg[2][ERR_MSG_MAX];
    int want_frames;  /* per connection, before state says done */
    int stop_after;   /* on_frame says "stop" after this many frames; 0: never */
    int refuse_kind;  /* a header of this kind is refused with dpio_failf; 0: none */
    int failing;      /* state says DPIO_FAILING */
    size_t n;
};

static int on_header(void *arg, size_t i, Tpuemu__FrameHeader *h, void **dst)
{
    struct owner *o = arg;
    if (o->refuse_kind && (int)h->kind == o->refuse_kind) {
        dpio_failf(&o->conns[i], CODE_INTERNAL, "answered with frame kind %d", (int)h->kind);
        return DPIO_LOST;
    }
    *dst = o->dst[i];
    return DPIO_PAYLOAD;
}

static int on_frame(void *arg, size_t i, uint64_t got)
{
    struct owner *o = arg;
    o->got[i] = got;
    o->frames[i]++;
    return o->stop_after && o->frames[i] >= o->stop_after;
}

static void on_lost(void *arg, size_t i, int code, const char *msg)
{
    struct owner *o = arg;
    o->lost[i]++;
    o->lost_code[i] = code;
    snprintf(o->lost_msg[i], sizeof o->lost_msg[i], "%s", msg);
}

static int state(void *arg)
{
    const struct owner *o = arg;
    int done = 1;
    for (size_t i = 0; i < o->n; i++)
        if (!o->lost[i] && o->frames[i] < o->want_frames)
            done = 0;
    return done ? DPIO_DONE : o->failing ? DPIO_FAILING : DPIO_MORE;
}

static const struct dpio_ops ops = {on_header, on_frame, on_lost, state};

/* c gets one end of a socketpair (non-blocking, as dpio_dial leaves it); the other end is returned. */
static int pair(struct dpio_conn *c, const char *host, int core)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK), 0);
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "%s", host);
    c->core = core;
    c->fd = sv[0];
    return sv[1];
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31u + seed);
}

/* The far end of a big transfer: reads n bytes, then writes its own frame. */
struct far {
    int fd;
    uint8_t *in;
    size_t in_len;
    const uint8_t *out;
    size_t out_len;
    int rc_in, rc_out;
};

static void *far_main(void *arg)
{
    struct far *f = arg;
    err e;
    uint64_t dl = wire_now_ms() + 10000;
    f->rc_in = dpauth_read_all(f->fd, f->in, f->in_len, dl, &e);
    f->rc_out = f->rc_in == CODE_OK ? dpauth_write_all(f->fd, f->out, f->out_len, dl, &e) : f->rc_in;
    return NULL;
}

Test(dpio, frame_bytes_and_payload_into_place, .timeout = 20)
{
    struct dpio_conn c;
    int peer = pair(&c, "h0", 1);
    size_t a_len = 700 * 1024, b_len = 333 * 1024 + 7, ans_len = 900 * 1024 + 3;
    uint8_t *a = malloc(a_len), *b = malloc(b_len), *ans = malloc(ans_len), *into = malloc(ans_len);
    uint8_t hdr[DPAUTH_FRAME_MAX];
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT, r = TPUEMU__FRAME_HEADER__INIT;
    struct dpio_seg segs[3] = {{a, a_len}, {NULL, 0}, {b, b_len}};
    struct owner o = {.conns = &c, .dst = {into}, .want_frames = 1, .stop_after = 1, .n = 1};
    struct dpio_run run = {&ops, &o, "test #1", wire_now_ms() + 10000, 0, 0, NULL};
    pthread_t t;

    cr_assert(a && b && ans && into);
    fill(a, a_len, 1);
    fill(b, b_len, 2);
    fill(ans, ans_len, 3);
    /* what the wire must carry: prefix + header, then the segments in order */
    h.kind = KIND(STEPS);
    h.seq = 42;
    h.epoch = 7;
    cr_assert_eq(dpio_send(&c, &h, segs, 3), CODE_OK);
    cr_assert_eq(h.payload_bytes, a_len + b_len, "dpio_send sets the payload's size");
    size_t hlen = frame_encode(&h, hdr, sizeof hdr);
    cr_assert_gt(hlen, 0);
    cr_assert_not(dpio_sent_all(&c));

    /* the answer: a frame whose payload must land in `into` */
    r.kind = KIND(MODEL_RESULT);
    r.seq = 42;
    r.payload_bytes = ans_len;
    uint8_t *reply = malloc(DPAUTH_FRAME_MAX + ans_len);
    size_t rlen = frame_encode(&r, reply, DPAUTH_FRAME_MAX);
    memcpy(reply + rlen, ans, ans_len);

    struct far f = {peer, malloc(hlen + a_len + b_len), hlen + a_len + b_len, reply, rlen + ans_len, -1, -1};
    cr_assert(f.in);
    c.reading = 1;
    cr_assert_eq(pthread_create(&t, NULL, far_main, &f), 0);
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_DONE, "%s", c.err);
    pthread_join(t, NULL);
    cr_assert_eq(f.rc_in, CODE_OK);
    cr_assert_eq(f.rc_out, CODE_OK);
    cr_assert_arr_eq(f.in, hdr, hlen, "the header's bytes");
    cr_assert_arr_eq(f.in + hlen, a, a_len, "the first segment");
    cr_assert_arr_eq(f.in + hlen + a_len, b, b_len, "the last segment");
    cr_assert_eq(o.frames[0], 1);
    cr_assert_eq(o.got[0], ans_len);
    cr_assert_arr_eq(into, ans, ans_len, "the payload went straight to the caller's buffer");
    cr_assert(dpio_sent_all(&c));
    cr_assert_eq(c.reading, 0, "on_frame said stop");
    cr_assert_eq(o.lost[0], 0);
    dpio_close(&c);
    cr_assert_eq(c.fd, -1);
    close(peer);
    free(a), free(b), free(ans), free(into), free(reply), free(f.in);
}

/* Writes frames of the given kinds, each with a payload of len bytes, in one go. */
static void send_frames(int fd, const int *kinds, size_t nk, size_t len)
{
    uint8_t buf[DPAUTH_FRAME_MAX + 256];
    err e;
    for (size_t i = 0; i < nk; i++) {
        Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
        h.kind = (Tpuemu__FrameKind)kinds[i];
        h.seq = i + 1;
        h.payload_bytes = len;
        size_t n = frame_encode(&h, buf, DPAUTH_FRAME_MAX);
        cr_assert_leq(len, 256);
        fill(buf + n, len, (unsigned)i);
        cr_assert_eq(dpauth_write_all(fd, buf, n + len, wire_now_ms() + 2000, &e), CODE_OK, "%s", e.msg);
    }
}

Test(dpio, frames_back_to_back_and_dropped_payloads, .timeout = 10)
{
    struct dpio_conn c;
    int peer = pair(&c, "h2", 0);
    int kinds[3] = {KIND(MODEL_RESULT), KIND(MODEL_RESULT), KIND(MODEL_RESULT)};
    struct owner o = {.conns = &c, .dst = {NULL}, .want_frames = 3, .n = 1};
    struct dpio_run run = {&ops, &o, NULL, wire_now_ms() + 5000, 0, 0, NULL};

    send_frames(peer, kinds, 3, 100);
    c.reading = 1;
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_DONE, "%s", c.err);
    cr_assert_eq(o.frames[0], 3);
    cr_assert_eq(o.got[0], 0, "a payload with no destination is read and dropped");
    cr_assert_eq(c.reading, 1);
    dpio_close(&c);
    close(peer);
}

Test(dpio, peer_closes, .timeout = 10)
{
    struct dpio_conn c;
    int peer = pair(&c, "h1", 3);
    struct owner o = {.conns = &c, .want_frames = 1, .n = 1};
    struct dpio_run run = {&ops, &o, "all-reduce #812", wire_now_ms() + 5000, 0, 0, NULL};

    close(peer);
    c.reading = 1;
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_DONE);
    cr_assert_eq(o.lost[0], 1);
    cr_assert_eq(o.lost_code[0], CODE_UNAVAILABLE);
    cr_assert_str_eq(o.lost_msg[0],
                     "core h1/3 closed its data connection during all-reduce #812 (the process died or was cut off)");
    cr_assert_eq(c.fd, -1, "a lost connection is closed");
}

Test(dpio, bad_prefix_and_malformed_header, .timeout = 10)
{
    struct dpio_conn c[2];
    int p0 = pair(&c[0], "h0", 0), p1 = pair(&c[1], "h0", 1);
    uint8_t zero[4] = {0, 0, 0, 0}, junk[8] = {4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    struct owner o = {.conns = c, .want_frames = 1, .n = 2};
    struct dpio_run run = {&ops, &o, NULL, wire_now_ms() + 5000, 0, 0, NULL};

    cr_assert_eq(write(p0, zero, sizeof zero), (ssize_t)sizeof zero);
    cr_assert_eq(write(p1, junk, sizeof junk), (ssize_t)sizeof junk);
    c[0].reading = c[1].reading = 1;
    cr_assert_eq(dpio_run(c, 2, &run), DPIO_END_DONE);
    cr_assert_eq(o.lost_code[0], CODE_INTERNAL);
    cr_assert(strncmp(o.lost_msg[0], "core h0/0 sent a bad frame: ", 28) == 0, "%s", o.lost_msg[0]);
    cr_assert_eq(o.lost_code[1], CODE_INTERNAL);
    cr_assert(strncmp(o.lost_msg[1], "core h0/1 sent a malformed answer: ", 35) == 0, "%s", o.lost_msg[1]);
    close(p0);
    close(p1);
}

Test(dpio, owner_refuses_a_header, .timeout = 10)
{
    struct dpio_conn c;
    int peer = pair(&c, "h5", 2);
    int kinds[1] = {KIND(PING)};
    struct owner o = {.conns = &c, .want_frames = 1, .refuse_kind = KIND(PING), .n = 1};
    struct dpio_run run = {&ops, &o, NULL, wire_now_ms() + 5000, 0, 0, NULL};

    send_frames(peer, kinds, 1, 0);
    c.reading = 1;
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_DONE);
    cr_assert_eq(o.lost[0], 1);
    char want[64];
    snprintf(want, sizeof want, "core h5/2 answered with frame kind %d", KIND(PING));
    cr_assert_str_eq(o.lost_msg[0], want);
    cr_assert_eq(c.fd, -1);
    close(peer);
}

Test(dpio, deadline_and_grace, .timeout = 20)
{
    struct dpio_conn c[2];
    int p0 = pair(&c[0], "h0", 0), p1 = pair(&c[1], "h0", 1);
    struct owner o = {.conns = c, .want_frames = 1, .n = 2};
    uint64_t t0 = wire_now_ms();
    struct dpio_run run = {&ops, &o, NULL, t0 + 200, 0, 0, NULL};

    /* a silent peer: the deadline ends the run */
    c[0].reading = c[1].reading = 1;
    cr_assert_eq(dpio_run(c, 2, &run), DPIO_END_DEADLINE);
    cr_assert_geq(wire_now_ms(), t0 + 200);
    cr_assert_eq(run.grace_used, 0);

    /* something failed: the rest get the grace, not the whole deadline */
    o.failing = 1;
    t0 = wire_now_ms();
    run.deadline_ms = t0 + 60000;
    run.grace_ms = 150;
    cr_assert_eq(dpio_run(c, 2, &run), DPIO_END_DEADLINE);
    cr_assert_eq(run.grace_used, 150);
    cr_assert_geq(wire_now_ms(), t0 + 150);
    cr_assert_lt(wire_now_ms(), t0 + 10000, "the grace did not cut the deadline");

    /* nothing to poll */
    dpio_close(&c[0]);
    dpio_close(&c[1]);
    cr_assert_eq(dpio_run(c, 2, &run), DPIO_END_IDLE);
    close(p0);
    close(p1);
}

static void *fire_later(void *arg)
{
    struct cli_cancel *k = arg;
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    cli_cancel_fire(k); /* as tpu_cancel does, from another thread */
    return NULL;
}

/* A cancel from another thread ends a run that waits on a silent peer with a
 * minute left, and only a run that began before it. */
Test(dpio, cancel, .timeout = 20)
{
    struct dpio_conn c;
    int p = pair(&c, "h0", 0);
    struct owner o = {.conns = &c, .want_frames = 1, .n = 1};
    struct cli_cancel k = {.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
    struct dpio_run run = {&ops, &o, NULL, wire_now_ms() + 60000, 0, 0, &k};
    pthread_t th;

    cr_assert_geq(k.fd, 0);
    c.reading = 1;
    /* a cancel before the call began is forgotten */
    cli_cancel_fire(&k);
    cli_cancel_enter(&k);
    run.deadline_ms = wire_now_ms() + 150;
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_DEADLINE);

    run.deadline_ms = wire_now_ms() + 60000;
    cr_assert_eq(pthread_create(&th, NULL, fire_later, &k), 0);
    cr_assert_eq(dpio_run(&c, 1, &run), DPIO_END_CANCELLED);
    cr_assert_lt(wire_now_ms() + 50000, run.deadline_ms, "the run waited for its deadline, not the cancel");
    pthread_join(th, NULL);
    struct cli_cancel *scope = &k;
    cli_cancel_leave(&scope);
    cr_assert_eq(k.depth, 0);
    dpio_close(&c);
    close(p);
    close(k.fd);
}

Test(dpio, header_too_big, .timeout = 5)
{
    struct dpio_conn c;
    int peer = pair(&c, "h0", 0);
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__CollSpec spec = TPUEMU__COLL_SPEC__INIT;
    size_t n = FRAME_MAX_HEADER; /* more group entries than a header holds */
    uint32_t *groups = calloc(n, sizeof *groups);
    cr_assert(groups);
    for (size_t i = 0; i < n; i++)
        groups[i] = (uint32_t)(1000000 + i);
    spec.n_group_of_replica = n;
    spec.group_of_replica = groups;
    h.kind = KIND(COLL);
    h.coll = &spec;
    cr_assert_eq(dpio_send(&c, &h, NULL, 0), CODE_INVALID_ARGUMENT);
    cr_assert(dpio_sent_all(&c), "nothing was queued");
    dpio_close(&c);
    close(peer);
    free(groups);
}

/* A data port that takes the connection and closes it at once, as a worker at
 * its connection limit does, or answers ERROR in place of its HELLO. */
struct refuser {
    int lfd;
    const char *error; /* NULL: close without a word */
};

static void *refuser_main(void *arg)
{
    struct refuser *r = arg;
    int fd = accept(r->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    if (r->error) {
        uint8_t buf[DPAUTH_FRAME_MAX];
        err e;
        size_t n = dpauth_error(CODE_RESOURCE_EXHAUSTED, r->error, buf, sizeof buf);
        dpauth_write_all(fd, buf, n, wire_now_ms() + 5000, &e);
    }
    close(fd);
    return NULL;
}

static void dial_refuser(const char *error, struct dpio_conn *c, int *rc, err *e)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    struct refuser r = {socket(AF_INET, SOCK_STREAM, 0), error};
    pthread_t t;

    cr_assert(r.lfd >= 0);
    cr_assert_eq(bind(r.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(r.lfd, 4), 0);
    cr_assert_eq(getsockname(r.lfd, (struct sockaddr *)&sa, &sl), 0);
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "h2");
    c->core = 5;
    snprintf(c->addr, sizeof c->addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    c->fd = -1;
    cr_assert_eq(pthread_create(&t, NULL, refuser_main, &r), 0);
    *rc = dpio_dial(c, NULL, "test", wire_now_ms() + 5000, e);
    pthread_join(t, NULL);
    close(r.lfd);
}

/* A full data port: the error says what happened, once, and names the core
 * (it used to repeat its own prefix with an empty reason). */
Test(dpio, dial_refused_by_a_full_port, .timeout = 15)
{
    struct dpio_conn c;
    char want[ERR_MSG_MAX + 512];
    int rc;
    err e;

    dial_refuser(NULL, &c, &rc, &e);
    cr_assert_eq(rc, CODE_UNAVAILABLE, "%s", e.msg);
    snprintf(want, sizeof want,
             "core h2/5 at %s: it closed the data connection before the handshake began: it takes no more data "
             "connections now (at its limit of data-plane connections, or shutting down)", c.addr);
    cr_assert_str_eq(e.msg, want);
    cr_assert_eq(c.fd, -1);

    dial_refuser("too many data-plane connections (256)", &c, &rc, &e);
    cr_assert_eq(rc, CODE_RESOURCE_EXHAUSTED, "%s", e.msg);
    snprintf(want, sizeof want, "core h2/5 at %s: it refused the data connection: too many data-plane connections (256)",
             c.addr);
    cr_assert_str_eq(e.msg, want);
}
