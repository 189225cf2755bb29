/* Integration: the cluster token (clients, workers, replays), protected mode,
 * and the data-plane challenge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cluster.h"
#include "raw.h"

#define SHOW(r) "exit %d\nstdout:\n%s\nstderr:\n%s", (r).code, (r).out, (r).err

static void write_token(const char *path, const char *tok)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%s\n", tok);
    fclose(f);
    chmod(path, 0600);
}

static uint64_t epoch_of(cluster *c)
{
    tpu_cluster_spec *s = cluster_spec(c);
    cr_assert_not_null(s, "the fixture's own client (right token) must work: %s", tpu_last_error());
    uint64_t e = tpu_cluster_spec_epoch(s);
    tpu_cluster_spec_free(s);
    return e;
}

static void setup(void)
{
    auth_global_init();
}

TestSuite(security, .init = setup);

Test(security, client_without_or_with_wrong_token, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    cr_assert(cl_log_contains(&c->resolver, "auth=on"));
    tpu_resolver *r;
    tpu_cluster *cc = NULL;
    tpu_topology *t = NULL;

    cr_assert_eq(tpu_resolver_new(c->addr, &r), TPU_OK);
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_UNAUTHENTICATED, "no token: %s",
                 tpu_status_name(tpu_last_status()));
    cr_assert_null(cc);
    tpu_resolver_free(r);

    char wrong[512];
    snprintf(wrong, sizeof wrong, "%s/wrong-token", c->dir);
    write_token(wrong, "a-completely-different-token-42");
    cr_assert_eq(tpu_resolver_new(c->addr, &r), TPU_OK);
    cr_assert_eq(tpu_resolver_set_token_file(r, wrong), TPU_OK);
    cr_assert_eq(tpu_connect_to_cluster(r, &cc), TPU_UNAUTHENTICATED);
    cr_assert(strstr(tpu_last_error(), "different cluster token"), "%s", tpu_last_error());
    tpu_resolver_free(r);

    /* tpuctl without a token cannot initialize: nothing changes */
    const char *argv[] = {CL_TPUCTL, "--tpu", c->addr, "init", NULL};
    run_result rr;
    run_cmd(argv, NULL, 10000, &rr);
    cr_assert_eq(rr.code, 1, SHOW(rr));
    cr_assert(strncmp(rr.err, "UNAUTHENTICATED: ", 17) == 0, SHOW(rr));
    run_result_free(&rr);
    char envtok[600];
    snprintf(envtok, sizeof envtok, "TPUEMU_TOKEN_FILE=%s", wrong);
    const char *envs[] = {envtok, NULL};
    run_cmd(argv, envs, 10000, &rr);
    cr_assert_eq(rr.code, 1, SHOW(rr));
    cr_assert(strncmp(rr.err, "UNAUTHENTICATED: ", 17) == 0, SHOW(rr));
    run_result_free(&rr);
    cr_assert_eq(epoch_of(c), 0, "refused clients changed the epoch");

    /* the right token works, through the environment too */
    snprintf(envtok, sizeof envtok, "TPUEMU_TOKEN=%s", CL_TOKEN);
    run_cmd(argv, envs, 10000, &rr);
    cr_assert_eq(rr.code, 0, SHOW(rr));
    run_result_free(&rr);
    cr_assert_eq(epoch_of(c), 1);
    (void)t;
    cluster_free(c);
}

Test(security, worker_with_wrong_token_does_not_register, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    char wrong[512];
    snprintf(wrong, sizeof wrong, "%s/wrong-token", c->dir);
    write_token(wrong, "a-completely-different-token-42");
    const char *extra[] = {"--token-file", wrong, NULL}; /* the last --token-file wins */
    int w = cluster_add_worker(c, "h9", 0, extra);
    const char *notok[] = {CL_WORKER, "--resolver", c->addr, "--host-id", "h8", "--core", "0", NULL};
    cl_proc p2 = {0};
    snprintf(p2.log, sizeof p2.log, "%s/notoken.log", c->dir);
    cl_spawn(&p2, CL_WORKER, notok + 1, NULL);
    /* 10 heartbeats: neither may appear */
    int64_t end = cl_now_ms() + 1000;
    while (cl_now_ms() < end) {
        cr_assert_eq(cluster_core_state(c, "h9", 0, NULL), TPU_CORE_UNKNOWN, "wrong-token worker registered");
        cr_assert_eq(cluster_core_state(c, "h8", 0, NULL), TPU_CORE_UNKNOWN, "token-less worker registered");
    }
    cr_assert(cl_wait_log(&c->resolver, "UNAUTHENTICATED", 1000) ||
                  cl_wait_log(&c->resolver, "authentication", 1000),
              "the resolver logs the refusal");
    if (!cluster_alive(&c->workers[w]))
        cr_assert(WIFEXITED(c->workers[w].status) && WEXITSTATUS(c->workers[w].status) != 0);
    if (cluster_wait_exit(&p2, 10)) {
        cr_assert(WEXITSTATUS(p2.status) != 0);
    } else {
        kill(p2.pid, SIGKILL);
        cluster_wait_exit(&p2, 2000);
    }
    cluster_free(c);
}

