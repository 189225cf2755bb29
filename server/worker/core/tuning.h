/* The worker's tuning knobs: chunk sizes and thresholds of the collectives,
 * the shared-memory segment, polling, socket buffers, the heap, the training
 * loop and the matrix unit. Each is a row of tpu-worker's settings table (a
 * flag and its TPUEMU_* environment variable, shown by --help and the manual
 * page and checked at start), made here so the layers that read them and the
 * daemon that parses them agree. The daemon parses them once and hands them
 * over (tuning_set); a library used without the daemon (the unit tests, the
 * benches) reads the same variables from its environment at each call, a
 * value that is not valid taken as the default. */
#ifndef TPUEMU_WORKER_CORE_TUNING_H
#define TPUEMU_WORKER_CORE_TUNING_H

#include <stddef.h>

#include "config.h"

struct tuning {
    long long coll_chunk;          /* bytes of one chunk of a collective */
    long long coll_depth;          /* receive slots in flight */
    long long coll_hd_max;         /* halving-doubling below this; -1: 512 KiB, 2 MiB for a power of two */
    long long coll_rd_max;         /* recursive doubling below this */
    long long coll_hier_min;       /* hierarchical all-reduce from this size */
    long long coll_shm_direct;     /* 0: no host segment (the direct path off) */
    long long coll_shm_max;        /* bytes of a host segment's area */
    long long coll_shm_one_max;    /* the direct path's one-barrier variant below this */
    long long spin_us;             /* polling after a receive's last progress */
    long long dp_sockbuf;          /* data-plane socket buffers; 0: the kernel's autotuning */
    long long heap_prefault_kb;    /* heap touched at start */
    long long train_inline_max_us; /* steps shorter than this run on the loop thread */
    long long test_step_ms;        /* tests only: each step's compute takes at least this */
    const char *test_lose_chunk;   /* tests only: "HOST/CORE:N", the Nth chunk from that core is lost; "": off */
    const char *mxu_bf16;          /* auto, onednn or f32 */
};

/* The rows; a row's dst points into t. */
#define TUNING_ROWS 15
void tuning_rows(struct tuning *t, struct opt rows[TUNING_ROWS]);

/* What the parsed values cannot say by their bounds alone: CODE_OK, or
 * CODE_INVALID_ARGUMENT naming the flag. */
int tuning_check(const struct tuning *t, err *e);

/* Reads --test-lose-chunk's "HOST/CORE:N": 1 with peer and *nth set, 0 when
 * spec is empty (off), -1 when it does not parse. */
int tuning_lose_chunk(const char *spec, char *peer, size_t peer_len, unsigned long *nth);

/* The process's tuning from now on (the daemon, after parsing, before any
 * thread starts). */
void tuning_set(const struct tuning *t);

/* The process's tuning: what tuning_set gave, else the environment's now. */
const struct tuning *tuning_get(void);

#endif
