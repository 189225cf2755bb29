/* The registry of cores: validation, sorted storage, lookup, counters. It knows
 * nothing about sockets or the system state machine. */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slice.h"

void reg_init(registry *g, size_t max)
{
    memset(g, 0, sizeof *g);
    g->max = max;
}

void reg_free(registry *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->v[i]);
    free(g->v);
    g->v = NULL;
    g->n = g->cap = g->n_dead = 0;
}

const char *reg_name(const char *host, int core, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%d", host, core);
    return buf;
}

int reg_validate(const Tpuemu__WorkerInfo *w, err *e)
{
    size_t len;

    if (!w)
        return err_set(e, CODE_INVALID_ARGUMENT, "heartbeat carries no worker description");
    len = w->host_id ? strlen(w->host_id) : 0;
    if (len < 1 || len >= REG_HOST_MAX || strspn(w->host_id,
                                                 "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                 "0123456789._-") != len)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "host_id must be 1..%d characters of [A-Za-z0-9._-] (got %zu characters)",
                       REG_HOST_MAX - 1, len);
    if (host_id_reserved(w->host_id))
        return err_set(e, CODE_INVALID_ARGUMENT, "host_id '%s' is a word tpuctl reads as a target (%s): a core "
                       "of that host could never be named; choose another", w->host_id, HOST_ID_RESERVED);
    if (w->core < -1 || w->core > REG_CORE_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "core %d is out of range (-1 to let the resolver "
                       "assign one, or 0..%d)", (int)w->core, REG_CORE_MAX);
    if (w->incarnation == 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "incarnation must not be 0");
    len = w->control_addr ? strlen(w->control_addr) : 0;
    if (len >= REG_ADDR_MAX || strncmp(w->control_addr ? w->control_addr : "", "tcp://", 6) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "control_addr must start with tcp:// and be shorter than %d characters",
                       REG_ADDR_MAX);
    if (w->data_addr && strlen(w->data_addr) >= REG_ADDR_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "data_addr must be shorter than %d characters",
                       REG_ADDR_MAX);
    if (w->shm_name && strlen(w->shm_name) >= REG_SHM_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "shm_name must be shorter than %d characters",
                       REG_SHM_MAX);
    if (w->last_fault && strlen(w->last_fault) >= sizeof((winfo *)0)->last_fault)
        return err_set(e, CODE_INVALID_ARGUMENT, "last_fault must be shorter than %zu characters",
                       sizeof((winfo *)0)->last_fault);
    if (w->metrics_port > 65535)
        return err_set(e, CODE_INVALID_ARGUMENT, "metrics_port %u is outside 0..65535", w->metrics_port);
    if (w->boot_id && strlen(w->boot_id) >= sizeof ((winfo *)0)->boot_id)
        return err_set(e, CODE_INVALID_ARGUMENT, "boot_id must be shorter than %zu characters",
                       sizeof ((winfo *)0)->boot_id);
    if (!slice_type_find(w->tpu_type))
        return err_set(e, CODE_INVALID_ARGUMENT, "tpu_type must be one of %s", slice_type_names());
    if (w->accelerator_type && *w->accelerator_type) {
        struct slice sl;
        err se;
        if (strlen(w->accelerator_type) >= sizeof ((winfo *)0)->accelerator_type)
            return err_set(e, CODE_INVALID_ARGUMENT, "accelerator_type must be shorter than %zu characters",
                           sizeof ((winfo *)0)->accelerator_type);
        if (slice_parse(w->accelerator_type, &sl, &se) != CODE_OK)
            return err_set(e, CODE_INVALID_ARGUMENT, "accelerator_type: %s", se.msg);
        if (strcmp(sl.type->name, w->tpu_type) != 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "accelerator_type %s is a %s slice, but tpu_type is %s",
                           w->accelerator_type, sl.type->name, w->tpu_type);
        if (w->core >= (int)sl.devices_per_host)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "core %d does not exist on a %s host: it has %u devices (cores 0..%u)",
                           (int)w->core, w->accelerator_type, sl.devices_per_host, sl.devices_per_host - 1);
    }
    if (w->hbm_capacity == 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "hbm_capacity must be greater than 0");
    if (w->notice && (w->notice->kind < TPUEMU__NOTICE_KIND__NOTICE_NONE ||
                      w->notice->kind > TPUEMU__NOTICE_KIND__NOTICE_MAINTENANCE))
        return err_set(e, CODE_INVALID_ARGUMENT, "notice: kind %d is not none (0), preemption (1) or maintenance (2)",
                       (int)w->notice->kind);
    if (w->notice && w->notice->event_in_ms > 86400000u)
        return err_set(e, CODE_INVALID_ARGUMENT, "notice: an event %llu ms away is more than a day away",
                       (unsigned long long)w->notice->event_in_ms);
    return CODE_OK;
}

