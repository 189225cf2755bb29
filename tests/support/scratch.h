/* Scratch directories for tests: made fresh under /tmp, removed whole. */
#ifndef TPUEMU_TEST_SCRATCH_H
#define TPUEMU_TEST_SCRATCH_H

#include <stddef.h>

/* A new directory /tmp/TAG.XXXXXX, its path in buf (size n); fails the
 * test (criterion) when it cannot be made. */
void scratch_make(char *buf, size_t n, const char *tag);

/* Removes dir and everything under it, without following links; a
 * directory a test left unwritable is made writable first. */
void scratch_remove(const char *dir);

#endif
