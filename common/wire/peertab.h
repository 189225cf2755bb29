/* peertab: the cores of a system as every core learns them at an initialize
 * (ResetCore.peer_table, a serialized PeerTable: see tpuemu.proto).
 *
 * The resolver packs the table once per initialize and sends every core the
 * same bytes; a core opens it once and keeps it for the epoch, reading a
 * replica's fields only when it talks to that replica. Columns and a string
 * pool rather than a message per core: at 1,024 cores the table is about
 * 19 KB where a list of PeerInfo messages was 100 KB, and opening it touches
 * a handful of pages instead of about a hundred (on a VM a fresh page costs
 * 20-36 us, and a first initialize is 1,024 cores opening it at once).
 *
 * Pure functions over their arguments; thread-safe. */
#ifndef TPUEMU_COMMON_PEERTAB_H
#define TPUEMU_COMMON_PEERTAB_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The longest strings a table carries (what registration accepts). */
#define PEERTAB_MAX_HOST 63
#define PEERTAB_MAX_ADDR 255
#define PEERTAB_MAX_SHM 63

/* One core, as the resolver knows it. NULL strings read as "". */
struct peertab_row {
    const char *host;         /* host id */
    int core;
    const char *data_addr;    /* "ADDR:PORT" */
    const char *control_addr; /* "tcp://ADDR:PORT" */
    const char *shm_name;     /* "" when it offers no shared memory */
    uint64_t incarnation;
};

/* Serializes rows[0..n) (replica order) into a PeerTable: *out is malloc'd,
 * the caller frees it. CODE_OK; CODE_INVALID_ARGUMENT naming the replica
 * whose string is longer than the limits above; CODE_RESOURCE_EXHAUSTED. */
int peertab_pack(const struct peertab_row *rows, size_t n, uint8_t **out, size_t *outlen, err *e);

struct peertab;

/* Decodes and checks a PeerTable of exactly n cores (len 0 with n 0 is the
 * empty table). CODE_OK with *out to free with peertab_free, or
 * CODE_INVALID_ARGUMENT saying what is wrong (not a PeerTable, a column of
 * the wrong length, an index past the strings, a port past 65535, a string
 * too long), or CODE_RESOURCE_EXHAUSTED. */
int peertab_open(const uint8_t *buf, size_t len, size_t n, struct peertab **out, err *e);
void peertab_free(struct peertab *t);

/* Accessors; r < the table's n (unchecked: the caller checked it). */
size_t peertab_n(const struct peertab *t);
const char *peertab_host(const struct peertab *t, size_t r);
/* Equal for two replicas exactly when their host ids are equal. */
uint32_t peertab_host_index(const struct peertab *t, size_t r);
int peertab_core(const struct peertab *t, size_t r);
uint64_t peertab_incarnation(const struct peertab *t, size_t r);
/* 1 when the replica offers shared memory (a socket name). */
int peertab_has_shm(const struct peertab *t, size_t r);

/* Replica r's strings written into buf (cap bytes; a table that opened
 * always fits in PEERTAB_MAX_ADDR + 1, or PEERTAB_MAX_SHM + 1 for the shm
 * name); returns buf. */
const char *peertab_data_addr(const struct peertab *t, size_t r, char *buf, size_t cap);
const char *peertab_control_addr(const struct peertab *t, size_t r, char *buf, size_t cap);
const char *peertab_shm_name(const struct peertab *t, size_t r, char *buf, size_t cap);

#endif
