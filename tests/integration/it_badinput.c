/* Integration: bad input against running daemons (resolver control port,
 * worker control port, worker data port). Each case checks for a clear
 * error reply or a refusal, and that the daemon still serves a normal request
 * afterwards. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include "hostin.h"
#include "raw.h"

static cluster *c;
static char ctl[300], data[300];
static Tpuemu__CoreRef h00 = TPUEMU__CORE_REF__INIT; /* h0/0's process: the recipient of its control messages */

/* The incarnation of host/core, from a raw cluster spec request (the
 * library's core info does not carry it). */
static uint64_t incarnation_of(const char *host, int core)
{
    int sock = raw_req_open(c->addr, 3000);
    wire_msg m = TPUEMU__MESSAGE__INIT, *rep;
    Tpuemu__ClusterSpecRequest q = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint64_t inc = 0;
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &q;
    cr_assert_eq(raw_call_msg(sock, NULL, &m, &rep, NULL), CODE_OK);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC);
    for (size_t i = 0; i < rep->cluster_spec->n_cores; i++) {
        const Tpuemu__WorkerInfo *w = rep->cluster_spec->cores[i]->worker;
        if (strcmp(w->host_id, host) == 0 && w->core == core)
            inc = w->incarnation;
    }
    wire_msg_free(rep);
    raw_req_close(sock);
    cr_assert_neq(inc, 0, "%s/%d is not registered", host, core);
    return inc;
}

static void setup(void)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    auth_global_init();
    c = cluster_start(&o);
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    cr_assert_not_null(s);
    cr_assert(cluster_find_core(s, "h0", 0, &ci));
    snprintf(ctl, sizeof ctl, "%s", ci.control_addr);
    snprintf(data, sizeof data, "%s", ci.data_addr);
    tpu_cluster_spec_free(s);
    h00.host_id = "h0";
    h00.core = 0;
    h00.incarnation = incarnation_of("h0", 0);
}

static void teardown(void)
{
    cluster_free(c);
    c = NULL;
}

TestSuite(badinput, .init = setup, .fini = teardown, .timeout = 30);

/* The resolver answers a cluster spec request, the worker a probe and a ping. */
static void still_serving(void)
{
    cr_assert(cluster_alive(&c->resolver), "tpu-resolver died");
    cr_assert(cluster_alive(&c->workers[0]), "tpu-worker died");
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not_null(s, "the resolver stopped answering: %s", tpu_last_error());
    tpu_cluster_spec_free(s);

    int sock = raw_req_open(ctl, 3000);
    wire_msg m = TPUEMU__MESSAGE__INIT, *rep;
    Tpuemu__ProbeCore pc = TPUEMU__PROBE_CORE__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_PROBE_CORE;
    m.probe_core = &pc;
    m.recipient = &h00;
    cr_assert_eq(raw_call_msg(sock, NULL, &m, &rep, NULL), CODE_OK, "worker control port stopped answering");
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CORE_REPORT, "%s", wire_body_name(rep));
    wire_msg_free(rep);
    raw_req_close(sock);

    int fd;
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans;
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0, "worker data port stopped answering");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK);
    frame_header_free(ans);
    close(fd);
}

/* Sends bytes on an SP REQ socket; returns the error reply's code, or -1 if no reply. */
static int send_raw(const char *addr, const void *buf, size_t len, char *msg, size_t mlen)
{
    int sock = raw_req_open(addr, 1500);
    uint8_t *rep;
    size_t rlen;
    wire_msg *m;
    err e;
    int code = -1;
    if (msg)
        msg[0] = '\0';
    cr_assert_geq(sock, 0);
    if (raw_req_call(sock, buf, len, &rep, &rlen) == 0) {
        cr_assert_eq(wire_open(NULL, NULL, rep, rlen, WIRE_MAX_REPLY, &m, &e), CODE_OK,
                     "the reply is a proper envelope: %s", e.msg);
        cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_ERROR, "expected an error, got %s",
                     wire_body_name(m));
        cr_assert_eq(m->request_id, wire_peek_nonce(buf, len, WIRE_MAX_REQUEST),
                     "a refusal names the request when its envelope could be read, else request_id 0");
        code = (int)m->error->code;
        if (msg)
            snprintf(msg, mlen, "%s", m->error->message);
        wire_msg_free(m);
        free(rep);
    }
    raw_req_close(sock);
    return code;
}

