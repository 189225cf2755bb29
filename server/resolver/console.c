/* The cluster console (console.h) on the resolver's metrics port: the page
 * (index.html, console.js, console.css, built into the daemon) and the data it
 * polls, GET /api/cluster[?since=N]: every core the registry tracks with its
 * state, Cloud TPU health, HBM and last training step as its heartbeats told
 * them, the system's epoch and topology, and the events after number N.
 *
 * The page polls rather than streams (Server-Sent Events): the server answers
 * one request per connection within its deadlines and holds no connection
 * open, so a page left open costs nothing between polls, cannot take one of
 * the HTTPD_MAX_CONNS, and finds a restarted resolver by its next poll; and a
 * poll carries the console key in an Authorization header, which an
 * EventSource cannot send. */
#include "console.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resolver.h"
#include "topology.h"
#include "wire.h"

struct embedded_file {
    const char *name;
    const unsigned char *p;
    size_t n;
};
extern const struct embedded_file console_assets[];

/* A JSON string: quotes, backslashes and control bytes escaped, and '<' too
 * (the text is a host id or a message: never markup). */
static void jstr(hbuf *b, const char *s)
{
    char chunk[256];
    size_t k = 0;

    chunk[k++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (k > sizeof chunk - 8) {
            hbuf_put(b, chunk, k);
            k = 0;
        }
        if (*p == '"' || *p == '\\') {
            chunk[k++] = '\\';
            chunk[k++] = (char)*p;
        } else if (*p < 0x20 || *p == '<' || *p == '>' || *p == '&' || *p == 0x7f) {
            k += (size_t)snprintf(chunk + k, 8, "\\u%04x", *p);
        } else {
            chunk[k++] = (char)*p;
        }
    }
    chunk[k++] = '"';
    hbuf_put(b, chunk, k);
}

static const char *state_name(Tpuemu__CoreState st)
{
    switch (st) {
    case TPUEMU__CORE_STATE__CORE_READY:
        return "READY";
    case TPUEMU__CORE_STATE__CORE_IDLE:
        return "IDLE";
    case TPUEMU__CORE_STATE__CORE_DEAD:
        return "DEAD";
    case TPUEMU__CORE_STATE__CORE_PREEMPTED:
        return "PREEMPTED";
    case TPUEMU__CORE_STATE__CORE_MAINTENANCE:
        return "MAINTENANCE";
    default:
        return "UNSPECIFIED";
    }
}

/* As tpu_cluster_spec_core_health() tells it (Cloud TPU's health names). */
static const char *health_name(const resolver *r, const rentry *en, Tpuemu__CoreState st)
{
    switch (st) {
    case TPUEMU__CORE_STATE__CORE_DEAD:
        return "TIMEOUT";
    case TPUEMU__CORE_STATE__CORE_PREEMPTED:
        return "HEALTH_UNSPECIFIED";
    case TPUEMU__CORE_STATE__CORE_MAINTENANCE:
        return "UNHEALTHY_MAINTENANCE";
    case TPUEMU__CORE_STATE__CORE_IDLE:
        if (r->sys.initialized)
            return "UNHEALTHY_TENSORFLOW";
        break;
    default:
        break;
    }
    (void)en;
    return "HEALTHY";
}

/* "http://HOST:PORT/PAGE" (PAGE: metrics, log) of the core's worker from its
 * control address (tcp://HOST:PORT) and its metrics port; "" when it has none. */
static void metrics_url(const winfo *w, const char *page, char *out, size_t n)
{
    const char *h = w->control_addr, *colon;
    out[0] = '\0';
    if (!w->metrics_port || strncmp(h, "tcp://", 6) != 0)
        return;
    h += 6;
    if (!(colon = strrchr(h, ':')) || colon == h)
        return;
    snprintf(out, n, "http://%.*s:%u/%s", (int)(colon - h), h, w->metrics_port, page);
}

