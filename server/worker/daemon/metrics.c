/* What a worker tells a Prometheus scrape (metrics.h): its training steps and
 * their time, the collectives it ran and the bytes it all-reduced, its HBM,
 * its heartbeats and the system epoch it is in; whether it is alive
 * (/healthz) and whether it is ready to serve (/readyz); its last log lines
 * (/log, what the cluster console's tiles link to). */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"

/* the log lines a worker with a metrics port keeps for /log: the last 100 or so */
#define WM_LOG_KEEP (32u << 10)

static int registered(const struct heartbeat *hb)
{
    return hb->registered && !hb->unreachable && !hb->last_error;
}

static int render(void *user, struct httpd_req *q, hbuf *b)
{
    (void)q;
    const struct wm_env *w = user;
    static const char *const kinds[COLL_STAT_KINDS] = {NULL, "all-reduce", "broadcast", "all-gather",
                                                       "reduce-scatter"};
    char host[2 * IDENT_HOST_ID_MAX + 2], id[160], l[200];

    prom_escape(w->id->host_id, host, sizeof host);
    if (w->id->core >= 0)
        snprintf(id, sizeof id, "host=\"%s\",core=\"%d\"", host, w->id->core);
    else
        snprintf(id, sizeof id, "host=\"%s\",core=\"\"", host);
    prom_family(b, "tpuemu_build_info", "gauge", "Version of the daemon serving these metrics.");
    prom_u64(b, "tpuemu_build_info", "daemon=\"worker\",version=\"" TPUEMU_VERSION "\"", 1);
    prom_family(b, "tpuemu_worker_train_steps_total", "counter",
                "Training steps this core ran to the end (gradients all-reduced).");
    prom_u64(b, "tpuemu_worker_train_steps_total", id, prom_get(&w->train->steps));
    prom_family(b, "tpuemu_worker_step_seconds", "histogram",
                "Time of each training step on this core: the optimizer update before it, forward, backward "
                "and the gradient all-reduce.");
    prom_hist_write(b, "tpuemu_worker_step_seconds", id, &w->train->step_seconds);
    prom_family(b, "tpuemu_worker_allreduce_bytes_total", "counter",
                "Bytes of this core's input to every all-reduce it completed (once per iteration).");
    prom_u64(b, "tpuemu_worker_allreduce_bytes_total", id, prom_get(&w->coll->allreduce_bytes));
    prom_family(b, "tpuemu_worker_collectives_total", "counter",
                "Collectives this core completed, by kind (training's gradient all-reduces included).");
    for (int k = 1; k < COLL_STAT_KINDS; k++) {
        snprintf(l, sizeof l, "%s,kind=\"%s\"", id, kinds[k]);
        prom_u64(b, "tpuemu_worker_collectives_total", l, prom_get(&w->coll->done[k]));
    }
    prom_family(b, "tpuemu_worker_collectives_failed_total", "counter", "Collectives that failed on this core.");
    prom_u64(b, "tpuemu_worker_collectives_failed_total", id, prom_get(&w->coll->failed));
    prom_family(b, "tpuemu_worker_hbm_used_bytes", "gauge", "HBM this core has allocated now.");
    prom_u64(b, "tpuemu_worker_hbm_used_bytes", id, w->hbm->used);
    prom_family(b, "tpuemu_worker_hbm_capacity_bytes", "gauge", "HBM capacity of this core.");
    prom_u64(b, "tpuemu_worker_hbm_capacity_bytes", id, w->hbm->capacity);
    prom_family(b, "tpuemu_worker_hbm_peak_bytes", "gauge", "Most HBM allocated at once since the last initialize.");
    prom_u64(b, "tpuemu_worker_hbm_peak_bytes", id, w->hbm->peak);
    prom_family(b, "tpuemu_worker_heartbeats_sent_total", "counter", "Heartbeats sent to the resolver.");
    prom_u64(b, "tpuemu_worker_heartbeats_sent_total", id, prom_get(&w->hb->sent));
    prom_family(b, "tpuemu_worker_heartbeats_acked_total", "counter", "Heartbeats the resolver accepted.");
    prom_u64(b, "tpuemu_worker_heartbeats_acked_total", id, prom_get(&w->hb->acked));
    prom_family(b, "tpuemu_worker_registered", "gauge",
                "1 while the resolver accepts this core's heartbeats (the /readyz condition), else 0.");
    prom_u64(b, "tpuemu_worker_registered", id, registered(w->hb) ? 1 : 0);
    prom_family(b, "tpuemu_worker_system_epoch", "gauge", "System epoch of this core's last reset; 0: never reset.");
    prom_u64(b, "tpuemu_worker_system_epoch", id, w->id->epoch);
    prom_family(b, "tpuemu_worker_faults_injected_total", "counter",
                "Faults injected into this core (tpuctl chaos), by kind.");
    for (int k = 1; k < FAULT_KINDS; k++) {
        char labels[64];
        snprintf(labels, sizeof labels, "kind=\"%s\"", fault_kind_name(k));
        prom_u64(b, "tpuemu_worker_faults_injected_total", labels, prom_get(&w->fault->injected[k]));
    }
    prom_family(b, "tpuemu_worker_replica_id", "gauge",
                "This core's replica in the initialized system; -1 when it is not part of one.");
    prom_i64(b, "tpuemu_worker_replica_id", id, w->id->replica_id);
    return 200;
}