/* Seals m, sends it, returns the reply (caller frees). */
static wire_msg *call(const char *addr, wire_msg *m)
{
    int sock = raw_req_open(addr, 3000);
    wire_msg *rep = NULL;
    uint64_t nonce;
    cr_assert_eq(raw_call_msg(sock, NULL, m, &rep, &nonce), CODE_OK, "no reply from %s", addr);
    if (rep->body_case != TPUEMU__MESSAGE__BODY_ERROR)
        cr_assert_eq(rep->request_id, nonce);
    raw_req_close(sock);
    return rep;
}

static void expect_error(wire_msg *rep, int code, const char *needle)
{
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_ERROR, "got %s", wire_body_name(rep));
    cr_assert_eq((int)rep->error->code, code, "%s: %s", code_name((int)rep->error->code), rep->error->message);
    if (needle)
        cr_assert(strstr(rep->error->message, needle), "'%s' not in: %s", needle, rep->error->message);
    wire_msg_free(rep);
}

static void raw_tcp(const char *hostport, const void *buf, size_t len)
{
    int fd = tcp_connect_addr(hostport, 2000);
    cr_assert_geq(fd, 0, "connect %s", hostport);
    tcp_send_all(fd, buf, len); /* the daemon may close early: fine */
    tcp_wait_closed(fd, 300);
    close(fd);
}

static const char *hostport_of(const char *url)
{
    return strncmp(url, "tcp://", 6) == 0 ? url + 6 : url;
}

