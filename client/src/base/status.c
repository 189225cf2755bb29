/* The public status names and this thread's last error. The library keeps no
 * other global state. */
#include "client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local struct {
    int code;
    char msg[ERR_MSG_MAX];
} last;

const char *tpu_status_name(tpu_status s)
{
    return s == TPU_PREEMPTED ? "PREEMPTED" : code_name((int)s);
}

tpu_status tpu_last_status(void)
{
    return (tpu_status)last.code;
}

const char *tpu_last_error(void)
{
    return last.msg;
}

const char *tpu_version(void)
{
    return TPUEMU_VERSION_STRING;
}

int tpu_version_number(void)
{
    return TPUEMU_VERSION_NUMBER;
}

tpu_status cli_fail(const err *e)
{
    last.code = e->code;
    snprintf(last.msg, sizeof last.msg, "%s", e->msg);
    return (tpu_status)e->code;
}

tpu_status cli_failf(int code, const char *fmt, ...)
{
    va_list ap;
    last.code = code;
    va_start(ap, fmt);
    vsnprintf(last.msg, sizeof last.msg, fmt, ap);
    va_end(ap);
    return (tpu_status)code;
}

void cli_check_magic(const void *h, uint32_t magic, const char *what)
{
    if (!h || *(const uint32_t *)h != magic) {
        fprintf(stderr, "libtpuclient: fatal: %s %p is %s (freed, or not a %s)\n", what, h,
                h ? "not a live handle" : "NULL", what);
        abort();
    }
}
