/* The resolver's registry of cores, keyed by (host_id, core).
 *
 * Entries are heap objects (their address is stable: corelinks and pending
 * operations point at them) kept in an array sorted by (host_id, core), which
 * is also ring order. An entry goes when its worker leaves, when it has been
 * dead for --forget-after-ms, when an operator forgets it, or when --max-cores
 * are tracked and a new core needs the room of the longest-dead one; until
 * then a dead one stays listed, and a new worker on its key replaces it in
 * place. Loop thread only. */
#ifndef TPUEMU_RESOLVER_REGISTRY_H
#define TPUEMU_RESOLVER_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tpuemu.pb-c.h"

#define REG_HOST_MAX 64   /* host ids are 1..63 chars */
#define REG_ADDR_MAX 256  /* control/data addresses are < 256 chars */
#define REG_CORE_MAX 1023 /* largest core index */
#define REG_SHM_MAX 64    /* shm_name is < 64 chars */

struct corelink;

/* WorkerInfo with bounded, owned storage. */
typedef struct winfo {
    char host_id[REG_HOST_MAX];
    int core;
    uint64_t incarnation;
    char control_addr[REG_ADDR_MAX];
    char data_addr[REG_ADDR_MAX];
    char tpu_type[8];
    uint64_t hbm_capacity, hbm_used, hbm_peak;
    uint32_t pid;
    char version[32];
    uint64_t epoch;
    int32_t replica_id;
    char shm_name[REG_SHM_MAX]; /* same-host shared-memory socket, "" if none */
    uint32_t hbm_ooms;
    char accelerator_type[32]; /* its slice ("v4-16"), "" if none */
    uint32_t host_cpus;        /* its machine's CPUs (its affinity), 0 if not told */
    char boot_id[40];          /* its machine's kernel boot id, "" if not told */
    uint64_t train_step;       /* its last training step finished (0: none) */
    uint32_t step_us, allreduce_us; /* that step's time, and its all-reduce's */
    uint32_t metrics_port;          /* its /metrics port (0: none) */
    uint32_t faults;                /* faults injected into it that took effect */
    char last_fault[96];            /* the last one, "" if none */
    /* its notice (preemption, maintenance): kind 0 none; the event at
     * notice_at_ms on this resolver's monotonic clock */
    int notice_kind;
    uint64_t notice_at_ms;
    uint32_t notice_window_ms;
    int notice_under_way;   /* down for maintenance: listed MAINTENANCE, kept out of initializes */
} winfo;

typedef struct rentry {
    winfo w;
    uint64_t last_hb_ms;    /* monotonic */
    uint64_t registered_ms; /* monotonic, when this incarnation registered */
    int dead;               /* silent, preempted or down for maintenance: not given to an initialize */
    int preempted;          /* it left preempted (PREEMPTED until a new process registers) */
    uint64_t probe_tag;     /* != 0 while a claim on this key waits for a probe */
    struct corelink *link;  /* REQ socket to w.control_addr, made lazily */
} rentry;

typedef struct registry {
    rentry **v; /* sorted by (host_id, core) */
    size_t n, cap, max;
    size_t n_dead;
} registry;

void reg_init(registry *g, size_t max);
/* Frees every entry; their links must be closed (NULL) already. */
void reg_free(registry *g);

/* Checks a worker's self-description; INVALID_ARGUMENT naming the field. */
int reg_validate(const Tpuemu__WorkerInfo *w, err *e);
/* Copies a validated WorkerInfo, received at now_ms, into owned storage. */
void reg_winfo_copy(winfo *dst, const Tpuemu__WorkerInfo *src, uint64_t now_ms);
/* Points a protobuf WorkerInfo at w's strings (valid while w is), its notice
 * as of now_ms written to *nbuf. */
void reg_winfo_view(const winfo *w, Tpuemu__WorkerInfo *out, Tpuemu__Notice *nbuf, uint64_t now_ms);

rentry *reg_lookup(const registry *g, const char *host, int core);
/* Index of the first entry of host (or where it would go) and the count. */
size_t reg_host_range(const registry *g, const char *host, size_t *count);
/* Adds a new entry for w (w->core >= 0, key not present). NULL and
 * RESOURCE_EXHAUSTED when --max-cores entries are tracked already. */
rentry *reg_add(registry *g, const winfo *w, uint64_t now_ms, err *e);
/* Marks an entry dead or alive, keeping the counters right. */
void reg_set_dead(registry *g, rentry *en, int dead);
/* Takes en out of the registry and frees it; its link must be closed (NULL)
 * already. Nothing may point at it afterwards. */
void reg_remove(registry *g, rentry *en);
/* The dead entry whose last heartbeat is the oldest; NULL if none is dead. */
rentry *reg_longest_dead(const registry *g);

static inline size_t reg_alive(const registry *g)
{
    return g->n - g->n_dead;
}

/* "h0/3" into buf. */
const char *reg_name(const char *host, int core, char *buf, size_t n);

#endif
