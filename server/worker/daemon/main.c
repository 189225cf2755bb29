/* tpu-worker: one emulated TPU core. Reads its settings, binds its control and
 * data-plane listeners, then registers with the resolver and heartbeats until
 * SIGINT/SIGTERM (exit 0) or a refusal it cannot fix (exit 3). Bad settings
 * exit 2. Nothing a peer sends makes it exit. */
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "machine.h"
#include "config.h"
#include "slice.h"
#include "fdlimit.h"
#include "httpd.h"
#include "log.h"
#include "memtrim.h"
#include "tuning.h"
#include "wire.h"
#include "worker.h"

#define EXIT_USAGE 2
#define EXIT_PREEMPTED 4 /* an injected preemption terminated this core */
#define RUN (-1) /* configure(): start the daemon */
#define MAX_REPLICAS 4096

/* The host's profiler port, served by the host's core 0 (which the worker
 * knows at start with --core 0, else once the resolver assigned it): every
 * worker keeps its own core's events, so the one port is the host's entry
 * point; it answers with core 0's events and names the resolver, where the
 * client finds the host's other cores and reads each directly. Another
 * process holding the port (a second emulated host on this machine) is
 * logged once, naming the flag; the cores still answer on their data ports. */
static void profiler_maybe_start(struct worker *w)
{
    struct dp_env env;
    err e;
    if (w->prof_tried || w->stopping || !w->profiler_port || w->id.core != 0)
        return;
    w->prof_tried = 1;
    env = w->dp.env;
    env.port = w->profiler_port;
    env.profiler_only = 1;
    env.resolver_addr = w->resolver_hp;
    env.peers = NULL;
    env.coll = NULL;
    env.train = NULL;
    if (dp_start(&w->prof, &env, &e) != CODE_OK) {
        log_warn("the host's profiler port is not served by this core",
                 "host=%s core=%d port=%d reason=%s hint=%s", log_q(w->id.host_id), w->id.core, w->profiler_port,
                 log_q(e.msg),
                 log_q(e.code == CODE_ALREADY_EXISTS ? "another process holds it (another host's core 0 on this "
                                                       "machine?): give each host its own --profiler-port"
                                                     : "check --listen and --profiler-port"));
        dp_stop(&w->prof);
        return;
    }
    log_info("profiler service listening", "host=%s core=%d addr=%s:%d", log_q(w->id.host_id), w->id.core,
             w->advertise, w->prof.port);
}

/* Fills out (an initialized WorkerInfo) from w; strings point into w. The
 * heartbeat and the control socket's replies carry it. */
static void worker_info(void *arg, Tpuemu__WorkerInfo *out)
{
    struct worker *w = arg;
    profiler_maybe_start(w);
    out->host_id = w->id.host_id;
    out->core = w->id.core;
    out->incarnation = w->id.incarnation;
    out->control_addr = w->control_addr;
    out->data_addr = w->data_addr;
    out->tpu_type = (char *)w->preset->name;
    out->hbm_capacity = w->hbm.capacity;
    out->hbm_used = w->hbm.used;
    out->hbm_peak = w->hbm.peak;
    out->pid = (uint32_t)getpid();
    out->version = (char *)TPUEMU_VERSION;
    out->epoch = w->id.epoch;
    out->replica_id = w->id.replica_id;
    out->shm_name = (char *)peers_shm_name(w->peers);
    out->hbm_ooms = w->hbm.ooms;
    out->accelerator_type = w->accelerator_type;
    out->host_cpus = machine_cpus();
    out->boot_id = (char *)machine_boot_id();
    out->train_step = w->train_stats.last_step;
    out->step_us = (uint32_t)(w->train_stats.last_step_ns / 1000 > UINT32_MAX ? UINT32_MAX
                                                                              : w->train_stats.last_step_ns / 1000);
    out->allreduce_us = (uint32_t)(w->train_stats.last_allreduce_ns / 1000 > UINT32_MAX
                                       ? UINT32_MAX
                                       : w->train_stats.last_allreduce_ns / 1000);
    out->metrics_port = (uint32_t)w->metrics_port;
    out->faults = w->fault.recorded;
    out->last_fault = w->fault.last;
    tpuemu__notice__init(&w->notice_pb);
    if (notice_fill(&w->notice, uv_now(w->loop), &w->notice_pb))
        out->notice = &w->notice_pb;
}