Test(badinput, raw_garbage_tcp)
{
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    uint8_t rnd[70000];
    auth_random(rnd, sizeof rnd);
    raw_tcp(c->addr, http, sizeof http - 1);
    raw_tcp(c->addr, rnd, sizeof rnd);
    raw_tcp(hostport_of(ctl), http, sizeof http - 1);
    raw_tcp(hostport_of(ctl), rnd, sizeof rnd);
    /* an SP header claiming REP talking to a REP, then junk */
    const uint8_t sp[] = {0, 'S', 'P', 0, 0, 0x31, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    raw_tcp(c->addr, sp, sizeof sp);
    raw_tcp(hostport_of(ctl), sp, sizeof sp);
    still_serving();
}

Test(badinput, sp_framed_garbage)
{
    char msg[1024];
    const char junk[] = "this is not a protobuf envelope at all";
    cr_assert_eq(send_raw(c->addr, junk, sizeof junk - 1, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);
    cr_assert(strstr(msg, "decode"), "%s", msg);
    cr_assert_eq(send_raw(ctl, junk, sizeof junk - 1, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);
    /* an empty message decodes as an envelope of version 0 */
    int code = send_raw(c->addr, "", 0, msg, sizeof msg);
    cr_assert(code == CODE_INVALID_ARGUMENT || code == CODE_FAILED_PRECONDITION, "empty message: %d %s", code, msg);
    cr_assert(cl_wait_log(&c->resolver, "level=warn", 2000), "one warn line per refusal");
    still_serving();
}

static int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Sends n junk messages on one REQ socket, each answered with a refusal. */
static void flood(const char *addr, int n)
{
    const char junk[] = "this is not a protobuf envelope at all";
    int sock = raw_req_open(addr, 3000);
    cr_assert_geq(sock, 0);
    for (int i = 0; i < n; i++) {
        uint8_t *rep;
        size_t rlen;
        cr_assert_eq(raw_req_call(sock, junk, sizeof junk - 1, &rep, &rlen), 0, "refusal %d of %d never came", i, n);
        free(rep);
    }
    raw_req_close(sock);
}

/* A flood of garbage costs a bounded amount of log: the first refusals of a
 * kind are written with their reasons, the rest summed up in one line (at
 * the latest when the daemon stops). One warn line per refused message made
 * 5,000 garbage messages 1.3 MB of log. */
Test(badinput, garbage_flood_log_is_bounded, .timeout = 120)
{
    int n = cl_time_scale() > 1 ? 600 : 3000;
    char *before = cl_read_file(c->resolver.log), *wbefore = cl_read_file(c->workers[0].log);
    size_t rb = strlen(before), wb = strlen(wbefore);
    free(before);
    free(wbefore);

    flood(c->addr, n);
    flood(ctl, n);
    char *r = cl_read_file(c->resolver.log), *w = cl_read_file(c->workers[0].log);
    const char *rnew = r + rb, *wnew = w + wb;
    int rl = count_in(rnew, "msg=\"message refused\""), wl = count_in(wnew, "msg=\"control request refused\"");
    printf("garbage flood: %d messages each; resolver wrote %zu bytes (%d refusal lines), worker %zu bytes (%d)\n", n,
           strlen(rnew), rl, strlen(wnew), wl);
    cr_assert(rl >= 1 && rl <= 2 * 10, "resolver: %d 'message refused' lines for %d messages", rl, n);
    cr_assert(wl >= 1 && wl <= 2 * 10, "worker: %d 'control request refused' lines for %d messages", wl, n);
    cr_assert(strstr(rnew, "msg=\"message refused\" bytes=38 code=INVALID_ARGUMENT reason=\""),
              "the first refusal is there with its reason: %s", rnew);
    cr_assert(strstr(wnew, "msg=\"control request refused\" code=INVALID_ARGUMENT reason=\""),
              "the first refusal is there with its reason: %s", wnew);
    cr_assert_lt(strlen(rnew), 16384u, "resolver log grew by %zu bytes", strlen(rnew));
    cr_assert_lt(strlen(wnew), 16384u, "worker log grew by %zu bytes", strlen(wnew));
    free(r);
    free(w);
    still_serving();

    /* what was left out is summed up, at the latest when the daemon stops */
    cluster_restart_resolver(c);
    r = cl_read_file(c->resolver.log);
    cr_assert(strstr(r, "msg=\"message refused: ") && strstr(r, " more like this suppressed in the last "),
              "the resolver sums up the refusals it left out: %s", r + rb);
    cr_assert(strstr(r, "kind=\"message refused\" suppressed="), "%s", r + rb);
    free(r);
}

Test(badinput, truncated_envelope)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest req = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint8_t *buf;
    size_t len;
    err e;
    char msg[1024];
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &req;
    cr_assert_eq(wire_seal(NULL, "client t", &m, &buf, &len, NULL, &e), CODE_OK);
    cr_assert_eq(send_raw(c->addr, buf, len / 2, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);
    cr_assert_eq(send_raw(ctl, buf, len - 1, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);
    free(buf);
    still_serving();
}

Test(badinput, oversized_message)
{
    size_t len = 200 * 1024;
    uint8_t *big = malloc(len);
    memset(big, 0x0a, len);
    /* over NN_RCVMAXSIZE: nanomsg drops it (no reply) or the daemon refuses it */
    int code = send_raw(c->addr, big, len, NULL, 0);
    cr_assert(code == -1 || code == CODE_INVALID_ARGUMENT, "code %d", code);
    code = send_raw(ctl, big, len, NULL, 0);
    cr_assert(code == -1 || code == CODE_INVALID_ARGUMENT, "code %d", code);
    free(big);
    still_serving();
}

Test(badinput, unknown_and_misdirected_messages)
{
    /* a body field from a newer release */
    uint8_t body[64];
    wire_msg mm = TPUEMU__MESSAGE__INIT;
    mm.nonce = 99;
    mm.sent_unix_ms = wire_now_unix_ms();
    size_t blen = tpuemu__message__pack(&mm, body);
    body[blen++] = 0x9a; /* field 99, length-delimited */
    body[blen++] = 0x06;
    body[blen++] = 0x00;
    Tpuemu__Envelope env = TPUEMU__ENVELOPE__INIT;
    env.version = WIRE_VERSION;
    env.body.data = body;
    env.body.len = blen;
    uint8_t out[128];
    size_t olen = tpuemu__envelope__pack(&env, out);
    char msg[1024];
    cr_assert_eq(send_raw(c->addr, out, olen, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);
    cr_assert_eq(send_raw(ctl, out, olen, msg, sizeof msg), CODE_INVALID_ARGUMENT, "%s", msg);

    /* a known message the daemon does not handle */
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ResetCore rc = TPUEMU__RESET_CORE__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_RESET_CORE;
    m.reset_core = &rc;
    expect_error(call(c->addr, &m), CODE_INVALID_ARGUMENT, "tpu-resolver does not handle 'reset_core' messages");
    Tpuemu__ClusterSpecRequest csr = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &csr;
    expect_error(call(ctl, &m), CODE_INVALID_ARGUMENT, "does not handle 'cluster_spec_request'");
    still_serving();
}

Test(badinput, protocol_version_2)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest req = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint8_t *buf;
    size_t len;
    err e;
    char msg[1024];
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &req;
    cr_assert_eq(wire_seal(NULL, "client t", &m, &buf, &len, NULL, &e), CODE_OK);
    Tpuemu__Envelope *env = tpuemu__envelope__unpack(NULL, len, buf);
    env->version = 2;
    uint8_t out[512];
    size_t olen = tpuemu__envelope__pack(env, out);
    tpuemu__envelope__free_unpacked(env, NULL);
    free(buf);
    cr_assert_eq(send_raw(c->addr, out, olen, msg, sizeof msg), CODE_FAILED_PRECONDITION, "%s", msg);
    cr_assert(strstr(msg, "version 2"), "%s", msg);
    cr_assert_eq(send_raw(ctl, out, olen, msg, sizeof msg), CODE_FAILED_PRECONDITION, "%s", msg);
    still_serving();
}

static wire_msg *heartbeat(Tpuemu__WorkerInfo *w)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Heartbeat hb = TPUEMU__HEARTBEAT__INIT;
    hb.worker = w;
    m.body_case = TPUEMU__MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    return call(c->addr, &m);
}

static void good_worker(Tpuemu__WorkerInfo *w)
{
    tpuemu__worker_info__init(w);
    w->host_id = "fake";
    w->core = 5;
    w->incarnation = 12345;
    w->control_addr = "tcp://127.0.0.1:1";
    w->data_addr = "127.0.0.1:1";
    w->tpu_type = "v3";
    w->hbm_capacity = 1 << 30;
    w->pid = 1;
    w->version = TPUEMU_VERSION;
    w->replica_id = -1;
}

Test(badinput, absurd_values)
{
    Tpuemu__WorkerInfo w;
    char big[10 * 1024 + 1];
    memset(big, 'h', sizeof big - 1);
    big[sizeof big - 1] = '\0';

    good_worker(&w);
    w.host_id = big;
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "host_id");
    good_worker(&w);
    w.host_id = "bad host/with slash";
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "host_id");
    good_worker(&w);
    w.core = 99999;
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "core");
    good_worker(&w);
    w.core = -2;
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "core");
    good_worker(&w);
    w.incarnation = 0;
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "incarnation");
    good_worker(&w);
    w.control_addr = "http://x:1";
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "control_addr");
    good_worker(&w);
    w.tpu_type = "v9";
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "tpu_type");
    good_worker(&w);
    w.hbm_capacity = 0;
    expect_error(heartbeat(&w), CODE_INVALID_ARGUMENT, "hbm_capacity");

    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__InitializeRequest ir = TPUEMU__INITIALIZE_REQUEST__INIT;
    ir.expect = 1000000000;
    ir.timeout_ms = 100;
    ir.client_id = "1@test";
    m.body_case = TPUEMU__MESSAGE__BODY_INITIALIZE;
    m.initialize = &ir;
    expect_error(call(c->addr, &m), CODE_INVALID_ARGUMENT, NULL);
    ir.expect = 1;
    ir.timeout_ms = 4000000000u;
    expect_error(call(c->addr, &m), CODE_INVALID_ARGUMENT, NULL);

    /* nothing of the above was registered */
    cr_assert_eq(cluster_count(c, CL_ALIVE), 1);
    still_serving();
}