void reg_winfo_copy(winfo *d, const Tpuemu__WorkerInfo *s, uint64_t now_ms)
{
    snprintf(d->host_id, sizeof d->host_id, "%s", s->host_id ? s->host_id : "");
    d->core = s->core;
    d->incarnation = s->incarnation;
    snprintf(d->control_addr, sizeof d->control_addr, "%s", s->control_addr ? s->control_addr : "");
    snprintf(d->data_addr, sizeof d->data_addr, "%s", s->data_addr ? s->data_addr : "");
    snprintf(d->tpu_type, sizeof d->tpu_type, "%s", s->tpu_type ? s->tpu_type : "");
    d->hbm_capacity = s->hbm_capacity;
    d->hbm_used = s->hbm_used;
    d->hbm_peak = s->hbm_peak;
    d->pid = s->pid;
    snprintf(d->version, sizeof d->version, "%.31s", s->version ? s->version : "");
    d->epoch = s->epoch;
    d->replica_id = s->replica_id;
    snprintf(d->shm_name, sizeof d->shm_name, "%s", s->shm_name ? s->shm_name : "");
    d->hbm_ooms = s->hbm_ooms;
    snprintf(d->accelerator_type, sizeof d->accelerator_type, "%s", s->accelerator_type ? s->accelerator_type : "");
    d->host_cpus = s->host_cpus;
    d->train_step = s->train_step;
    d->step_us = s->step_us;
    d->allreduce_us = s->allreduce_us;
    d->metrics_port = s->metrics_port;
    d->faults = s->faults;
    snprintf(d->last_fault, sizeof d->last_fault, "%s", s->last_fault ? s->last_fault : "");
    snprintf(d->boot_id, sizeof d->boot_id, "%s", s->boot_id ? s->boot_id : "");
    d->notice_kind = s->notice ? (int)s->notice->kind : 0;
    d->notice_at_ms = s->notice ? now_ms + s->notice->event_in_ms : 0;
    d->notice_window_ms = s->notice ? s->notice->window_ms : 0;
    d->notice_under_way = s->notice && s->notice->under_way;
}

void reg_winfo_view(const winfo *w, Tpuemu__WorkerInfo *o, Tpuemu__Notice *nbuf, uint64_t now_ms)
{
    tpuemu__worker_info__init(o);
    o->host_id = (char *)w->host_id;
    o->core = w->core;
    o->incarnation = w->incarnation;
    o->control_addr = (char *)w->control_addr;
    o->data_addr = (char *)w->data_addr;
    o->shm_name = (char *)w->shm_name;
    o->tpu_type = (char *)w->tpu_type;
    o->hbm_capacity = w->hbm_capacity;
    o->hbm_used = w->hbm_used;
    o->hbm_peak = w->hbm_peak;
    o->pid = w->pid;
    o->version = (char *)w->version;
    o->epoch = w->epoch;
    o->replica_id = w->replica_id;
    o->hbm_ooms = w->hbm_ooms;
    o->accelerator_type = (char *)w->accelerator_type;
    o->host_cpus = w->host_cpus;
    o->train_step = w->train_step;
    o->step_us = w->step_us;
    o->allreduce_us = w->allreduce_us;
    o->metrics_port = w->metrics_port;
    o->faults = w->faults;
    o->last_fault = (char *)w->last_fault;
    o->boot_id = (char *)w->boot_id;
    if (w->notice_kind) {
        tpuemu__notice__init(nbuf);
        nbuf->kind = (Tpuemu__NoticeKind)w->notice_kind;
        nbuf->event_in_ms = w->notice_at_ms > now_ms ? w->notice_at_ms - now_ms : 0;
        nbuf->window_ms = w->notice_window_ms;
        nbuf->under_way = w->notice_under_way != 0;
        o->notice = nbuf;
    }
}

static int key_cmp(const char *h1, int c1, const char *h2, int c2)
{
    int d = strcmp(h1, h2);
    if (d)
        return d;
    return (c1 > c2) - (c1 < c2);
}

/* First index whose key is >= (host, core). */
static size_t lower_bound(const registry *g, const char *host, int core)
{
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key_cmp(g->v[mid]->w.host_id, g->v[mid]->w.core, host, core) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

rentry *reg_lookup(const registry *g, const char *host, int core)
{
    size_t i = lower_bound(g, host, core);
    if (i < g->n && key_cmp(g->v[i]->w.host_id, g->v[i]->w.core, host, core) == 0)
        return g->v[i];
    return NULL;
}

size_t reg_host_range(const registry *g, const char *host, size_t *count)
{
    size_t i = lower_bound(g, host, -1), j = i;
    while (j < g->n && strcmp(g->v[j]->w.host_id, host) == 0)
        j++;
    *count = j - i;
    return i;
}

rentry *reg_add(registry *g, const winfo *w, uint64_t now_ms, err *e)
{
    rentry *en;
    size_t i;

    if (g->n >= g->max) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "resolver already tracks %zu cores (--max-cores)", g->n);
        return NULL;
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 16;
        rentry **nv = realloc(g->v, nc * sizeof *nv);
        if (!nv) {
            err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory adding a core");
            return NULL;
        }
        g->v = nv;
        g->cap = nc;
    }
    en = calloc(1, sizeof *en);
    if (!en) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory adding a core");
        return NULL;
    }
    en->w = *w;
    en->last_hb_ms = en->registered_ms = now_ms;
    i = lower_bound(g, w->host_id, w->core);
    memmove(&g->v[i + 1], &g->v[i], (g->n - i) * sizeof *g->v);
    g->v[i] = en;
    g->n++;
    return en;
}

void reg_set_dead(registry *g, rentry *en, int dead)
{
    if (!en->dead && dead)
        g->n_dead++;
    else if (en->dead && !dead)
        g->n_dead--;
    en->dead = dead;
}

void reg_remove(registry *g, rentry *en)
{
    size_t i = lower_bound(g, en->w.host_id, en->w.core);

    if (i >= g->n || g->v[i] != en)
        return;
    if (en->dead)
        g->n_dead--;
    memmove(&g->v[i], &g->v[i + 1], (g->n - i - 1) * sizeof *g->v);
    g->n--;
    free(en);
}

rentry *reg_longest_dead(const registry *g)
{
    rentry *best = NULL;
    for (size_t i = 0; i < g->n; i++)
        if (g->v[i]->dead && (!best || g->v[i]->last_hb_ms < best->last_hb_ms))
            best = g->v[i];
    return best;
}
