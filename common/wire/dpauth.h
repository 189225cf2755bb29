/* Data-plane handshake: the frames both sides exchange before any tensor moves.
 *
 *   accepting side                     connecting side
 *   HELLO{challenge S}         ---->
 *                              <----   AUTH{mac(S), challenge C, peer}
 *   AUTH_OK{mac(C)}            ---->   (or ERROR{UNAUTHENTICATED, why}, then close)
 *
 * MACs are auth_challenge_mac() under the cluster key and empty without a token.
 * The builders and checkers here do no I/O, so the worker's event-driven
 * connections and blocking tools (tests, the client) share one implementation;
 * dpauth_client_fd() is the blocking connecting side over a plain socket. */
#ifndef TPUEMU_COMMON_DPAUTH_H
#define TPUEMU_COMMON_DPAUTH_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "frame.h"
#include "status.h"

/* Room every builder below needs in out. */
#define DPAUTH_FRAME_MAX (FRAME_PREFIX_BYTES + FRAME_MAX_HEADER)
/* Longest status message an ERROR frame carries (longer ones are cut). */
#define DPAUTH_ERROR_MSG_MAX 800

/* Each builder writes prefix + header (no payload) and returns its length. */
size_t dpauth_hello(const unsigned char chal[AUTH_CHALLENGE_BYTES], uint8_t *out, size_t cap);
size_t dpauth_auth(const auth *a, const unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                   const unsigned char my_chal[AUTH_CHALLENGE_BYTES], const char *peer, uint8_t *out,
                   size_t cap);
size_t dpauth_auth_ok(const auth *a, const unsigned char client_chal[AUTH_CHALLENGE_BYTES],
                      uint8_t *out, size_t cap);
size_t dpauth_error(int code, const char *msg, uint8_t *out, size_t cap);

/* Accepting side: checks an AUTH frame against the challenge we sent; copies
 * the client's challenge out. CODE_UNAUTHENTICATED with the reason otherwise
 * (wrong kind, missing or wrong MAC, malformed challenge). */
int dpauth_check_auth(const auth *a, const unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                      const Tpuemu__FrameHeader *h, unsigned char client_chal[AUTH_CHALLENGE_BYTES],
                      err *e);
/* Connecting side: checks a HELLO and copies its challenge out. */
int dpauth_check_hello(const Tpuemu__FrameHeader *h, unsigned char server_chal[AUTH_CHALLENGE_BYTES],
                       err *e);
/* Connecting side: checks AUTH_OK against our challenge; an ERROR frame turns
 * into its own code and message. */
int dpauth_check_auth_ok(const auth *a, const unsigned char my_chal[AUTH_CHALLENGE_BYTES],
                         const Tpuemu__FrameHeader *h, err *e);

/* Blocking connecting side over a connected stream socket fd: reads HELLO,
 * sends AUTH (peer names us in the server's logs), reads AUTH_OK. Waits at most
 * timeout_ms in all (DEADLINE_EXCEEDED). The server's ERROR comes back as its
 * code and message; I/O failures are UNAVAILABLE. Leaves fd open either way. */
int dpauth_client_fd(int fd, const auth *a, const char *peer, int timeout_ms, err *e);

/* Blocking helpers for the same kind of callers: read one frame header (the
 * payload is left unread; free *out with frame_header_free) and write all bytes,
 * both bounded by an absolute CLOCK_MONOTONIC deadline in ms (wire_now_ms). */
int dpauth_read_header(int fd, uint64_t deadline_ms, uint64_t max_payload, Tpuemu__FrameHeader **out,
                       err *e);
int dpauth_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ms, err *e);
int dpauth_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms, err *e);

#endif
