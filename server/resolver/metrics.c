/* What the resolver tells a Prometheus scrape (metrics.h): the registry's
 * cores by state, the system's epoch and whether it is initialized, and the
 * heartbeat and registration counters. */
#include "metrics.h"

#include <stdio.h>

#include "console.h"
#include "corelink.h"
#include "resolver.h"

static int render(void *user, struct httpd_req *q, hbuf *b)
{
    (void)q;
    resolver *r = user;
    uint64_t by_state[6] = {0, 0, 0, 0, 0, 0}, links = 0;
    static const struct {
        Tpuemu__CoreState st;
        const char *name;
    } states[] = {
        {TPUEMU__CORE_STATE__CORE_READY, "READY"},
        {TPUEMU__CORE_STATE__CORE_IDLE, "IDLE"},
        {TPUEMU__CORE_STATE__CORE_DEAD, "DEAD"},
        {TPUEMU__CORE_STATE__CORE_PREEMPTED, "PREEMPTED"},
        {TPUEMU__CORE_STATE__CORE_MAINTENANCE, "MAINTENANCE"},
    };

    for (size_t i = 0; i < r->reg.n; i++) {
        Tpuemu__CoreState st = sys_core_state(r, r->reg.v[i]);
        if ((int)st >= 0 && (int)st < 6)
            by_state[st]++;
        if (r->reg.v[i]->link && corelink_is_open(r->reg.v[i]->link))
            links++;
    }
    prom_family(b, "tpuemu_build_info", "gauge", "Version of the daemon serving these metrics.");
    prom_u64(b, "tpuemu_build_info", "daemon=\"resolver\",version=\"" TPUEMU_VERSION "\"", 1);
    prom_family(b, "tpuemu_resolver_cores", "gauge",
                "Cores the resolver tracks, by state (READY: in the initialized system; IDLE: alive, not in it; "
                "DEAD: missed its heartbeats; PREEMPTED: terminated by a preemption; MAINTENANCE: down for a "
                "maintenance event).");
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        char labels[32];
        snprintf(labels, sizeof labels, "state=\"%s\"", states[i].name);
        prom_u64(b, "tpuemu_resolver_cores", labels, by_state[states[i].st]);
    }
    prom_family(b, "tpuemu_resolver_core_links_open", "gauge",
                "Control connections from the resolver to cores that are open (made when a core registers and "
                "kept, so an initialize does not wait for them).");
    prom_u64(b, "tpuemu_resolver_core_links_open", NULL, links);
    prom_family(b, "tpuemu_resolver_max_cores", "gauge", "Most cores the resolver tracks (--max-cores).");
    prom_u64(b, "tpuemu_resolver_max_cores", NULL, r->max_cores);
    prom_family(b, "tpuemu_resolver_system_epoch", "gauge",
                "Epoch of the TPU system: each initialize and shutdown starts a new one.");
    prom_u64(b, "tpuemu_resolver_system_epoch", NULL, r->sys.epoch);
    prom_family(b, "tpuemu_resolver_system_initialized", "gauge", "1 while the TPU system is initialized, else 0.");
    prom_u64(b, "tpuemu_resolver_system_initialized", NULL, r->sys.initialized ? 1 : 0);
    prom_family(b, "tpuemu_resolver_heartbeats_received_total", "counter", "Heartbeats received from workers.");
    prom_u64(b, "tpuemu_resolver_heartbeats_received_total", NULL, prom_get(&r->metrics.heartbeats));
    prom_family(b, "tpuemu_resolver_registrations_total", "counter",
                "Cores registered: new ones and new incarnations of known ones.");
    prom_u64(b, "tpuemu_resolver_registrations_total", NULL, prom_get(&r->metrics.registrations));
    prom_family(b, "tpuemu_resolver_duplicate_requests_total", "counter",
                "Resent requests answered again with the original reply (the first reply was lost).");
    prom_u64(b, "tpuemu_resolver_duplicate_requests_total", NULL, prom_get(&r->metrics.duplicates));
    prom_family(b, "tpuemu_resolver_cores_forgotten_total", "counter",
                "Cores removed from the registry, by reason (left: the worker stopped cleanly; expired: dead for "
                "--forget-after-ms; operator: tpuctl forget; evicted: the longest-dead made room at --max-cores).");
    for (int i = 0; i < FORGET_REASONS; i++) {
        char labels[32];
        snprintf(labels, sizeof labels, "reason=\"%s\"", rsv_forget_reason_name((enum forget_reason)i));
        prom_u64(b, "tpuemu_resolver_cores_forgotten_total", labels, prom_get(&r->metrics.forgotten[i]));
    }
    prom_family(b, "tpuemu_resolver_heartbeat_interval_seconds", "gauge",
                "Heartbeat interval the workers are told to use (--heartbeat-ms).");
    hbuf_printf(b, "tpuemu_resolver_heartbeat_interval_seconds %.3f\n", r->heartbeat_ms / 1000.0);
    return 200;
}

static int health(void *user, struct httpd_req *q, hbuf *b)
{
    (void)q;
    resolver *r = user;
    if (r->stopping) {
        hbuf_printf(b, "stopping\n");
        return 503;
    }
    hbuf_printf(b, "ok\n");
    return 200;
}

/* The resolver is ready when it is alive: it needs nobody else to serve.
 * The rest is the cluster console (console.h). */
static const struct httpd_route routes[] = {
    {"/metrics", PROM_CONTENT_TYPE, render},
    {"/healthz", "text/plain; charset=utf-8", health},
    {"/readyz", "text/plain; charset=utf-8", health},
    {"/", "text/html; charset=utf-8", console_page},
    {"/console.js", "text/javascript; charset=utf-8", console_script},
    {"/console.css", "text/css; charset=utf-8", console_style},
    {"/api/cluster", "application/json", console_api},
};

int rm_start(resolver *r, const char *host, int port, err *e)
{
    if (port == 0)
        return CODE_OK;
    return httpd_start(r->loop, "metrics", host, port, routes, sizeof routes / sizeof routes[0], r,
                       &r->metrics.httpd, e);
}

void rm_stop(resolver *r)
{
    httpd_close(r->metrics.httpd);
    r->metrics.httpd = NULL;
}
