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

/* Prints "usage" and one line per row, with env var and default, to stdout.
 * After --help-man, writes the same as a manual page in roff (man(7)) instead:
 * the first call of a process makes the page (NAME, SYNOPSIS, DESCRIPTION,
 * OPTIONS, ENVIRONMENT; the name and section from opt_man_page), each later
 * call a subsection of it (a command's own flags). */
void opt_usage(const struct opt *table, size_t n, const char *usage, const char *about);

/* Names the manual page --help-man writes: the program, its section (1 for
 * commands, 8 for daemons) and a one-line summary. Prints nothing. */
void opt_man_page(const char *name, int section, const char *summary);

/* Nonzero once opt_parse has seen --help-man. */
int opt_man_mode(void);

/* In man mode, writes a section of the page (.SH TITLE) whose text is
 * paragraphs separated by blank lines; a line starting with "  " is kept as
 * it is (an example). Does nothing otherwise. */
void opt_man_section(const char *title, const char *text);

/* In man mode, writes one tagged paragraph (.TP): the tag in bold, then text. */
void opt_man_item(const char *tag, const char *text);

/* A whole decimal number in [lo, hi] -> *out. Returns 0 on success, -1 if
 * malformed or out of range. */
int opt_parse_int(const char *s, long long lo, long long hi, long long *out);

/* "64M" -> 67108864. Returns 0 on success, -1 if malformed or overflowing. */
int opt_parse_bytes(const char *s, long long *out);

#endif
