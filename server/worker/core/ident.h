/* ident: who this emulated core is and which system it belongs to: its host
 * id and core index (as the resolver assigned it), the incarnation of the
 * process, and the system epoch and replica of its last reset. The daemon owns
 * it and is the only writer (a registration assigns the core, a ResetCore the
 * epoch and replica); the layers below read it through the pointer they are
 * given and never keep a pointer to the daemon. Loop thread only. */
#ifndef TPUEMU_WORKER_CORE_IDENT_H
#define TPUEMU_WORKER_CORE_IDENT_H

#include <stdint.h>

#define IDENT_HOST_ID_MAX 63

struct core_ident {
    char host_id[IDENT_HOST_ID_MAX + 1];
    int core;                 /* -1 until assigned */
    uint64_t incarnation;     /* random per process (names its shared-memory socket) */
    uint64_t epoch;           /* system epoch of the last reset; 0: never */
    int replica_id;           /* -1: not part of an initialized system */
    uint32_t num_replicas;
    char sender[96];          /* "worker h0/3", kept in step with host_id and core */
};

/* Sets host_id and core (-1: unassigned), no system. */
void ident_init(struct core_ident *id, const char *host_id, int core);
/* The resolver assigned the core index. */
void ident_set_core(struct core_ident *id, int core);

#endif
