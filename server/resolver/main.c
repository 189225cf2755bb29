/* tpu-resolver: the emulator's TPUClusterResolver. Tracks the workers (one per
 * emulated core) through their heartbeats, answers cluster-spec requests, and
 * runs the TPU system's initialize/shutdown. main.c reads the settings, starts
 * the loop in stages and has the one cleanup path. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "addr.h"
#include "config.h"
#include "corelink.h"
#include "fdlimit.h"
#include "httpd.h"
#include "log.h"
#include "memtrim.h"
#include "resolver.h"

struct settings {
    const char *listen, *token_file, *log_level, *name;
    int insecure, probe, probe_ready;
    long long heartbeat_ms, dead_after, max_cores, forget_after_ms, metrics_port;
};

/* A Cloud TPU node name: a lowercase letter, then lowercase letters, digits and hyphens. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63 || s[0] < 'a' || s[0] > 'z')
        return 0;
    return strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

static int parse_settings(int argc, char **argv, struct settings *st)
{
    const struct opt table[] = {
        {"listen", "TPUEMU_LISTEN", OPT_STRING, "127.0.0.1:8470", 0, 0, "ADDR:PORT",
         "address to accept workers and clients on", &st->listen},
        {"name", "TPUEMU_TPU_NAME", OPT_STRING, NULL, 0, 0, "NAME",
         "the TPU node name of this cluster, as Cloud TPU names a node: a client whose TPU_NAME is "
         "this bare name finds the cluster here; any other name is NOT_FOUND (1..63 of a-z 0-9 -, "
         "starting with a letter)", &st->name},
        {"token-file", "TPUEMU_TOKEN_FILE", OPT_STRING, NULL, 0, 0, "FILE",
         "cluster token file (else $TPUEMU_TOKEN; none: no authentication)", &st->token_file},
        {"insecure", "TPUEMU_INSECURE", OPT_BOOL, NULL, 0, 0, NULL,
         "allow a non-loopback --listen without a cluster token", &st->insecure},
        {"heartbeat-ms", "TPUEMU_HEARTBEAT_MS", OPT_INT, "1000", 50, 60000, "MS",
         "heartbeat interval the workers are told to use", &st->heartbeat_ms},
        {"dead-after", "TPUEMU_DEAD_AFTER", OPT_INT, "3", 1, 100, "N",
         "missed heartbeats after which a core is dead", &st->dead_after},
        {"max-cores", "TPUEMU_MAX_CORES", OPT_INT, "1024", 1, 4096, "N",
         "most cores the resolver tracks; when full, the core dead for longest makes room for a new one",
         &st->max_cores},
        {"forget-after-ms", "TPUEMU_FORGET_AFTER_MS", OPT_INT, "300000", 0, 604800000, "MS",
         "forget a dead core once its last heartbeat is this old (it is no longer listed, nor "
         "named as missing by an initialize); 0: never", &st->forget_after_ms},
        {"metrics-port", "TPUEMU_METRICS_PORT", OPT_INT, "0", 0, 65535, "PORT",
         "serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this port of the --listen "
         "host; 0: off", &st->metrics_port},
        {"probe", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "liveness check: GET /healthz on the metrics port of the --listen host and exit 0 if it answers 200, "
         "1 if not, 2 without a metrics port", &st->probe},
        {"probe-ready", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "readiness check: GET /readyz the same way (the resolver is ready while it serves)",
         &st->probe_ready},
        {"log-level", "TPUEMU_LOG_LEVEL", OPT_STRING, "info", 0, 0, "LEVEL",
         "debug, info, warn or error", &st->log_level},
    };
    const size_t n = sizeof table / sizeof *table;
    int first = 0, rc;
    err e;

    opt_man_page("tpu-resolver", 8, "the cluster resolver of a tpuemu cluster");
    rc = opt_parse(table, n, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(table, n, "tpu-resolver [OPTIONS]",
                  "Registry of TPU workers, their health and topology; initializes and shuts "
                  "down the TPU system.");
        opt_man_section("LOGGING", "One logfmt line per event on stderr: ts=... level=info daemon=resolver pid=... "
                                   "msg=\"...\" and the event's fields.");
        opt_man_section("SIGNALS", "SIGTERM or SIGINT: stop cleanly (exit 0).");
        opt_man_section("EXIT STATUS",
                        "0: stopped by SIGTERM or SIGINT; --probe and --probe-ready: the check passed.\n\n"
                        "1: a failure at start (a port that cannot be bound, ...); --probe and --probe-ready: "
                        "the check failed, the reason on stderr.\n\n"
                        "2: a bad flag or environment value, named in the message; --probe without a metrics port.");
        opt_man_section("EXAMPLES", "On one machine, for a TPU named my-tpu:\n"
                                    "  tpu-resolver --name my-tpu\n\n"
                                    "For workers on other machines, with a cluster token:\n"
                                    "  tpu-resolver --listen 0.0.0.0:8470 --token-file token");
        opt_man_section("SEE ALSO", "tpu-resolver(8), tpu-worker(8), tpu-slice(8), tpuctl(1); the manual in the "
                                    "project's docs/ directory (docs/operations/daemons.md for every setting).");
        return 0;
    }
    if (rc != CODE_OK) {
        fprintf(stderr, "tpu-resolver: %s\n", e.msg);
        return 2;
    }
    if (first < argc) {
        fprintf(stderr, "tpu-resolver: unexpected argument '%s' (see --help)\n", argv[first]);
        return 2;
    }
    if (st->name && *st->name && !valid_name(st->name)) {
        fprintf(stderr, "tpu-resolver: --name: '%s' is not a TPU name: 1 to 63 characters of a-z, 0-9 "
                        "and -, starting with a letter (as Cloud TPU names nodes)\n", st->name);
        return 2;
    }
    if (log_level_parse(st->log_level) < 0) {
        fprintf(stderr, "tpu-resolver: --log-level: '%s' is not one of debug, info, warn, error\n",
                st->log_level);
        return 2;
    }
    return -1;
}

/* sprep's vouch: a request that proves its sender holds the cluster token. */
static int vouch(void *data, const uint8_t *buf, size_t len)
{
    return wire_vouches(&((resolver *)data)->auth, buf, len);
}

