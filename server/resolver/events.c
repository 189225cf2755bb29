/* The console's event log (events.h). */
#include "events.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "resolver.h"

void rsv_events_init(struct rsv_events *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->next_seq = 1;
    ev->run = auth_random64() >> 12; /* exact in a JavaScript number */
}

void rsv_event(resolver *r, const char *kind, const char *host, int core, const char *fmt, ...)
{
    struct rsv_events *ev = &r->events;
    struct rsv_event *e = &ev->v[(ev->next_seq - 1) % RSV_EVENTS];
    struct timespec ts;
    va_list ap;

    memset(e, 0, sizeof *e);
    e->seq = ev->next_seq++;
    clock_gettime(CLOCK_REALTIME, &ts);
    e->unix_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    snprintf(e->kind, sizeof e->kind, "%s", kind);
    if (host)
        snprintf(e->core, sizeof e->core, "%.63s/%d", host, core);
    va_start(ap, fmt);
    vsnprintf(e->text, sizeof e->text, fmt, ap);
    va_end(ap);
}
