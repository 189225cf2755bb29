/* tpuctl: the command-line face of libtpuclient. Shared by main.c (global
 * flags, dispatch) and commands.c (one function per command). */
#ifndef TPUCTL_H
#define TPUCTL_H

#include "tpuemu/tpuemu.h"

/* Exit statuses. */
#define EXIT_OK 0
#define EXIT_ERROR 1 /* the cluster said no, or could not be reached */
#define EXIT_USAGE 2 /* bad command line */

struct tpuctl {
    const char *tpu;        /* --tpu, NULL: $TPU_NAME or 127.0.0.1:8470 */
    const char *token_file; /* --token-file */
    int json;
    long long timeout_ms;
};

struct tpuctl_cmd {
    const char *name;
    const char *summary;
    int (*run)(const struct tpuctl *g, int argc, char **argv); /* argv[0] is the name */
};

extern const struct tpuctl_cmd tpuctl_cmds[];

/* bench.c: tpuctl bench allreduce ... */
int tpuctl_cmd_bench(const struct tpuctl *g, int argc, char **argv);
/* board.c: tpuctl board --logdir DIR [--port N] */
int tpuctl_cmd_board(const struct tpuctl *g, int argc, char **argv);
extern const int tpuctl_ncmds;

#endif
