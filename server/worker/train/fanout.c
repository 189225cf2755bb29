/* Fan-out of STEPS requests (docs/design/fanout.md). A client that drives
 * many cores with host-side input sends each execution's request once, to
 * replica 0, marked with a fanout k. Every core passes it on to its children
 * in a k-ary tree over the replicas (replica r's are r*k+1 .. r*k+k), as
 * their client, over a data connection of its own to each; each child gets
 * its own rows and input pipeline. A core answers once for its subtree: its
 * own answer and its children's, merged (losses, correct and rows summed per
 * step, times maxed, the most HBM, the soonest notice, the failure that says
 * most). So the client reads one small answer an execution, whatever the
 * number of cores, and no core handles more than k + 1 answers.
 *
 * Answers on one connection go in request order: t->fans holds every fan
 * (and every plain answer that would overtake one) in the order they came,
 * and only its head may be sent. Once a part of a fan failed, the others get
 * the fan's wait_ms; then the answer goes with what is in (the client waits
 * as long after a first failure). Loop thread only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "frame.h"
#include "log.h"
#include "train_int.h"

#define FAN_ADDR_MAX (ADDR_HOST_MAX + 16)
#define FAN_NAME_MAX (IDENT_HOST_ID_MAX + 16)

struct fan_part {
    struct fan *f;
    struct fan_part *next; /* in its link's queue */
    uint32_t replica;
    int done;
};

struct fan {
    struct fan *next; /* in t->fans */
    struct train *t;
    dp_conn *conn;     /* who asked: a client or the parent core; NULL once it left */
    struct treq *held; /* a plain answer kept behind the fans before it (no parts) */
    err held_err;
    uint64_t seq, epoch;
    uint32_t steps, open; /* parts not in yet (own + children) */
    uint32_t nchildren;
    int sent;
    uint64_t fail_ms; /* loop time of the first failure (0: none) */
    uint32_t wait_ms;
    Tpuemu__StepsSpec *spec; /* a copy, for the children (NULL: no child) */
    /* the answer so far */
    err e;
    int rank;
    Tpuemu__StepStat stats[TRAIN_MAX_STEPS];
    uint64_t hbm_used, hbm_capacity;
    uint32_t cores;
    Tpuemu__Notice notice;
    int has_notice;
    int32_t notice_replica;
    struct fan_part part[TRAIN_MAX_FANOUT];
};

struct fan_link {
    struct train *t;
    dp_conn *conn;
    int ready;
    uint64_t epoch;
    uint32_t replica, slot;
    char addr[FAN_ADDR_MAX], name[FAN_NAME_MAX];
    struct fan_part *head, *tail; /* passed on, in order */
    struct fan_part *unsent;      /* the first of them still waiting for the handshake */
};

static uint32_t shard_rows(uint32_t rows, uint32_t n, uint32_t r)
{
    return rows / n + (r < rows % n ? 1 : 0);
}

/* ---- the answer ---- */

static void merge_err(struct fan *f, int code, const char *msg)
{
    int rank = err_rank(code, msg);
    if (rank > f->rank) {
        f->rank = rank;
        err_set(&f->e, code, "%s", msg);
    }
}

static void merge_stats(struct fan *f, Tpuemu__StepStat *const *s, size_t n)
{
    for (size_t i = 0; i < n && i < f->steps; i++) {
        Tpuemu__StepStat *d = &f->stats[i];
        const Tpuemu__StepStat *a = s[i];
        uint64_t ar = a->allreduce_min_ns ? a->allreduce_min_ns : a->allreduce_ns;
        d->loss_sum += a->loss_sum;
        d->correct += a->correct;
        d->rows += a->rows;
#define MAXF(x)      \
    if (a->x > d->x) \
    d->x = a->x
        MAXF(compute_ns);
        MAXF(matmul_ns);
        MAXF(allreduce_ns);
        MAXF(optimizer_ns);
        MAXF(infeed_wait_ns);
        MAXF(step);
#undef MAXF
        if (ar && (!d->allreduce_min_ns || ar < d->allreduce_min_ns))
            d->allreduce_min_ns = ar;
    }
}

