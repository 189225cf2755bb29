/* Mesh shapes of an initialized system (the rule itself is slice_mesh in
 * common/slice.c, which the tests check against TensorFlow's figures). */
#include "topology.h"

#include "slice.h"

unsigned topo_cores_per_chip(const char *t)
{
    const struct slice_type *st = slice_type_find(t);
    return st ? st->cores_per_chip : 1u;
}

void topo_mesh(const char *t, unsigned n, unsigned shape[4])
{
    slice_mesh(slice_type_find(t), n, shape);
}

void topo_coords(const unsigned s[4], unsigned r, unsigned c[4])
{
    unsigned chip = r / s[3];
    c[0] = chip % s[0];
    c[1] = (chip / s[0]) % s[1];
    c[2] = chip / (s[0] * s[1]);
    c[3] = r % s[3];
}
