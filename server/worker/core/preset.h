/* TPU generation presets: what one emulated core of each generation has, per
 * core as the framework sees it (a v2/v3 chip shows two cores; a v4/v5p chip's
 * two TensorCores act as one "megacore" device; v5e and v6e chips have one).
 * The figures are the published Cloud TPU ones; preset.c cites each source.
 * The HBM capacity is enforced (hbm.c); the rest feeds the roofline estimate
 * of device time and the MXU utilization figure. Static data, thread-safe. */
#ifndef TPUEMU_WORKER_PRESET_H
#define TPUEMU_WORKER_PRESET_H

#include <stdint.h>

struct tpu_preset {
    const char *name;            /* "v3" */
    int cores_per_chip;          /* devices the framework sees per chip (megacore: 1) */
    int tensorcores_per_chip;    /* physical TensorCores per chip */
    uint64_t hbm_per_core;       /* bytes of HBM per device */
    double hbm_bw_per_core;      /* bytes/s of HBM bandwidth per device */
    double bf16_flops_per_core;  /* peak bf16 FLOP/s per device */
    double ici_bw_per_chip;      /* bytes/s, bidirectional, all ICI links of a chip together */
    int mxus_per_core;           /* matrix units per device */
    int mxu_dim;                 /* each MXU is mxu_dim x mxu_dim (128, or 256 on v6e) */
};

/* The preset called name ("v2", "v3", "v4", "v5e", "v5p", "v6e"), or NULL. */
const struct tpu_preset *preset_find(const char *name);
/* "v2, v3, v4, v5e, v5p, v6e" for messages. */
const char *preset_names(void);
/* The i-th preset (0-based) or NULL past the end, to list them all. */
const struct tpu_preset *preset_at(unsigned i);

#endif
