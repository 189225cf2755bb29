/* Mesh shapes and physical coordinates of an initialized system (the mesh
 * rule itself is slice_mesh in common/base/slice.c, which the tests check against
 * TensorFlow's figures). */
#include "topology.h"

#include "slice.h"

#include <limits.h>

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

/* The block of h chips a host owns: bx*by*bz = h, each dividing the mesh's
 * side; flattest first (smallest bz), then squarest, then wider than deep.
 * 0 when none fits. */
static int host_block(const unsigned s[4], unsigned h, unsigned b[3])
{
    unsigned best = UINT_MAX;
    for (unsigned bz = 1; bz <= s[2]; bz++) {
        if (s[2] % bz || h % bz)
            continue;
        for (unsigned by = 1; by <= s[1]; by++) {
            if (s[1] % by || (h / bz) % by)
                continue;
            unsigned bx = h / bz / by;
            if (bx == 0 || bx > s[0] || s[0] % bx)
                continue;
            unsigned score = bz * 65536u + (bx >= by ? bx - by : (by - bx) * 2 + 1);
            if (score < best) {
                best = score;
                b[0] = bx;
                b[1] = by;
                b[2] = bz;
            }
        }
    }
    return best != UINT_MAX;
}

int topo_layout(const unsigned s[4], size_t n, const unsigned *task, unsigned (*coords)[4])
{
    size_t ntasks = 0, per = 0, run = 0;
    unsigned b[3], chips = s[0] * s[1] * s[2];
    int equal = 1;

    for (size_t i = 0; i < n; i++) {
        if (i == 0 || task[i] != task[i - 1]) {
            if (i > 0 && per && run != per)
                equal = 0;
            if (i > 0 && !per)
                per = run;
            ntasks++;
            run = 0;
        }
        run++;
    }
    if (!per)
        per = run;
    else if (run != per)
        equal = 0;
    if (!n || !equal || per % s[3] || ntasks * (per / s[3]) != chips ||
        !host_block(s, (unsigned)(per / s[3]), b)) {
        for (size_t i = 0; i < n; i++)
            topo_coords(s, (unsigned)i, coords[i]);
        return 0;
    }
    unsigned gx = s[0] / b[0], gy = s[1] / b[1];
    for (size_t i = 0; i < n; i++) {
        unsigned t = (unsigned)(i / per), d = (unsigned)(i % per), chip = d / s[3];
        coords[i][0] = (t % gx) * b[0] + chip % b[0];
        coords[i][1] = ((t / gx) % gy) * b[1] + (chip / b[0]) % b[1];
        coords[i][2] = (t / (gx * gy)) * b[2] + chip / (b[0] * b[1]);
        coords[i][3] = d % s[3];
    }
    return 1;
}