Test(badinput, stale_reset_refused_by_worker)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ResetCore rc = TPUEMU__RESET_CORE__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_RESET_CORE;
    m.reset_core = &rc;
    m.recipient = &h00;
    rc.epoch = 5;
    rc.replica_id = -1;
    wire_msg *rep = call(ctl, &m);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CORE_REPORT, "%s", wire_body_name(rep));
    cr_assert_eq(rep->core_report->worker->epoch, 5);
    wire_msg_free(rep);
    rc.epoch = 4;
    expect_error(call(ctl, &m), CODE_FAILED_PRECONDITION, "stale reset for epoch 4, core is in epoch 5");
    still_serving();
}

Test(badinput, control_message_for_another_recipient_refused)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ResetCore rc = TPUEMU__RESET_CORE__INIT;
    Tpuemu__ProbeCore pc = TPUEMU__PROBE_CORE__INIT;
    Tpuemu__CoreRef to = TPUEMU__CORE_REF__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_RESET_CORE;
    m.reset_core = &rc;
    rc.epoch = 9;
    rc.replica_id = -1;
    /* none, another core, another process of this core */
    expect_error(call(ctl, &m), CODE_PERMISSION_DENIED, "names no recipient");
    to.host_id = "h0";
    to.core = 1;
    to.incarnation = h00.incarnation;
    m.recipient = &to;
    expect_error(call(ctl, &m), CODE_PERMISSION_DENIED, "addressed to core h0/1");
    to.host_id = "h1";
    to.core = 0;
    expect_error(call(ctl, &m), CODE_PERMISSION_DENIED, "addressed to core h1/0");
    to.host_id = "h0";
    to.incarnation = h00.incarnation + 1;
    expect_error(call(ctl, &m), CODE_PERMISSION_DENIED, "this is core h0/0");
    m.body_case = TPUEMU__MESSAGE__BODY_PROBE_CORE;
    m.probe_core = &pc;
    expect_error(call(ctl, &m), CODE_PERMISSION_DENIED, "'probe_core' is addressed to core h0/0");
    /* none of them changed the core: it was never reset into epoch 9 */
    m.recipient = &h00;
    wire_msg *rep = call(ctl, &m);
    cr_assert_eq(rep->body_case, TPUEMU__MESSAGE__BODY_CORE_REPORT, "%s", wire_body_name(rep));
    cr_assert_neq(rep->core_report->worker->epoch, 9);
    wire_msg_free(rep);
    cr_assert(cl_log_contains(&c->workers[0], "control request refused"));
    still_serving();
}