/* The control port's connection budget from the open-file limit: each core's
 * link costs a descriptor (its TCP connection), the metrics port up to 2 x
 * its slots, and some are the process's own; connections get the rest, at
 * least half of what is left, and the links what connections leave. */
static void conn_budget(long nofile, uint32_t max_cores, int metrics, unsigned *trusted, unsigned *untrusted,
                        unsigned *links)
{
    long avail = nofile - 64 - (metrics ? 2 * HTTPD_MAX_CONNS : 0), u, t;

    if (avail < 32)
        avail = 32;
    /* not yet authenticated: room for every core to connect at once (all
     * workers restarting: each connection is untrusted until its first
     * message, which a starved process may send seconds later), at most a
     * quarter of the descriptors */
    u = (long)max_cores + 64 < 256 ? 256 : (long)max_cores + 64;
    if (u > avail / 4)
        u = avail / 4;
    if (u < 8)
        u = 8;
    t = avail - u - (long)max_cores;
    if (t < avail / 2)
        t = avail / 2;
    if (t > 65536)
        t = 65536;
    *trusted = (unsigned)t;
    *untrusted = (unsigned)u;
    *links = avail - u - t >= 1 ? (unsigned)(avail - u - t) : 1;
}

static void on_signal(uv_signal_t *h, int signum)
{
    resolver *r = h->data;

    if (r->stopping)
        return;
    r->stopping = 1;
    log_info("stopping", "signal=%d", signum);
    uv_timer_stop(&r->dead_timer);
    uv_close((uv_handle_t *)&r->dead_timer, NULL);
    uv_timer_stop(&r->fault_timer);
    uv_close((uv_handle_t *)&r->fault_timer, NULL);
    sys_stop(r);
    rm_stop(r);
    rsv_stop_claims(r);
    for (size_t i = 0; i < r->reg.n; i++)
        rsv_drop_link(r->reg.v[i]);
    sprep_close(r->rep);
    r->rep = NULL;
    uv_close((uv_handle_t *)&r->sigint, NULL);
    uv_close((uv_handle_t *)&r->sigterm, NULL);
}

