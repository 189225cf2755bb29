/* Canonical status codes: names and the error value. */
#include "status.h"

#include <stdio.h>
#include <string.h>

static const char *const names[CODE_MAX + 1] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

const char *code_name(int code)
{
    if (code < 0 || code > CODE_MAX)
        return "UNKNOWN";
    return names[code];
}

int err_vset(err *e, int code, const char *fmt, va_list ap)
{
    if (e) {
        e->code = code;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    }
    return code;
}

int err_set(err *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(e, code, fmt, ap);
    va_end(ap);
    return code;
}

void err_prefix(err *e, const char *fmt, ...)
{
    char pre[ERR_MSG_MAX], old[ERR_MSG_MAX];
    va_list ap;

    if (!e)
        return;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(pre);
    if (n > sizeof e->msg - 3)
        n = sizeof e->msg - 3;
    memcpy(e->msg, pre, n);
    memcpy(e->msg + n, ": ", 2);
    n += 2;
    size_t m = strlen(old);
    if (m > sizeof e->msg - 1 - n)
        m = sizeof e->msg - 1 - n;
    memcpy(e->msg + n, old, m);
    e->msg[n + m] = '\0';
}

int err_rank(int code, const char *msg)
{
    if (code == CODE_OK)
        return -1;
    if (code == CODE_CANCELLED) /* the caller's own word */
        return 4;
    if (strstr(msg, "after another core failed"))
        return 0;
    if (strstr(msg, "never sent") || strstr(msg, "did not answer") || strstr(msg, "stopped"))
        return ERR_RANK_CULPRIT;
    if (code != CODE_ABORTED && code != CODE_DEADLINE_EXCEEDED)
        return 2;
    return 1;
}
