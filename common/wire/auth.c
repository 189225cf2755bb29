/* Token, key, MACs and the replay cache. */
#include "auth.h"
#include "memtrim.h"
#include "safefile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>
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

    a->warning[0] = '\0';
    while (len > 0 && (token[len - 1] == '\n' || token[len - 1] == '\r'))
        len--;
    if (len < 16)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "the cluster token is %zu bytes long; use at least 16 random bytes "
                       "(for example: head -c 32 /dev/urandom | base64 > token)", len);
    {
        /* a token typed by hand ("aaaa...", "password12345678") passes the
         * length check: a guesser tries those first */
        unsigned char seen[256] = {0};
        unsigned distinct = 0;
        for (size_t i = 0; i < len; i++)
            distinct += !seen[(unsigned char)token[i]]++;
        if (distinct < 8)
            snprintf(a->warning, sizeof a->warning, "the cluster token has only %u distinct bytes: it does not "
                     "look random; make one with: head -c 32 /dev/urandom | base64", distinct);
    }
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
        FILE *f = NULL;
        size_t n;
        int fd, rc0;
        /* opened without blocking and only if it is a regular file: a FIFO
         * would wait forever, a directory would read as 0 bytes */
        if ((rc0 = safefile_open_read("token file", token_file, &fd, e)) != CODE_OK) {
            if (e)
                e->code = CODE_INVALID_ARGUMENT;
            return CODE_INVALID_ARGUMENT;
        }
        struct stat st;
        int open_to_others = fstat(fd, &st) == 0 && (st.st_mode & 077);
        if (!(f = fdopen(fd, "rb"))) {
            close(fd);
            return err_set(e, CODE_INVALID_ARGUMENT, "cannot read token file %s: %s",
                           token_file, strerror(errno));
        }
        n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (n == sizeof buf)
            return err_set(e, CODE_INVALID_ARGUMENT, "token file %s is larger than 4096 bytes",
                           token_file);
        int rc = auth_from_token(a, buf, n, e);
        sodium_memzero(buf, sizeof buf);
        if (rc)
            err_prefix(e, "token file %s", token_file);
        else if (open_to_others) { /* as OpenSSH says of a private key others can read */
            char weak[sizeof a->warning];
            snprintf(weak, sizeof weak, "%s", a->warning);
            snprintf(a->warning, sizeof a->warning, "token file %.300s can be read by others than its owner (mode "
                     "%04o): anyone who reads it holds the cluster; chmod 600 %.300s%s%.200s", token_file,
                     (unsigned)(st.st_mode & 07777), token_file, weak[0] ? "; also: " : "", weak);
        }
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

void auth_subkey(const auth *a, const char *purpose, unsigned char out[32])
{
    crypto_generichash(out, 32, (const unsigned char *)purpose, strlen(purpose), a->key, sizeof a->key);
}

void auth_console_key_hex(const auth *a, char out[65])
{
    unsigned char k[32];
    auth_subkey(a, "tpuemu console v1", k);
    sodium_bin2hex(out, 65, k, sizeof k);
    sodium_memzero(k, sizeof k);
}

