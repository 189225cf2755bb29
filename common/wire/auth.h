/* The cluster token: loading it, the key derived from it, MACs, and the replay
 * cache. The token itself never leaves the process: messages carry an
 * HMAC-SHA-256 under a key derived from it (libsodium), data-plane connections
 * answer a random challenge. */
#ifndef TPUEMU_COMMON_AUTH_H
#define TPUEMU_COMMON_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define AUTH_MAC_BYTES 32
#define AUTH_CHALLENGE_BYTES 32
/* Messages whose timestamp is further than this from the receiver's clock are
 * refused: daemons' clocks must agree within it (as Kerberos asks for 5 min). */
#define AUTH_WINDOW_MS 60000u

typedef struct auth {
    int enabled;
    unsigned char key[32];
    /* auth_load: what is weak about the token, for the caller to show (a
     * token of few distinct bytes, a token file others can read); "" if
     * nothing */
    char warning[1024];
} auth;

/* Loads the token from token_file if given, else from $TPUEMU_TOKEN, else leaves
 * auth disabled. A file's trailing newline is ignored. An unreadable or empty
 * file, or a token shorter than 16 bytes, is CODE_INVALID_ARGUMENT. */
int auth_load(auth *a, const char *token_file, err *e);
/* Same from a token in memory (tests, tools). */
int auth_from_token(auth *a, const char *token, size_t len, err *e);

/* libsodium must be initialized first; calls sodium_init(), aborts if it fails. */
void auth_global_init(void);

void auth_mac(const auth *a, const void *data, size_t len, unsigned char out[AUTH_MAC_BYTES]);
/* Constant-time; 1 if mac is right. */
int auth_mac_ok(const auth *a, const void *data, size_t len, const unsigned char *mac, size_t maclen);
/* MAC of a data-plane challenge, domain-separated from message MACs. */
void auth_challenge_mac(const auth *a, const unsigned char chal[AUTH_CHALLENGE_BYTES],
                        unsigned char out[AUTH_MAC_BYTES]);
/* Constant-time; 1 if mac (maclen bytes) is the challenge's MAC. Every check of
 * a challenge's answer goes through here, never through memcmp. */
int auth_challenge_mac_ok(const auth *a, const unsigned char chal[AUTH_CHALLENGE_BYTES], const unsigned char *mac,
                          size_t maclen);

/* A 32-byte key for one purpose (a short fixed string), derived from the
 * cluster key: a key of one use cannot be turned into a key of another. */
void auth_subkey(const auth *a, const char *purpose, unsigned char out[32]);

/* The cluster console's key: a subkey that lets a browser read the console's
 * data (GET /api/cluster on the resolver's metrics port) and nothing else,
 * as 64 lowercase hex digits and a NUL. */
void auth_console_key_hex(const auth *a, char out[65]);
/* Constant-time; 1 if the len bytes at key are the console key's hex. */
int auth_console_key_ok(const auth *a, const char *key, size_t len);

void auth_random(void *buf, size_t n);
uint64_t auth_random64(void); /* never 0 */

/* Replay cache: remembers each accepted nonce for the window. When full it
 * forgets the entry sent first and from then on refuses anything sent at or
 * before that entry's time, so a forgotten nonce can never be replayed. That
 * floor never passes the receiver's clock: when the entry sent first is dated
 * ahead of it, the newcomer is refused instead (transient: the sender retries).
 * Byte-identical resends are for the caller's duplicate-request cache (drc.h)
 * to answer before this refuses them. */
typedef struct replay replay;
replay *replay_new(size_t capacity);
void replay_free(replay *r);
/* Refuses from now on anything sent at or before start_ms, the owner's start:
 * a new process has an empty cache and cannot tell a replay of a message sent
 * to its predecessor within the window from a fresh one. Senders retry with a
 * fresh message (a worker's next heartbeat, a client's retry), which passes
 * once it is dated after start_ms on the receiver's clock. */
void replay_refuse_before(replay *r, uint64_t start_ms);
/* CODE_OK and remembers the nonce, or CODE_UNAUTHENTICATED with a reason. */
int replay_check(replay *r, uint64_t nonce, uint64_t sent_ms, uint64_t now_ms, err *e);

#endif
