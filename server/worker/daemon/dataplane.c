/* The data-plane listener: accepts, bounds the number of connections, and
 * routes what arrives: a connection whose AUTH names a replica and an epoch is
 * another worker's link (handed to peers, net/peers.h); from clients, COLL
 * frames go to the collectives engine (coll/coll.h), training frames to the
 * training service (train/train.h), and PING is echoed. The framing,
 * handshake and write bounds live in net/dpconn.c. */
#include "machine.h"
#include "dataplane.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dpconn.h"
#include "frame.h"
#include "log.h"
#include "uvtcp.h"

/* Where a connection stands in the counts. */
enum dp_slot {
    SLOT_HANDSHAKE, /* counted in nunauth */
    SLOT_EVICTED,   /* was in its handshake, closed for a newer one: counted nowhere */
    SLOT_CLIENT,    /* authenticated client: counted in nauth */
    SLOT_NONE       /* handed to peers, or refused after its handshake */
};

struct dp_peer {
    struct dp_peer *prev, *next;
    struct dataplane *dp;
    dp_conn *c;
    enum dp_slot slot;
    unsigned long long seq; /* arrival order */
    uint64_t last_ms;       /* its last frame (uv_now), or when it authenticated */
};

static void forget(struct dp_peer *p)
{
    struct dataplane *dp = p->dp;
    if (p->slot == SLOT_HANDSHAKE)
        dp->nunauth--;
    else if (p->slot == SLOT_CLIENT)
        dp->nauth--;
    if (p->prev)
        p->prev->next = p->next;
    else
        dp->conns = p->next;
    if (p->next)
        p->next->prev = p->prev;
    free(p);
}

static void on_ready(dp_conn *c)
{
    struct dp_peer *p = dp_conn_data(c);
    struct dataplane *dp = p->dp;

    if (p->slot == SLOT_HANDSHAKE)
        dp->nunauth--;
    p->slot = SLOT_NONE;
    log_debug("data-plane peer authenticated", "peer=%s name=%s replica=%d epoch=%llu", dp_conn_peer_addr(c),
              log_q(dp_conn_peer_name(c)), (int)dp_conn_auth_replica(c),
              (unsigned long long)dp_conn_auth_epoch(c));
    if (dp->env.profiler_only && dp_conn_auth_epoch(c) != 0 && dp_conn_auth_replica(c) >= 0) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                     "this is core %s/%d's profiler port: links between workers go to its data port",
                     dp->env.id->host_id, dp->env.id->core);
        return;
    }
    if (dp_conn_auth_epoch(c) == 0 || dp_conn_auth_replica(c) < 0) { /* a client */
        uint64_t now = uv_now(dp->env.loop), idle_ms = dp->env.profiler_only ? DP_PROFILER_IDLE_MS : DP_CLIENT_IDLE_MS;
        p->last_ms = now;
        if (dp->nauth >= DP_MAX_CONNS) { /* the client silent longest goes, if silent long enough */
            struct dp_peer *q, *idle = NULL;
            for (q = dp->conns; q; q = q->next)
                if (q->slot == SLOT_CLIENT && (!idle || q->last_ms < idle->last_ms))
                    idle = q;
            if (idle && now - idle->last_ms >= idle_ms) {
                err why;
                idle->slot = SLOT_EVICTED;
                dp->nauth--;
                dp->evicted++;
                err_set(&why, CODE_RESOURCE_EXHAUSTED, "closed after %llu ms without a request: %d clients were "
                        "connected (the limit) and another one came", (unsigned long long)(now - idle->last_ms),
                        DP_MAX_CONNS);
                dp_conn_close(idle->c, &why);
            }
        }
        if (dp->nauth >= DP_MAX_CONNS) {
            dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED,
                         "too many data-plane connections: %d clients are connected to core %s/%d already "
                         "(the limit); close some and retry", DP_MAX_CONNS, dp->env.id->host_id,
                         dp->env.id->core);
            return;
        }
        p->slot = SLOT_CLIENT;
        dp->nauth++;
        return;
    }
    /* another worker's link: peers takes the connection over, or refuses it */
    peers_accept(p->dp->env.peers, c);
    if (dp_conn_data(c) != p)
        forget(p);
}

