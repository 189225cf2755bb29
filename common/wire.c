/* Envelope sealing and opening. */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t wire_now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t wire_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int wire_seal(const auth *a, const char *sender, wire_msg *m, uint8_t **out, size_t *outlen,
              uint64_t *nonce_out, err *e)
{
    return wire_seal_at(a, sender, wire_now_unix_ms(), m, out, outlen, nonce_out, e);
}

int wire_seal_at(const auth *a, const char *sender, uint64_t sent_unix_ms, wire_msg *m, uint8_t **out,
                 size_t *outlen, uint64_t *nonce_out, err *e)
{
    Tpuemu__Envelope env = TPUEMU__ENVELOPE__INIT;
    unsigned char mac[AUTH_MAC_BYTES];
    uint8_t *body, *buf;
    size_t blen, elen;

    m->nonce = auth_random64();
    m->sent_unix_ms = sent_unix_ms;
    m->sender = (char *)(sender ? sender : "");
    if (nonce_out)
        *nonce_out = m->nonce;
    blen = tpuemu__message__get_packed_size(m);
    body = malloc(blen ? blen : 1);
    if (!body)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory sealing a %zu-byte message", blen);
    tpuemu__message__pack(m, body);
    env.version = WIRE_VERSION;
    env.body.data = body;
    env.body.len = blen;
    if (a && a->enabled) {
        auth_mac(a, body, blen, mac);
        env.mac.data = mac;
        env.mac.len = sizeof mac;
    }
    elen = tpuemu__envelope__get_packed_size(&env);
    buf = malloc(elen ? elen : 1);
    if (!buf) {
        free(body);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory sealing a %zu-byte message", elen);
    }
    tpuemu__envelope__pack(&env, buf);
    free(body);
    *out = buf;
    *outlen = elen;
    return CODE_OK;
}

int wire_open(const auth *a, replay *r, const uint8_t *buf, size_t len, size_t cap,
              wire_msg **out, err *e)
{
    Tpuemu__Envelope *env;
    wire_msg *m;
    char sample[64];
    int rc;

    *out = NULL;
    if (len > cap)
        return err_set(e, CODE_INVALID_ARGUMENT, "message of %zu bytes exceeds the %zu-byte limit",
                       len, cap);
    env = tpuemu__envelope__unpack(NULL, len, buf);
    if (!env) {
        wire_sample(buf, len, sample, sizeof sample);
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "could not decode a %zu-byte message as a tpuemu envelope (starts %s); "
                       "is the peer a tpuemu daemon or client?", len, sample);
    }
    if (env->version != WIRE_VERSION) {
        rc = err_set(e, CODE_FAILED_PRECONDITION,
                     "peer speaks protocol version %u, this side speaks %u; run the same tpuemu "
                     "release on every host", env->version, WIRE_VERSION);
        goto out;
    }
    if (a && a->enabled) {
        if (env->mac.len == 0) {
            rc = err_set(e, CODE_UNAUTHENTICATED,
                         "message carries no authentication but this cluster requires its token; "
                         "give the sender --token-file or $TPUEMU_TOKEN");
            goto out;
        }
        if (!auth_mac_ok(a, env->body.data, env->body.len, env->mac.data, env->mac.len)) {
            rc = err_set(e, CODE_UNAUTHENTICATED,
                         "message authentication failed: the sender uses a different cluster token");
            goto out;
        }
    }
    m = tpuemu__message__unpack(NULL, env->body.len, env->body.data);
    if (!m) {
        wire_sample(env->body.data, env->body.len, sample, sizeof sample);
        rc = err_set(e, CODE_INVALID_ARGUMENT, "could not decode the %zu-byte message body (starts %s)",
                     env->body.len, sample);
        goto out;
    }
    if (m->body_case == TPUEMU__MESSAGE__BODY__NOT_SET) {
        tpuemu__message__free_unpacked(m, NULL);
        rc = err_set(e, CODE_INVALID_ARGUMENT, "message has no body (unknown message type?)");
        goto out;
    }
    if (a && a->enabled && r &&
        (rc = replay_check(r, m->nonce, m->sent_unix_ms, wire_now_unix_ms(), e)) != CODE_OK) {
        tpuemu__message__free_unpacked(m, NULL);
        goto out;
    }
    *out = m;
    rc = CODE_OK;
out:
    tpuemu__envelope__free_unpacked(env, NULL);
    return rc;
}

int wire_vouches(const auth *a, const uint8_t *buf, size_t len)
{
    wire_msg *m = NULL;
    err e;

    /* the port has bounded len already (the largest is a worker's control port) */
    if (wire_open(a, NULL, buf, len, WIRE_MAX_CONTROL, &m, &e) != CODE_OK)
        return 0;
    wire_msg_free(m);
    return 1;
}

void wire_msg_free(wire_msg *m)
{
    if (m)
        tpuemu__message__free_unpacked(m, NULL);
}

uint64_t wire_peek_nonce(const uint8_t *buf, size_t len, size_t cap)
{
    Tpuemu__Envelope *env;
    wire_msg *m;
    uint64_t nonce = 0;

    if (len > cap || !(env = tpuemu__envelope__unpack(NULL, len, buf)))
        return 0;
    if ((m = tpuemu__message__unpack(NULL, env->body.len, env->body.data)) != NULL) {
        nonce = m->nonce;
        tpuemu__message__free_unpacked(m, NULL);
    }
    tpuemu__envelope__free_unpacked(env, NULL);
    return nonce;
}

int wire_seal_error(const auth *a, const char *sender, uint64_t request_id, int code,
                    const char *message, uint8_t **out, size_t *outlen)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;

    st.code = (Tpuemu__Code)code;
    st.message = (char *)message;
    m.request_id = request_id;
    m.body_case = TPUEMU__MESSAGE__BODY_ERROR;
    m.error = &st;
    return wire_seal(a, sender, &m, out, outlen, NULL, NULL);
}

void wire_sample(const uint8_t *buf, size_t len, char *out, size_t outlen)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < len && i < 8 && n + 4 < outlen; i++)
        n += (size_t)snprintf(out + n, outlen - n, "%s%02x", i ? " " : "", buf[i]);
    if (len > 8 && n + 4 < outlen)
        snprintf(out + n, outlen - n, " ...");
}

const char *wire_body_name(const wire_msg *m)
{
    static char unknown[32];
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&tpuemu__message__descriptor, (unsigned)m->body_case);
    if (f)
        return f->name;
    snprintf(unknown, sizeof unknown, "unknown(%d)", (int)m->body_case);
    return unknown;
}