/* since=N (digits only, at most 19 of them), or nothing. 0 or 400. */
static int parse_query(const char *q, uint64_t *since)
{
    *since = 0;
    if (!*q)
        return 0;
    if (strncmp(q, "since=", 6) != 0)
        return 400;
    q += 6;
    if (!*q || strlen(q) > 19)
        return 400;
    for (const char *p = q; *p; p++)
        if (*p < '0' || *p > '9')
            return 400;
    *since = strtoull(q, NULL, 10);
    return 0;
}

/* The console key in "Authorization: Bearer KEY" when the cluster has a
 * token; without one, anyone who reaches the port may read (as /metrics). */
static int authorized(const resolver *r, const struct httpd_req *q)
{
    const char *a = q->authorization;
    size_t n;
    if (!r->auth.enabled)
        return 1;
    if (!a || strncmp(a, "Bearer ", 7) != 0)
        return 0;
    a += 7;
    n = strlen(a);
    while (n && (a[n - 1] == ' ' || a[n - 1] == '\t'))
        n--;
    return auth_console_key_ok(&r->auth, a, n);
}

int console_api(void *user, struct httpd_req *q, hbuf *b)
{
    resolver *r = user;
    uint64_t since, now = wire_now_ms();
    size_t hosts = 0, ready = 0;
    const char *type = "", *slice = "";
    char url[300];
    unsigned shape[4] = {0, 0, 0, 0};

    if (parse_query(q->query, &since)) {
        q->content_type = "text/plain; charset=utf-8";
        hbuf_printf(b, "400 Bad Request: the query is since=N (an event number), or nothing\n");
        return 400;
    }
    if (!authorized(r, q)) {
        q->content_type = "text/plain; charset=utf-8";
        q->extra_headers = "WWW-Authenticate: Bearer realm=\"tpuemu console\"\r\n";
        hbuf_printf(b, "401 Unauthorized: this cluster has a token; open the URL `tpuctl console` prints (its "
                       "#key=... is the console key)\n");
        return 401;
    }
    size_t in_system = 0;
    for (size_t i = 0; i < r->reg.n; i++) {
        const rentry *en = r->reg.v[i];
        if (!i || strcmp(en->w.host_id, r->reg.v[i - 1]->w.host_id) != 0)
            hosts++;
        if (sys_core_state(r, en) == TPUEMU__CORE_STATE__CORE_READY)
            ready++;
        /* the system's cores, those lost since included: its mesh stays */
        if (r->sys.initialized && en->w.epoch == r->sys.epoch && en->w.replica_id >= 0) {
            in_system++;
            type = en->w.tpu_type;
            slice = en->w.accelerator_type;
        } else if (!*type) {
            type = en->w.tpu_type;
            slice = en->w.accelerator_type;
        }
    }
    if (*type && r->reg.n)
        topo_mesh(type, (unsigned)(in_system ? in_system : r->reg.n), shape);
    hbuf_printf(b, "{\"run\":%" PRIu64 ",\"name\":", r->events.run);
    jstr(b, r->tpu_name);
    hbuf_printf(b, ",\"version\":\"%s\",\"epoch\":%" PRIu64 ",\"initialized\":%s,\"owner\":", TPUEMU_VERSION,
                r->sys.epoch, r->sys.initialized ? "true" : "false");
    jstr(b, r->sys.initialized ? r->sys.owner : "");
    hbuf_printf(b, ",\"tpu_type\":");
    jstr(b, type);
    hbuf_printf(b, ",\"slice\":");
    jstr(b, slice);
    hbuf_printf(b,
                ",\"hosts\":%zu,\"ready\":%zu,\"mesh\":[%u,%u,%u,%u],\"heartbeat_ms\":%u,\"dead_ms\":%" PRIu64
                ",\"cores\":[",
                hosts, ready, shape[0], shape[1], shape[2], shape[3], r->heartbeat_ms, rsv_dead_ms(r));
    for (size_t i = 0; i < r->reg.n; i++) {
        const rentry *en = r->reg.v[i];
        const winfo *w = &en->w;
        Tpuemu__CoreState st = sys_core_state(r, en);
        const char *notice = "";
        char nb[80];

        if (w->notice_kind && !w->notice_under_way && !en->dead) {
            snprintf(nb, sizeof nb, "%s in %.1f s",
                     w->notice_kind == TPUEMU__NOTICE_KIND__NOTICE_PREEMPTION ? "preemption" : "maintenance",
                     w->notice_at_ms > now ? (double)(w->notice_at_ms - now) / 1000.0 : 0.0);
            notice = nb;
        }
        hbuf_printf(b, "%s{\"host\":", i ? ",\n" : "\n");
        jstr(b, w->host_id);
        hbuf_printf(b,
                    ",\"core\":%d,\"state\":\"%s\",\"health\":\"%s\",\"replica\":%d,\"pid\":%u,\"hbm_used\":%" PRIu64
                    ",\"hbm_capacity\":%" PRIu64 ",\"hbm_peak\":%" PRIu64 ",\"hbm_ooms\":%u,\"step\":%" PRIu64
                    ",\"step_us\":%u,\"allreduce_us\":%u,\"heartbeat_age_ms\":%" PRIu64 ",\"notice\":",
                    w->core, state_name(st), health_name(r, en, st), w->replica_id, w->pid, w->hbm_used,
                    w->hbm_capacity, w->hbm_peak, w->hbm_ooms, w->train_step, w->step_us, w->allreduce_us,
                    now > en->last_hb_ms ? now - en->last_hb_ms : 0);
        jstr(b, notice);
        metrics_url(w, "metrics", url, sizeof url);
        hbuf_printf(b, ",\"metrics\":");
        jstr(b, url);
        metrics_url(w, "log", url, sizeof url);
        hbuf_printf(b, ",\"log\":");
        jstr(b, url);
        hbuf_printf(b, "}");
    }
    hbuf_printf(b, "],\"events\":[");
    {
        const struct rsv_events *ev = &r->events;
        uint64_t first = ev->next_seq > RSV_EVENTS ? ev->next_seq - RSV_EVENTS : 1;
        int any = 0;
        if (since + 1 > first)
            first = since + 1;
        for (uint64_t s = first; s < ev->next_seq; s++) {
            const struct rsv_event *e = &ev->v[(s - 1) % RSV_EVENTS];
            hbuf_printf(b, "%s{\"seq\":%" PRIu64 ",\"unix_ms\":%" PRIu64 ",\"kind\":", any ? ",\n" : "\n", e->seq,
                        e->unix_ms);
            jstr(b, e->kind);
            hbuf_printf(b, ",\"core\":");
            jstr(b, e->core);
            hbuf_printf(b, ",\"text\":");
            jstr(b, e->text);
            hbuf_printf(b, "}");
            any = 1;
        }
    }
    hbuf_printf(b, "],\"next\":%" PRIu64 "}\n", r->events.next_seq);
    return 200;
}

static int asset(hbuf *b, const char *name)
{
    for (const struct embedded_file *f = console_assets; f->name; f++)
        if (!strcmp(f->name, name)) {
            hbuf_put(b, f->p, f->n);
            return 200;
        }
    hbuf_printf(b, "404 Not Found: this resolver was built without %s\n", name);
    return 404;
}

int console_page(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    if (*q->query) { /* the key travels in the fragment, which a browser never sends */
        q->content_type = "text/plain; charset=utf-8";
        hbuf_printf(b, "400 Bad Request: the console page takes no query\n");
        return 400;
    }
    q->extra_headers = "Content-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\n"
                       "X-Content-Type-Options: nosniff\r\n";
    return asset(b, "index.html");
}

int console_script(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    (void)q;
    return asset(b, "console.js");
}

int console_style(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    (void)q;
    return asset(b, "console.css");
}
