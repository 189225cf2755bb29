/* A strict validator of Chrome trace-event JSON files (the Trace Event Format
 * of chrome://tracing and Perfetto), plain or gzip, for the profiler's tests:
 * event fields, slice nesting per thread, B/E balance, flows, and this
 * project's rule that every process and every thread with slices is named. */
#ifndef TPUEMU_TESTS_TRACE_CHECK_H
#define TPUEMU_TESTS_TRACE_CHECK_H

#include <stddef.h>

struct trace_check_stats {
    size_t events;    /* entries of traceEvents */
    size_t slices;    /* X events */
    size_t flows;     /* distinct flow ids (with their cat) */
    size_t processes; /* distinct pids over all events */
    size_t threads;   /* distinct (pid, tid) over all events that have a tid */
    double ts_min;    /* over the events other than M; 0 when there are none */
    double ts_max;
};

/* 0 if the file at path is a valid trace (st filled when not NULL), else -1
 * with a message in why ("event 12: ..." naming the event index and what is
 * wrong, or what is wrong with the file as a whole). */
int trace_check_file(const char *path, char *why, size_t whyn, struct trace_check_stats *st);

#endif
