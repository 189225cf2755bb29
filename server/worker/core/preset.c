/* The table of TPU generations. Sources (Cloud TPU documentation, fetched for
 * this table; "chip" figures are divided by the devices per chip):
 *   [v2]  https://cloud.google.com/tpu/docs/v2 : no figures of its own; it points
 *         to Jouppi et al., "A Domain-Specific Supercomputer for Training Deep
 *         Neural Networks", CACM 63(7), 2020 (Table 3), which gives per chip
 *         46 TFLOP/s bf16, 16 GiB HBM at 700 GB/s, 4 ICI links of 496 Gbit/s,
 *         one 128x128 MXU per core. The older Cloud page said 180 TFLOP/s and
 *         64 GiB per 4-chip board (45 TFLOP/s per chip); we take the paper's 46.
 *   [v3]  https://cloud.google.com/tpu/docs/v3 : per chip 123 TFLOP/s bf16,
 *         32 GiB HBM2 at 900 GB/s, 2 TensorCores with 2 MXUs each. ICI from
 *         the same paper: 4 links of 656 Gbit/s.
 *   [v4]  https://cloud.google.com/tpu/docs/v4 : per chip 275 TFLOP/s bf16,
 *         32 GiB HBM2 at 1200 GB/s, 2 TensorCores with 4 MXUs each (one
 *         megacore device). The page gives no ICI figure; we take 6 links of
 *         45 GB/s each way (540 GB/s bidirectional) from "How to Scale Your
 *         Model" (jax-ml.github.io/scaling-book, the TPU chapter) - the least
 *         certain number in this table.
 *   [v5e] https://cloud.google.com/tpu/docs/v5e : per chip 197 TFLOP/s bf16,
 *         16 GB HBM2 at 819 GB/s, 1 TensorCore with 4 MXUs, ICI 400 GB/s
 *         bidirectional. Older revisions of the page say "1600 Gbps" ICI (one
 *         way, the same figure) and one revision says "800 GiBps" HBM; we take
 *         819 GB/s, and 16 GiB as capacity (the page mixes GB and GiB).
 *   [v5p] https://cloud.google.com/tpu/docs/v5p : per chip 459 TFLOP/s bf16,
 *         95 GiB HBM2e at 2765 GB/s, 2 TensorCores with 4 MXUs each (one
 *         megacore device), ICI 1200 GB/s bidirectional (older revision:
 *         "4800 Gbps", i.e. 600 GB/s one way - the same figure).
 *   [v6e] https://cloud.google.com/tpu/docs/v6e : per chip 918 TFLOP/s bf16,
 *         32 GB HBM at 1640 GB/s (the table says 1638), 1 TensorCore with two
 *         256x256 MXUs, ICI 800 GB/s bidirectional. Capacity taken as 32 GiB.
 *         The page's two 256x256 MXUs would need a 3.5 GHz clock to reach 918
 *         TFLOP/s; we keep both published figures (the peak drives the
 *         estimates, the MXU size the utilization figure).
 * The MXU counts are per device: a megacore device has both TensorCores'. */
#include "preset.h"

#include <string.h>

#define GIB (1024ull * 1024 * 1024)
#define GB 1e9
#define TFLOPS 1e12
#define GBIT (1e9 / 8)

static const struct tpu_preset presets[] = {
    /* name  dev/chip TC/chip  HBM/device   HBM bw/device  bf16 peak/device  ICI/chip       MXUs dim */
    {"v2", 2, 2, 8 * GIB, 700 * GB / 2, 46 * TFLOPS / 2, 4 * 496 * GBIT, 1, 128},
    {"v3", 2, 2, 16 * GIB, 900 * GB / 2, 123 * TFLOPS / 2, 4 * 656 * GBIT, 2, 128},
    {"v4", 1, 2, 32 * GIB, 1200 * GB, 275 * TFLOPS, 540 * GB, 8, 128},
    {"v5e", 1, 1, 16 * GIB, 819 * GB, 197 * TFLOPS, 400 * GB, 4, 128},
    {"v5p", 1, 2, 95 * GIB, 2765 * GB, 459 * TFLOPS, 1200 * GB, 8, 128},
    {"v6e", 1, 1, 32 * GIB, 1640 * GB, 918 * TFLOPS, 800 * GB, 2, 256},
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

const struct tpu_preset *preset_at(unsigned i)
{
    return i < sizeof presets / sizeof presets[0] ? &presets[i] : NULL;
}

const char *preset_names(void)
{
    return "v2, v3, v4, v5e, v5p, v6e";
}
