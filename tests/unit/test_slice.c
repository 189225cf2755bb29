/* Unit tests of common/slice: slice names map to the devices and mesh shapes
 * TensorFlow reports (tf.tpu.experimental.Topology.mesh_shape). */
#include <string.h>

#include <criterion/criterion.h>

#include "slice.h"

static void expect_mesh(const char *name, unsigned devices, unsigned x, unsigned y, unsigned z, unsigned c)
{
    struct slice s;
    err e;
    cr_assert_eq(slice_parse(name, &s, &e), CODE_OK, "%s: %s", name, e.msg);
    cr_assert_eq(s.devices, devices, "%s: %u devices, want %u", name, s.devices, devices);
    cr_assert(s.mesh[0] == x && s.mesh[1] == y && s.mesh[2] == z && s.mesh[3] == c,
              "%s: mesh_shape [%u, %u, %u, %u], TensorFlow reports [%u, %u, %u, %u]", name, s.mesh[0],
              s.mesh[1], s.mesh[2], s.mesh[3], x, y, z, c);
}

Test(slice, tensorflow_mesh_shapes)
{
    /* TF's Topology for a v2-8: 4 chips of 2 cores, mesh_shape [2, 2, 1, 2] */
    expect_mesh("v2-8", 8, 2, 2, 1, 2);
    /* v3-32: 16 chips as a 4x4 torus, 2 cores each */
    expect_mesh("v3-32", 32, 4, 4, 1, 2);
    /* v4-16: 16 TensorCores = 8 megacore chips on a 2x2x2 cube, 1 device each */
    expect_mesh("v4-16", 8, 2, 2, 2, 1);
}

Test(slice, other_generations)
{
    expect_mesh("v3-8", 8, 2, 2, 1, 2);
    expect_mesh("v4-8", 4, 2, 2, 1, 1);              /* Cloud's 2x2x1 */
    expect_mesh("v5p-8", 4, 2, 2, 1, 1);             /* v5p counts TensorCores like v4 */
    expect_mesh("v5litepod-16", 16, 4, 4, 1, 1);     /* v5e counts chips */
    expect_mesh("v5e-4", 4, 2, 2, 1, 1);
    expect_mesh("v6e-16", 16, 4, 4, 1, 1);
}

Test(slice, bad_names_say_what_is_wrong)
{
    struct slice s;
    err e;
    cr_assert_eq(slice_parse("v7-8", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "'v7' is not a TPU type"), "%s", e.msg);
    cr_assert_eq(slice_parse("v3-7", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "multiple of 2"), "%s", e.msg);
    cr_assert_eq(slice_parse("v3", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse("v3-", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse("v3-0", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse("v3--8", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse("v3-8x", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse("v3-99999999999", &s, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(slice_parse(NULL, &s, &e), CODE_INVALID_ARGUMENT);
}

Test(slice, known_types)
{
    cr_assert_eq(slice_type_find("v3")->cores_per_chip, 2);
    cr_assert_eq(slice_type_find("v4")->cores_per_chip, 1, "v4 is a megacore: one device per chip");
    cr_assert_null(slice_type_find("v7"));
    cr_assert_null(slice_type_find(NULL));
}
