/* Unit tests of common/wire/auth: token loading, MACs, challenge MACs and the replay
 * cache (replays refused, the time window, the eviction floor). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>
#include <criterion/criterion.h>

#include "auth.h"

#define TOKEN_A "0123456789abcdef-token-a"
#define TOKEN_B "0123456789abcdef-token-b"

static void setup(void)
{
    auth_global_init();
    unsetenv("TPUEMU_TOKEN");
}

TestSuite(auth, .init = setup);

static void key(auth *a, const char *t)
{
    err e;
    cr_assert_eq(auth_from_token(a, t, strlen(t), &e), CODE_OK, "%s", e.msg);
    cr_assert(a->enabled);
}

Test(auth, mac_round_trip_and_wrong_key)
{
    auth a, b;
    unsigned char mac[AUTH_MAC_BYTES];
    key(&a, TOKEN_A);
    key(&b, TOKEN_B);
    auth_mac(&a, "hello", 5, mac);
    cr_assert(auth_mac_ok(&a, "hello", 5, mac, sizeof mac));
    cr_assert_not(auth_mac_ok(&b, "hello", 5, mac, sizeof mac), "another token must not verify");
    cr_assert_not(auth_mac_ok(&a, "hellp", 5, mac, sizeof mac), "other data must not verify");
    cr_assert_not(auth_mac_ok(&a, "hello", 5, mac, sizeof mac - 1), "short MAC");
    cr_assert_not(auth_mac_ok(&a, "hello", 5, mac, 0), "empty MAC");
}

Test(auth, trailing_newline_is_ignored)
{
    auth a, b;
    unsigned char m1[AUTH_MAC_BYTES], m2[AUTH_MAC_BYTES];
    key(&a, TOKEN_A);
    key(&b, TOKEN_A "\n");
    auth_mac(&a, "x", 1, m1);
    auth_mac(&b, "x", 1, m2);
    cr_assert_arr_eq(m1, m2, sizeof m1);
}

Test(auth, short_token_is_refused)
{
    auth a;
    err e;
    memset(&a, 0, sizeof a);
    cr_assert_eq(auth_from_token(&a, "short", 5, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "at least 16"), "%s", e.msg);
    cr_assert_eq(auth_from_token(&a, "0123456789abcde\n", 16, &e), CODE_INVALID_ARGUMENT,
                 "15 bytes plus a newline is still too short");
}

Test(auth, load_from_file_env_and_nothing)
{
    auth a;
    err e;
    char path[] = "/tmp/tpuemu-auth-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, TOKEN_A "\n", strlen(TOKEN_A) + 1), (ssize_t)strlen(TOKEN_A) + 1);
    close(fd);

    cr_assert_eq(auth_load(&a, path, &e), CODE_OK, "%s", e.msg);
    cr_assert(a.enabled);
    cr_assert_eq(auth_load(&a, NULL, &e), CODE_OK);
    cr_assert_not(a.enabled, "no file and no $TPUEMU_TOKEN: auth off");
    setenv("TPUEMU_TOKEN", TOKEN_A, 1);
    cr_assert_eq(auth_load(&a, NULL, &e), CODE_OK);
    cr_assert(a.enabled);
    setenv("TPUEMU_TOKEN", "tiny", 1);
    cr_assert_eq(auth_load(&a, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "$TPUEMU_TOKEN"), "%s", e.msg);
    unlink(path);
    cr_assert_eq(auth_load(&a, path, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, path), "names the file: %s", e.msg);
}

Test(auth, empty_and_huge_token_files)
{
    auth a;
    err e;
    char path[] = "/tmp/tpuemu-auth-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(auth_load(&a, path, &e), CODE_INVALID_ARGUMENT, "empty file");
    char big[5000];
    memset(big, 'z', sizeof big);
    cr_assert_eq(write(fd, big, sizeof big), (ssize_t)sizeof big);
    close(fd);
    cr_assert_eq(auth_load(&a, path, &e), CODE_INVALID_ARGUMENT, "file over 4096 bytes");
    unlink(path);
}

/* A FIFO as the token file is refused at once (it used to wait forever for
 * a writer), and a directory is named as one (it used to read as "0 bytes"). */
