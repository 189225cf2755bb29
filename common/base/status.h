/* Canonical status codes and an error value that carries a message.
 *
 * The numbers are gRPC's and TensorFlow's; the client's public tpu_status and
 * the wire's tpuemu.Code use the same ones, so a code crosses every boundary
 * unchanged. Messages say what happened, where, and what to do. */
#ifndef TPUEMU_COMMON_STATUS_H
#define TPUEMU_COMMON_STATUS_H

#include <stdarg.h>
#include <stddef.h>

enum code {
    CODE_OK = 0,
    CODE_CANCELLED = 1,
    CODE_UNKNOWN = 2,
    CODE_INVALID_ARGUMENT = 3,
    CODE_DEADLINE_EXCEEDED = 4,
    CODE_NOT_FOUND = 5,
    CODE_ALREADY_EXISTS = 6,
    CODE_PERMISSION_DENIED = 7,
    CODE_RESOURCE_EXHAUSTED = 8,
    CODE_FAILED_PRECONDITION = 9,
    CODE_ABORTED = 10,
    CODE_OUT_OF_RANGE = 11,
    CODE_UNIMPLEMENTED = 12,
    CODE_INTERNAL = 13,
    CODE_UNAVAILABLE = 14,
    CODE_DATA_LOSS = 15,
    CODE_UNAUTHENTICATED = 16,
};
#define CODE_MAX 16

#define ERR_MSG_MAX 1024

/* An error: a code and a message. code == CODE_OK means no error. */
typedef struct err {
    int code;
    char msg[ERR_MSG_MAX];
} err;

/* "UNAVAILABLE"; "UNKNOWN" for numbers outside the enum. */
const char *code_name(int code);

/* Sets e (if not NULL) and returns code, so callers can `return err_set(...)`. */
int err_set(err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int err_vset(err *e, int code, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));

/* How much a failure of one core's step says about what went wrong, to pick
 * one among the failures of many cores: -1 for CODE_OK; 4 the caller's own
 * cancel; ERR_RANK_CULPRIT one that names the core that stopped ("never
 * sent", "did not answer", "stopped"); 0 one that gave up because another
 * core failed first; 2 another error; 1 an abort or a deadline. */
#define ERR_RANK_CULPRIT 3
int err_rank(int code, const char *msg);

/* Prefixes e->msg with more context: "connecting to X: <old message>". */
void err_prefix(err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline void err_clear(err *e)
{
    if (e) {
        e->code = CODE_OK;
        e->msg[0] = '\0';
    }
}

#endif
