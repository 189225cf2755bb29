/* Unit tests of the generation presets: the published Cloud TPU figures, per
 * device, and agreement with the slice table the resolver uses. */
#include <math.h>
#include <string.h>

#include <criterion/criterion.h>

#include "preset.h"
#include "slice.h"

#define GIB (1024ull * 1024 * 1024)

static double chip_tflops(const struct tpu_preset *p)
{
    return p->bf16_flops_per_core * p->cores_per_chip / 1e12;
}

Test(preset, published_chip_figures)
{
    /* peak bf16 per chip, TFLOP/s, from the Cloud TPU pages cited in preset.c */
    cr_assert_float_eq(chip_tflops(preset_find("v2")), 46.0, 1e-9);
    cr_assert_float_eq(chip_tflops(preset_find("v3")), 123.0, 1e-9);
    cr_assert_float_eq(chip_tflops(preset_find("v4")), 275.0, 1e-9);
    cr_assert_float_eq(chip_tflops(preset_find("v5e")), 197.0, 1e-9);
    cr_assert_float_eq(chip_tflops(preset_find("v5p")), 459.0, 1e-9);
    cr_assert_float_eq(chip_tflops(preset_find("v6e")), 918.0, 1e-9);
    cr_assert_eq(preset_find("v3")->hbm_per_core, 16 * GIB, "a v3 core has half of the chip's 32 GiB");
    cr_assert_eq(preset_find("v2")->hbm_per_core, 8 * GIB);
    cr_assert_eq(preset_find("v4")->hbm_per_core, 32 * GIB);
    cr_assert_eq(preset_find("v5p")->hbm_per_core, 95 * GIB);
    cr_assert_float_eq(preset_find("v5p")->hbm_bw_per_core, 2765e9, 1);
    cr_assert_eq(preset_find("v6e")->mxu_dim, 256, "Trillium has 256x256 MXUs");
    cr_assert_eq(preset_find("v3")->mxu_dim, 128);
}

Test(preset, every_preset_is_complete_and_matches_the_slice_table)
{
    const struct tpu_preset *p;
    unsigned n = 0;
    for (unsigned i = 0; (p = preset_at(i)); i++, n++) {
        const struct slice_type *t = slice_type_find(p->name);
        cr_assert_not_null(t, "%s is in the presets but not in the slice table", p->name);
        cr_assert_eq(p->cores_per_chip, (int)t->cores_per_chip, "%s", p->name);
        cr_assert_eq(p->tensorcores_per_chip, (int)t->tensorcores_per_chip, "%s", p->name);
        cr_assert(p->hbm_per_core > 0 && p->hbm_bw_per_core > 0 && p->bf16_flops_per_core > 0 &&
                  p->ici_bw_per_chip > 0 && p->mxus_per_core > 0, "%s has a missing figure", p->name);
        cr_assert(strstr(preset_names(), p->name), "%s missing from the names list", p->name);
        /* the MXUs must be able to deliver the peak at a plausible clock (0.5..2 GHz).
         * Not v6e: its page's "two 256x256 MXUs" and 918 TFLOP/s imply 3.5 GHz (see preset.c). */
        double ghz = p->bf16_flops_per_core / (2.0 * p->mxus_per_core * p->mxu_dim * p->mxu_dim) / 1e9;
        if (strcmp(p->name, "v6e") != 0)
            cr_assert(ghz > 0.5 && ghz < 2.0, "%s: peak implies a %.2f GHz MXU clock", p->name, ghz);
    }
    cr_assert_eq(n, 6);
    cr_assert_null(preset_find("v7"));
    cr_assert_null(preset_find(NULL));
}
