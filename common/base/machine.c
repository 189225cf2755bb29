/* The machine a daemon runs on (see machine.h). */
#include "machine.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

uint32_t machine_cpus(void)
{
    cpu_set_t set;
    long n;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (uint32_t)CPU_COUNT(&set);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 0;
}

const char *machine_boot_id(void)
{
    static char id[40];
    static int done;
    if (!done) {
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        done = 1;
        if (f) {
            if (fgets(id, sizeof id, f))
                id[strcspn(id, "\n")] = '\0';
            else
                id[0] = '\0';
            fclose(f);
        }
    }
    return id;
}

uint32_t machine_stretch(uint32_t cores, uint32_t cpus)
{
    uint64_t per = (uint64_t)MACHINE_CORES_PER_CPU * (cpus ? cpus : 1);
    uint64_t f = ((uint64_t)cores + per - 1) / per;
    return f < 1 ? 1 : f > 60 ? 60 : (uint32_t)f;
}
