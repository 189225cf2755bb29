/* Unit tests of common/wire/wire: seal/open round trip, wrong token, missing MAC,
 * version mismatch, garbage, oversized, no body, unknown body field; the
 * envelope read in place, what vouches, the arenas opened messages live in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "peertab.h"
#include "wire.h"

#define TOKEN_A "0123456789abcdef-token-a"
#define TOKEN_B "0123456789abcdef-token-b"

static auth ka, kb, none;

static void setup(void)
{
    err e;
    auth_global_init();
    memset(&none, 0, sizeof none);
    cr_assert_eq(auth_from_token(&ka, TOKEN_A, strlen(TOKEN_A), &e), CODE_OK);
    cr_assert_eq(auth_from_token(&kb, TOKEN_B, strlen(TOKEN_B), &e), CODE_OK);
}

TestSuite(wire, .init = setup);

/* A sealed ClusterSpecRequest. */
static uint8_t *seal_spec_req(const auth *a, size_t *len, uint64_t *nonce)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest req = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint8_t *buf;
    err e;
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &req;
    cr_assert_eq(wire_seal(a, "client 1@test", &m, &buf, len, nonce, &e), CODE_OK, "%s", e.msg);
    return buf;
}

/* Repacks an envelope with one field changed. */
static uint8_t *reenvelope(const uint8_t *buf, size_t len, int version, int drop_mac, size_t *outlen)
{
    Tpuemu__Envelope *env = tpuemu__envelope__unpack(NULL, len, buf);
    cr_assert_not_null(env);
    if (version >= 0)
        env->version = (uint32_t)version;
    if (drop_mac)
        env->mac.len = 0;
    *outlen = tpuemu__envelope__get_packed_size(env);
    uint8_t *out = malloc(*outlen + 1);
    tpuemu__envelope__pack(env, out);
    tpuemu__envelope__free_unpacked(env, NULL);
    return out;
}

Test(wire, round_trip_with_token)
{
    size_t len;
    uint64_t nonce;
    uint8_t *buf = seal_spec_req(&ka, &len, &nonce);
    replay *r = replay_new(16);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, r, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST);
    cr_assert_eq(m->nonce, nonce);
    cr_assert_neq(m->nonce, 0);
    cr_assert_str_eq(m->sender, "client 1@test");
    cr_assert_str_eq(wire_body_name(m), "cluster_spec_request");
    uint64_t now = wire_now_unix_ms();
    cr_assert(m->sent_unix_ms <= now && m->sent_unix_ms + 5000 > now);
    wire_msg_free(m);
    /* the same bytes again are a replay */
    cr_assert_eq(wire_open(&ka, r, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_UNAUTHENTICATED);
    cr_assert_null(m);
    cr_assert(strstr(e.msg, "replay"), "%s", e.msg);
    replay_free(r);
    free(buf);
}

Test(wire, round_trip_without_token)
{
    size_t len;
    uint8_t *buf = seal_spec_req(&none, &len, NULL);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&none, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_OK, "%s", e.msg);
    wire_msg_free(m);
    cr_assert_eq(wire_open(NULL, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_OK, "%s", e.msg);
    wire_msg_free(m);
    free(buf);
}

Test(wire, wrong_token)
{
    size_t len;
    uint8_t *buf = seal_spec_req(&kb, &len, NULL);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "different cluster token"), "%s", e.msg);
    cr_assert_null(m);
    free(buf);
}

Test(wire, missing_mac)
{
    size_t len, len2;
    uint8_t *buf = seal_spec_req(&none, &len, NULL);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "no authentication"), "%s", e.msg);
    free(buf);
    buf = seal_spec_req(&ka, &len, NULL);
    uint8_t *stripped = reenvelope(buf, len, -1, 1, &len2);
    cr_assert_eq(wire_open(&ka, NULL, stripped, len2, WIRE_MAX_REQUEST, &m, &e), CODE_UNAUTHENTICATED);
    free(stripped);
    free(buf);
}

Test(wire, tampered_body)
{
    size_t len;
    uint8_t *buf = seal_spec_req(&ka, &len, NULL);
    Tpuemu__Envelope *env = tpuemu__envelope__unpack(NULL, len, buf);
    cr_assert_not_null(env);
    env->body.data[env->body.len - 1] ^= 1;
    size_t l2 = tpuemu__envelope__get_packed_size(env);
    uint8_t *b2 = malloc(l2);
    tpuemu__envelope__pack(env, b2);
    tpuemu__envelope__free_unpacked(env, NULL);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, b2, l2, WIRE_MAX_REQUEST, &m, &e), CODE_UNAUTHENTICATED);
    free(b2);
    free(buf);
}

