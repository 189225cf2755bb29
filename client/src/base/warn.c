/* The library's warnings: one process-wide handler (tpu_set_warning_handler),
 * reached from every room through cli_warn. The library never prints: no
 * handler, no output. */
#include "client.h"

#include <stdarg.h>
#include <stdio.h>

#include "tpuemu/model.h"

static tpu_warning_fn warn_fn;
static void *warn_user;

void tpu_set_warning_handler(tpu_warning_fn fn, void *user)
{
    warn_fn = fn;
    warn_user = user;
}

void cli_warn(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (warn_fn)
        warn_fn(msg, warn_user);
}

void tpu_warning_to_file(const char *message, void *file)
{
    if (file && message)
        fprintf((FILE *)file, "tpuemu: warning: %s\n", message);
}
