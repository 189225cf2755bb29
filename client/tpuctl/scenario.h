/* tpuctl chaos: a fault's arguments as the command line and scenario files
 * give them, and scenario files: a seeded, replayable list of faults.
 *
 *   # comments and blank lines are skipped
 *   seed 42                                  # optional; --seed overrides it
 *   at 2000ms    slow        h0/1         50 3000
 *   at step 30   preempt     random-host  notice=4000
 *   at 5000ms    maintenance random-core  2000 notice=500
 *   at 0ms       hbm         all          10
 *   at 1000ms    link-loss   h0/0         h0/1 20 5000
 *
 * WHEN is a delay from when the scenario is injected (0ms..3600000ms) or a
 * training step (as --at-step); KIND and ARGS are those of tpuctl chaos
 * (notice=MS for --notice-ms); TARGET is HOST/CORE, HOST, all, or
 * random-core / random-host, picked with the seed among the live cores in
 * the resolver's order, so the same seed on the same cluster picks the same
 * cores. A link fault's TARGET is one core (HOST/CORE) and its first
 * argument the other end; it faults the link both ways, and the losses of
 * link-loss follow from the seed. The whole file is checked before anything
 * is injected. */
#ifndef TPUCTL_SCENARIO_H
#define TPUCTL_SCENARIO_H

#include <stddef.h>
#include <stdint.h>

#include "tpuemu/tpuemu.h"

#define SCENARIO_MAX 256

struct scen_fault {
    int line;
    tpu_fault f;
    char target[128];
    char peer[128];      /* link faults: f.peer_host points here */
};

struct scenario {
    uint32_t seed;
    int has_seed;
    size_t n;
    struct scen_fault v[SCENARIO_MAX];
};

/* A live core, in the resolver's order (by host, then core). */
struct chaos_core {
    char host[128];
    int core;
};

/* Fills f's duration, percent and the rest from the arguments after the
 * target (f->kind set); a link fault's peer host goes into peer, which
 * f->peer_host then points to: 0, or -1 with why saying what is wrong. */
int chaos_fault_args(tpu_fault *f, char *const *args, int nargs, char *peer, size_t peern, char *why, size_t errn);
/* Reads and checks the whole file: 0, or -1 with why naming the line and field. */
int scenario_load(const char *path, struct scenario *s, char *why, size_t errn);
/* The target a scenario line names, random ones picked with *rng: 0, or -1
 * when there is nothing live to pick from. */
int scenario_pick(const char *target, const struct chaos_core *live, int nlive, uint32_t *rng, char *out,
                  size_t outn);

#endif
