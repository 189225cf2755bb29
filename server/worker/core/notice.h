/* A notice of what is coming to this core, as Cloud TPU gives one: a
 * preemption (terminated at the event) or a maintenance event (down for a
 * window from the event, then back, restarted). Set by the injected faults
 * (daemon/fault.h); read, on the loop thread, by the heartbeat and by the
 * training service, which carries it in every answer so that a training
 * loop learns of it from the steps it runs. */
#ifndef TPUEMU_WORKER_CORE_NOTICE_H
#define TPUEMU_WORKER_CORE_NOTICE_H

#include <stdint.h>

#include "tpuemu.pb-c.h"

struct notice {
    int kind;            /* Tpuemu__NoticeKind; 0: none */
    uint64_t event_ms;   /* the loop's clock (uv_now) at the event */
    uint32_t window_ms;  /* maintenance: how long the core is down */
    int under_way;       /* maintenance: the window has begun */
};

/* Points *out (initialized by the caller) at a Notice describing n as of
 * now_ms and returns 1; 0 (out untouched) when there is none. */
int notice_fill(const struct notice *n, uint64_t now_ms, Tpuemu__Notice *out);

#endif