static void merge_notice(struct fan *f, const Tpuemu__Notice *n, int32_t replica)
{
    if (!n || n->kind == TPUEMU__NOTICE_KIND__NOTICE_NONE)
        return;
    if (!f->has_notice || n->event_in_ms < f->notice.event_in_ms ||
        (n->event_in_ms == f->notice.event_in_ms && replica < f->notice_replica)) {
        f->notice = *n;
        f->notice.base.unknown_fields = NULL;
        f->notice.base.n_unknown_fields = 0;
        f->has_notice = 1;
        f->notice_replica = replica;
    }
}

static void merge_hbm(struct fan *f, uint64_t used, uint64_t capacity)
{
    if (used > f->hbm_used)
        f->hbm_used = used;
    if (capacity > f->hbm_capacity)
        f->hbm_capacity = capacity;
}

static void send_answer(struct fan *f)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    Tpuemu__StepStat *sp[TRAIN_MAX_STEPS];

    if (!f->conn)
        return;
    h.kind = KIND(MODEL_RESULT);
    h.epoch = f->epoch;
    h.seq = f->seq;
    st.code = (Tpuemu__Code)f->e.code;
    st.message = f->e.msg;
    h.status = &st;
    if (f->e.code == CODE_OK) {
        for (uint32_t i = 0; i < f->steps; i++)
            sp[i] = &f->stats[i];
        h.n_step_stats = f->steps;
        h.step_stats = sp;
    }
    h.cores = f->cores;
    h.hbm_used = f->hbm_used;
    h.hbm_capacity = f->hbm_capacity;
    if (f->has_notice) {
        h.notice = &f->notice;
        h.notice_replica = f->notice_replica;
    }
    /* a failed send: the connection is closing, its owner learns it there */
    (void)dp_conn_send(f->conn, &h, NULL, 0, NULL, NULL);
}

static void fan_free(struct fan *f)
{
    if (f->spec)
        tpuemu__steps_spec__free_unpacked(f->spec, NULL);
    free(f);
}

static void arm_timer(struct train *t);

/* Sends what may go, in order, and frees what is done with. */
static void flush(struct train *t)
{
    uint64_t now = uv_now(t->env.loop);
    int blocked = 0;
    for (struct fan **pp = &t->fans; *pp;) {
        struct fan *f = *pp;
        if (!f->sent && !blocked) {
            if (f->held) {
                struct treq *r = f->held;
                f->held = NULL;
                treq_send(t, r, &f->held_err);
                f->sent = 1;
            } else if (!f->open || (f->fail_ms && now >= f->fail_ms + f->wait_ms)) {
                if (f->open) { /* the wait after the first failure is over */
                    char m[ERR_MSG_MAX];
                    for (uint32_t i = 0; i < f->nchildren; i++)
                        if (!f->part[i].done) {
                            char where[FAN_ADDR_MAX], name[FAN_NAME_MAX];
                            if (!t->env.replica_addr ||
                                t->env.replica_addr(t->env.replica_addr_arg, f->part[i].replica, where, sizeof where,
                                                    name, sizeof name) != CODE_OK)
                                snprintf(name, sizeof name, "replica %u", f->part[i].replica);
                            snprintf(m, sizeof m,
                                     "core %s (or a core it passes steps on to) did not answer within "
                                     "%u ms after another core failed (it hangs or is cut off)",
                                     name, f->wait_ms);
                            merge_err(f, CODE_UNAVAILABLE, m);
                        }
                    if (f->rank < 0)
                        merge_err(f, CODE_UNAVAILABLE, "a core of this request did not answer in time");
                }
                send_answer(f);
                f->sent = 1;
            } else {
                blocked = 1; /* the answers behind it wait their turn */
            }
        }
        if (f->sent && !f->open && !f->held) {
            *pp = f->next;
            fan_free(f);
            continue;
        }
        pp = &f->next;
    }
    arm_timer(t);
}

