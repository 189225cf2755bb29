/* Which cores a tpuctl listing shows: --host patterns and --state names,
 * parsed once and matched core by core; and a per-host roll-up for
 * `tpuctl cluster --summary`. At pod scale (thousands of cores) these keep the
 * listings readable; the library's snapshot is always the whole cluster. */
#ifndef TPUCTL_SELECT_H
#define TPUCTL_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "tpuemu/tpuemu.h"

#define SELECT_MAX_HOSTS 32

typedef struct core_select {
    const char *host[SELECT_MAX_HOSTS]; /* shell patterns (fnmatch), any matches; none: all */
    size_t nhost;
    unsigned states;                    /* bit (1 << tpu_core_state); 0: all */
    char buf[1024];                     /* the --host list, split in place */
} core_select;

/* Parses --host (comma list of host ids or patterns like 'h1*') and --state
 * (comma list of READY, IDLE, DEAD, any case); either may be NULL. 0, or -1
 * with msg naming what was wrong. */
int select_parse(core_select *s, const char *hosts, const char *states, char *msg, size_t msg_len);
int select_active(const core_select *s);
int select_match(const core_select *s, const tpu_core_info *ci);

/* One host's cores, as `tpuctl cluster --summary` shows them. */
typedef struct host_sum {
    const char *host; /* points into the snapshot */
    size_t cores, state[TPU_CORE_STATES];
    uint64_t hbm_used, hbm_capacity, max_heartbeat_age_ms;
} host_sum;

/* Rolls up the selected cores of s (sorted by host) into *out (malloc'd,
 * caller frees); the number of hosts. Exits when out of memory (a CLI). */
size_t select_by_host(const core_select *sel, const tpu_cluster_spec *s, host_sum **out);

#endif
