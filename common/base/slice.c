/* The TPU type table and slice names. Chip and core counts follow the Cloud
 * TPU system-architecture pages (see server/worker/core/preset.c for the sources);
 * the mesh ordering follows what TensorFlow reports in Topology.mesh_shape. */
#include "slice.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct slice_type types[] = {
    /* name  devices/chip  TCs/chip  name counts TCs  3-D */
    {"v2", 2, 2, 1, 0},
    {"v3", 2, 2, 1, 0},
    {"v4", 1, 2, 1, 1},    /* megacore: the chip's two TensorCores are one device */
    {"v5e", 1, 1, 0, 0},   /* "v5litepod-N": N chips */
    {"v5p", 1, 2, 1, 1},   /* megacore */
    {"v6e", 1, 1, 0, 0},
};

const struct slice_type *slice_type_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, name) == 0)
            return &types[i];
    return NULL;
}

const char *slice_type_names(void)
{
    return "v2, v3, v4, v5e, v5p, v6e";
}

void slice_mesh(const struct slice_type *t, unsigned n, unsigned shape[4])
{
    unsigned cpc = t ? t->cores_per_chip : 1;
    unsigned chips = (n + cpc - 1) / cpc;

    if (chips == 0)
        chips = 1;
    shape[3] = cpc;
    if (!t || !t->torus_3d) {
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

#define SLICE_COUNT_MAX 65536u   /* above any real pod (v5p: 8960 chips) */

int host_id_reserved(const char *h)
{
    static const char *const r[] = {"all", "resolver", "random-core", "random-host"};
    for (size_t i = 0; h && i < sizeof r / sizeof r[0]; i++)
        if (strcmp(h, r[i]) == 0)
            return 1;
    return 0;
}

int slice_parse(const char *name, struct slice *out, err *e)
{
    char type[16];
    const char *dash;
    char *end;
    unsigned long count;
    size_t tl;

    memset(out, 0, sizeof *out);
    if (!name || !(dash = strrchr(name, '-')) || (tl = (size_t)(dash - name)) == 0 || tl >= sizeof type)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "'%s' is not a TPU slice name: TYPE-COUNT, such as v3-8, v4-16 or v5litepod-16",
                       name ? name : "(null)");
    memcpy(type, name, tl);
    type[tl] = '\0';
    if (strcmp(type, "v5litepod") == 0)
        strcpy(type, "v5e");
    if (!(out->type = slice_type_find(type)))
        return err_set(e, CODE_INVALID_ARGUMENT, "slice '%s': '%s' is not a TPU type (%s)", name, type,
                       slice_type_names());
    errno = 0;
    count = strtoul(dash + 1, &end, 10);
    if (dash[1] < '0' || dash[1] > '9' || *end || errno || count == 0 || count > SLICE_COUNT_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "slice '%s': '%s' is not a core count between 1 and %u",
                       name, dash + 1, SLICE_COUNT_MAX);
    if (out->type->name_counts_tensorcores) {
        if (count % out->type->tensorcores_per_chip)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "slice '%s': %s chips have %u TensorCores each, so the count must be a "
                           "multiple of %u", name, out->type->name, out->type->tensorcores_per_chip,
                           out->type->tensorcores_per_chip);
        out->chips = (unsigned)count / out->type->tensorcores_per_chip;
    } else {
        out->chips = (unsigned)count;
    }
    /* the shapes Cloud TPU offers: v2, v3, v4, v5p in whole hosts of 4 chips
     * (v3-8, v3-32, v4-16, ...); v5e and v6e 1, 4, 8 chips or a larger power
     * of two */
    if (out->type->name_counts_tensorcores && out->chips % 4)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "slice '%s': %u chips do not fill hosts of 4 chips each: a %s slice is whole hosts "
                       "(%s-%u, %s-%u, ...)", name, out->chips, out->type->name, out->type->name,
                       4 * out->type->tensorcores_per_chip, out->type->name, 16 * out->type->tensorcores_per_chip);
    if (!out->type->name_counts_tensorcores && (out->chips == 2 || (out->chips & (out->chips - 1))))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "slice '%s': a %s slice has 1, 4, 8, 16, ... chips (a power of two other than 2), not %u",
                       name, out->type->name, out->chips);
    out->devices = out->chips * out->type->cores_per_chip;
    slice_mesh(out->type, out->devices, out->mesh);
    {
        /* Cloud TPU's system-architecture pages: a v2/v3/v4/v5p host drives 4
         * chips; v5e and v6e slices up to 8 chips are one host, larger ones 4
         * chips per host */
        unsigned per_host = 4;
        if (!out->type->name_counts_tensorcores && out->chips <= 8)
            per_host = out->chips;
        if (per_host > out->chips)
            per_host = out->chips;
        if (out->chips % per_host)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "slice '%s': %u chips do not fill hosts of %u chips each", name, out->chips,
                           per_host);
        out->hosts = out->chips / per_host;
        out->devices_per_host = per_host * out->type->cores_per_chip;
    }
    return CODE_OK;
}
