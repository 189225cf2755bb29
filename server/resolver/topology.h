/* Mesh shape and coordinates of an initialized system, as Cloud TPU lays out
 * its slices: cores per chip (2 on v2/v3, 1 on v4/v5e/v5p/v6e), chips on a 2-D
 * torus (v2, v3, v5e, v6e) or a 3-D one (v4, v5p). The type table and the mesh
 * rule live in common/base/slice.c, shared with the worker and the tests. Pure
 * functions. */
#ifndef TPUEMU_RESOLVER_TOPOLOGY_H
#define TPUEMU_RESOLVER_TOPOLOGY_H

#include <stddef.h>

/* shape = [x, y, z, cores_per_chip] for n cores (n >= 1) of tpu_type.
 * v2-8 -> [2,2,1,2]; v3-32 -> [4,4,1,2]; v4-16 -> [2,2,2,1]. */
void topo_mesh(const char *tpu_type, unsigned n, unsigned shape[4]);

/* Coordinates [x, y, z, core-on-chip] of the r-th device when chips are
 * filled x first, then y, then z (each chip's cores adjacent). */
void topo_coords(const unsigned shape[4], unsigned r, unsigned coords[4]);

/* Physical coordinates of n devices in ring order, task[i] being device i's
 * host index (a host's devices adjacent), as a Cloud TPU slice places them:
 * each host owns a contiguous block of chips (a v3 host's 4 chips are 2x2 in
 * x, y; a v4 host's 2x2x1), blocks tile the mesh x first, then y, then z, and
 * inside a block the devices go core on chip first, then x, y, z. When hosts
 * differ in size or their chips do not tile the mesh, the devices fill the
 * mesh in order instead (topo_coords). Returns 1 for the block layout, 0 for
 * the fill. */
int topo_layout(const unsigned shape[4], size_t n, const unsigned *task, unsigned (*coords)[4]);

#endif