int auth_console_key_ok(const auth *a, const char *key, size_t len)
{
    char want[65];
    int ok;
    if (len != 64)
        return 0;
    auth_console_key_hex(a, want);
    ok = sodium_memcmp(want, key, 64) == 0;
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

/* A min-heap of the remembered messages by send time (its root is the one
 * sent first: the next to expire, and the one a full cache forgets) and a
 * hash set of their nonces (open addressing, linear probing, deletion by
 * backward shift; 0 marks a free slot, so a nonce 0 is kept as a flag). Each
 * check is O(log n): the cache used to be scanned whole on every message,
 * which at 1,024 cores heartbeating through a full 16,384-entry cache was a
 * third of an idle resolver's CPU. */
struct replay {
    struct entry *heap;
    size_t cap, len;
    uint64_t *set;     /* nonces; 0 = free */
    size_t mask;       /* set size - 1 (a power of two, at least 2 x cap) */
    int has_zero;      /* nonce 0 is remembered */
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
    size_t n = 16;

    if (!r || capacity == 0 || capacity > ((size_t)1 << 28)) {
        free(r);
        return NULL;
    }
    while (n < 2 * capacity)
        n <<= 1;
    r->heap = calloc(capacity, sizeof *r->heap);
    r->set = calloc(n, sizeof *r->set);
    if (!r->heap || !r->set) {
        free(r->heap);
        free(r->set);
        free(r);
        return NULL;
    }
    mem_resident(r->heap, capacity * sizeof *r->heap);
    mem_resident(r->set, n * sizeof *r->set);
    r->cap = capacity;
    r->mask = n - 1;
    return r;
}

void replay_free(replay *r)
{
    if (r) {
        free(r->heap);
        free(r->set);
        free(r);
    }
}

static size_t slot_of(const replay *r, uint64_t x)
{
    x ^= x >> 33; /* a mix of the bits (murmur3's finalizer): nonces come from senders */
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (size_t)x & r->mask;
}

static int set_has(const replay *r, uint64_t x)
{
    if (x == 0)
        return r->has_zero;
    for (size_t i = slot_of(r, x);; i = (i + 1) & r->mask) {
        if (r->set[i] == x)
            return 1;
        if (r->set[i] == 0)
            return 0;
    }
}

static void set_add(replay *r, uint64_t x)
{
    size_t i;
    if (x == 0) {
        r->has_zero = 1;
        return;
    }
    for (i = slot_of(r, x); r->set[i] != 0 && r->set[i] != x; i = (i + 1) & r->mask)
        ;
    r->set[i] = x;
}

static void set_del(replay *r, uint64_t x)
{
    size_t i, j;
    if (x == 0) {
        r->has_zero = 0;
        return;
    }
    for (i = slot_of(r, x); r->set[i] != x; i = (i + 1) & r->mask)
        if (r->set[i] == 0)
            return;
    /* backward shift: move up every later entry of the run whose home slot is
     * not cyclically in (i, j], so no lookup stops early at the hole */
    for (j = (i + 1) & r->mask; r->set[j] != 0; j = (j + 1) & r->mask) {
        size_t k = slot_of(r, r->set[j]);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        r->set[i] = r->set[j];
        i = j;
    }
    r->set[i] = 0;
}

/* Heap order: send time, then nonce (a total order: which of two messages
 * sent in the same millisecond goes first does not depend on arrival). */
static int before(const struct entry *a, const struct entry *b)
{
    return a->sent_ms < b->sent_ms || (a->sent_ms == b->sent_ms && a->nonce < b->nonce);
}

static void heap_down(replay *r, size_t i)
{
    struct entry e = r->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= r->len)
            break;
        if (c + 1 < r->len && before(&r->heap[c + 1], &r->heap[c]))
            c++;
        if (!before(&r->heap[c], &e))
            break;
        r->heap[i] = r->heap[c];
        i = c;
    }
    r->heap[i] = e;
}

static void heap_push(replay *r, uint64_t nonce, uint64_t sent_ms)
{
    size_t i = r->len++;
    struct entry e = {nonce, sent_ms};
    while (i > 0 && before(&e, &r->heap[(i - 1) / 2])) {
        r->heap[i] = r->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    r->heap[i].nonce = nonce;
    r->heap[i].sent_ms = sent_ms;
    set_add(r, nonce);
}

/* Forgets the message sent first (the root). */
static void heap_pop(replay *r)
{
    set_del(r, r->heap[0].nonce);
    r->heap[0] = r->heap[--r->len];
    if (r->len > 0)
        heap_down(r, 0);
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
    while (r->len > 0 && r->heap[0].sent_ms + AUTH_WINDOW_MS < now_ms) /* expired: the window refuses them now */
        heap_pop(r);
    if (set_has(r, nonce))
        return err_set(e, CODE_UNAUTHENTICATED, "message is a replay (nonce %016llx seen before)",
                       (unsigned long long)nonce);
    if (r->len < r->cap) {
        heap_push(r, nonce, sent_ms);
        return CODE_OK;
    }
    /* Full: forget the message sent first (the newcomer itself if it is that
     * one) and refuse from then on anything sent at or before it, so the
     * forgotten nonce can never come back. Evicting by send time, not by
     * arrival, keeps the floor below every message still remembered: one
     * message dated ahead cannot carry the floor past correctly dated ones. */
    if (sent_ms <= r->heap[0].sent_ms) {
        if (sent_ms > now_ms)
            return refuse_full(sent_ms, now_ms, e);
        r->floor_ms = sent_ms;
        return CODE_OK;
    }
    if (r->heap[0].sent_ms > now_ms)
        return refuse_full(r->heap[0].sent_ms, now_ms, e);
    if (r->heap[0].sent_ms > r->floor_ms)
        r->floor_ms = r->heap[0].sent_ms;
    heap_pop(r);
    heap_push(r, nonce, sent_ms);
    return CODE_OK;
}
