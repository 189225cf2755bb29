/* Token, key, MACs and the replay cache. */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

void auth_global_init(void)
{
    if (sodium_init() < 0) {
        fprintf(stderr, "fatal: libsodium failed to initialize\n");
        abort();
    }
}

int auth_from_token(auth *a, const char *token, size_t len, err *e)
{
    static const char ctx[] = "tpuemu cluster key v1";

    while (len > 0 && (token[len - 1] == '\n' || token[len - 1] == '\r'))
        len--;
    if (len < 16)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "the cluster token is %zu bytes long; use at least 16 random bytes "
                       "(for example: head -c 32 /dev/urandom | base64 > token)", len);
    crypto_generichash(a->key, sizeof a->key, (const unsigned char *)token, len,
                       (const unsigned char *)ctx, sizeof ctx - 1);
    a->enabled = 1;
    return CODE_OK;
}

int auth_load(auth *a, const char *token_file, err *e)
{
    memset(a, 0, sizeof *a);
    if (token_file && *token_file) {
        char buf[4097];
        FILE *f = fopen(token_file, "rb");
        size_t n;
        if (!f)
            return err_set(e, CODE_INVALID_ARGUMENT, "cannot read token file %s: %s",
                           token_file, strerror(errno));
        n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (n == sizeof buf)
            return err_set(e, CODE_INVALID_ARGUMENT, "token file %s is larger than 4096 bytes",
                           token_file);
        int rc = auth_from_token(a, buf, n, e);
        sodium_memzero(buf, sizeof buf);
        if (rc)
            err_prefix(e, "token file %s", token_file);
        return rc;
    }
    const char *t = getenv("TPUEMU_TOKEN");
    if (t && *t) {
        int rc = auth_from_token(a, t, strlen(t), e);
        if (rc)
            err_prefix(e, "$TPUEMU_TOKEN");
        return rc;
    }
    return CODE_OK;
}

void auth_mac(const auth *a, const void *data, size_t len, unsigned char out[AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256(out, data, len, a->key);
}

int auth_mac_ok(const auth *a, const void *data, size_t len, const unsigned char *mac, size_t maclen)
{
    if (maclen != AUTH_MAC_BYTES)
        return 0;
    return crypto_auth_hmacsha256_verify(mac, data, len, a->key) == 0;
}

void auth_challenge_mac(const auth *a, const unsigned char chal[AUTH_CHALLENGE_BYTES],
                        unsigned char out[AUTH_MAC_BYTES])
{
    unsigned char buf[16 + AUTH_CHALLENGE_BYTES];
    memcpy(buf, "tpuemu-data-v1\0\0", 16);
    memcpy(buf + 16, chal, AUTH_CHALLENGE_BYTES);
    crypto_auth_hmacsha256(out, buf, sizeof buf, a->key);
}

void auth_random(void *buf, size_t n)
{
    randombytes_buf(buf, n);
}

uint64_t auth_random64(void)
{
    uint64_t v;
    do
        randombytes_buf(&v, sizeof v);
    while (v == 0);
    return v;
}

struct entry {
    uint64_t nonce;
    uint64_t sent_ms;
};

struct replay {
    struct entry *ring; /* arrival order; a linear scan is cheap at control-plane rates */
    size_t cap, head, len;
    uint64_t floor_ms;  /* anything sent at or before this is refused */
};

replay *replay_new(size_t capacity)
{
    replay *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->ring = calloc(capacity, sizeof *r->ring);
    if (!r->ring) {
        free(r);
        return NULL;
    }
    r->cap = capacity;
    return r;
}

void replay_free(replay *r)
{
    if (r) {
        free(r->ring);
        free(r);
    }
}

int replay_check(replay *r, uint64_t nonce, uint64_t sent_ms, uint64_t now_ms, err *e)
{
    if (sent_ms + AUTH_WINDOW_MS < now_ms || sent_ms > now_ms + AUTH_WINDOW_MS)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "message was sent %.1f s %s this daemon's clock; clocks must agree "
                       "within %u s (is the sender's clock set, or is this a replay?)",
                       (double)(sent_ms > now_ms ? sent_ms - now_ms : now_ms - sent_ms) / 1000.0,
                       sent_ms > now_ms ? "ahead of" : "behind", AUTH_WINDOW_MS / 1000);
    if (sent_ms <= r->floor_ms)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "message is older than the replay cache can vouch for; resend it");
    /* drop expired entries from the old end */
    while (r->len > 0) {
        struct entry *old = &r->ring[(r->head + r->cap - r->len) % r->cap];
        if (old->sent_ms + AUTH_WINDOW_MS >= now_ms)
            break;
        r->len--;
    }
    for (size_t i = 0; i < r->len; i++)
        if (r->ring[(r->head + r->cap - 1 - i) % r->cap].nonce == nonce)
            return err_set(e, CODE_UNAUTHENTICATED, "message is a replay (nonce %016llx seen before)",
                           (unsigned long long)nonce);
    if (r->len == r->cap) {
        struct entry *old = &r->ring[r->head]; /* the oldest, about to be overwritten */
        if (old->sent_ms > r->floor_ms)
            r->floor_ms = old->sent_ms;
        r->len--;
    }
    r->ring[r->head].nonce = nonce;
    r->ring[r->head].sent_ms = sent_ms;
    r->head = (r->head + 1) % r->cap;
    r->len++;
    return CODE_OK;
}
