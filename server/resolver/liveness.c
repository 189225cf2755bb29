/* How long a core may stay silent before the resolver calls it dead: the
 * heartbeat interval the workers are told, stretched on a machine that runs
 * more emulated cores than its CPUs keep up with, times --dead-after. Below
 * the handlers, the system and forgetting, which all ask it. */
#include <stdint.h>
#include <string.h>

#include "log.h"
#include "machine.h"
#include "resolver.h"

/* Machines told apart by boot id; a cluster spread over more than this many
 * counts the rest as one (their cores are then over-, never under-counted). */
#define MACHINES_MAX 256

void rsv_machine_update(resolver *r)
{
    struct mach { const char *boot; uint32_t cores, cpus; } m[MACHINES_MAX];
    size_t nm = 0, busiest = 0;
    uint32_t hb;

    for (size_t i = 0; i < r->reg.n; i++) {
        const rentry *en = r->reg.v[i];
        size_t k;
        if (en->dead || !en->w.boot_id[0])
            continue;
        for (k = 0; k < nm; k++)
            if (!strcmp(m[k].boot, en->w.boot_id))
                break;
        if (k == nm) {
            if (nm == MACHINES_MAX)
                k = nm - 1;
            else
                m[nm++] = (struct mach){en->w.boot_id, 0, 0};
        }
        m[k].cores++;
        if (en->w.host_cpus > m[k].cpus)
            m[k].cpus = en->w.host_cpus;
    }
    for (size_t k = 1; k < nm; k++) /* most cores per CPU */
        if ((uint64_t)m[k].cores * (m[busiest].cpus ? m[busiest].cpus : 1) >
            (uint64_t)m[busiest].cores * (m[k].cpus ? m[k].cpus : 1))
            busiest = k;
    r->machine_cores = nm ? m[busiest].cores : 0;
    r->machine_cpus = nm ? m[busiest].cpus : 0;
    hb = r->heartbeat_flag_ms * machine_stretch(r->machine_cores, r->machine_cpus);
    if (hb > 60000)
        hb = 60000 > r->heartbeat_flag_ms ? 60000 : r->heartbeat_flag_ms;
    if (hb != r->heartbeat_ms) {
        log_info("heartbeat follows the machine", "heartbeat_ms=%u dead_ms=%llu machine_cores=%u "
                 "machine_cpus=%u flag_heartbeat_ms=%u dead_after=%u", hb,
                 (unsigned long long)hb * r->dead_after, r->machine_cores, r->machine_cpus,
                 r->heartbeat_flag_ms, r->dead_after);
        if (hb < r->heartbeat_ms) {
            /* cores beat at the old interval until their next reply */
            r->heartbeat_old_ms = r->heartbeat_ms;
            r->heartbeat_old_until = wire_now_ms() + 2ull * r->heartbeat_ms;
        }
        r->heartbeat_ms = hb;
    }
}

uint64_t rsv_dead_ms(const resolver *r)
{
    uint32_t hb = r->heartbeat_ms;
    if (r->heartbeat_old_until && wire_now_ms() < r->heartbeat_old_until && r->heartbeat_old_ms > hb)
        hb = r->heartbeat_old_ms;
    return (uint64_t)r->dead_after * hb;
}