Test(wire, version_mismatch)
{
    size_t len, len2;
    uint8_t *buf = seal_spec_req(&ka, &len, NULL);
    uint8_t *v2 = reenvelope(buf, len, 2, 0, &len2);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, v2, len2, WIRE_MAX_REQUEST, &m, &e), CODE_FAILED_PRECONDITION);
    cr_assert(strstr(e.msg, "version 2"), "%s", e.msg);
    free(v2);
    v2 = reenvelope(buf, len, 0, 0, &len2);
    cr_assert_eq(wire_open(&ka, NULL, v2, len2, WIRE_MAX_REQUEST, &m, &e), CODE_FAILED_PRECONDITION,
                 "a missing version is not version 1");
    free(v2);
    free(buf);
}

Test(wire, garbage)
{
    const uint8_t garbage[] = "GET / HTTP/1.0\r\n\r\n";
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, garbage, sizeof garbage - 1, WIRE_MAX_REQUEST, &m, &e),
                 CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "47 45 54 20"), "sample of the bytes in the message: %s", e.msg);
    cr_assert_null(m);
    uint8_t rnd[512];
    for (int i = 0; i < 200; i++) {
        auth_random(rnd, sizeof rnd);
        int rc = wire_open(&ka, NULL, rnd, (size_t)(i * 2 + 1), WIRE_MAX_REQUEST, &m, &e);
        cr_assert_neq(rc, CODE_OK);
        cr_assert_null(m);
    }
    cr_assert_neq(wire_open(&ka, NULL, rnd, 0, WIRE_MAX_REQUEST, &m, &e), CODE_OK, "empty input");
}

Test(wire, truncated)
{
    size_t len;
    uint8_t *buf = seal_spec_req(&ka, &len, NULL);
    wire_msg *m;
    err e;
    for (size_t n = 1; n < len; n++) {
        int rc = wire_open(&ka, NULL, buf, n, WIRE_MAX_REQUEST, &m, &e);
        cr_assert_neq(rc, CODE_OK, "truncated to %zu of %zu bytes accepted", n, len);
        cr_assert_null(m);
    }
    free(buf);
}

Test(wire, oversized)
{
    size_t len = WIRE_MAX_REQUEST + 1;
    uint8_t *buf = calloc(1, len);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "exceeds"), "%s", e.msg);
    free(buf);
}

/* An envelope around arbitrary message bytes, MAC'd with k. */
static uint8_t *envelope_of(const auth *k, const uint8_t *body, size_t blen, size_t *outlen)
{
    Tpuemu__Envelope env = TPUEMU__ENVELOPE__INIT;
    unsigned char mac[AUTH_MAC_BYTES];
    env.version = WIRE_VERSION;
    env.body.data = (uint8_t *)body;
    env.body.len = blen;
    if (k->enabled) {
        auth_mac(k, body, blen, mac);
        env.mac.data = mac;
        env.mac.len = sizeof mac;
    }
    *outlen = tpuemu__envelope__get_packed_size(&env);
    uint8_t *out = malloc(*outlen + 1);
    tpuemu__envelope__pack(&env, out);
    return out;
}

Test(wire, no_body)
{
    wire_msg mm = TPUEMU__MESSAGE__INIT;
    uint8_t body[64];
    mm.nonce = 7;
    mm.sent_unix_ms = wire_now_unix_ms();
    size_t blen = tpuemu__message__pack(&mm, body);
    size_t len;
    uint8_t *buf = envelope_of(&ka, body, blen, &len);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "no body"), "%s", e.msg);
    free(buf);
}

Test(wire, unknown_body_field)
{
    /* nonce (fixed64, field 1) then field 99, length-delimited: a message type
     * from a newer release. */
    uint8_t body[] = {0x09, 1, 2, 3, 4, 5, 6, 7, 8, 0x9a, 0x06, 0x02, 0x08, 0x01};
    size_t len;
    uint8_t *buf = envelope_of(&ka, body, sizeof body, &len);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_INVALID_ARGUMENT);
    cr_assert_null(m);
    free(buf);
}