static void on_timer(uv_timer_t *h)
{
    flush(h->data);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

/* The soonest end of a wait after a failure, if an unsent fan has one. */
static void arm_timer(struct train *t)
{
    uint64_t now = uv_now(t->env.loop), soonest = UINT64_MAX;
    for (struct fan *f = t->fans; f; f = f->next)
        if (!f->sent && f->open && f->fail_ms && f->fail_ms + f->wait_ms < soonest)
            soonest = f->fail_ms + f->wait_ms;
    if (soonest == UINT64_MAX || t->fan_stopped) {
        if (t->fan_timer)
            uv_timer_stop(t->fan_timer);
        return;
    }
    if (!t->fan_timer) {
        if (!(t->fan_timer = calloc(1, sizeof *t->fan_timer)))
            return; /* the client's own wait still ends it */
        uv_timer_init(t->env.loop, t->fan_timer);
        t->fan_timer->data = t;
        uv_unref((uv_handle_t *)t->fan_timer);
    }
    uv_timer_start(t->fan_timer, on_timer, soonest > now ? soonest - now : 0, 0);
}

static void part_in(struct fan *f, int failed)
{
    if (failed && !f->fail_ms)
        f->fail_ms = uv_now(f->t->env.loop);
    f->open--;
}

static void part_fail(struct fan_part *p, int code, const char *msg)
{
    if (p->done)
        return;
    p->done = 1;
    merge_err(p->f, code, msg);
    part_in(p->f, 1);
}

/* ---- the links to the children ---- */

static void link_fail_all(struct fan_link *l, int code, const char *msg)
{
    struct train *t = l->t;
    while (l->head) {
        struct fan_part *p = l->head;
        l->head = p->next;
        part_fail(p, code, msg);
    }
    l->tail = l->unsent = NULL;
    flush(t);
}

static int send_part(struct fan_link *l, struct fan_part *p)
{
    struct fan *f = p->f;
    Tpuemu__StepsSpec *s = f->spec;
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint32_t rows[TRAIN_MAX_STEPS], *own = s->rows;
    size_t nown = s->n_rows;
    uint32_t pid = s->host_input->input_pipeline_id;
    int rc;

    for (uint32_t i = 0; i < f->steps; i++)
        rows[i] = shard_rows(s->global_rows[i], s->fanout_cores, p->replica);
    s->rows = rows;
    s->n_rows = f->steps;
    s->host_input->input_pipeline_id = p->replica;
    h.kind = KIND(STEPS);
    h.seq = f->seq;
    h.epoch = f->epoch;
    h.steps = s;
    rc = dp_conn_send(l->conn, &h, NULL, 0, NULL, NULL);
    s->rows = own;
    s->n_rows = nown;
    s->host_input->input_pipeline_id = pid;
    return rc;
}

static void link_ready(dp_conn *c)
{
    struct fan_link *l = dp_conn_data(c);
    l->ready = 1;
    for (struct fan_part *p = l->unsent; p; p = p->next)
        if (send_part(l, p) != CODE_OK)
            break; /* closing: on_close fails them */
    l->unsent = NULL;
}

static void link_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    struct fan_link *l = dp_conn_data(c);
    struct fan_part *p = l->head;
    struct fan *f = p ? p->f : NULL;
    err e;

    (void)len;
    free(payload);
    if (h->kind != KIND(MODEL_RESULT) || !p || p == l->unsent || h->seq != f->seq) {
        err_set(&e, CODE_UNAVAILABLE, "core %s answered with frame kind %d, seq %" PRIu64 ", which was not expected",
                l->name, (int)h->kind, h->seq);
        dp_conn_close(c, &e);
        return;
    }
    l->head = p->next;
    if (!l->head)
        l->tail = NULL;
    if (!p->done) {
        int code = h->status ? (int)h->status->code : CODE_OK;
        p->done = 1;
        if (code != CODE_OK) {
            merge_err(f, code,
                      h->status->message && *h->status->message ? h->status->message
                                                                : "a core below failed the request");
        } else if (h->n_step_stats != f->steps || h->cores == 0) {
            char m[256];
            snprintf(m, sizeof m, "core %s answered for %u cores with %zu step stats for %u steps", l->name, h->cores,
                     h->n_step_stats, f->steps);
            merge_err(f, CODE_INTERNAL, m);
            code = CODE_INTERNAL;
        } else {
            merge_stats(f, h->step_stats, h->n_step_stats);
            f->cores += h->cores;
        }
        merge_hbm(f, h->hbm_used, h->hbm_capacity);
        merge_notice(f, h->notice, h->notice_replica);
        part_in(f, code != CODE_OK);
    }
    flush(l->t);
}

static void link_close(dp_conn *c, const err *why)
{
    struct fan_link *l = dp_conn_data(c);
    struct train *t = l->t;
    err m;
    if (t->fan_links[l->slot] == l)
        t->fan_links[l->slot] = NULL;
    if (l->head) {
        err_set(&m, why && why->code != CODE_OK && why->code != CODE_CANCELLED ? why->code : CODE_UNAVAILABLE,
                "core %s/%d lost its connection to core %s (at %s), to which it passes steps on: %s",
                t->env.id->host_id, t->env.id->core, l->name, l->addr,
                why && why->code != CODE_OK ? why->msg : "it closed the connection");
        link_fail_all(l, m.code, m.msg);
    }
    free(l);
}

