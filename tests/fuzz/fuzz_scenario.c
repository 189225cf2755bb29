/* libFuzzer target: tpuctl's scenario parser (client/tpuctl/scenario.c) on
 * any file, and the random target picks of what it accepts. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "scenario.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static struct scenario sc;
    static const struct chaos_core live[3] = {{"h0", 0}, {"h0", 1}, {"h1", 0}};
    char path[64], why[600], out[128];

    if (size > (1u << 16))
        return 0;
    if (fd < 0 && (fd = memfd_create("fuzz_scenario", 0)) < 0)
        return 0;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (scenario_load(path, &sc, why, sizeof why) != 0)
        return 0;
    uint32_t rng = sc.seed;
    for (size_t i = 0; i < sc.n; i++)
        (void)scenario_pick(sc.v[i].target, live, 3, &rng, out, sizeof out);
    return 0;
}