Test(wire, undecodable_body_with_valid_mac)
{
    uint8_t body[] = {0xff, 0xff, 0xff, 0xff, 0xff};
    size_t len;
    uint8_t *buf = envelope_of(&ka, body, sizeof body, &len);
    wire_msg *m;
    err e;
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REQUEST, &m, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "body"), "%s", e.msg);
    free(buf);
}

Test(wire, error_reply)
{
    uint8_t *buf;
    size_t len;
    wire_msg *m;
    err e;
    cr_assert_eq(wire_seal_error(&ka, "resolver", 1234, CODE_ABORTED, "busy", &buf, &len), CODE_OK);
    cr_assert_eq(wire_open(&ka, NULL, buf, len, WIRE_MAX_REPLY, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_ERROR);
    cr_assert_eq(m->request_id, 1234);
    cr_assert_eq((int)m->error->code, CODE_ABORTED);
    cr_assert_str_eq(m->error->message, "busy");
    cr_assert_str_eq(m->sender, "resolver");
    cr_assert_str_eq(wire_body_name(m), "error");
    wire_msg_free(m);
    free(buf);
}

Test(wire, sample_is_bounded)
{
    char out[16];
    uint8_t b[100] = {0xab};
    wire_sample(b, sizeof b, out, sizeof out);
    cr_assert_lt(strlen(out), sizeof out);
    wire_sample(b, 0, out, sizeof out);
    cr_assert_str_empty(out);
}

Test(wire, clocks)
{
    uint64_t a = wire_now_ms(), b = wire_now_ms();
    cr_assert_geq(b, a);
    cr_assert_gt(wire_now_unix_ms(), 1600000000000ull);
}

Test(wire, peek_nonce_of_a_refused_message)
{
    err e;
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ClusterSpecRequest cs = TPUEMU__CLUSTER_SPEC_REQUEST__INIT;
    uint8_t *buf;
    size_t len;
    uint64_t nonce;
    wire_msg *out;
    m.body_case = TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST;
    m.cluster_spec_request = &cs;
    cr_assert_eq(wire_seal(&ka, "t", &m, &buf, &len, &nonce, &e), CODE_OK);
    cr_assert_eq(wire_open(&kb, NULL, buf, len, WIRE_MAX_REQUEST, &out, &e), CODE_UNAUTHENTICATED);
    cr_assert_eq(wire_peek_nonce(buf, len, WIRE_MAX_REQUEST), nonce);
    cr_assert_eq(wire_peek_nonce(buf, len, len - 1), 0, "over the cap");
    cr_assert_eq(wire_peek_nonce((const uint8_t *)"GET / HTTP/1.0", 14, WIRE_MAX_REQUEST), 0);
    free(buf);
}

/* The envelope is read in place, with protobuf's rules: fields in any order,
 * unknown ones skipped, a repeated one's last value winning. */
Test(wire, envelope_fields_in_any_order_and_unknown_ones_skipped)
{
    size_t len;
    uint8_t *buf = seal_spec_req(&ka, &len, NULL);
    Tpuemu__Envelope *env = tpuemu__envelope__unpack(NULL, len, buf);
    uint8_t out[1024], *p = out;
    wire_msg *m = NULL;
    err e;

    cr_assert_not_null(env);
    cr_assert_lt(env->body.len + env->mac.len, sizeof out - 64);
    *p++ = 0x28; *p++ = 0x07;                                    /* field 5, varint: unknown */
    *p++ = 0x1a; *p++ = (uint8_t)env->mac.len;                   /* mac first */
    memcpy(p, env->mac.data, env->mac.len), p += env->mac.len;
    *p++ = 0x08; *p++ = 0x09;                                    /* version 9 ... */
    *p++ = 0x12;                                                 /* body */
    *p++ = (uint8_t)(env->body.len | 0x80), *p++ = (uint8_t)(env->body.len >> 7);
    memcpy(p, env->body.data, env->body.len), p += env->body.len;
    *p++ = 0x35; memset(p, 0, 4), p += 4;                        /* field 6, 32-bit: unknown */
    *p++ = 0x08; *p++ = WIRE_VERSION;                            /* ... then the right one */
    cr_assert_eq(wire_open(&ka, NULL, out, (size_t)(p - out), WIRE_MAX_REQUEST, &m, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(m->body_case, TPUEMU__MESSAGE__BODY_CLUSTER_SPEC_REQUEST);
    wire_msg_free(m);
    cr_assert(wire_vouches(&ka, out, (size_t)(p - out)));

    /* body given the wrong wire type: refused, naming the envelope */
    out[0] = 0x10; /* field 2 as a varint */
    cr_assert_eq(wire_open(&ka, NULL, out, (size_t)(p - out), WIRE_MAX_REQUEST, &m, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "tpuemu envelope"), "%s", e.msg);
    cr_assert_not(wire_vouches(&ka, out, (size_t)(p - out)));
    tpuemu__envelope__free_unpacked(env, NULL);
    free(buf);
}

/* What a control port's connection budget trusts: a sealed envelope of this
 * version, MAC'd under the token when there is one; not garbage, not another
 * token's, not another version's, not an unsigned one where a token is set. */
Test(wire, vouches)
{
    size_t len, l2;
    uint8_t *buf = seal_spec_req(&ka, &len, NULL), *v2, *nomac;
    uint8_t junk[64];

    cr_assert(wire_vouches(&ka, buf, len));
    cr_assert(wire_vouches(&none, buf, len));
    cr_assert_not(wire_vouches(&kb, buf, len));
    v2 = reenvelope(buf, len, 2, 0, &l2);
    cr_assert_not(wire_vouches(&ka, v2, l2));
    free(v2);
    nomac = reenvelope(buf, len, -1, 1, &l2);
    cr_assert_not(wire_vouches(&ka, nomac, l2));
    cr_assert(wire_vouches(&none, nomac, l2));
    free(nomac);
    memset(junk, 0xff, sizeof junk);
    cr_assert_not(wire_vouches(&none, junk, sizeof junk));
    cr_assert_not(wire_vouches(&none, buf, 0));
    cr_assert_not(wire_vouches(&none, buf, len - 1));
    free(buf);
}

/* A ResetCore of n peers, sealed. */
static uint8_t *seal_reset(size_t n, size_t *len)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__ResetCore r = TPUEMU__RESET_CORE__INIT;
    struct peertab_row *v = calloc(n, sizeof *v);
    char (*addr)[32] = calloc(n, sizeof *addr);
    uint8_t *buf, *table;
    size_t tlen;
    err e;

    for (size_t i = 0; i < n; i++) {
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%zu", 20000 + i);
        v[i] = (struct peertab_row){"h1", (int)(i % 8), addr[i], "tcp://127.0.0.1:1", "", 0};
    }
    cr_assert_eq(peertab_pack(v, n, &table, &tlen, &e), CODE_OK, "%s", e.msg);
    r.peer_table.data = table;
    r.peer_table.len = tlen;
    r.num_replicas = (uint32_t)n;
    m.body_case = TPUEMU__MESSAGE__BODY_RESET_CORE;
    m.reset_core = &r;
    cr_assert_eq(wire_seal(&ka, "resolver", &m, &buf, len, NULL, &e), CODE_OK, "%s", e.msg);
    free(table);
    free(v);
    free(addr);
    return buf;
}

/* Opened messages live in arenas that are reused: large and small ones, kept
 * open together and freed in any order, each keep their own contents. */
Test(wire, messages_open_together_and_free_in_any_order)
{
    enum { K = 6 };
    static const size_t sizes[K] = {1024, 1, 3000, 8, 200, 1024};
    size_t len[K];
    uint8_t *buf[K];
    wire_msg *m[K];
    err e;

    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < K; k++) {
            buf[k] = seal_reset(sizes[k], &len[k]);
            cr_assert_eq(wire_open(&ka, NULL, buf[k], len[k], WIRE_MAX_CONTROL, &m[k], &e), CODE_OK, "%s", e.msg);
        }
        for (int k = 0; k < K; k++) {
            int j = (k * 5 + round) % K; /* a different order each round */
            Tpuemu__ResetCore *r = m[j]->reset_core;
            struct peertab *t;
            char want[32], got[PEERTAB_MAX_ADDR + 1];
            cr_assert_eq(r->num_replicas, sizes[j]);
            cr_assert_eq(peertab_open(r->peer_table.data, r->peer_table.len, sizes[j], &t, &e), CODE_OK, "%s",
                         e.msg);
            snprintf(want, sizeof want, "127.0.0.1:%zu", 20000 + sizes[j] - 1);
            cr_assert_str_eq(peertab_data_addr(t, sizes[j] - 1, got, sizeof got), want);
            cr_assert_eq(peertab_core(t, sizes[j] - 1), (int)((sizes[j] - 1) % 8));
            peertab_free(t);
            wire_msg_free(m[j]);
            m[j] = NULL;
            free(buf[j]);
        }
    }
}