Test(auth, fifo_and_directory_token_files_are_refused, .timeout = 10)
{
    auth a;
    err e;
    char d[] = "/tmp/tpuemu-auth-XXXXXX", p[64];
    cr_assert_not_null(mkdtemp(d));
    snprintf(p, sizeof p, "%s/token", d);
    cr_assert_eq(mkfifo(p, 0600), 0);
    cr_assert_eq(auth_load(&a, p, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, p) && strstr(e.msg, "a FIFO"), "%s", e.msg);
    cr_assert_eq(auth_load(&a, d, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "a directory") && !strstr(e.msg, "0 bytes"), "%s", e.msg);
    unlink(p);
    rmdir(d);
}

Test(auth, challenge_mac_is_domain_separated)
{
    auth a, b;
    unsigned char chal[AUTH_CHALLENGE_BYTES], m1[AUTH_MAC_BYTES], m2[AUTH_MAC_BYTES], m3[AUTH_MAC_BYTES];
    key(&a, TOKEN_A);
    key(&b, TOKEN_B);
    auth_random(chal, sizeof chal);
    auth_challenge_mac(&a, chal, m1);
    auth_challenge_mac(&b, chal, m2);
    auth_mac(&a, chal, sizeof chal, m3);
    cr_assert_arr_neq(m1, m2, sizeof m1);
    cr_assert_arr_neq(m1, m3, sizeof m1, "a message MAC must not answer a challenge");
}

Test(auth, challenge_mac_ok_takes_only_the_exact_mac)
{
    auth a, b;
    unsigned char chal[AUTH_CHALLENGE_BYTES], m[AUTH_MAC_BYTES], other[AUTH_MAC_BYTES];
    key(&a, TOKEN_A);
    key(&b, TOKEN_B);
    auth_random(chal, sizeof chal);
    auth_challenge_mac(&a, chal, m);
    cr_assert(auth_challenge_mac_ok(&a, chal, m, sizeof m));
    cr_assert(!auth_challenge_mac_ok(&b, chal, m, sizeof m), "another token's key");
    cr_assert(!auth_challenge_mac_ok(&a, chal, m, sizeof m - 1), "a short MAC");
    cr_assert(!auth_challenge_mac_ok(&a, chal, NULL, 0), "no MAC");
    for (size_t bit = 0; bit < 8 * sizeof m; bit++) {
        memcpy(other, m, sizeof m);
        other[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        cr_assert(!auth_challenge_mac_ok(&a, chal, other, sizeof other), "bit %zu flipped", bit);
    }
    chal[0] ^= 1;
    cr_assert(!auth_challenge_mac_ok(&a, chal, m, sizeof m), "another challenge");
}

/* A process that starts with an empty cache refuses what was sent before its start. */
Test(auth, replay_refuses_what_was_sent_before_the_start)
{
    replay *r = replay_new(16);
    err e;
    uint64_t start = 1000000000;
    replay_refuse_before(r, start);
    cr_assert_eq(replay_check(r, 1, start - 5000, start + 10, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "5000 ms before this process started"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 2, start, start + 10, &e), CODE_UNAUTHENTICATED);
    cr_assert_eq(replay_check(r, 3, start + 1, start + 10, &e), CODE_OK, "%s", e.msg);
    /* the clock stepped back past the start: the start no longer refuses fresh messages */
    cr_assert_eq(replay_check(r, 4, start - 120000, start - 120000, &e), CODE_OK, "%s", e.msg);
    replay_free(r);
}

Test(auth, random64_never_zero)
{
    uint64_t prev = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t v = auth_random64();
        cr_assert_neq(v, 0);
        cr_assert_neq(v, prev);
        prev = v;
    }
}