static void free_payload(void *arg, int status)
{
    (void)status;
    free(arg);
}

/* PROFILE: answered at once, ahead of any queued training work, so the
 * client can also use it to estimate this worker's clock offset. */
static void profile_answer(const struct dp_env *env, dp_conn *c, const Tpuemu__FrameHeader *h)
{
    Tpuemu__FrameHeader a = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ProfileInfo pi = TPUEMU__PROFILE_INFO__INIT;
    const Tpuemu__ProfileRequest *rq = h->profile;
    uint8_t *out = NULL;
    size_t out_len = 0;
    int truncated = 0;

    if (trace_fetch(env->trace, rq ? rq->since_ns : 0, rq ? rq->until_ns : 0, rq ? rq->max_events : 0, &out,
                    &out_len, &truncated) != CODE_OK) {
        dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED, "out of memory for the profile of core %s/%d", env->id->host_id,
                     env->id->core);
        return;
    }
    pi.now_ns = uv_hrtime();
    pi.recorded = trace_recorded(env->trace);
    pi.dropped = trace_dropped(env->trace);
    pi.oldest_ns = trace_oldest(env->trace);
    pi.capacity = trace_capacity(env->trace);
    pi.host_id = (char *)env->id->host_id;
    pi.core = env->id->core;
    pi.replica = env->id->replica_id;
    pi.tpu_type = (char *)env->preset->name;
    pi.hbm_used = env->hbm->used;
    pi.hbm_capacity = env->hbm->capacity;
    pi.hbm_peak = env->hbm->peak;
    pi.truncated = truncated;
    pi.peak_bf16_flops = env->preset->bf16_flops_per_core;
    pi.hbm_bandwidth = env->preset->hbm_bw_per_core;
    pi.ici_bandwidth = env->preset->ici_bw_per_chip / env->preset->cores_per_chip;
    pi.mxu_dim = (uint32_t)env->preset->mxu_dim;
    pi.host_cpus = machine_cpus();
    pi.boot_id = (char *)machine_boot_id();
    pi.host_service = env->profiler_only != 0;
    pi.resolver = (char *)(env->profiler_only && env->resolver_addr ? env->resolver_addr : "");
    a.kind = TPUEMU__FRAME_KIND__FRAME_PROFILE_RESULT;
    a.epoch = env->id->epoch;
    a.seq = h->seq;
    a.profile_info = &pi;
    if (dp_conn_send(c, &a, out, out_len, free_payload, out) != CODE_OK)
        free(out);
}

static void on_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    struct dp_peer *p = dp_conn_data(c);

    p->last_ms = uv_now(p->dp->env.loop);
    if (p->dp->env.profiler_only && h->kind != TPUEMU__FRAME_KIND__FRAME_PROFILE) {
        free(payload);
        dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                     "this is host %s's profiler port: it answers profile requests only (frame kind %d); "
                     "collectives and training go to a core's data port", p->dp->env.id->host_id, (int)h->kind);
        return;
    }

    if (h->kind == TPUEMU__FRAME_KIND__FRAME_COLL) {
        coll_on_client_frame(p->dp->env.coll, c, h, payload, len);
        return;
    }
    if (train_is_frame(h)) {
        train_on_client_frame(p->dp->env.train, c, h, payload, len);
        return;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_PING) {
        Tpuemu__FrameHeader pong = TPUEMU__FRAME_HEADER__INIT;
        pong.kind = TPUEMU__FRAME_KIND__FRAME_PONG;
        pong.epoch = h->epoch;
        pong.step = h->step;
        pong.chunk = h->chunk;
        if (dp_conn_send(c, &pong, payload, len, free_payload, payload) != CODE_OK)
            free(payload); /* not queued: the connection is closing */
        return;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_PROFILE) {
        free(payload);
        profile_answer(&p->dp->env, c, h);
        return;
    }
    free(payload);
    dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                 "tpu-worker does not handle data-plane frames of kind %d from clients (only COLL, PING, "
                 "COMPILE, STEPS, STATE_GET, STATE_SET and PROFILE)", (int)h->kind);
}