/* InjectFault (control.h, fault.h). */
static int worker_fault(void *arg, const Tpuemu__InjectFault *f, err *e)
{
    return fault_inject(&((struct worker *)arg)->fault, f, e);
}

static int worker_faults(void *arg, const Tpuemu__ScheduledFaults *q, Tpuemu__CoreReport *report, err *e)
{
    return fault_scheduled(&((struct worker *)arg)->fault, q->cancel, q->cancel_all, report, e);
}

/* Link faults: the transport holds the sends (peers.h). */
static int link_check(void *arg, const char *host, int core, err *e)
{
    struct worker *w = arg;
    if (!w->peers)
        return err_set(e, CODE_UNAVAILABLE, "this worker has no data plane yet");
    return peers_link_check(w->peers, host, core, e);
}

static int link_fault(void *arg, int kind, const char *host, int core, uint32_t latency_ms, uint32_t percent,
                      uint32_t duration_ms, uint32_t seed, err *e)
{
    struct worker *w = arg;
    if (!w->peers)
        return err_set(e, CODE_UNAVAILABLE, "this worker has no data plane yet");
    return peers_link_fault(w->peers, kind, host, core, latency_ms, percent, duration_ms, seed, e);
}

/* train_env.replica_addr: where the training service passes requests on */
static int replica_addr(void *arg, uint32_t r, char *where, size_t acap, char *name, size_t ncap)
{
    return peers_replica_addr(arg, r, where, acap, name, ncap);
}

static void on_step(void *arg, uint64_t step)
{
    fault_on_step(&((struct worker *)arg)->fault, step);
}

static void notified(void *arg)
{
    hb_beat_now(&((struct worker *)arg)->hb);
}

static void worker_stop(struct worker *w, int exit_code);

static void preempted(void *arg)
{
    worker_stop(arg, EXIT_PREEMPTED);
}

/* The maintenance window begins: the core leaves its system (as a reset to
 * no replica: the model, HBM and the links to its peers go, and every
 * collective in flight fails naming this core) and refuses work until the
 * window ends; then it is back, as a restarted core, idle. */
static void maintenance(void *arg, int begin)
{
    struct worker *w = arg;
    if (!begin)
        return;
    Tpuemu__ResetCore r = TPUEMU__RESET_CORE__INIT;
    r.epoch = w->id.epoch;
    r.replica_id = -1;
    w->id.replica_id = -1;
    w->id.num_replicas = 0;
    hbm_reset(&w->hbm);
    peers_reset(w->peers, &r);
    coll_reset(w->coll);
    train_reset(w->train);
}

static void set_throttle(void *arg, int pct)
{
    struct worker *w = arg;
    if (w->train)
        train_set_throttle(w->train, pct);
}

/* ResetCore from the resolver (control.h): the core joins system epoch
 * r->epoch as replica r->replica_id (-1: it leaves the system). Every layer
 * forgets the old epoch, bottom up. */
static int worker_reset(void *arg, const Tpuemu__ResetCore *r, err *e)
{
    struct worker *w = arg;

    if (w->notice.under_way)
        return err_set(e, CODE_UNAVAILABLE, "core %s/%d is down for a maintenance event for %llu more ms",
                       w->id.host_id, w->id.core,
                       (unsigned long long)(w->notice.event_ms + w->notice.window_ms > uv_now(w->loop)
                                                ? w->notice.event_ms + w->notice.window_ms - uv_now(w->loop)
                                                : 0));
    if (r->epoch < w->id.epoch)
        return err_set(e, CODE_FAILED_PRECONDITION, "stale reset for epoch %llu, core is in epoch %llu",
                       (unsigned long long)r->epoch, (unsigned long long)w->id.epoch);
    if (r->num_replicas > MAX_REPLICAS || r->replica_id < -1 ||
        (r->replica_id >= 0 && (uint32_t)r->replica_id >= r->num_replicas))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "reset: replica %d of %u is not a valid replica (0..num_replicas-1, or -1; at "
                       "most %d replicas)", (int)r->replica_id, r->num_replicas, MAX_REPLICAS);
    w->id.epoch = r->epoch;
    w->id.replica_id = r->replica_id;
    trace_make_resident(w->trace); /* from the first system on (trace.h) */
    w->id.num_replicas = r->replica_id >= 0 ? r->num_replicas : 0;
    hbm_reset(&w->hbm);
    /* a fault waiting for step N counted the old system's steps */
    if (!r->keep_scheduled_faults)
        fault_clear_steps(&w->fault);
    /* every link of the old epoch closes; then the engine forgets its collectives */
    peers_reset(w->peers, r);
    coll_reset(w->coll);
    train_reset(w->train); /* after coll_reset: a step waiting on its all-reduce has been answered */
    log_info("core reset", "epoch=%llu replica=%d replicas=%u heartbeat_ms=%u dead_after=%u",
             (unsigned long long)w->id.epoch, w->id.replica_id, w->id.num_replicas, r->heartbeat_ms,
             r->dead_after);
    return CODE_OK;
}