Test(auth, replay_refused)
{
    replay *r = replay_new(16);
    err e;
    uint64_t now = 1700000000000ull;
    cr_assert_eq(replay_check(r, 42, now, now, &e), CODE_OK);
    cr_assert_eq(replay_check(r, 42, now, now + 10, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "replay"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 43, now, now + 10, &e), CODE_OK);
    replay_free(r);
}

Test(auth, replay_window)
{
    replay *r = replay_new(16);
    err e;
    uint64_t now = 1700000000000ull;
    cr_assert_eq(replay_check(r, 1, now - AUTH_WINDOW_MS - 1, now, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "behind"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 2, now + AUTH_WINDOW_MS + 1, now, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "ahead"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 3, now - AUTH_WINDOW_MS, now, &e), CODE_OK, "edge of the window");
    cr_assert_eq(replay_check(r, 4, now + AUTH_WINDOW_MS, now, &e), CODE_OK);
    replay_free(r);
}

Test(auth, replay_expired_entries_are_dropped)
{
    replay *r = replay_new(2);
    err e;
    uint64_t t = 1700000000000ull;
    cr_assert_eq(replay_check(r, 1, t, t, &e), CODE_OK);
    cr_assert_eq(replay_check(r, 2, t + 1, t + 1, &e), CODE_OK);
    /* both expire; the cache makes room without raising its floor */
    uint64_t later = t + AUTH_WINDOW_MS + 10;
    cr_assert_eq(replay_check(r, 3, later, later, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(replay_check(r, 4, later, later, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(replay_check(r, 3, later, later, &e), CODE_UNAUTHENTICATED);
    replay_free(r);
}

Test(auth, replay_eviction_floor)
{
    replay *r = replay_new(4);
    err e;
    uint64_t t = 1700000000000ull;
    for (uint64_t i = 0; i < 4; i++)
        cr_assert_eq(replay_check(r, 100 + i, t + i, t + 10, &e), CODE_OK);
    /* full: the next one evicts nonce 100 (sent at t) and raises the floor */
    cr_assert_eq(replay_check(r, 200, t + 5, t + 10, &e), CODE_OK);
    cr_assert_eq(replay_check(r, 100, t, t + 10, &e), CODE_UNAUTHENTICATED,
                 "a forgotten nonce can never be replayed");
    cr_assert(strstr(e.msg, "older than the replay cache"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 300, t, t + 10, &e), CODE_UNAUTHENTICATED,
                 "anything sent at or before the floor is refused");
    cr_assert_eq(replay_check(r, 301, t + 6, t + 10, &e), CODE_OK);
    cr_assert_eq(replay_check(r, 101, t + 1, t + 10, &e), CODE_UNAUTHENTICATED, "still cached or below floor");
    replay_free(r);
}

Test(auth, replay_many)
{
    replay *r = replay_new(4096);
    err e;
    uint64_t t = 1700000000000ull;
    for (uint64_t i = 1; i <= 6000; i++)
        cr_assert_eq(replay_check(r, i, t + i / 4 + 1, t + 5000, &e), CODE_OK, "%llu: %s",
                     (unsigned long long)i, e.msg);
    cr_assert_eq(replay_check(r, 5999, t + 5000, t + 5000, &e), CODE_UNAUTHENTICATED);
    replay_free(r);
}

Test(auth, replay_message_dated_ahead_does_not_raise_the_floor)
{
    /* one message dated 50 s ahead (inside the window), then a minute of
     * correctly dated ones at 1000 a second: more than the cache holds */
    replay *r = replay_new(16384);
    err e;
    uint64_t t = 1700000000000ull;
    int refused = 0;
    char first[ERR_MSG_MAX] = "";
    cr_assert_eq(replay_check(r, 1, t + 50000, t, &e), CODE_OK, "%s", e.msg);
    for (uint64_t i = 0; i < 60000; i++) {
        uint64_t now = t + 1 + i;
        if (replay_check(r, 1000 + i, now, now, &e) != CODE_OK && !refused++)
            snprintf(first, sizeof first, "%s", e.msg);
    }
    cr_assert_eq(refused, 0, "%d of 60000 refused (first: %s)", refused, first);
    cr_assert_eq(replay_check(r, 1, t + 50000, t + 60001, &e), CODE_UNAUTHENTICATED,
                 "the message dated ahead is still remembered");
    cr_assert_eq(replay_check(r, 1000, t + 1, t + 60001, &e), CODE_UNAUTHENTICATED,
                 "a forgotten nonce is still refused");
    replay_free(r);
}

Test(auth, replay_floor_never_passes_the_clock)
{
    replay *r = replay_new(2);
    err e;
    uint64_t t = 1700000000000ull;
    cr_assert_eq(replay_check(r, 1, t + 30000, t, &e), CODE_OK);
    cr_assert_eq(replay_check(r, 2, t + 40000, t, &e), CODE_OK);
    /* full of messages dated ahead: correctly dated ones still pass, each
     * remembered as the floor, so none can be replayed */
    cr_assert_eq(replay_check(r, 3, t, t, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(replay_check(r, 3, t, t + 1, &e), CODE_UNAUTHENTICATED);
    cr_assert_eq(replay_check(r, 4, t + 1, t + 1, &e), CODE_OK, "%s", e.msg);
    /* one dated ahead that would have to push out another dated ahead: refused,
     * transiently, and the floor stays behind the clock */
    cr_assert_eq(replay_check(r, 5, t + 45000, t + 2, &e), CODE_UNAUTHENTICATED);
    cr_assert(strstr(e.msg, "ahead"), "%s", e.msg);
    cr_assert_eq(replay_check(r, 6, t + 2, t + 2, &e), CODE_OK, "%s", e.msg);
    replay_free(r);
}

Test(auth, replay_survives_the_clock_stepping_back)
{
    replay *r = replay_new(2);
    err e;
    uint64_t t = 1700000000000ull, back = t - 10 * 60000;
    for (uint64_t i = 0; i < 4; i++) /* raises the floor to t + 1 */
        cr_assert_eq(replay_check(r, 10 + i, t + i, t + i, &e), CODE_OK, "%s", e.msg);
    /* the clock goes back 10 minutes: messages dated by it pass again */
    cr_assert_eq(replay_check(r, 20, back, back, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(replay_check(r, 21, back + 5, back + 5, &e), CODE_OK, "%s", e.msg);
    replay_free(r);
}

/* The cache's rules, written the plain way (every check scans every entry):
 * what replay_check must decide, message for message. */
struct ref_entry {
    uint64_t nonce, sent_ms;
};
struct ref_cache {
    struct ref_entry v[64];
    size_t cap, len;
    uint64_t floor_ms;
};

static int ref_check(struct ref_cache *r, uint64_t nonce, uint64_t sent_ms, uint64_t now_ms)
{
    size_t oldest = SIZE_MAX;
    if (sent_ms + AUTH_WINDOW_MS < now_ms || sent_ms > now_ms + AUTH_WINDOW_MS)
        return CODE_UNAUTHENTICATED;
    if (r->floor_ms > now_ms)
        r->floor_ms = now_ms > AUTH_WINDOW_MS ? now_ms - AUTH_WINDOW_MS : 0;
    if (sent_ms <= r->floor_ms)
        return CODE_UNAUTHENTICATED;
    for (size_t i = 0; i < r->len;) {
        if (r->v[i].sent_ms + AUTH_WINDOW_MS < now_ms) {
            r->v[i] = r->v[--r->len];
            continue;
        }
        if (r->v[i].nonce == nonce)
            return CODE_UNAUTHENTICATED;
        if (oldest == SIZE_MAX || r->v[i].sent_ms < r->v[oldest].sent_ms ||
            (r->v[i].sent_ms == r->v[oldest].sent_ms && r->v[i].nonce < r->v[oldest].nonce))
            oldest = i; /* of two sent in the same millisecond, the lower nonce */
        i++;
    }
    if (r->len < r->cap) {
        r->v[r->len++] = (struct ref_entry){nonce, sent_ms};
        return CODE_OK;
    }
    if (sent_ms <= r->v[oldest].sent_ms) {
        if (sent_ms > now_ms)
            return CODE_UNAUTHENTICATED;
        r->floor_ms = sent_ms;
        return CODE_OK;
    }
    if (r->v[oldest].sent_ms > now_ms)
        return CODE_UNAUTHENTICATED;
    if (r->v[oldest].sent_ms > r->floor_ms)
        r->floor_ms = r->v[oldest].sent_ms;
    r->v[oldest] = (struct ref_entry){nonce, sent_ms};
    return CODE_OK;
}

/* 200,000 messages from a seeded generator: nonces from a small set (replays
 * and a nonce 0 included), send times around a clock that mostly moves on,
 * sometimes jumps a window ahead and sometimes steps back, senders' clocks up
 * to a window off: the cache (heap and hash set) decides as the plain rules
 * do every time, and its floor refuses what theirs refuses. */
Test(auth, replay_cache_decides_as_the_plain_rules)
{
    for (size_t cap = 1; cap <= 64; cap = cap * 3 + 1) {
        replay *r = replay_new(cap);
        struct ref_cache ref = {.cap = cap};
        uint64_t now = 1700000000000ull, x = 0x9e3779b97f4a7c15ull ^ cap;
        err e;
        cr_assert_not_null(r);
        for (int i = 0; i < 200000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            switch (x % 1000) {
            case 0: now += AUTH_WINDOW_MS + 1; break; /* everything expires */
            case 1: now -= 5000; break;               /* the clock steps back */
            default: now += x % 50;
            }
            uint64_t nonce = (x >> 12) % (3 * cap + 2); /* 0 included */
            uint64_t skew = (x >> 24) % (2 * AUTH_WINDOW_MS / 4 + 1);
            uint64_t sent = now + skew - AUTH_WINDOW_MS / 4;
            if ((x >> 40) % 64 == 0)
                sent = now - AUTH_WINDOW_MS - 1 - (x >> 50) % 100; /* out of the window */
            int want = ref_check(&ref, nonce, sent, now);
            int got = replay_check(r, nonce, sent, now, &e);
            cr_assert_eq(got, want, "capacity %zu, message %d: nonce %llu sent %lld ms from now: got %s, want %s",
                         cap, i, (unsigned long long)nonce, (long long)(sent - now), code_name(got), code_name(want));
        }
        replay_free(r);
    }
}

/* A token of few distinct bytes ("aaaa...") and a token file others can read
 * are taken, with a warning the daemons and the client show (as OpenSSH
 * warns of a private key others can read); a random one, mode 0600, with
 * none. */
Test(auth, weak_tokens_and_open_token_files_warn)
{
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, "aaaaaaaaaaaaaaaa", 16, &e), CODE_OK, "%s", e.msg);
    cr_assert(strstr(a.warning, "does not look random"), "'%s'", a.warning);
    cr_assert_eq(auth_from_token(&a, TOKEN_A, strlen(TOKEN_A), &e), CODE_OK);
    cr_assert_str_eq(a.warning, "");

    char path[] = "/tmp/tpuemu-auth-XXXXXX";
    int fd = mkstemp(path); /* 0600 */
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, TOKEN_A "\n", strlen(TOKEN_A) + 1), (ssize_t)strlen(TOKEN_A) + 1);
    close(fd);
    cr_assert_eq(auth_load(&a, path, &e), CODE_OK, "%s", e.msg);
    cr_assert_str_eq(a.warning, "", "a private random token");
    chmod(path, 0644);
    cr_assert_eq(auth_load(&a, path, &e), CODE_OK, "%s", e.msg);
    cr_assert(strstr(a.warning, path) && strstr(a.warning, "can be read by others") && strstr(a.warning, "0644"),
              "'%s'", a.warning);
    unlink(path);
}
