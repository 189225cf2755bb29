/* Mesh shapes: factor the chip count into a torus the way Cloud TPU slices are
 * shaped (as square / cubic as the count allows). */
#include "topology.h"

#include <string.h>

unsigned topo_cores_per_chip(const char *t)
{
    return (strcmp(t, "v2") == 0 || strcmp(t, "v3") == 0) ? 2u : 1u;
}

static int is_3d(const char *t)
{
    return strcmp(t, "v4") == 0 || strcmp(t, "v5p") == 0;
}

void topo_mesh(const char *t, unsigned n, unsigned shape[4])
{
    unsigned cpc = topo_cores_per_chip(t);
    unsigned chips = (n + cpc - 1) / cpc;

    if (chips == 0)
        chips = 1;
    shape[3] = cpc;
    if (!is_3d(t)) {
        unsigned y = 1;
        for (unsigned d = 1; (unsigned long long)d * d <= chips; d++)
            if (chips % d == 0)
                y = d;
        shape[0] = chips / y;
        shape[1] = y;
        shape[2] = 1;
        return;
    }
    /* x >= y >= z, x*y*z = chips, smallest spread x - z (then smallest x) */
    unsigned bx = chips, by = 1, bz = 1;
    for (unsigned z = 1; (unsigned long long)z * z * z <= chips; z++) {
        if (chips % z)
            continue;
        unsigned rest = chips / z;
        for (unsigned y = z; (unsigned long long)y * y <= rest; y++) {
            if (rest % y)
                continue;
            unsigned x = rest / y;
            if (x - z < bx - bz || (x - z == bx - bz && x < bx)) {
                bx = x;
                by = y;
                bz = z;
            }
        }
    }
    shape[0] = bx;
    shape[1] = by;
    shape[2] = bz;
}

void topo_coords(const unsigned s[4], unsigned r, unsigned c[4])
{
    unsigned chip = r / s[3];
    c[0] = chip % s[0];
    c[1] = (chip / s[0]) % s[1];
    c[2] = chip / (s[0] * s[1]);
    c[3] = r % s[3];
}