static void close_signal(uv_signal_t *s)
{
    if (uv_is_active((uv_handle_t *)s) || !uv_is_closing((uv_handle_t *)s)) {
        uv_signal_stop(s);
        if (!uv_is_closing((uv_handle_t *)s))
            uv_close((uv_handle_t *)s, NULL);
    }
}

/* Starts the graceful stop (idempotent); the process exits with exit_code
 * once the loop has run dry. */
static void worker_stop(struct worker *w, int exit_code)
{
    if (w->stopping)
        return;
    w->stopping = 1;
    w->exit_code = exit_code;
    log_info("stopping", "host=%s core=%d", log_q(w->id.host_id), w->id.core);
    /* a clean stop tells the resolver (it forgets the core at once); a refusal
     * for good does not: the core is another process's, or never was ours */
    if (exit_code == 0 || exit_code == EXIT_PREEMPTED)
        hb_leave(&w->hb, exit_code == EXIT_PREEMPTED);
    else
        hb_stop(&w->hb);
    wm_stop(&w->metrics);
    ctl_stop(&w->ctl);
    fault_stop(&w->fault);
    dp_stop(&w->dp);
    dp_stop(&w->prof);
    peers_stop(w->peers);
    train_stop(w->train);
    close_signal(&w->sigint);
    close_signal(&w->sigterm);
    if (w->trim.loop && !uv_is_closing((uv_handle_t *)&w->trim)) { /* started */
        uv_timer_stop(&w->trim);
        uv_close((uv_handle_t *)&w->trim, NULL);
    }
}

/* Not before the first system: the heap start() prefaulted waits for the
 * first initialize (heap_prefault). */
static void on_trim(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (w->id.epoch)
        mem_trim_every(uv_now(w->loop), &w->trim_ms, MEM_TRIM_PERIOD_MS);
}

/* The resolver refused this worker for good (heartbeat.h). */
static void on_refused(void *arg, int exit_code)
{
    worker_stop(arg, exit_code);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct worker *w = s->data;
    log_info("signal received; shutting down", "signal=%d", signum);
    worker_stop(w, 0);
}

static int valid_host_id(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > IDENT_HOST_ID_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

static int is_wildcard(const char *h)
{
    return !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "*");
}

