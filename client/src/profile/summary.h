/* The step split the summary (summary.c) computes and the overview
 * (overview.c) prints per core. Never installed. */
#ifndef TPUEMU_CLIENT_PROFILE_SUMMARY_H
#define TPUEMU_CLIENT_PROFILE_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "capture.h"

enum { CAT_INPUT, CAT_COMPUTE, CAT_ALLREDUCE, CAT_OPT, CAT_IDLE, NCAT };

struct csum {
    double cat[NCAT];   /* ns, summed over the steps that have a period */
    double period;      /* ns, summed */
    size_t steps;
    double flops, padded;
    uint64_t first, last;
    /* the roofline estimate on the real generation, summed over the rows */
    size_t rows;
    double est_mm, est_opt, est_ar, est_other; /* ns */
    size_t est_ops, est_hbm_ops;
};

struct srow {
    uint64_t step;
    int64_t end, ar_start, ar_end;
    double cat[NCAT - 1];
};

/* Core c's step rows (malloc'd, the caller frees; *nrows of them) and their
 * sums in *cs. */
struct srow *profile_core_rows(const struct pcore *c, size_t ncores, struct csum *cs, size_t *nrows);

#endif