static int dp_connect_after_hello(void)
{
    int fd = tcp_connect_addr(data, 2000);
    Tpuemu__FrameHeader *hello;
    cr_assert_geq(fd, 0);
    cr_assert_eq(dp_recv(fd, 3000, &hello, NULL), 0, "no HELLO");
    cr_assert_eq(hello->kind, TPUEMU__FRAME_KIND__FRAME_HELLO);
    frame_header_free(hello);
    return fd;
}

Test(badinput, data_port_bad_frames)
{
    /* header length 2^31 */
    int fd = dp_connect_after_hello();
    const uint8_t huge[4] = {0, 0, 0, 0x80};
    tcp_send_all(fd, huge, sizeof huge);
    cr_assert(tcp_wait_closed(fd, 3000), "header length 2^31 must close the connection");
    close(fd);

    /* garbage */
    fd = dp_connect_after_hello();
    const uint8_t junk[] = {10, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    tcp_send_all(fd, junk, sizeof junk);
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);

    /* after authenticating: payload 2^40, then a frame kind that is not allowed */
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    h.payload_bytes = 1ull << 40;
    dp_send(fd, &h, NULL, 0);
    if (dp_recv(fd, 3000, &ans, NULL) == 0) {
        cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR, "payload 2^40: got kind %d", ans->kind);
        frame_header_free(ans);
    }
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);

    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    Tpuemu__FrameHeader h2 = TPUEMU__FRAME_HEADER__INIT;
    h2.kind = TPUEMU__FRAME_KIND__FRAME_AUTH_OK;
    dp_send(fd, &h2, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "an unexpected kind gets an ERROR frame");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR);
    cr_assert_eq((int)ans->status->code, CODE_INVALID_ARGUMENT);
    frame_header_free(ans);
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);

    /* a PING announced at 1 MiB + 1 */
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    h.payload_bytes = (1u << 20) + 1;
    dp_send(fd, &h, NULL, 0);
    cr_assert(tcp_wait_closed(fd, 3000), "PING over 1 MiB closes the connection");
    close(fd);
    still_serving();
}

