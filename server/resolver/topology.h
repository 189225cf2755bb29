/* Mesh shape and coordinates of an initialized system, as Cloud TPU lays out
 * its slices: cores per chip (2 on v2/v3, 1 on v4/v5e/v5p/v6e), chips on a 2-D
 * torus (v2, v3, v5e, v6e) or a 3-D one (v4, v5p). The type table and the mesh
 * rule live in common/slice.c, shared with the worker and the tests. Pure
 * functions. */
#ifndef TPUEMU_RESOLVER_TOPOLOGY_H
#define TPUEMU_RESOLVER_TOPOLOGY_H

/* 2 for v2/v3, 1 otherwise. */
unsigned topo_cores_per_chip(const char *tpu_type);

/* shape = [x, y, z, cores_per_chip] for n cores (n >= 1) of tpu_type.
 * v2-8 -> [2,2,1,2]; v3-32 -> [4,4,1,2]; v4-16 -> [2,2,2,1]. */
void topo_mesh(const char *tpu_type, unsigned n, unsigned shape[4]);

/* Coordinates [x, y, z, core-on-chip] of replica r in shape. */
void topo_coords(const unsigned shape[4], unsigned r, unsigned coords[4]);

#endif
