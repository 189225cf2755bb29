/* tpu_cancel and the waits that give way to it (cancel.h). */
#include "client.h"

#include <poll.h>

#include "wire.h"

tpu_status tpu_cancel(tpu_cluster *c)
{
    /* no last error, no message: this must stay async-signal-safe */
    if (!c || c->magic != MAGIC_CLUSTER)
        return TPU_INVALID_ARGUMENT;
    cli_cancel_fire(&c->cancel);
    return TPU_OK;
}

int cli_cancelled(const char *what, err *e)
{
    return err_set(e, CODE_CANCELLED, "%s was cancelled (tpu_cancel)", what);
}

int cli_sleep(tpu_cluster *c, uint64_t ms, const char *what, err *e)
{
    uint64_t end = wire_now_ms() + ms;
    for (;;) {
        uint64_t now = wire_now_ms();
        struct pollfd pf = {cli_cancel_fd(&c->cancel), POLLIN, 0};
        if (cli_cancel_requested(&c->cancel))
            return cli_cancelled(what, e);
        if (now >= end)
            return CODE_OK;
        if (poll(&pf, 1, (int)(end - now)) < 0 && errno != EINTR)
            return CODE_OK;
    }
}
