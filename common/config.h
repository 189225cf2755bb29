/* Settings: one table per program, each row a flag, its environment variable,
 * default, bounds and help line. --help and validation both come from the table,
 * so they cannot disagree. Precedence: flag, then environment, then default. */
#ifndef TPUEMU_COMMON_CONFIG_H
#define TPUEMU_COMMON_CONFIG_H

#include <stddef.h>

#include "status.h"

enum opt_type {
    OPT_STRING, /* dst: const char ** (points into argv/environ/defval) */
    OPT_INT,    /* dst: long long *, decimal, bounded by min..max */
    OPT_BYTES,  /* dst: long long *, accepts K/M/G/T and KiB/MiB/GiB/TiB suffixes (powers of 2) */
    OPT_BOOL,   /* dst: int *; a flag without value; env accepts 1/0/true/false/yes/no */
};

struct opt {
    const char *name;    /* flag without dashes: "heartbeat-ms" */
    const char *env;     /* "TPUEMU_HEARTBEAT_MS", or NULL */
    enum opt_type type;
    const char *defval;  /* NULL: no default (unset) */
    long long min, max;  /* for OPT_INT and OPT_BYTES */
    const char *metavar; /* "MS" */
    const char *help;
    void *dst;
};

/* Parses argv against the table. Returns CODE_OK and sets *first_arg to the index
 * of the first positional argument (argc if none); CODE_CANCELLED when --help was
 * printed to stdout; CODE_INVALID_ARGUMENT with a message naming the flag or
 * variable and the accepted values otherwise. Stops at the first positional
 * argument or at "--". */
int opt_parse(const struct opt *table, size_t n, int argc, char **argv, int *first_arg, err *e);

/* Prints "usage" and one line per row, with env var and default, to stdout. */
void opt_usage(const struct opt *table, size_t n, const char *usage, const char *about);

/* A whole decimal number in [lo, hi] -> *out. Returns 0 on success, -1 if
 * malformed or out of range. */
int opt_parse_int(const char *s, long long lo, long long hi, long long *out);

/* "64M" -> 67108864. Returns 0 on success, -1 if malformed or overflowing. */
int opt_parse_bytes(const char *s, long long *out);

#endif