Test(badinput, data_port_peer_dies_mid_frame)
{
    uint8_t chal[AUTH_CHALLENGE_BYTES], part[1000];
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    int fd;
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    h.payload_bytes = 1u << 20;
    memset(part, 7, sizeof part);
    dp_send(fd, &h, part, sizeof part);
    close(fd);
    /* before the handshake, too */
    fd = tcp_connect_addr(data, 2000);
    tcp_send_all(fd, "\x05\x00", 2);
    close(fd);
    still_serving();
}

/* Host-side input specs no client of the library sends (it checks them
 * first): each refused with an error naming what is wrong, before any file is
 * opened or anything allocated from them, and the worker keeps serving. */
/* Sends STEPS{ss} on the handshaken fd and checks the worker refuses it
 * with INVALID_ARGUMENT naming expect; closes fd. */
static void steps_refused(int fd, Tpuemu__StepsSpec *ss, const char *what, const char *expect)
{
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    h.kind = TPUEMU__FRAME_KIND__FRAME_STEPS;
    h.steps = ss;
    dp_send(fd, &h, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "%s: no answer", what);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR, "%s: got kind %d", what, ans->kind);
    cr_assert_eq((int)ans->status->code, CODE_INVALID_ARGUMENT, "%s: %s", what, ans->status->message);
    cr_assert(strstr(ans->status->message, expect), "%s: %s", what, ans->status->message);
    frame_header_free(ans);
    close(fd);
}

