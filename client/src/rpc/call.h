/* The control-plane call of the cluster room's handles (call.c): one
 * request/reply with the cluster's endpoint, and the wire's notices as the
 * public API says them. Never installed. */
#ifndef TPUEMU_CLIENT_CALL_H
#define TPUEMU_CLIENT_CALL_H

#include <stdint.h>

#include "client.h"

/* One request/reply with the cluster's endpoint: seal req, send, wait up to
 * timeout_ms for the reply, open it and check request_id. A reply whose body
 * is an error becomes that error. Otherwise the body case must be want.
 * *reply is freed by the caller with wire_msg_free(). */
int call_do(tpu_cluster *c, wire_msg *req, int want, uint32_t timeout_ms, wire_msg **reply, err *e);

/* Opens the REQ socket to endpoint i of c->r, after a plain TCP connect check
 * within timeout_ms. Closes any previous socket. */
int call_open(tpu_cluster *c, size_t i, uint32_t timeout_ms, err *e);
void call_close(tpu_cluster *c);

/* *out from a wire Notice (NULL: none). */
void cli_notice_from(const Tpuemu__Notice *n, tpu_notice *out);

#endif
