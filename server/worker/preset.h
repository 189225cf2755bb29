/* TPU generation presets: what one emulated core of each generation has.
 * Only figures the emulator uses live here; later issues add bandwidths and
 * peak FLOP/s. Figures come from the Cloud TPU system-architecture pages
 * (https://cloud.google.com/tpu/docs/system-architecture-tpu-vm and the per-
 * version pages v2, v3, v4, v5e, v5p): HBM per chip divided by the cores a
 * chip exposes to the framework. */
#ifndef TPUEMU_WORKER_PRESET_H
#define TPUEMU_WORKER_PRESET_H

#include <stdint.h>

struct tpu_preset {
    const char *name;        /* "v3" */
    int cores_per_chip;      /* TensorCores the framework sees per chip (megacore: 1) */
    uint64_t hbm_per_core;   /* bytes */
};

/* The preset called name, or NULL. */
const struct tpu_preset *preset_find(const char *name);
/* "v2, v3, v4, v5e, v5p" for messages. */
const char *preset_names(void);

#endif