/* A client's frame header: refuse what is too large before reading it. */
static enum dp_buf client_payload_buf(dp_conn *c, const Tpuemu__FrameHeader *h, void **buf)
{
    (void)buf;
    if (((struct dp_peer *)dp_conn_data(c))->dp->env.profiler_only && h->payload_bytes > 0) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                     "this is a profiler port: it answers profile requests, which carry no payload");
        return DP_BUF_FAILED;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_PING && h->payload_bytes > DP_MAX_PING) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT, "a PING payload is at most %u bytes (announced %llu)",
                     DP_MAX_PING, (unsigned long long)h->payload_bytes);
        return DP_BUF_FAILED;
    }
    if (train_is_frame(h)) {
        struct dp_peer *p = dp_conn_data(c);
        err e;
        if (train_check_payload(p->dp->env.train, h, &e) != CODE_OK) {
            dp_conn_fail(c, e.code, "%s", e.msg);
            return DP_BUF_FAILED;
        }
        return DP_BUF_MALLOC;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_COLL && h->payload_bytes > 0) {
        /* checked against the collective and the HBM before anything is
         * allocated for it: a refused payload is read and dropped, the
         * connection goes on */
        struct dp_peer *p = dp_conn_data(c);
        return coll_check_client_header(p->dp->env.coll, c, h) ? DP_BUF_MALLOC : DP_BUF_DISCARD;
    }
    if (h->kind != TPUEMU__FRAME_KIND__FRAME_PING && h->kind != TPUEMU__FRAME_KIND__FRAME_COLL &&
        h->payload_bytes > 0) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                     "tpu-worker does not handle data-plane frames of kind %d from clients (only COLL and PING)",
                     (int)h->kind);
        return DP_BUF_FAILED;
    }
    return DP_BUF_MALLOC;
}

static void on_conn_close(dp_conn *c, const err *why)
{
    struct dp_peer *p = dp_conn_data(c);

    coll_on_client_close(p->dp->env.coll, c);
    train_on_client_close(p->dp->env.train, c);
    /* refusals are warnings; a peer that simply went away is not. Anyone can
     * cause them (a stranger's connection): the lines are rate-limited. */
    if (why->code != CODE_OK)
        log_limited(why->code == CODE_UNAVAILABLE ? LOG_INFO : LOG_WARN,
               why->code == CODE_UNAVAILABLE ? "data-plane connection lost" : "data-plane connection refused",
               "peer=%s name=%s code=%s reason=%s", dp_conn_peer_addr(c), log_q(dp_conn_peer_name(c)),
               code_name(why->code), log_q(why->msg));
    else if (why->code == CODE_OK)
        log_debug("data-plane connection closed", "peer=%s", dp_conn_peer_addr(c));
    forget(p);
}

/* Stopping or out of memory: accept and close at once, so the backlog drains. */
static void refuse_one(struct dataplane *dp, uv_stream_t *server, const char *why)
{
    char peer[64];
    if (uvtcp_drop(dp->env.loop, server, peer, sizeof peer))
        log_warn_limited("data-plane connection refused", "peer=%s reason=%s", peer, log_q(why));
}

/* DP_MAX_UNAUTH connections are in their handshake and another arrives: the
 * oldest of them goes. A client or peer finishes its handshake in a round
 * trip, so only a connection that idles in it (a stranger holding the port)
 * stays long enough to be the oldest. */