/* Liveness: the loop answers (this runs on it) and the ports listen. Nothing
 * outside the process counts: a resolver outage must not get a worker
 * restarted, which a liveness probe that failed would. */
static int live(const struct wm_env *w, hbuf *b)
{
    if (*w->stopping) {
        hbuf_printf(b, "stopping\n");
        return 503;
    }
    if (!w->ctl->started || !w->dp->started) {
        hbuf_printf(b, "the control or data-plane port is not listening\n");
        return 503;
    }
    return 200;
}

static int health(void *user, struct httpd_req *q, hbuf *b)
{
    (void)q;
    int st = live(user, b);
    if (st == 200)
        hbuf_printf(b, "ok\n");
    return st;
}

/* Readiness: alive, and registered with a resolver that accepts its heartbeats. */
static int ready(void *user, struct httpd_req *q, hbuf *b)
{
    (void)q;
    const struct wm_env *w = user;
    const struct heartbeat *hb = w->hb;
    int st = live(w, b);

    if (st != 200)
        return st;
    if (!hb->registered) {
        hbuf_printf(b, "not registered with the resolver at %s yet\n", w->resolver_url);
        return 503;
    }
    if (hb->unreachable) {
        hbuf_printf(b, "the resolver at %s has not answered the last %u heartbeats\n", w->resolver_url,
                    hb->unanswered);
        return 503;
    }
    if (hb->last_error) {
        hbuf_printf(b, "the resolver at %s refused the last heartbeat (%s)\n", w->resolver_url,
                    code_name(hb->last_error));
        return 503;
    }
    hbuf_printf(b, "ok\n");
    return 200;
}

/* The worker's last log lines, oldest first, as its stderr has them. */
static int last_log(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user, (void)q;
    char *buf = malloc(WM_LOG_KEEP + 1);
    if (!buf) {
        hbuf_printf(b, "out of memory for the log lines\n");
        return 500;
    }
    hbuf_put(b, buf, log_kept(buf, WM_LOG_KEEP + 1));
    free(buf);
    return 200;
}

static const struct httpd_route routes[] = {
    {"/metrics", PROM_CONTENT_TYPE, render},
    {"/healthz", "text/plain; charset=utf-8", health},
    {"/readyz", "text/plain; charset=utf-8", ready},
    {"/log", "text/plain; charset=utf-8", last_log},
};

int wm_start(struct wmetrics *m, const struct wm_env *env, int port, err *e)
{
    m->env = *env;
    m->port = port;
    m->httpd = NULL;
    if (!port)
        return CODE_OK;
    log_keep(WM_LOG_KEEP);
    return httpd_start(env->loop, "metrics", env->listen, port, routes, sizeof routes / sizeof routes[0], &m->env,
                       &m->httpd, e);
}

void wm_stop(struct wmetrics *m)
{
    httpd_close(m->httpd);
    m->httpd = NULL;
}