Test(badinput, data_port_hostile_host_input_specs)
{
    static char long_path[5000];
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    memset(long_path, 'a', sizeof long_path - 1);
    struct {
        const char *what, *expect;
        uint32_t kind, batch, id, num, depth;
        uint64_t rows, buffer, nbatches;
        float a, b;
        const char *images;
    } cases[] = {
        {"no batch()", "no batch()", HIN_CACHE, 0, 0, 1, 0, 60000, 0, 1, 0, 0, "/x"},
        {"2^62 rows", "is not a dataset", HIN_BATCH, 8, 0, 1, 0, 1ull << 62, 0, 1, 0, 0, "/x"},
        {"a batch of 2^31 rows", "1..", HIN_BATCH, 1u << 31, 0, 1, 0, 60000, 0, 1, 0, 0, "/x"},
        {"pipeline 7 of 2", "does not exist", HIN_BATCH, 8, 7, 2, 0, 60000, 0, 1, 0, 0, "/x"},
        {"0 pipelines", "does not exist", HIN_BATCH, 8, 0, 0, 0, 60000, 0, 1, 0, 0, "/x"},
        {"a 4999-byte file name", "longer than", HIN_BATCH, 8, 0, 1, 0, 60000, 0, 1, 0, 0, long_path},
        {"no file name", "no images file", HIN_BATCH, 8, 0, 1, 0, 60000, 0, 1, 0, 0, NULL},
        {"positions for 3 steps in a 1-step request", "batch positions", HIN_BATCH, 8, 0, 1, 0, 60000, 0, 3, 0, 0,
         "/x"},
        {"op kind 99", "unknown kind 99", 99, 8, 0, 1, 0, 60000, 0, 1, 0, 0, "/x"},
        {"a NaN scale", "not a finite number", HIN_MAP_SCALE, 8, 0, 1, 0, 60000, 0, 1, NAN, 0, "/x"},
        {"normalize by 0", "zero deviation", HIN_MAP_NORMALIZE, 8, 0, 1, 0, 60000, 0, 1, 1, 0, "/x"},
        {"a shuffle buffer of 0", "buffer 0", HIN_SHUFFLE, 8, 0, 1, 0, 60000, 0, 1, 0, 0, "/x"},
        {"prefetch 1000", "prefetch depth", HIN_PREFETCH, 8, 0, 1, 1000, 60000, 0, 1, 0, 0, "/x"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Tpuemu__FrameHeader *ans;
        Tpuemu__StepsSpec ss = TPUEMU__STEPS_SPEC__INIT;
        Tpuemu__HostInput hi = TPUEMU__HOST_INPUT__INIT;
        Tpuemu__InputOp op = TPUEMU__INPUT_OP__INIT, bop = TPUEMU__INPUT_OP__INIT, *ops[2] = {&op, &bop};
        uint32_t rows[1] = {8}, grows[1] = {8};
        uint64_t pos[3] = {0, 1, 2};
        int fd;
        cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
        frame_header_free(ans);
        op.kind = cases[k].kind;
        op.batch = cases[k].batch;
        op.buffer = cases[k].buffer;
        op.depth = cases[k].depth;
        op.a = cases[k].a;
        op.b = cases[k].b;
        bop.kind = HIN_BATCH; /* a batch after the op (maps and shuffles come before it) */
        bop.batch = 8;
        hi.images = (char *)(uintptr_t)cases[k].images;
        hi.labels = (char *)"/y";
        hi.rows = cases[k].rows;
        hi.x_dim = 784;
        hi.n_ops = cases[k].kind == HIN_BATCH || cases[k].kind == HIN_CACHE || cases[k].kind == HIN_PREFETCH ? 1 : 2;
        hi.ops = ops;
        if (cases[k].kind == HIN_PREFETCH) { /* prefetch last, after the batch */
            ops[0] = &bop;
            ops[1] = &op;
            hi.n_ops = 2;
        }
        hi.input_pipeline_id = cases[k].id;
        hi.num_input_pipelines = cases[k].num;
        hi.n_batches = cases[k].nbatches;
        hi.batches = pos;
        ss.model_id = 77;
        ss.steps = 1;
        ss.n_rows = ss.n_global_rows = 1;
        ss.rows = rows;
        ss.global_rows = grows;
        ss.has_labels = 1;
        ss.host_input = &hi;
        steps_refused(fd, &ss, cases[k].what, cases[k].expect);
    }
    still_serving();
}

/* A request to fan out down a tree of cores (docs/design/fanout.md) that does
 * not hold together is refused before anything is passed on. */
Test(badinput, data_port_hostile_fanout)
{
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    struct {
        const char *what, *expect;
        uint32_t fanout, cores;
        int no_input, predict;
    } cases[] = {
        {"a tree of degree 17", "more than 16", 17, 1, 0, 0},
        {"a tree of degree 2^32-1", "more than 16", 0xffffffffu, 1, 0, 0},
        {"no host-side input", "needs host-side input", 2, 1, 1, 0},
        {"predictions", "training and evaluation", 2, 1, 0, 1},
        {"1000 cores in a system of none", "fanout_cores is 1000", 4, 1000, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Tpuemu__FrameHeader *ans;
        Tpuemu__StepsSpec ss = TPUEMU__STEPS_SPEC__INIT;
        Tpuemu__HostInput hi = TPUEMU__HOST_INPUT__INIT;
        Tpuemu__InputOp bop = TPUEMU__INPUT_OP__INIT, *ops[1] = {&bop};
        uint32_t rows[1] = {8}, grows[1] = {8};
        uint64_t pos[1] = {0};
        int fd;
        cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
        frame_header_free(ans);
        bop.kind = HIN_BATCH;
        bop.batch = 8;
        hi.images = (char *)"/x";
        hi.labels = (char *)"/y";
        hi.rows = 60000;
        hi.x_dim = 784;
        hi.n_ops = 1;
        hi.ops = ops;
        hi.num_input_pipelines = 1;
        hi.n_batches = 1;
        hi.batches = pos;
        ss.model_id = 77;
        ss.mode = cases[k].predict ? TPUEMU__STEP_MODE__STEP_PREDICT : TPUEMU__STEP_MODE__STEP_TRAIN;
        ss.steps = 1;
        ss.n_rows = ss.n_global_rows = 1;
        ss.rows = rows;
        ss.global_rows = grows;
        ss.has_labels = !cases[k].predict;
        ss.host_input = cases[k].no_input ? NULL : &hi;
        ss.fanout = cases[k].fanout;
        ss.fanout_cores = cases[k].cores;
        steps_refused(fd, &ss, cases[k].what, cases[k].expect);
    }
    still_serving();
}

/* Training frames a client might get wrong: the worker answers each with an
 * error naming what was wrong, and keeps serving. */
Test(badinput, data_port_bad_training_frames)
{
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans, h = TPUEMU__FRAME_HEADER__INIT;
    int fd;

    /* STEPS announcing 64 MiB of infeed for a model this core never compiled */
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    Tpuemu__StepsSpec ss = TPUEMU__STEPS_SPEC__INIT;
    uint32_t rows[1] = {8}, grows[1] = {8};
    ss.model_id = 77;
    ss.steps = 1;
    ss.n_rows = ss.n_global_rows = 1;
    ss.rows = rows;
    ss.global_rows = grows;
    ss.has_labels = 1;
    h.kind = TPUEMU__FRAME_KIND__FRAME_STEPS;
    h.steps = &ss;
    h.payload_bytes = 64ull << 20;
    dp_send(fd, &h, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "STEPS for no model: no answer");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR, "got kind %d", ans->kind);
    cr_assert(strstr(ans->status->message, "not compiled"), "%s", ans->status->message);
    frame_header_free(ans);
    cr_assert(tcp_wait_closed(fd, 3000), "the refused payload is not read: the connection closes");
    close(fd);

    /* COMPILE of a model with no layers, then one without a system: answered
     * with the reason, and the connection stays usable */
    cr_assert_eq(dp_handshake(data, NULL, 0, &fd, &ans, chal), 0);
    frame_header_free(ans);
    Tpuemu__FrameHeader comp = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ModelSpec ms = TPUEMU__MODEL_SPEC__INIT;
    comp.kind = TPUEMU__FRAME_KIND__FRAME_COMPILE;
    comp.seq = 5;
    comp.model = &ms;
    dp_send(fd, &comp, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "COMPILE: no answer");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_MODEL_RESULT, "got kind %d", ans->kind);
    cr_assert_eq(ans->seq, 5);
    cr_assert_neq((int)ans->status->code, CODE_OK, "a model without layers cannot compile");
    frame_header_free(ans);
    /* STATE_SET without a state description */
    Tpuemu__FrameHeader st = TPUEMU__FRAME_HEADER__INIT;
    st.kind = TPUEMU__FRAME_KIND__FRAME_STATE_SET;
    st.payload_bytes = 16;
    dp_send(fd, &st, NULL, 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, NULL), 0, "STATE_SET: no answer");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR);
    cr_assert_eq((int)ans->status->code, CODE_INVALID_ARGUMENT);
    cr_assert(strstr(ans->status->message, "state"), "%s", ans->status->message);
    frame_header_free(ans);
    cr_assert(tcp_wait_closed(fd, 3000));
    close(fd);
    still_serving();
}

