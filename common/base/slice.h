/* TPU types and slice names: which generations exist, how many cores the
 * framework sees per chip, and the mesh a slice such as "v3-32" or "v4-16" is
 * reported with (TensorFlow's Topology.mesh_shape: x, y, z, cores per chip).
 * Shared by the resolver (topology of an initialized system), the worker
 * (--tpu-type) and the tests. Pure functions, thread-safe. */
#ifndef TPUEMU_COMMON_SLICE_H
#define TPUEMU_COMMON_SLICE_H

#include "status.h"

struct slice_type {
    const char *name;            /* "v3" */
    unsigned cores_per_chip;     /* devices the framework sees per chip (megacore: 1) */
    unsigned tensorcores_per_chip;
    int name_counts_tensorcores; /* "v4-16" counts TensorCores (8 chips); "v5litepod-16" counts chips */
    int torus_3d;                /* chips on a 3-D torus (v4, v5p) rather than a 2-D one */
};

/* The TPU type called name ("v2", "v3", "v4", "v5e", "v5p", "v6e"), or NULL. */
const struct slice_type *slice_type_find(const char *name);
/* "v2, v3, v4, v5e, v5p, v6e", for messages. */
const char *slice_type_names(void);

/* shape = [x, y, z, cores_per_chip] for n devices (n >= 1) of type t: chips
 * on a torus as square (2-D) or cubic (3-D) as the count allows, x >= y >= z.
 * v2-8 -> [2,2,1,2]; v3-32 -> [4,4,1,2]; v4-16 -> [2,2,2,1]. */
void slice_mesh(const struct slice_type *t, unsigned n, unsigned shape[4]);

/* A parsed slice name ("v3-32", "v4-16", "v5litepod-16", "v5e-8", "v6e-4"). */
struct slice {
    const struct slice_type *type;
    unsigned chips;
    unsigned devices;            /* TPU devices the framework sees: num_replicas */
    unsigned mesh[4];
    /* Hosts (TensorFlow tasks, Cloud TPU's workers) the slice has and the
     * devices each has: 4 chips per host (v2, v3, v4, v5p; v3-8 is one host of
     * 8 cores, v4-16 two hosts of 4 devices), v5e and v6e 8 chips on a single
     * host of up to 8 chips, else 4 per host. Every host has the same count. */
    unsigned hosts;
    unsigned devices_per_host;
};

/* CODE_INVALID_ARGUMENT, saying what is wrong, for a name that is not a slice
 * of a known type with a count that fits whole chips. */
int slice_parse(const char *name, struct slice *out, err *e);

/* Host ids that tpuctl reads as something else ("all", "resolver",
 * "random-core", "random-host"): a core of such a host could never be
 * targeted, so workers and the resolver refuse them. 1 if h is one. */
int host_id_reserved(const char *h);
#define HOST_ID_RESERVED "all, resolver, random-core, random-host"

#endif