/* The local address the kernel would use to reach host:port (a UDP connect sends nothing). */
static int route_source(const char *host, int port, char *out, size_t n, err *e)
{
    struct addrinfo hints, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ps[16];
    int fd, rc;

    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_DGRAM;
    snprintf(ps, sizeof ps, "%d", port);
    if ((rc = getaddrinfo(host, ps, &hints, &res)) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "--resolver: cannot resolve '%s': %s", host,
                       gai_strerror(rc));
    fd = socket(res->ai_family, SOCK_DGRAM, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = err_set(e, CODE_INVALID_ARGUMENT,
                     "cannot find the local address that reaches the resolver %s: %s; give --advertise",
                     host, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return rc;
    }
    close(fd);
    freeaddrinfo(res);
    if (ss.ss_family == AF_INET6)
        uv_ip6_name((struct sockaddr_in6 *)&ss, out, n);
    else
        uv_ip4_name((struct sockaddr_in *)&ss, out, n);
    return CODE_OK;
}

/* Flags and environment into w; returns RUN, or an exit status (--help and
 * --probe end here too). */
static int configure(struct worker *w, int argc, char **argv)
{
    const char *resolver = NULL, *listen = NULL, *advertise = NULL, *host_id = NULL;
    const char *tpu_type = NULL, *token_file = NULL, *log_level = NULL, *transport = NULL;
    const char *advertise_data = NULL, *accel = NULL;
    struct slice sl;
    long long data_port = 0, core = -1, hbm_bytes = 0, trace_events = TRACE_DEFAULT_EVENTS, throttle = 100, metrics_port = 0;
    long long profiler_port = 8466;
    int insecure = 0, probe = 0, probe_ready = 0, first, rc, lvl;
    char hostname[256];
    err e;
    struct tuning tu;
    const struct opt opts[] = {
        {"resolver", "TPUEMU_RESOLVER", OPT_STRING, NULL, 0, 0, "HOST:PORT",
         "the tpu-resolver to register with (required; default port 8470)", &resolver},
        {"listen", "TPUEMU_WORKER_LISTEN", OPT_STRING, "127.0.0.1", 0, 0, "ADDR",
         "local IP address for the control and data-plane ports (ports chosen by the kernel)", &listen},
        {"advertise", "TPUEMU_ADVERTISE", OPT_STRING, NULL, 0, 0, "ADDR",
         "address other processes use to reach this worker (default: --listen, or for a wildcard "
         "--listen the local address that routes to the resolver)", &advertise},
        {"data-port", "TPUEMU_DATA_PORT", OPT_INT, "0", 0, 65535, "PORT",
         "listen for the data plane on this port of the --listen address (a firewall rule, a "
         "container's published port); 0: the kernel picks one", &data_port},
        {"advertise-data", "TPUEMU_ADVERTISE_DATA", OPT_STRING, NULL, 0, 0, "HOST:PORT",
         "address and port others use to reach this worker's data plane when it is not "
         "--advertise and the listening port (a port forward, NAT, a proxy)", &advertise_data},
        {"host-id", "TPUEMU_HOST_ID", OPT_STRING, NULL, 0, 0, "NAME",
         "host this core belongs to; cores of one host are adjacent in the ring (default: hostname)",
         &host_id},
        {"core", "TPUEMU_CORE", OPT_INT, "-1", -1, 1023, "N",
         "core index on the host; -1 lets the resolver assign the lowest free one", &core},
        {"tpu-type", "TPUEMU_TPU_TYPE", OPT_STRING, NULL, 0, 0, "TYPE",
         "TPU generation to emulate: v2, v3, v4, v5e, v5p, v6e (default: the --accelerator-type's, "
         "else v3)", &tpu_type},
        {"accelerator-type", "TPUEMU_ACCELERATOR_TYPE", OPT_STRING, NULL, 0, 0, "SLICE",
         "the Cloud TPU slice this core is part of (v2-8, v3-32, v4-16, v5p-16, v5litepod-16, ...): "
         "its generation, and --core must be below the slice's devices per host (8 on a v3 host, "
         "4 on a v4 host); the resolver checks the host count and that every core names the same slice",
         &accel},
        {"hbm-bytes", "TPUEMU_HBM_BYTES", OPT_BYTES, NULL, 1, 1LL << 50, "N",
         "HBM capacity of this core, suffixes K/M/G (default: the generation's per-core HBM)",
         &hbm_bytes},
        {"transport", "TPUEMU_TRANSPORT", OPT_STRING, "auto", 0, 0, "auto|tcp",
         "collectives between cores of one host: auto uses shared memory, tcp forces TCP", &transport},
        {"trace-events", "TPUEMU_TRACE_EVENTS", OPT_INT, "65536", 0, TRACE_MAX_EVENTS, "N",
         "events the profiler's ring keeps (about 100 bytes each); 0 turns recording off",
         &trace_events},
        {"throttle-pct", "TPUEMU_THROTTLE_PCT", OPT_INT, "100", 1, 100, "PCT",
         "run this core's training compute at PCT% of its speed (a slower or throttled chip: the "
         "straggler the profiler should find)", &throttle},
        {"token-file", "TPUEMU_TOKEN_FILE", OPT_STRING, NULL, 0, 0, "FILE",
         "file holding the cluster token (else $TPUEMU_TOKEN)", &token_file},
        {"insecure", "TPUEMU_INSECURE", OPT_BOOL, NULL, 0, 0, NULL,
         "allow listening on a non-loopback address without a cluster token", &insecure},
        {"metrics-port", "TPUEMU_METRICS_PORT", OPT_INT, "0", 0, 65535, "PORT",
         "serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this port of the --listen "
         "address; 0: off", &metrics_port},
        {"profiler-port", "TPUEMU_PROFILER_PORT", OPT_INT, "8466", 0, 65535, "PORT",
         "the host's profiler port (capture_tpu_profile --service_addr HOST:PORT), on the --listen address, "
         "served by the host's core 0 and naming the host's cores; 0: off", &profiler_port},
        {"probe", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "liveness check: GET /healthz on the metrics port of the --listen address and exit 0 if it answers "
         "200 (the process and its loop answer, its ports listen), 1 if not, 2 without a metrics port",
         &probe},
        {"probe-ready", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "readiness check: GET /readyz the same way; 200 once registered with a resolver that accepts its "
         "heartbeats", &probe_ready},
        {"log-level", "TPUEMU_LOG_LEVEL", OPT_STRING, "info", 0, 0, "LEVEL",
         "debug, info, warn or error", &log_level},
    };
    /* its own rows, then the layers' tuning knobs (core/tuning.h) */
    const size_t nown = sizeof opts / sizeof opts[0], nall = nown + TUNING_ROWS;
    struct opt all[sizeof opts / sizeof opts[0] + TUNING_ROWS];

    memcpy(all, opts, sizeof opts);
    tuning_rows(&tu, all + nown);

    opt_man_page("tpu-worker", 8, "one emulated TPU core of a tpuemu cluster");
    rc = opt_parse(all, nall, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(all, nall, "tpu-worker --resolver HOST:PORT [options]",
                  "One emulated TPU core: registers with tpu-resolver, heartbeats, and serves its "
                  "control and data-plane ports.");
        opt_man_section("LOGGING", "One logfmt line per event on stderr: ts=... level=info daemon=worker pid=... "
                                   "msg=\"...\" and the event's fields.");
        opt_man_section("SIGNALS", "SIGTERM or SIGINT: leave the cluster and stop cleanly (exit 0).");
        opt_man_section("EXIT STATUS",
                        "0: stopped by SIGTERM or SIGINT; --probe and --probe-ready: the check passed.\n\n"
                        "1: a failure at start (a port that cannot be bound, ...); --probe and --probe-ready: "
                        "the check failed, the reason on stderr.\n\n"
                        "2: a bad flag or environment value, named in the message; --probe without a metrics port.\n\n"
                        "3: refused by the resolver for what a person must fix (the core is held by another live "
                        "worker, the cluster token or release differs from the resolver's).\n\n"
                        "4: terminated by an injected preemption (tpuctl chaos preempt), to be restarted as a "
                        "preemptible TPU that is provisioned again.");
        opt_man_section("EXAMPLES",
                        "Four cores of one host, registering with a resolver on this machine:\n"
                        "  for c in 0 1 2 3; do tpu-worker --resolver 127.0.0.1:8470 --host-id host0 --core $c & done");
        opt_man_section("SEE ALSO", "tpu-resolver(8), tpu-worker(8), tpu-slice(8), tpuctl(1); the manual in the "
                                    "project's docs/ directory (docs/operations/daemons.md for every setting).");
        return 0;
    }
    if (rc != CODE_OK) {
        fprintf(stderr, "tpu-worker: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (first < argc) {
        fprintf(stderr, "tpu-worker: unexpected argument '%s' (see --help)\n", argv[first]);
        return EXIT_USAGE;
    }
    if (tuning_check(&tu, &e) != CODE_OK) {
        fprintf(stderr, "tpu-worker: %s\n", e.msg);
        return EXIT_USAGE;
    }
    tuning_set(&tu);
    if ((lvl = log_level_parse(log_level)) < 0) {
        fprintf(stderr, "tpu-worker: --log-level: '%s' is not one of debug, info, warn, error\n", log_level);
        return EXIT_USAGE;
    }
    log_init("worker", (enum log_level)lvl);
    if (probe || probe_ready) /* needs nothing but where the daemon would listen */
        return httpd_probe_main("tpu-worker", listen, (int)metrics_port, probe ? "/healthz" : "/readyz");
    if (!resolver || !*resolver) {
        fprintf(stderr, "tpu-worker: --resolver is required: give the tpu-resolver's HOST:PORT "
                        "(or set $TPUEMU_RESOLVER)\n");
        return EXIT_USAGE;
    }
    if (addr_parse(resolver, ADDR_DEFAULT_PORT, &w->resolver, &e) != CODE_OK) {
        fprintf(stderr, "tpu-worker: --resolver: %s\n", e.msg);
        return EXIT_USAGE;
    }
    addr_nn_url(w->resolver.host, w->resolver.port, w->resolver_url, sizeof w->resolver_url);
    if (accel && *accel) {
        if (slice_parse(accel, &sl, &e) != CODE_OK) {
            fprintf(stderr, "tpu-worker: --accelerator-type: %s\n", e.msg);
            return EXIT_USAGE;
        }
        if (tpu_type && *tpu_type && strcmp(tpu_type, sl.type->name) != 0) {
            fprintf(stderr, "tpu-worker: --tpu-type %s contradicts --accelerator-type %s (a %s slice); "
                            "give one of them\n", tpu_type, accel, sl.type->name);
            return EXIT_USAGE;
        }
        if (core >= (long long)sl.devices_per_host) {
            fprintf(stderr, "tpu-worker: --core %lld does not exist on a %s host: it has %u devices "
                            "(cores 0..%u); the slice is %u host%s of %u\n", core, accel,
                            sl.devices_per_host, sl.devices_per_host - 1, sl.hosts, sl.hosts == 1 ? "" : "s",
                            sl.devices_per_host);
            return EXIT_USAGE;
        }
        tpu_type = sl.type->name;
        snprintf(w->accelerator_type, sizeof w->accelerator_type, "%s", accel);
    }
    if (!tpu_type || !*tpu_type)
        tpu_type = "v3";
    if (!(w->preset = preset_find(tpu_type))) {
        fprintf(stderr, "tpu-worker: --tpu-type: '%s' is not a TPU type (%s)\n", tpu_type, preset_names());
        return EXIT_USAGE;
    }
    if (!host_id) {
        if (gethostname(hostname, sizeof hostname) < 0)
            snprintf(hostname, sizeof hostname, "localhost");
        hostname[sizeof hostname - 1] = '\0';
        host_id = hostname;
    }
    if (!valid_host_id(host_id)) {
        fprintf(stderr, "tpu-worker: --host-id: '%s' is not a host id (1..%d characters of "
                        "A-Z a-z 0-9 . _ -)\n", host_id, IDENT_HOST_ID_MAX);
        return EXIT_USAGE;
    }
    if (host_id_reserved(host_id)) {
        fprintf(stderr, "tpu-worker: --host-id: '%s' is a word tpuctl reads as a target (%s): a core of "
                        "that host could never be named; choose another\n", host_id, HOST_ID_RESERVED);
        return EXIT_USAGE;
    }
    ident_init(&w->id, host_id, (int)core);
    snprintf(w->listen, sizeof w->listen, "%s", strcmp(listen, "localhost") ? listen : "127.0.0.1");
    if (auth_load(&w->auth, token_file, &e) != CODE_OK) {
        fprintf(stderr, "tpu-worker: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (w->auth.warning[0])
        fprintf(stderr, "tpu-worker: warning: %s\n", w->auth.warning);
    if (!w->auth.enabled && !addr_is_loopback(w->listen) && !insecure) {
        fprintf(stderr, "tpu-worker: refusing to listen on %s without a cluster token: give "
                        "--token-file (or $TPUEMU_TOKEN), or --insecure to allow it\n", w->listen);
        return EXIT_USAGE;
    }
    if (advertise && *advertise) {
        snprintf(w->advertise, sizeof w->advertise, "%s", advertise);
    } else if (is_wildcard(w->listen)) {
        if (route_source(w->resolver.host, w->resolver.port, w->advertise, sizeof w->advertise, &e) != CODE_OK) {
            fprintf(stderr, "tpu-worker: %s\n", e.msg);
            return EXIT_USAGE;
        }
    } else {
        snprintf(w->advertise, sizeof w->advertise, "%s", w->listen);
    }
    if (advertise_data && *advertise_data) {
        addr a;
        if (addr_parse(advertise_data, 0, &a, &e) != CODE_OK || a.port <= 0) {
            fprintf(stderr, "tpu-worker: --advertise-data: '%s' is not HOST:PORT\n", advertise_data);
            return EXIT_USAGE;
        }
        addr_format(a.host, a.port, w->data_addr, sizeof w->data_addr);
    }
    w->data_port = (int)data_port;
    if (strcmp(transport, "auto") == 0) {
        w->tcp_only = 0;
    } else if (strcmp(transport, "tcp") == 0) {
        w->tcp_only = 1;
    } else {
        fprintf(stderr, "tpu-worker: --transport: '%s' is not one of auto, tcp\n", transport);
        return EXIT_USAGE;
    }
    w->trace_cap = (size_t)trace_events;
    w->throttle_pct = (int)throttle;
    w->metrics_port = (int)metrics_port;
    w->profiler_port = (int)profiler_port;
    addr_format(w->resolver.host, w->resolver.port, w->resolver_hp, sizeof w->resolver_hp);
    hbm_init(&w->hbm, hbm_bytes > 0 ? (uint64_t)hbm_bytes : w->preset->hbm_per_core);
    coll_stats_init(&w->coll_stats);
    train_stats_init(&w->train_stats);
    return RUN;
}

/* Binds everything and starts heartbeating; on failure the caller stops and drains. */
static int start(struct worker *w, err *e)
{
    const struct hb_env hb = {w->loop, &w->auth, w->resolver_url, &w->id, worker_info, on_refused, w};
    struct ctl_env ctl = {.loop = w->loop, .auth = &w->auth, .listen = w->listen, .id = &w->id,
                          .reset = worker_reset, .fault = worker_fault, .faults = worker_faults, .info = worker_info, .arg = w};
    const struct fault_env fe = {w->loop,   set_throttle, w,        w->throttle_pct, &w->hbm,
                                 &w->notice, NULL,        notified, preempted, maintenance,
                                 link_check, link_fault};
    const struct dp_env dp = {w->loop, &w->auth, w->listen, w->data_port, &w->id, &w->stopping,
                              NULL,    NULL,     NULL,      NULL,         &w->hbm, w->preset,
                              0,       NULL};
    const struct wm_env wm = {w->loop, w->listen, w->resolver_url, &w->id, &w->hbm, &w->coll_stats,
                              &w->train_stats, &w->hb, &w->ctl, &w->dp, &w->fault, &w->stopping};
    struct peers_env pe = {w->loop, &w->auth, &w->id, NULL, w->tcp_only};
    struct coll_env ce;
    struct train_env te;
    int rc;

    hb_init(&w->hb, &hb);
    fault_init(&w->fault, &fe);
    if (!(w->replay = replay_new(16384)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the replay cache");
    ctl.replay = w->replay;
    uv_signal_init(w->loop, &w->sigint);
    uv_signal_init(w->loop, &w->sigterm);
    w->sigint.data = w->sigterm.data = w;
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_timer_init(w->loop, &w->trim);
    w->trim.data = w;
    uv_timer_start(&w->trim, on_trim, 1000, 1000);
    if ((rc = ctl_start(&w->ctl, &ctl, e)) != CODE_OK || (rc = dp_start(&w->dp, &dp, e)) != CODE_OK ||
        (rc = wm_start(&w->metrics, &wm, w->metrics_port, e)) != CODE_OK)
        return rc;
    addr_nn_url(w->advertise, w->ctl.port, w->control_addr, sizeof w->control_addr);
    if (!w->data_addr[0]) /* else --advertise-data */
        addr_format(w->advertise, w->dp.port, w->data_addr, sizeof w->data_addr);
    w->id.incarnation = auth_random64();
    /* the profiler's ring before the transport: it records every chunk */
    if (!(w->trace = trace_new(w->trace_cap)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for %zu profiler events", w->trace_cap);
    pe.trace = w->trace;
    w->fault.env.trace = w->trace;
    if ((rc = peers_new(&pe, &w->peers, e)) != CODE_OK) /* its shm socket is named after the incarnation */
        return rc;
    ce = (struct coll_env){&w->id, &w->hbm, peers_xport(w->peers), &w->coll_stats};
    if (!(w->coll = coll_new(&ce)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the collectives engine");
    te = (struct train_env){w->loop,         &w->id,  &w->hbm, w->trace,   w->preset, w->throttle_pct, w->coll,
                            &w->train_stats, on_step, w,       &w->notice, &w->auth,  replica_addr,    w->peers};
    if ((rc = train_new(&te, &w->train)) != CODE_OK)
        return err_set(e, rc, "cannot start the training service (no matrix unit)");
    /* the data plane routes to them from the first frame on (the loop has not run yet) */
    w->dp.env.peers = w->peers;
    w->dp.env.coll = w->coll;
    w->dp.env.train = w->train;
    w->dp.env.trace = w->trace;
    log_info("started", "host=%s core=%d tpu_type=%s accelerator_type=%s hbm_bytes=%llu control=%s data=%s listen=%s "
             "metrics_port=%d resolver=%s auth=%s pid=%d version=%s", log_q(w->id.host_id), w->id.core,
             w->preset->name, w->accelerator_type[0] ? w->accelerator_type : "-",
             (unsigned long long)w->hbm.capacity, log_q(w->control_addr),
             log_q(w->data_addr), log_q(w->listen), w->metrics.port, log_q(w->resolver_url),
             w->auth.enabled ? "on" : "off", (int)getpid(), TPUEMU_VERSION);
    return hb_start(&w->hb, e);
}

/* Touches the heap's next bytes now, once the worker has started, and keeps
 * them: the first initialize is the first time a worker needs that much more
 * (the decoded reset, the peer table's columns, a link per replica), and a
 * fresh page costs 20-36 us in a VM. At 1,024 workers on two CPUs those
 * faults were a third of the first initialize (docs/performance.md: pod scale). */
static void heap_prefault(size_t bytes)
{
#ifdef __GLIBC__
    enum { PIECE = 32 * 1024 }; /* under the mmap threshold: from the heap */
    void *p[64], *big;
    size_t n = bytes / PIECE < 64 ? bytes / PIECE : 64;
    /* Freeing a mapped block raises glibc's mmap threshold to its size and
     * the trim threshold to twice that (mallopt(3), dynamic threshold), as
     * the first training step's buffers would: the pieces freed below then
     * stay in the heap. Setting M_TRIM_THRESHOLD instead would turn that
     * adjustment off, and every step's large buffers would be mapped and
     * faulted in anew (a 256-core training step took twice as long). */
    if (n && (big = malloc(2 * bytes)) != NULL)
        free(big);
    for (size_t i = 0; i < n; i++)
        if ((p[i] = malloc(PIECE)) != NULL)
            memset(p[i], 0, PIECE);
    for (size_t i = n; i-- > 0;)
        free(p[i]);
#else
    (void)bytes;
#endif
}

int main(int argc, char **argv)
{
    struct worker w;
    uv_loop_t loop;
    err e;
    int rc;

    memset(&w, 0, sizeof w);
    w.id.replica_id = -1;
    log_init("worker", LOG_INFO);
    auth_global_init();
    /* weeks of running meet steps of the wall clock: the messages' dates
     * keep going as the boot clock does, and follow the resolver's clock */
    wire_clock_hold_steps(1);
    if ((rc = configure(&w, argc, argv)) != RUN)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    /* data-plane clients and handshakes, the metrics port, one link per peer
     * replica (a v5p-8192 has 8192), control and nanomsg's own */
    fdlimit_raise("worker", 65536, DP_MAX_CONNS + DP_MAX_UNAUTH + HTTPD_MAX_CONNS + 2 * 1024 + 64);
    if ((rc = uv_loop_init(&loop)) < 0) {
        fprintf(stderr, "tpu-worker: uv_loop_init: %s\n", uv_strerror(rc));
        return 1;
    }
    w.loop = &loop;
    if (start(&w, &e) != CODE_OK) {
        log_error("cannot start", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
        fprintf(stderr, "tpu-worker: %s: %s\n", code_name(e.code), e.msg);
        worker_stop(&w, 1);
    }
    heap_prefault((size_t)tuning_get()->heap_prefault_kb * 1024);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(&loop);
    if (rc != 0) {
        log_error("event loop did not close cleanly", "reason=%s", log_q(uv_strerror(rc)));
        if (w.exit_code == 0)
            w.exit_code = 1;
    }
    coll_free(w.coll);
    train_free(w.train);
    peers_free(w.peers);
    trace_free(w.trace);
    hbm_destroy(&w.hbm);
    replay_free(w.replay);
    log_flush_suppressed(1);
    log_info("stopped", "exit=%d", w.exit_code);
    return w.exit_code;
}