static struct fan_link *link_open(struct train *t, uint32_t slot, uint32_t replica, err *e)
{
    struct fan_link *l = calloc(1, sizeof *l);
    struct sockaddr_storage ss;
    struct dp_conn_cfg cfg;
    addr a;

    if (!l) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a connection to replica %u", replica);
        return NULL;
    }
    l->t = t;
    l->slot = slot;
    l->replica = replica;
    l->epoch = t->env.id->epoch;
    if (!t->env.replica_addr || t->env.replica_addr(t->env.replica_addr_arg, replica, l->addr, sizeof l->addr, l->name,
                                                    sizeof l->name) != CODE_OK) {
        err_set(e, CODE_FAILED_PRECONDITION, "replica %u is not in core %s/%d's system", replica, t->env.id->host_id,
                t->env.id->core);
        free(l);
        return NULL;
    }
    memset(&ss, 0, sizeof ss);
    if (addr_parse(l->addr, 0, &a, e) != CODE_OK || (uv_ip4_addr(a.host, a.port, (struct sockaddr_in *)&ss) != 0 &&
                                                     uv_ip6_addr(a.host, a.port, (struct sockaddr_in6 *)&ss) != 0)) {
        err_set(e, CODE_FAILED_PRECONDITION, "core %s's data address '%s' is not an IP address and port", l->name,
                l->addr);
        free(l);
        return NULL;
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = t->env.auth;
    cfg.self_name = t->env.id->sender;
    cfg.max_payload = 0; /* answers carry no payload */
    cfg.max_pending_write = DP_MAX_PENDING;
    cfg.handshake_ms = TRAIN_FANOUT_DIAL_MS;
    cfg.on_ready = link_ready;
    cfg.on_frame = link_frame;
    cfg.on_close = link_close;
    cfg.data = l;
    cfg.replica = -1; /* a client of the child's */
    if (dp_conn_connect(t->env.loop, (struct sockaddr *)&ss, &cfg, &l->conn, e) != CODE_OK) {
        err_prefix(e, "connecting to core %s at %s: ", l->name, l->addr);
        free(l);
        return NULL;
    }
    return l;
}

static void pass_on(struct train *t, uint32_t slot, struct fan_part *p)
{
    struct fan_link *l = t->fan_links[slot];
    err e;

    if (l && (l->epoch != t->env.id->epoch || l->replica != p->replica)) {
        t->fan_links[slot] = NULL; /* another system, or another tree: its answers are not ours */
        dp_conn_close(l->conn, NULL);
        l = NULL;
    }
    if (!l && !(l = t->fan_links[slot] = link_open(t, slot, p->replica, &e))) {
        part_fail(p, e.code, e.msg);
        return;
    }
    if (l->tail)
        l->tail->next = p;
    else
        l->head = p;
    l->tail = p;
    if (!l->ready) {
        if (!l->unsent)
            l->unsent = p;
    } else {
        (void)send_part(l, p); /* not sent: the connection is closing, and on_close fails it */
    }
}

/* ---- the service's side ---- */

int fan_check(const struct train *t, const Tpuemu__StepsSpec *s, err *e)
{
    if (!s->fanout)
        return CODE_OK;
    if (s->fanout > TRAIN_MAX_FANOUT)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps.fanout %u is more than %d", s->fanout, TRAIN_MAX_FANOUT);
    if (!s->host_input)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "steps.fanout needs host-side input (steps.host_input): a core "
                       "passes on no infeed");
    if (s->mode == TPUEMU__STEP_MODE__STEP_PREDICT)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "steps.fanout is for training and evaluation: predictions come "
                       "back from each core");
    if (s->fanout_cores != t->env.id->num_replicas)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps.fanout_cores is %u; core %s/%d's system has %u replicas",
                       s->fanout_cores, t->env.id->host_id, t->env.id->core, t->env.id->num_replicas);
    return CODE_OK;
}

static void append(struct train *t, struct fan *f)
{
    struct fan **pp = &t->fans;
    while (*pp)
        pp = &(*pp)->next;
    *pp = f;
}

