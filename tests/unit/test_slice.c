/* Unit tests of common/base/slice: slice names map to the devices and mesh shapes
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

static void expect_hosts(const char *name, unsigned hosts, unsigned per_host)
{
    struct slice s;
    err e;
    cr_assert_eq(slice_parse(name, &s, &e), CODE_OK, "%s: %s", name, e.msg);
    cr_assert(s.hosts == hosts && s.devices_per_host == per_host,
              "%s: %u hosts of %u devices, Cloud TPU has %u hosts of %u", name, s.hosts, s.devices_per_host,
              hosts, per_host);
    cr_assert_eq(s.hosts * s.devices_per_host, s.devices, "%s: every host has the same count", name);
}

/* Cloud TPU's system-architecture pages (docs/system-architecture-tpu-vm, the
 * v4, v5e and v5p pages): a v2/v3 host has 4 chips of 2 cores (a v3-8 is one
 * host of 8 cores, a v3-32 four); a v4 or v5p host 4 megacore chips, one
 * device each (v4-16: 2 hosts of 4); v5e and v6e slices of up to 8 chips are
 * one host, larger ones 4 chips per host. TensorFlow's num_accelerators() is
 * the per-host count (tensorflow/python/distribute/cluster_resolver/tpu/
 * tpu_cluster_resolver.py). */
Test(slice, hosts_and_devices_per_host)
{
    expect_hosts("v2-8", 1, 8);
    expect_hosts("v3-8", 1, 8);
    expect_hosts("v3-32", 4, 8);
    expect_hosts("v4-8", 1, 4);
    expect_hosts("v4-16", 2, 4);
    expect_hosts("v4-32", 4, 4);
    expect_hosts("v5p-16", 2, 4);
    expect_hosts("v5litepod-8", 1, 8);
    expect_hosts("v5litepod-4", 1, 4);
    expect_hosts("v5litepod-16", 4, 4);
    expect_hosts("v6e-8", 1, 8);

    struct slice s;
    err e;
    cr_assert_eq(slice_parse("v3-12", &s, &e), CODE_INVALID_ARGUMENT, "6 chips do not fill hosts of 4");
    cr_assert(strstr(e.msg, "do not fill hosts of 4 chips"), "%s", e.msg);
}

/* Only the shapes Cloud TPU has: v2, v3, v4 and v5p in whole hosts of 4
 * chips, v5e and v6e in 1, 4, 8 chips or a larger power of two. Each other
 * count is refused naming the rule (v3-6 and v4-2 were taken as one host of
 * 3 chips and of 1). */
Test(slice, only_cloud_shapes)
{
    static const char *const bad[] = {"v3-6", "v4-2", "v4-4", "v2-4", "v5p-4", "v5litepod-7", "v5litepod-2",
                                      "v6e-5", "v5e-12", "v6e-24"};
    static const char *const good[] = {"v2-8", "v3-8", "v3-32", "v3-2048", "v4-8", "v4-4096", "v5p-8",
                                       "v5litepod-1", "v5litepod-4", "v5litepod-256", "v6e-1", "v6e-8", "v6e-256"};
    struct slice s;
    err e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(slice_parse(bad[i], &s, &e), CODE_INVALID_ARGUMENT, "%s was accepted", bad[i]);
        cr_assert(strstr(e.msg, bad[i]) && (strstr(e.msg, "whole hosts") || strstr(e.msg, "power of two") ||
                                            strstr(e.msg, "multiple of")),
                  "%s: %s", bad[i], e.msg);
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert_eq(slice_parse(good[i], &s, &e), CODE_OK, "%s: %s", good[i], e.msg);
    cr_assert(host_id_reserved("all") && host_id_reserved("resolver") && host_id_reserved("random-core") &&
              host_id_reserved("random-host") && !host_id_reserved("h0") && !host_id_reserved("alls"));
}