static void evict_oldest_handshake(struct dataplane *dp)
{
    struct dp_peer *p, *oldest = NULL;
    err why;

    for (p = dp->conns; p; p = p->next)
        if (p->slot == SLOT_HANDSHAKE && (!oldest || p->seq < oldest->seq))
            oldest = p;
    if (!oldest)
        return;
    oldest->slot = SLOT_EVICTED;
    dp->nunauth--;
    dp->evicted++;
    err_set(&why, CODE_RESOURCE_EXHAUSTED,
            "evicted before finishing its handshake: %d data-plane connections were waiting for theirs and a "
            "newer one arrived", DP_MAX_UNAUTH);
    dp_conn_close(oldest->c, &why);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct dataplane *dp = server->data;
    struct dp_conn_cfg cfg;
    struct dp_peer *p;
    dp_conn *c;
    err e;

    if (status < 0) {
        /* libuv accepted and closed the connection already (its reserve
         * descriptor), so the listener does not spin on EMFILE */
        uvtcp_accept_failed("data", dp->env.listen, status);
        return;
    }
    if (*dp->env.stopping) {
        refuse_one(dp, server, "the worker is stopping");
        return;
    }
    if (dp->nunauth >= DP_MAX_UNAUTH)
        evict_oldest_handshake(dp);
    if (!(p = calloc(1, sizeof *p))) {
        refuse_one(dp, server, "out of memory");
        return;
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = dp->env.auth;
    cfg.self_name = dp->env.id->sender;
    cfg.max_payload = FRAME_MAX_PAYLOAD; /* COLL inputs; PING is checked on arrival */
    cfg.max_pending_write = DP_MAX_PENDING;
    cfg.handshake_ms = DP_HANDSHAKE_MS;
    cfg.on_ready = on_ready;
    cfg.on_frame = on_frame;
    cfg.on_close = on_conn_close;
    cfg.payload_buf = client_payload_buf;
    cfg.data = p;
    p->dp = dp;
    if (dp_conn_accept(server, &cfg, &c, &e) != CODE_OK) {
        log_warn("data-plane accept failed", "reason=%s", log_q(e.msg));
        free(p);
        return;
    }
    p->c = c;
    p->slot = SLOT_HANDSHAKE;
    p->seq = ++dp->next_seq;
    p->next = dp->conns;
    if (p->next)
        p->next->prev = p;
    dp->conns = p;
    dp->nunauth++;
    log_debug("data-plane connection", "peer=%s handshaking=%u clients=%u", dp_conn_peer_addr(c), dp->nunauth,
              dp->nauth);
}

int dp_start(struct dataplane *dp, const struct dp_env *env, err *e)
{
    struct sockaddr_storage ss;
    int sl = sizeof ss, rc;
    const char *host = env->listen;

    dp->env = *env;
    memset(&ss, 0, sizeof ss);
    if (strcmp(host, "*") == 0)
        host = "0.0.0.0";
    if (uv_ip4_addr(host, env->port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, env->port, (struct sockaddr_in6 *)&ss) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "--listen: '%s' is not a local IP address", env->listen);
    uv_tcp_init(env->loop, &dp->listener);
    dp->listener.data = dp;
    dp->started = 1;
    if ((rc = uv_tcp_bind(&dp->listener, (struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&dp->listener, 128, on_connection)) < 0)
        return err_set(e, rc == UV_EADDRINUSE ? CODE_ALREADY_EXISTS : CODE_UNAVAILABLE,
                       "cannot listen for the %s on %s port %d: %s", env->profiler_only ? "profiler" : "data plane",
                       env->listen, env->port, uv_strerror(rc));
    if ((rc = uv_tcp_getsockname(&dp->listener, (struct sockaddr *)&ss, &sl)) < 0)
        return err_set(e, CODE_INTERNAL, "data-plane getsockname: %s", uv_strerror(rc));
    dp->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return CODE_OK;
}

void dp_stop(struct dataplane *dp)
{
    struct dp_peer *p, *next;

    if (dp->started && !uv_is_closing((uv_handle_t *)&dp->listener))
        uv_close((uv_handle_t *)&dp->listener, NULL);
    for (p = dp->conns; p; p = next) {
        next = p->next; /* p is freed later, in the close callback */
        dp_conn_close(p->c, NULL);
    }
}
