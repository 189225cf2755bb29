/* The table of TPU generations (see preset.h for the sources). */
#include "preset.h"

#include <string.h>

#define GIB (1024ull * 1024 * 1024)

static const struct tpu_preset presets[] = {
    /* v2: 16 GiB HBM per chip, 2 TensorCores per chip */
    {"v2", 2, 8 * GIB},
    /* v3: 32 GiB HBM per chip, 2 TensorCores per chip */
    {"v3", 2, 16 * GIB},
    /* v4: 32 GiB HBM per chip; its 2 TensorCores act as one megacore */
    {"v4", 1, 32 * GIB},
    /* v5e: 16 GiB HBM per chip, 1 TensorCore per chip */
    {"v5e", 1, 16 * GIB},
    /* v5p: 95 GiB HBM per chip, 2 TensorCores as one megacore */
    {"v5p", 1, 95 * GIB},
};

const struct tpu_preset *preset_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

const char *preset_names(void)
{
    return "v2, v3, v4, v5e, v5p";
}