Test(badinput, data_port_connection_limit, .timeout = 60)
{
    enum { N = 300, WAITING = 64 };
    int fds[N], open_n = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = tcp_connect_addr(data, 2000);
        if (fds[i] >= 0)
            open_n++;
    }
    cr_assert_eq(open_n, N, "the data port did not take every connection");
    /* at most 64 connections wait for their handshake: each newer one closed
     * the oldest waiting, so the first N - 64 are closed and the last 64 open */
    int closed = 0, still_open = 0;
    for (int i = 0; i < N; i++) {
        if (i < N - WAITING)
            closed += tcp_wait_closed(fds[i], 5000 * cl_time_scale());
        else
            still_open += !tcp_wait_closed(fds[i], 20);
    }
    cr_assert_eq(closed, N - WAITING, "only %d of the oldest %d waiting connections were closed", closed,
                 N - WAITING);
    cr_assert_eq(still_open, WAITING, "%d of the newest %d are open", still_open, WAITING);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    cr_assert(cl_wait_log(&c->workers[0], "evicted before finishing its handshake", 2000), "see %s",
              c->workers[0].log);
    still_serving();
}

/* The 5 s handshake timeout: never before it (less the hello's own time),
 * and at most a few seconds after it (a whole 3 s more on a loaded machine,
 * several times that under valgrind). */
Test(badinput, data_port_handshake_timeout, .timeout = 60)
{
    int fd = dp_connect_after_hello();
    int64_t t0 = cl_now_ms(), bound = 5000 + 3000 * cl_time_scale();
    cr_assert(tcp_wait_closed(fd, (int)bound), "a silent peer is dropped after the 5 s handshake timeout");
    int64_t ms = cl_now_ms() - t0;
    cr_assert(ms >= 4000 && ms < bound, "closed after %lld ms", (long long)ms);
    close(fd);
    still_serving();
}
