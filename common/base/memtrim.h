/* A long-running daemon's free heap given back to the system. glibc keeps
 * the pages of freed blocks (a training step's buffers, a profile fetch's
 * reply, a burst of connections) in its arenas, and a daemon's RSS then
 * follows the most it ever held at once in each arena, creeping up over
 * hours as peaks of different threads and sizes come together. A trim every
 * MEM_TRIM_PERIOD_MS (malloc_trim(3): every arena's free pages, not only the
 * top of the heap) keeps RSS at what the daemon holds. */
#ifndef TPUEMU_BASE_MEMTRIM_H
#define TPUEMU_BASE_MEMTRIM_H

#include <stddef.h>
#include <stdint.h>

#define MEM_TRIM_PERIOD_MS 30000u

/* Trims when period_ms have passed since *last_ms (0: never trimmed; the
 * first call only starts the count), setting *last_ms to now_ms. 1 if it
 * trimmed. Without glibc it does nothing and returns 0. */
int mem_trim_every(uint64_t now_ms, uint64_t *last_ms, uint64_t period_ms);

/* Writes a zero into every page of p[0..n) (a calloc's block stays all
 * zero), so that a fixed table used slot by slot over hours (a reply cache, a replay
 * window, the profiler's ring) is resident at once instead of adding
 * to the RSS page by page as it fills. */
void mem_resident(void *p, size_t n);

#endif