int fan_start(struct train *t, dp_conn *c, const Tpuemu__FrameHeader *h, struct fan **out, err *e)
{
    const Tpuemu__StepsSpec *s = h->steps;
    uint64_t me = (uint64_t)t->env.id->replica_id, n = t->env.id->num_replicas, k = s->fanout;
    struct fan *f = calloc(1, sizeof *f);

    *out = NULL;
    if (!f)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a request passed on");
    f->t = t;
    f->conn = c;
    f->seq = h->seq;
    f->epoch = h->epoch;
    f->steps = s->steps < TRAIN_MAX_STEPS ? s->steps : TRAIN_MAX_STEPS;
    f->wait_ms = s->fanout_wait_ms;
    f->rank = -1;
    for (uint32_t i = 0; i < f->steps; i++)
        tpuemu__step_stat__init(&f->stats[i]);
    tpuemu__notice__init(&f->notice);
    /* a core in no system, or a request of another epoch, is refused here
     * (kick): its children would refuse it too */
    for (uint64_t j = 1; t->env.id->replica_id >= 0 && h->epoch == t->env.id->epoch && j <= k && me * k + j < n; j++)
        f->part[f->nchildren++] = (struct fan_part){.f = f, .replica = (uint32_t)(me * k + j)};
    if (f->nchildren) {
        uint8_t buf[FRAME_MAX_HEADER];
        size_t len = tpuemu__steps_spec__get_packed_size(s);
        if (len > sizeof buf || !(f->spec = tpuemu__steps_spec__unpack(NULL, tpuemu__steps_spec__pack(s, buf), buf))) {
            free(f);
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a request passed on");
        }
        f->spec->client_input_start_ns = f->spec->client_input_wait_ns = f->spec->client_post_ns = 0;
        f->spec->client_pid = 0;
    }
    f->open = 1 + f->nchildren;
    append(t, f);
    for (uint32_t i = 0; i < f->nchildren; i++)
        pass_on(t, i, &f->part[i]);
    *out = f;
    return CODE_OK;
}

void fan_own(struct train *t, struct fan *f, const struct treq *r, const err *e)
{
    Tpuemu__Notice nt = TPUEMU__NOTICE__INIT;
    if (e->code != CODE_OK) {
        merge_err(f, e->code, e->msg);
    } else {
        Tpuemu__StepStat *sp[TRAIN_MAX_STEPS];
        for (uint32_t i = 0; i < r->steps; i++)
            sp[i] = (Tpuemu__StepStat *)&r->stats[i];
        merge_stats(f, sp, r->steps);
        f->cores++;
    }
    merge_hbm(f, t->env.hbm->used, t->env.hbm->capacity);
    if (notice_fill(t->env.notice, uv_now(t->env.loop), &nt))
        merge_notice(f, &nt, t->env.id->replica_id);
    part_in(f, e->code != CODE_OK);
    flush(t);
}

int fan_hold(struct train *t, struct treq *r, const err *e)
{
    struct fan *f;
    for (f = t->fans; f; f = f->next)
        if (!f->sent && f->conn == r->conn)
            break;
    if (!f || !r->conn || !(f = calloc(1, sizeof *f)))
        return 0; /* nothing to wait for (or no memory: it goes now) */
    f->t = t;
    f->conn = r->conn;
    f->held = r;
    f->held_err = *e;
    append(t, f);
    return 1;
}

void fan_conn_closed(struct train *t, dp_conn *c)
{
    for (struct fan *f = t->fans; f; f = f->next) {
        if (f->conn == c)
            f->conn = NULL;
        if (f->held && f->held->conn == c)
            f->held->conn = NULL;
    }
    flush(t);
}

void fan_stop(struct train *t)
{
    t->fan_stopped = 1;
    for (int i = 0; i < TRAIN_MAX_FANOUT; i++)
        if (t->fan_links[i]) {
            struct fan_link *l = t->fan_links[i];
            t->fan_links[i] = NULL;
            dp_conn_close(l->conn, NULL);
        }
    if (t->fan_timer) {
        uv_close((uv_handle_t *)t->fan_timer, free_handle);
        t->fan_timer = NULL;
    }
}

void fan_free_all(struct train *t)
{
    while (t->fans) {
        struct fan *f = t->fans;
        t->fans = f->next;
        treq_free(f->held);
        fan_free(f);
    }
}
