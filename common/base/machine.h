/* The machine a daemon runs on, as the cluster tells machines apart: the
 * kernel's boot id (the same for every process, container and network
 * namespace on one kernel) and the CPUs this process may run on. The
 * resolver counts the emulated cores sharing each machine's CPUs and
 * stretches the heartbeat interval, and with it the dead-core time and every
 * timeout derived from it, by the busiest machine's machine_stretch. */
#ifndef TPUEMU_COMMON_MACHINE_H
#define TPUEMU_COMMON_MACHINE_H

#include <stdint.h>

/* The CPUs this process may run on (its affinity; else those online). */
uint32_t machine_cpus(void);
/* The running kernel's boot id ("" when it cannot be read), read once. */
const char *machine_boot_id(void);

/* Emulated cores one CPU keeps at the configured heartbeat: past it a core
 * waits for its turn to run long enough to look dead, and the heartbeats of
 * idle cores alone take a good share of the CPUs (a heartbeat wakes a worker
 * twice, 0.1-1.8 ms of CPU on the VMs measured: 32 cores a CPU beating each
 * second then cost at most 6 % of a CPU). */
#define MACHINE_CORES_PER_CPU 32

/* How many times the configured heartbeat interval a machine running cores
 * emulated cores on cpus CPUs needs: 1 up to MACHINE_CORES_PER_CPU cores a
 * CPU, then in proportion (1,024 cores on 2 CPUs: 16), at most 60. The idle
 * cores' heartbeats then cost the machine about the same at any size, and a
 * core has as many of its turns to run within the dead-core time. */
uint32_t machine_stretch(uint32_t cores, uint32_t cpus);

#endif
