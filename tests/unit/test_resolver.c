/* Unit tests of the resolver's logic (server/resolver, linked as the daemon
 * links it, no daemon running): the registry of cores (ring order, lookups,
 * --max-cores, the dead ones), the checks of a worker's self-description, and
 * the physical layout of a system's devices. */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "registry.h"
#include "slice.h"
#include "topology.h"

static winfo core_info(const char *host, int core)
{
    winfo w;
    memset(&w, 0, sizeof w);
    snprintf(w.host_id, sizeof w.host_id, "%s", host);
    w.core = core;
    w.incarnation = 1;
    snprintf(w.control_addr, sizeof w.control_addr, "tcp://127.0.0.1:%d", 9000 + core);
    snprintf(w.tpu_type, sizeof w.tpu_type, "v3");
    w.hbm_capacity = 1u << 20;
    return w;
}

static rentry *add(registry *g, const char *host, int core, uint64_t now_ms)
{
    winfo w = core_info(host, core);
    err e;
    rentry *en = reg_add(g, &w, now_ms, &e);
    cr_assert_not_null(en, "adding %s/%d: %s", host, core, e.msg);
    return en;
}

Test(registry, keeps_ring_order_and_finds_each_core)
{
    static const char *want[] = {"h0/0", "h0/3", "h1/0", "h1/1", "h10/2"};
    registry g;
    char name[64];
    size_t count, first;

    reg_init(&g, 16);
    add(&g, "h1", 1, 10);
    add(&g, "h0", 3, 11);
    add(&g, "h10", 2, 12);
    add(&g, "h0", 0, 13);
    add(&g, "h1", 0, 14);
    cr_assert_eq(g.n, 5);
    for (size_t i = 0; i < g.n; i++)
        cr_assert_str_eq(reg_name(g.v[i]->w.host_id, g.v[i]->w.core, name, sizeof name), want[i], "ring position %zu",
                         i);
    cr_assert_eq(reg_lookup(&g, "h0", 3), g.v[1]);
    cr_assert_eq(reg_lookup(&g, "h0", 3)->registered_ms, 11);
    cr_assert_null(reg_lookup(&g, "h0", 1));
    cr_assert_null(reg_lookup(&g, "h2", 0));

    first = reg_host_range(&g, "h1", &count);
    cr_assert(first == 2 && count == 2, "h1 at %zu, %zu cores; want 2, 2", first, count);
    first = reg_host_range(&g, "h10", &count);
    cr_assert(first == 4 && count == 1, "h10 at %zu, %zu cores; want 4, 1", first, count);
    (void)reg_host_range(&g, "h05", &count);
    cr_assert_eq(count, 0, "a host with no cores has %zu", count);
    reg_free(&g);
}

Test(registry, refuses_a_core_past_max_cores)
{
    registry g;
    winfo w = core_info("h0", 2);
    err e;

    reg_init(&g, 2);
    add(&g, "h0", 0, 1);
    add(&g, "h0", 1, 1);
    cr_assert_null(reg_add(&g, &w, 2, &e));
    cr_assert_eq(e.code, CODE_RESOURCE_EXHAUSTED);
    cr_assert(strstr(e.msg, "--max-cores"), "the error names the flag: %s", e.msg);
    cr_assert_eq(g.n, 2);
    cr_assert_null(reg_lookup(&g, "h0", 2));
    reg_free(&g);
}

Test(registry, counts_the_dead_and_finds_the_longest_dead)
{
    registry g;
    rentry *a, *b, *c;

    reg_init(&g, 8);
    a = add(&g, "h0", 0, 0);
    b = add(&g, "h0", 1, 0);
    c = add(&g, "h1", 0, 0);
    cr_assert_null(reg_longest_dead(&g));
    a->last_hb_ms = 500;
    b->last_hb_ms = 100;
    c->last_hb_ms = 300;
    reg_set_dead(&g, a, 1);
    reg_set_dead(&g, c, 1);
    reg_set_dead(&g, c, 1); /* twice: still one */
    cr_assert_eq(g.n_dead, 2);
    cr_assert_eq(reg_alive(&g), 1);
    cr_assert_eq(reg_longest_dead(&g), c, "h1/0 (silent since 300) is the longest dead, not h0/0 (500)");

    reg_remove(&g, c);
    cr_assert_eq(g.n, 2);
    cr_assert_eq(g.n_dead, 1);
    cr_assert_null(reg_lookup(&g, "h1", 0));
    cr_assert_eq(reg_longest_dead(&g), a);
    reg_set_dead(&g, a, 0);
    cr_assert_eq(g.n_dead, 0);
    cr_assert_null(reg_longest_dead(&g));
    reg_free(&g);
}

