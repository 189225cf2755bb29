/* tpuctl's core selection (--host, --state) and per-host roll-up. */
#define _POSIX_C_SOURCE 200809L
#include "select.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    tpu_core_state st;
} state_names[] = {{"READY", TPU_CORE_READY},         {"IDLE", TPU_CORE_IDLE},
                   {"DEAD", TPU_CORE_DEAD},           {"PREEMPTED", TPU_CORE_PREEMPTED},
                   {"MAINTENANCE", TPU_CORE_MAINTENANCE}};

static int parse_states(core_select *s, const char *states, char *msg, size_t msg_len)
{
    const char *p = states;
    while (*p) {
        size_t len = strcspn(p, ","), i;
        for (i = 0; i < sizeof state_names / sizeof state_names[0]; i++)
            if (len == strlen(state_names[i].name) && strncasecmp(p, state_names[i].name, len) == 0)
                break;
        if (i == sizeof state_names / sizeof state_names[0]) {
            snprintf(msg, msg_len, "--state: '%.*s' is not a core state (READY, IDLE, DEAD, PREEMPTED or MAINTENANCE)",
                     (int)(len > 64 ? 64 : len), p);
            return -1;
        }
        s->states |= 1u << state_names[i].st;
        p += len;
        if (*p == ',')
            p++;
    }
    if (!s->states) {
        snprintf(msg, msg_len, "--state: give READY, IDLE, DEAD, PREEMPTED or MAINTENANCE (a comma list)");
        return -1;
    }
    return 0;
}

static int parse_hosts(core_select *s, const char *hosts, char *msg, size_t msg_len)
{
    char *p, *save = NULL;
    if (strlen(hosts) >= sizeof s->buf) {
        snprintf(msg, msg_len, "--host: the list is longer than %zu characters", sizeof s->buf - 1);
        return -1;
    }
    memcpy(s->buf, hosts, strlen(hosts) + 1);
    for (p = strtok_r(s->buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (s->nhost == SELECT_MAX_HOSTS) {
            snprintf(msg, msg_len, "--host: more than %d hosts or patterns; use a pattern like 'h1*'",
                     SELECT_MAX_HOSTS);
            return -1;
        }
        s->host[s->nhost++] = p;
    }
    if (!s->nhost) {
        snprintf(msg, msg_len, "--host: give a host id or pattern (a comma list)");
        return -1;
    }
    return 0;
}

int select_parse(core_select *s, const char *hosts, const char *states, char *msg, size_t msg_len)
{
    memset(s, 0, sizeof *s);
    if (states && parse_states(s, states, msg, msg_len) < 0)
        return -1;
    if (hosts && parse_hosts(s, hosts, msg, msg_len) < 0)
        return -1;
    return 0;
}

int select_active(const core_select *s)
{
    return s->nhost || s->states;
}

int select_match(const core_select *s, const tpu_core_info *ci)
{
    size_t i;
    if (s->states && !(s->states & (1u << (ci->state & 31))))
        return 0;
    if (!s->nhost)
        return 1;
    for (i = 0; i < s->nhost; i++)
        if (fnmatch(s->host[i], ci->host_id, 0) == 0)
            return 1;
    return 0;
}

size_t select_by_host(const core_select *sel, const tpu_cluster_spec *s, host_sum **out)
{
    size_t n = tpu_cluster_spec_num_cores(s), nh = 0;
    host_sum *h = calloc(n ? n : 1, sizeof *h);
    tpu_core_info ci;

    if (!h) {
        fprintf(stderr, "tpuctl: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        tpu_cluster_spec_core(s, i, &ci);
        if (!select_match(sel, &ci))
            continue;
        if (!nh || strcmp(h[nh - 1].host, ci.host_id) != 0)
            h[nh++].host = ci.host_id;
        host_sum *x = &h[nh - 1];
        x->cores++;
        x->state[(unsigned)ci.state < TPU_CORE_STATES ? ci.state : TPU_CORE_UNKNOWN]++;
        x->hbm_used += ci.hbm_used;
        x->hbm_capacity += ci.hbm_capacity;
        if (ci.heartbeat_age_ms > x->max_heartbeat_age_ms)
            x->max_heartbeat_age_ms = ci.heartbeat_age_ms;
    }
    *out = h;
    return nh;
}