static void on_dead_timer(uv_timer_t *t)
{
    resolver *r = t->data;
    /* the clock the ages are measured by, read now: the loop's cached time
     * may be from before a stop that came between its update and this call */
    uint64_t now = wire_now_ms(), last = r->dead_timer_ms;

    r->dead_timer_ms = now;
    /* Running a whole heartbeat late means this process did not run (a
     * stopped or starved resolver): the heartbeats of that time are waiting
     * in its sockets, and libuv runs timers before it reads them. The check
     * waits for the next round, after they are read, instead of declaring
     * every core dead. */
    if (now - last > r->heartbeat_flag_ms / 2 + r->heartbeat_flag_ms) {
        log_info("dead-core check deferred: the resolver itself did not run", "late_ms=%llu",
                 (unsigned long long)(now - last - r->heartbeat_flag_ms / 2));
    } else {
        rsv_machine_update(r);
        sys_dead_check(r, now);
    }
    rsv_expire(t->data);
    log_flush_suppressed(0); /* a flood of refusals that stopped is summed up */
    mem_trim_every(now, &r->trim_ms, MEM_TRIM_PERIOD_MS);
}

int main(int argc, char **argv)
{
    struct settings st;
    resolver r;
    uv_loop_t loop;
    addr la;
    err e;
    int rc, port = 0, status = 1;
    long nofile;
    unsigned max_trusted, max_untrusted, max_links;
    int loop_ok = 0, started = 0;
    char shown[300];

    memset(&st, 0, sizeof st);
    if ((rc = parse_settings(argc, argv, &st)) >= 0)
        return rc;
    memset(&r, 0, sizeof r);
    log_init("resolver", (enum log_level)log_level_parse(st.log_level));
    auth_global_init();
    if (addr_parse(st.listen, ADDR_DEFAULT_PORT, &la, &e) != CODE_OK) {
        fprintf(stderr, "tpu-resolver: --listen: %s\n", e.msg);
        return 2;
    }
    if (st.probe || st.probe_ready)
        return httpd_probe_main("tpu-resolver", la.host, (int)st.metrics_port, st.probe ? "/healthz" : "/readyz");
    if (auth_load(&r.auth, st.token_file, &e) != CODE_OK) {
        fprintf(stderr, "tpu-resolver: %s\n", e.msg);
        return 2;
    }
    if (r.auth.warning[0])
        fprintf(stderr, "tpu-resolver: warning: %s\n", r.auth.warning);
    addr_format(la.host, la.port, shown, sizeof shown);
    if (!r.auth.enabled && !addr_is_loopback(la.host) && !st.insecure) {
        fprintf(stderr, "tpu-resolver: refusing to listen on %s without a cluster token: give "
                "--token-file (or $TPUEMU_TOKEN), or --insecure to allow it\n", shown);
        return 2;
    }
    rsv_events_init(&r.events);
    r.heartbeat_ms = r.heartbeat_flag_ms = (uint32_t)st.heartbeat_ms;
    r.dead_after = (uint32_t)st.dead_after;
    r.max_cores = (uint32_t)st.max_cores;
    r.forget_after_ms = (uint64_t)st.forget_after_ms;
    snprintf(r.tpu_name, sizeof r.tpu_name, "%s", st.name ? st.name : "");
    reg_init(&r.reg, (size_t)st.max_cores);
    signal(SIGPIPE, SIG_IGN);
    /* every core: its link and its worker's connection; clients; the metrics port */
    nofile = fdlimit_raise("resolver", 65536, 2 * (long)st.max_cores + 256 + 64 + 2 * HTTPD_MAX_CONNS);
    conn_budget(nofile, r.max_cores, st.metrics_port != 0, &max_trusted, &max_untrusted, &max_links);
    corelink_set_max_sockets(max_links);

    /* stage 1: loop and replay cache */
    if (uv_loop_init(&loop) != 0) {
        log_error("cannot start the event loop", NULL);
        goto out;
    }
    loop_ok = 1;
    r.loop = &loop;
    if (!(r.replay = replay_new(16384)) ||
        !(r.drc = drc_new(16384, 4u << 20, AUTH_WINDOW_MS, sprep_ctl_free))) {
        log_error("out of memory", NULL);
        goto out;
    }
    /* the replay cache starts empty: a message sent before this start (a
     * replay of one the previous process accepted, within the window) is
     * refused; workers and clients go on with fresh ones */
    replay_refuse_before(r.replay, wire_now_unix_ms());
    /* stage 2: the listening socket */
    {
        struct sprep_cfg sc = {
            .name = "control",
            .max_msg = WIRE_MAX_REQUEST,
            .max_pending = 4 * WIRE_MAX_REPLY,
            .max_trusted = max_trusted,
            .max_untrusted = max_untrusted,
            .untrusted_ms = RSV_UNTRUSTED_MS,
            .idle_ms = 2 * r.heartbeat_ms * r.dead_after > RSV_IDLE_MS ? 2 * r.heartbeat_ms * r.dead_after
                                                                       : RSV_IDLE_MS,
            .on_msg = rsv_on_request,
            .vouch = vouch,
            .data = &r,
        };
        if (sprep_start(&loop, la.host, la.port, &sc, &r.rep, &port, &e) != CODE_OK) {
            log_error("cannot listen", "listen=%s reason=%s", log_q(shown), log_q(e.msg));
            fprintf(stderr, "tpu-resolver: %s\n", e.msg);
            goto out;
        }
    }
    started = 1;
    if (rm_start(&r, la.host, (int)st.metrics_port, &e) != CODE_OK) {
        log_error("cannot serve metrics", "port=%lld reason=%s", st.metrics_port, log_q(e.msg));
        fprintf(stderr, "tpu-resolver: %s\n", e.msg);
        goto out;
    }
    /* stage 3: timers and signals */
    uv_timer_init(&loop, &r.dead_timer);
    r.dead_timer.data = &r;
    uv_timer_init(&loop, &r.fault_timer);
    r.fault_timer.data = &r;
    r.dead_timer_ms = wire_now_ms(); /* a stop before its first round is a late round too */
    uv_timer_start(&r.dead_timer, on_dead_timer, r.heartbeat_flag_ms / 2, r.heartbeat_flag_ms / 2);
    sys_start(&r);
    uv_signal_init(&loop, &r.sigint);
    uv_signal_init(&loop, &r.sigterm);
    r.sigint.data = r.sigterm.data = &r;
    uv_signal_start(&r.sigint, on_signal, SIGINT);
    uv_signal_start(&r.sigterm, on_signal, SIGTERM);

    addr_format(la.host, port, shown, sizeof shown);
    log_info("listening", "listen=%s auth=%s heartbeat_ms=%u dead_after=%u max_cores=%u forget_after_ms=%llu "
             "metrics_port=%lld open_files=%ld connections=%u unauthenticated=%u core_links=%u version=%s", log_q(shown),
             r.auth.enabled ? "on" : "off", r.heartbeat_ms, r.dead_after, r.max_cores,
             (unsigned long long)r.forget_after_ms, st.metrics_port, nofile, max_trusted, max_untrusted, max_links,
             TPUEMU_VERSION);
    uv_run(&loop, UV_RUN_DEFAULT);
    status = 0;
out:
    if (loop_ok) {
        if (started && !r.stopping) { /* not reached through a signal: close what is open */
            rm_stop(&r);
            sprep_close(r.rep);
            r.rep = NULL;
        }
        uv_run(&loop, UV_RUN_DEFAULT);
        if ((rc = uv_loop_close(&loop)) != 0) {
            log_error("event loop still has open handles at exit", "rc=%s", uv_err_name(rc));
            status = 1;
        }
    }
    reg_free(&r.reg);
    replay_free(r.replay);
    drc_free(r.drc);
    log_flush_suppressed(1);
    if (status == 0)
        log_info("stopped", NULL);
    return status;
}
