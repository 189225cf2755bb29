/* The resolver's event log for the cluster console (console.c): the last
 * RSV_EVENTS things that happened to the cluster (registrations, deaths,
 * notices, preemptions, maintenance, initializes and shutdowns, cores
 * forgotten, faults injected into the resolver), each numbered, so that a
 * page polling with ?since=N gets only the new ones. Kept in memory: a
 * restarted resolver starts a new log (and a new run id). Loop thread only. */
#ifndef TPUEMU_RESOLVER_EVENTS_H
#define TPUEMU_RESOLVER_EVENTS_H

#include <stdint.h>

#define RSV_EVENTS 256
#define RSV_EVENT_TEXT 240

struct rsv_event {
    uint64_t seq;     /* 1, 2, ... */
    uint64_t unix_ms; /* wall clock, for the page to show */
    char kind[16];    /* "registered", "dead", "preempted", "notice", "init", ... */
    char core[80];    /* "host0/1", "" if the event is not about one core */
    char text[RSV_EVENT_TEXT];
};

struct rsv_events {
    struct rsv_event v[RSV_EVENTS];
    uint64_t next_seq; /* of the next event; v[(seq - 1) % RSV_EVENTS] holds seq */
    uint64_t run;      /* random per resolver process: a page seeing it change starts over */
};

struct resolver;

void rsv_events_init(struct rsv_events *ev);
/* Adds an event; core may be NULL. The text is cut at RSV_EVENT_TEXT - 1. */
void rsv_event(struct resolver *r, const char *kind, const char *host, int core, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
