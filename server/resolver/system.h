/* The TPU system's state machine: initialize (wait for cores, choose them,
 * reset them into a new epoch, collect their acks), shutdown, the system check
 * that tells a client its handle is stale and why, dead detection, and the
 * recovery of the state from heartbeats after a resolver restart. */
#ifndef TPUEMU_RESOLVER_SYSTEM_H
#define TPUEMU_RESOLVER_SYSTEM_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "tpuemu.pb-c.h"

#define SYS_CLIENT_MAX 128
#define SYS_MAX_SHUTDOWNS 16
#define SYS_RESET_MIN_MS 2000u

struct resolver;
struct rentry;

enum sys_event_kind { SYS_EV_NONE, SYS_EV_INIT, SYS_EV_SHUTDOWN };

struct sys_event {
    enum sys_event_kind kind;
    char client[SYS_CLIENT_MAX];
    uint64_t at_ms;
    uint64_t from, to;
};

struct sys_chosen {
    char host[64];
    int core;
    uint64_t inc;
    char data_addr[256];
    char control_addr[256];
    char shm_name[64];
    int acked;
};

enum init_phase { INIT_IDLE, INIT_WAITING, INIT_RESETTING };

struct init_op {
    enum init_phase phase;
    uint64_t tag;
    void *ctl;           /* the request's routing header and nonce */
    uint64_t req_id;
    uint32_t expect, timeout_ms;
    int allow_partial;
    int keep_faults;     /* the cores keep faults waiting for a step */
    char client[SYS_CLIENT_MAX];
    uint64_t start_ms, deadline_ms, reset_ms;
    uint64_t epoch;
    struct sys_chosen *chosen;
    size_t nchosen, nacked;
    char **missing;
    size_t nmissing;
    char tpu_type[8];
};

struct shut_op;

typedef struct rsys {
    uint64_t epoch;         /* system epoch */
    uint64_t issued;        /* highest epoch this process started itself */
    int initialized;
    char owner[SYS_CLIENT_MAX];
    struct sys_event last;
    struct init_op init;
    uv_timer_t init_timer;
    struct shut_op *shuts;
    size_t nshuts;
} rsys;

int sys_start(struct resolver *r);
/* Answers waiting initialize/shutdown requests with UNAVAILABLE and closes the
 * timers. */
void sys_stop(struct resolver *r);

void sys_initialize(struct resolver *r, void *ctl, uint64_t req_id, const Tpuemu__InitializeRequest *q);
void sys_shutdown(struct resolver *r, void *ctl, uint64_t req_id, const Tpuemu__ShutdownRequest *q);
void sys_check(struct resolver *r, void *ctl, uint64_t req_id, const Tpuemu__SystemCheck *q);

/* After a heartbeat refreshed or added en: epoch recovery after a restart. */
void sys_note_worker(struct resolver *r, const struct rentry *en);
/* Membership changed (heartbeat, dead timer): re-check a waiting initialize. */
void sys_on_change(struct resolver *r);
/* The dead-check timer's work. */
void sys_dead_check(struct resolver *r, uint64_t now_ms); /* now_ms: wire_now_ms() */

Tpuemu__CoreState sys_core_state(const struct resolver *r, const struct rentry *en);

#endif
