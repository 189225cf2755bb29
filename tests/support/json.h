/* A strict JSON syntax check for tpuctl --json output (no dependency). */
#ifndef TPUEMU_TESTS_JSON_H
#define TPUEMU_TESTS_JSON_H

/* 1 if s is exactly one JSON object (surrounding whitespace allowed). */
int json_is_object(const char *s);

#endif
