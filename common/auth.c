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

int auth_challenge_mac_ok(const auth *a, const unsigned char chal[AUTH_CHALLENGE_BYTES], const unsigned char *mac,
                          size_t maclen)
{
    unsigned char want[AUTH_MAC_BYTES];
    int ok;

    if (!mac || maclen != AUTH_MAC_BYTES)
        return 0;
    auth_challenge_mac(a, chal, want);
    ok = sodium_memcmp(want, mac, AUTH_MAC_BYTES) == 0;
    sodium_memzero(want, sizeof want);
    return ok;
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

/* Unordered; every check scans the whole cache (dropping expired entries and
 * finding the oldest by send time), which is cheap at control-plane rates. */
struct replay {
    struct entry *v;
    size_t cap, len;
    uint64_t floor_ms; /* anything sent at or before this is refused */
    uint64_t start_ms; /* and anything sent at or before the owner's start */
};

void replay_refuse_before(replay *r, uint64_t start_ms)
{
    r->start_ms = start_ms;
}

replay *replay_new(size_t capacity)
{
    replay *r = calloc(1, sizeof *r);
    if (!r || capacity == 0) {
        free(r);
        return NULL;
    }
    r->v = calloc(capacity, sizeof *r->v);
    if (!r->v) {
        free(r);
        return NULL;
    }
    r->cap = capacity;
    return r;
}

void replay_free(replay *r)
{
    if (r) {
        free(r->v);
        free(r);
    }
}

static int refuse_full(uint64_t oldest_ms, uint64_t now_ms, err *e)
{
    return err_set(e, CODE_UNAUTHENTICATED,
                   "the replay cache is full of messages dated up to %.1f s ahead of this daemon's "
                   "clock (is a sender's clock fast?); resend it later",
                   (double)(oldest_ms - now_ms) / 1000.0);
}

int replay_check(replay *r, uint64_t nonce, uint64_t sent_ms, uint64_t now_ms, err *e)
{
    size_t oldest = SIZE_MAX;

    if (sent_ms + AUTH_WINDOW_MS < now_ms || sent_ms > now_ms + AUTH_WINDOW_MS)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "message was sent %.1f s %s this daemon's clock; clocks must agree "
                       "within %u s (is the sender's clock set, or is this a replay?)",
                       (double)(sent_ms > now_ms ? sent_ms - now_ms : now_ms - sent_ms) / 1000.0,
                       sent_ms > now_ms ? "ahead of" : "behind", AUTH_WINDOW_MS / 1000);
    /* The floor is only ever raised to a time at or before the clock of the
     * moment, so above the clock it means the clock was stepped back: keep
     * the nonces still cached, give up the floor (a forgotten nonce from
     * before the step could then be replayed within the window; refusing
     * every sender until the clock catches up again would be worse). */
    if (r->floor_ms > now_ms)
        r->floor_ms = now_ms > AUTH_WINDOW_MS ? now_ms - AUTH_WINDOW_MS : 0;
    if (r->start_ms > now_ms) /* the clock stepped back past the start: as for the floor */
        r->start_ms = now_ms > AUTH_WINDOW_MS ? now_ms - AUTH_WINDOW_MS : 0;
    if (sent_ms <= r->start_ms)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "message was sent %llu ms before this process started, so it cannot be told from a replay "
                       "of one its predecessor accepted; send a fresh one",
                       (unsigned long long)(r->start_ms - sent_ms));
    if (sent_ms <= r->floor_ms)
        return err_set(e, CODE_UNAUTHENTICATED,
                       "message is older than the replay cache can vouch for; resend it");
    for (size_t i = 0; i < r->len;) {
        struct entry *en = &r->v[i];
        if (en->sent_ms + AUTH_WINDOW_MS < now_ms) { /* expired: the window refuses it now */
            *en = r->v[--r->len];
            continue;
        }
        if (en->nonce == nonce)
            return err_set(e, CODE_UNAUTHENTICATED, "message is a replay (nonce %016llx seen before)",
                           (unsigned long long)nonce);
        if (oldest == SIZE_MAX || en->sent_ms < r->v[oldest].sent_ms)
            oldest = i;
        i++;
    }
    if (r->len < r->cap) {
        r->v[r->len].nonce = nonce;
        r->v[r->len].sent_ms = sent_ms;
        r->len++;
        return CODE_OK;
    }
    /* Full: forget the message sent first (the newcomer itself if it is that
     * one) and refuse from then on anything sent at or before it, so the
     * forgotten nonce can never come back. Evicting by send time, not by
     * arrival, keeps the floor below every message still remembered: one
     * message dated ahead cannot carry the floor past correctly dated ones. */
    if (sent_ms <= r->v[oldest].sent_ms) {
        if (sent_ms > now_ms)
            return refuse_full(sent_ms, now_ms, e);
        r->floor_ms = sent_ms;
        return CODE_OK;
    }
    if (r->v[oldest].sent_ms > now_ms)
        return refuse_full(r->v[oldest].sent_ms, now_ms, e);
    if (r->v[oldest].sent_ms > r->floor_ms)
        r->floor_ms = r->v[oldest].sent_ms;
    r->v[oldest].nonce = nonce;
    r->v[oldest].sent_ms = sent_ms;
    return CODE_OK;
}