Test(security, replayed_message_refused, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ShutdownRequest sr = TPUEMU__SHUTDOWN_REQUEST__INIT;
    m.body_case = TPUEMU__MESSAGE__BODY_SHUTDOWN;
    m.shutdown = &sr;
    sr.client_id = "1@test";
    uint8_t *buf, *rep;
    size_t len, rlen;
    uint64_t nonce;
    cr_assert_eq(wire_seal(&a, "client 1@test", &m, &buf, &len, &nonce, &e), CODE_OK);
    int s = raw_req_open(c->addr, 3000);
    cr_assert_geq(s, 0);
    cr_assert_eq(raw_req_call(s, buf, len, &rep, &rlen), 0, "no reply to a good shutdown");
    wire_msg *rm;
    cr_assert_eq(wire_open(&a, NULL, rep, rlen, WIRE_MAX_REPLY, &rm, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(rm->body_case, TPUEMU__MESSAGE__BODY_SHUTDOWN_REPLY, "%s", wire_body_name(rm));
    cr_assert_eq(rm->request_id, nonce, "replies carry the request's nonce");
    wire_msg_free(rm);
    free(rep);
    uint64_t ep = epoch_of(c);
    cr_assert_eq(ep, 1);

    /* the very same bytes again (what nanomsg resends when a connection drops
     * before the reply arrived): the original answer, from the resolver's
     * duplicate-request cache, and nothing done twice */
    cr_assert_eq(raw_req_call(s, buf, len, &rep, &rlen), 0, "no reply to a resend");
    cr_assert_eq(wire_open(&a, NULL, rep, rlen, WIRE_MAX_REPLY, &rm, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(rm->body_case, TPUEMU__MESSAGE__BODY_SHUTDOWN_REPLY, "%s", wire_body_name(rm));
    cr_assert_eq(rm->request_id, nonce);
    wire_msg_free(rm);
    free(rep);
    cr_assert_eq(epoch_of(c), ep, "the resend did nothing");

    /* the same signed message in another envelope (an unknown field added):
     * a replay, refused, and the refusal names the request it answers */
    uint8_t *other = malloc(len + 2);
    memcpy(other, buf, len);
    other[len] = 0x78; /* field 15, varint 1 */
    other[len + 1] = 0x01;
    cr_assert_eq(raw_req_call(s, other, len + 2, &rep, &rlen), 0, "a replay gets an error reply");
    free(other);
    cr_assert_eq(wire_open(&a, NULL, rep, rlen, WIRE_MAX_REPLY, &rm, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(rm->body_case, TPUEMU__MESSAGE__BODY_ERROR, "%s", wire_body_name(rm));
    cr_assert_eq((int)rm->error->code, CODE_UNAUTHENTICATED, "%s", rm->error->message);
    cr_assert(strstr(rm->error->message, "replay"), "%s", rm->error->message);
    cr_assert_eq(rm->request_id, nonce, "the refusal is bound to the request");
    wire_msg_free(rm);
    free(rep);
    cr_assert_eq(epoch_of(c), ep, "the replay did nothing");
    cr_assert(cl_wait_log(&c->resolver, "replay", 2000), "the resolver logs the refusal");
    raw_req_close(s);
    free(buf);
    cluster_free(c);
}

Test(security, protected_mode, .timeout = 20)
{
    run_result r;
    char listen[64];
    snprintf(listen, sizeof listen, "0.0.0.0:%d", cl_free_port());
    const char *res[] = {CL_RESOLVER, "--listen", listen, NULL};
    run_cmd(res, NULL, 5000, &r);
    cr_assert(r.exited, "tpu-resolver kept running on a public address without a token");
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "refusing to listen on 0.0.0.0"), SHOW(r));
    cr_assert(strstr(r.err, "--token-file") && strstr(r.err, "--insecure"), SHOW(r));
    run_result_free(&r);

    const char *wrk[] = {CL_WORKER, "--resolver", "127.0.0.1:1", "--listen", "0.0.0.0", NULL};
    run_cmd(wrk, NULL, 5000, &r);
    cr_assert(r.exited);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "refusing to listen on"), SHOW(r));
    run_result_free(&r);

    /* --insecure allows it */
    cl_proc p = {0};
    const char *ins[] = {"--listen", listen, "--insecure", NULL};
    cl_spawn(&p, CL_RESOLVER, ins, NULL);
    cr_assert(cl_wait_log(&p, "auth=off", 5000), "resolver with --insecure did not start");
    cr_assert(cluster_alive(&p));
    kill(p.pid, SIGTERM);
    cr_assert(cluster_wait_exit(&p, 5000));
}

static void data_addr_of(cluster *c, int i, char *out, size_t n)
{
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    cr_assert_not_null(s);
    cr_assert(cluster_find_core(s, c->workers[i].host, c->workers[i].core, &ci));
    snprintf(out, n, "%s", ci.data_addr);
    tpu_cluster_spec_free(s);
}

Test(security, data_plane_challenge, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1, .token = 1};
    cluster *c = cluster_start(&o);
    auth a, wrong;
    err e;
    char da[300];
    cr_assert_eq(auth_from_token(&a, CL_TOKEN, strlen(CL_TOKEN), &e), CODE_OK);
    cr_assert_eq(auth_from_token(&wrong, "a-completely-different-token-42", 31, &e), CODE_OK);
    data_addr_of(c, 0, da, sizeof da);
    int fd;
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans;

    /* wrong MAC (random) and a MAC under another token: ERROR, then close */
    for (int k = 0; k < 3; k++) {
        int rc = dp_handshake(da, k == 1 ? &wrong : NULL, k == 0, &fd, &ans, chal);
        cr_assert_eq(rc, 0, "handshake step %d failed (%d)", k, rc);
        cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_ERROR, "case %d: got kind %d", k, ans->kind);
        cr_assert_not_null(ans->status);
        cr_assert_eq((int)ans->status->code, CODE_UNAUTHENTICATED);
        cr_assert(strstr(ans->status->message, "data-plane authentication failed"), "%s",
                  ans->status->message);
        frame_header_free(ans);
        cr_assert(tcp_wait_closed(fd, 2000), "connection closed after the error");
        close(fd);
    }

    /* the right MAC: AUTH_OK proving the worker knows the token, then PING/PONG */
    cr_assert_eq(dp_handshake(da, &a, 0, &fd, &ans, chal), 0);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK);
    unsigned char want[AUTH_MAC_BYTES];
    auth_challenge_mac(&a, chal, want);
    cr_assert_eq(ans->mac.len, AUTH_MAC_BYTES);
    cr_assert_arr_eq(ans->mac.data, want, AUTH_MAC_BYTES, "AUTH_OK carries the MAC of our challenge");
    frame_header_free(ans);
    Tpuemu__FrameHeader ping = TPUEMU__FRAME_HEADER__INIT;
    uint8_t payload[1000], *back;
    auth_random(payload, sizeof payload);
    ping.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    ping.payload_bytes = sizeof payload;
    cr_assert_eq(dp_send(fd, &ping, payload, sizeof payload), 0);
    cr_assert_eq(dp_recv(fd, 3000, &ans, &back), 0, "no PONG");
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_PONG);
    cr_assert_eq(ans->payload_bytes, sizeof payload);
    cr_assert_arr_eq(back, payload, sizeof payload);
    free(back);
    frame_header_free(ans);
    close(fd);
    cluster_free(c);
}

Test(security, data_plane_without_token, .timeout = 30)
{
    cluster_opts o = {.hosts = 1, .cores_per_host = 1};
    cluster *c = cluster_start(&o);
    char da[300];
    int fd;
    uint8_t chal[AUTH_CHALLENGE_BYTES];
    Tpuemu__FrameHeader *ans;
    data_addr_of(c, 0, da, sizeof da);
    cr_assert_eq(dp_handshake(da, NULL, 0, &fd, &ans, chal), 0);
    cr_assert_eq(ans->kind, TPUEMU__FRAME_KIND__FRAME_AUTH_OK, "empty MAC is fine without a token");
    cr_assert_eq(ans->mac.len, 0);
    frame_header_free(ans);
    close(fd);
    cluster_free(c);
}
