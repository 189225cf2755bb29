/* The duplicate-request cache of a REP endpoint: the reply sent to each
 * request, kept for the replay window under a hash of the request's bytes, so
 * that a byte-identical resend (nanomsg's REQ resends the same bytes when the
 * connection drops before the reply arrived) gets the original answer instead
 * of being refused as a replay or done twice. As NFS servers do.
 *
 * Only requests that passed authentication are entered; a lookup needs none,
 * since it only ever returns what was already sent for the same bytes.
 * Bounded in entries and in reply bytes; the oldest entries go first. A
 * forgotten entry only means the resend is refused as a replay, which the
 * sender survives. Not thread-safe: the owner's loop thread only. */
#ifndef TPUEMU_COMMON_DRC_H
#define TPUEMU_COMMON_DRC_H

#include <stddef.h>
#include <stdint.h>

typedef struct drc drc;

/* keep_ms: how long an answer is kept (the replay window). ctl_free frees a
 * waiting resend's routing header when its entry is dropped unanswered. NULL
 * when out of memory. */
drc *drc_new(size_t max_entries, size_t max_bytes, uint32_t keep_ms, void (*ctl_free)(void *ctl));
void drc_free(drc *d);

enum { DRC_MISS, DRC_PENDING, DRC_DONE };

/* Looks the request up by its bytes.
 *   DRC_MISS     not seen, or forgotten: handle it.
 *   DRC_DONE     *reply, *rlen: the answer already sent (valid until the next
 *                call on d); send it to ctl.
 *   DRC_PENDING  the first copy is still being answered: d keeps ctl and
 *                drc_answer() hands it back with the answer. */
int drc_lookup(drc *d, const uint8_t *req, size_t len, void *ctl, uint64_t now_ms,
               const uint8_t **reply, size_t *rlen);

/* Enters a request that passed authentication and is being handled; id is the
 * request's nonce, by which drc_answer() finds it. */
void drc_begin(drc *d, const uint8_t *req, size_t len, uint64_t id, uint64_t now_ms);

/* Keeps the sealed reply to request id (copied). Returns the routing header of
 * a resend that waits for this answer (the caller sends the reply there too),
 * or NULL. */
void *drc_answer(drc *d, uint64_t id, const uint8_t *reply, size_t len);

/* Entries held (tests, metrics). */
size_t drc_count(const drc *d);

#endif