/* A worker's self-description, as a worker of a v4-8 host sends it. */
static Tpuemu__WorkerInfo good_worker(void)
{
    Tpuemu__WorkerInfo w;
    tpuemu__worker_info__init(&w);
    w.host_id = "h0";
    w.core = 3;
    w.incarnation = 7;
    w.control_addr = "tcp://127.0.0.1:8470";
    w.data_addr = "127.0.0.1:8471";
    w.tpu_type = "v4";
    w.accelerator_type = "v4-8";
    w.hbm_capacity = 1u << 30;
    return w;
}

static void expect_refused(const Tpuemu__WorkerInfo *w, const char *names)
{
    err e;
    cr_assert_eq(reg_validate(w, &e), CODE_INVALID_ARGUMENT, "accepted a worker whose %s is wrong", names);
    cr_assert(strstr(e.msg, names), "the error names %s: %s", names, e.msg);
}

Test(registry, checks_what_a_worker_says_of_itself)
{
    Tpuemu__WorkerInfo w = good_worker();
    winfo copy;
    err e;

    cr_assert_eq(reg_validate(&w, &e), CODE_OK, "%s", e.msg);
    reg_winfo_copy(&copy, &w, 1000);
    cr_assert_str_eq(copy.accelerator_type, "v4-8");
    cr_assert_eq(copy.incarnation, 7);

    w = good_worker();
    w.host_id = "h 0";
    expect_refused(&w, "host_id");
    w = good_worker();
    w.host_id = "all";
    expect_refused(&w, "host_id 'all'");
    w = good_worker();
    w.core = REG_CORE_MAX + 1;
    expect_refused(&w, "core 1024");
    w = good_worker();
    w.core = 4; /* a v4-8 host has 4 devices */
    expect_refused(&w, "core 4 does not exist on a v4-8 host");
    w = good_worker();
    w.incarnation = 0;
    expect_refused(&w, "incarnation");
    w = good_worker();
    w.control_addr = "127.0.0.1:8470";
    expect_refused(&w, "control_addr");
    w = good_worker();
    w.tpu_type = "v9";
    expect_refused(&w, "tpu_type");
    w = good_worker();
    w.accelerator_type = "v3-8";
    expect_refused(&w, "accelerator_type v3-8 is a v3 slice");
    w = good_worker();
    w.hbm_capacity = 0;
    expect_refused(&w, "hbm_capacity");
    cr_assert_eq(reg_validate(NULL, &e), CODE_INVALID_ARGUMENT);
}

Test(topology, hosts_own_blocks_of_chips_as_cloud_tpu_places_them)
{
    unsigned shape[4], task[32], coords[32][4];
    int seen[4][4][2] = {{{0}}};

    topo_mesh("v3", 32, shape);
    cr_assert(shape[0] == 4 && shape[1] == 4 && shape[2] == 1 && shape[3] == 2, "v3-32 mesh [%u,%u,%u,%u]", shape[0],
              shape[1], shape[2], shape[3]);
    for (unsigned i = 0; i < 32; i++)
        task[i] = i / 8; /* 4 hosts of 4 chips, 8 cores each */
    cr_assert_eq(topo_layout(shape, 32, task, coords), 1, "equal hosts that tile the mesh get blocks");
    for (unsigned i = 0; i < 32; i++) {
        unsigned x = coords[i][0], y = coords[i][1], c = coords[i][3];
        cr_assert(x < 4 && y < 4 && coords[i][2] == 0 && c < 2, "device %u at [%u,%u,%u,%u]", i, x, y, coords[i][2], c);
        cr_assert_eq(seen[x][y][c]++, 0, "two devices at [%u,%u,0,%u]", x, y, c);
        /* host t's chips are the 2x2 block at (t % 2 * 2, t / 2 * 2) */
        cr_assert(x / 2 == task[i] % 2 && y / 2 == task[i] / 2, "device %u of host %u at [%u,%u] is outside its block",
                  i, task[i], x, y);
        cr_assert_eq(c, i % 2, "a chip's two cores are adjacent in ring order");
    }
}

Test(topology, hosts_of_different_sizes_fill_the_mesh_in_order)
{
    unsigned shape[4], task[8] = {0, 0, 0, 0, 0, 0, 1, 1}, coords[8][4], fill[4];

    topo_mesh("v4", 8, shape);
    cr_assert_eq(shape[0] * shape[1] * shape[2] * shape[3], 8);
    cr_assert_eq(topo_layout(shape, 8, task, coords), 0, "hosts of 6 and 2 devices do not tile the mesh");
    for (unsigned i = 0; i < 8; i++) {
        topo_coords(shape, i, fill);
        cr_assert(memcmp(coords[i], fill, sizeof fill) == 0, "device %u is not at its place in x, y, z order", i);
    }
}
