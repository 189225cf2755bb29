/* hold: link faults (peers.h: peers_link_fault). A fault on the link to a
 * peer core holds this core's sends to it back before chan.c issues them:
 * each held send gets the time it may go (a delay later, after its lost
 * transmissions, or at the end of a partition; never before the send ahead
 * of it, so that chunks stay in order, as on one TCP stream), and one timer
 * per worker lets them go when due and ends the faults. The payload stays in
 * the engine's buffer (xport.h: untouched until the callback), so holding a
 * send costs its struct lop only; a held send fails, or is dropped with its
 * channel, like any pending one. Nothing else on the link is held: ABORTs and
 * receives go as usual. Nothing here runs on a link without a fault but the
 * check of l->holding in chan_send. chan.c reaches this layer through
 * hold_faults, which peers.c installs: it calls nothing here by name. */
#include "chan_impl.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "xorshift.h"

/* Retransmission timeout of a lost chunk: TCP's minimum (Linux 200 ms),
 * doubled for each loss of the same chunk, up to this. */
#define HOLD_RTO_MS 200u
#define HOLD_RTO_MAX_MS 3200u

static const char *kind_name(int kind)
{
    switch (kind) {
    case TPUEMU__FAULT_KIND__FAULT_LINK_DELAY:
        return "link-delay";
    case TPUEMU__FAULT_KIND__FAULT_LINK_LOSS:
        return "link-loss";
    default:
        return "partition";
    }
}

/* FNV-1a over s, into h: the link's ends in the loss's seed, so that the two
 * directions of one link lose different chunks from one seed. */
static uint32_t mix(uint32_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void on_hold(uv_timer_t *t);

/* The timer fires by due (uv_now ms) at the latest. */
static void arm(struct peers *p, uint64_t due)
{
    uint64_t now = uv_now(p->loop);
    if (p->stopping || (p->hold_due && p->hold_due <= due))
        return;
    p->hold_due = due;
    uv_timer_start(&p->hold, on_hold, due > now ? due - now : 0, 0);
}

void hold_init(struct peers *p)
{
    uv_timer_init(p->loop, &p->hold);
    p->hold.data = p;
}

void hold_close(struct peers *p, uv_close_cb cb)
{
    uv_timer_stop(&p->hold);
    uv_close((uv_handle_t *)&p->hold, cb);
}

static struct link_fault *find(struct peers *p, const char *name)
{
    for (int i = 0; i < PEERS_LINK_FAULTS; i++)
        if (p->lfaults[i].kind && !strcmp(p->lfaults[i].peer, name))
            return &p->lfaults[i];
    return NULL;
}

static void hold_attach(struct chan *l)
{
    if ((l->lf = find(l->p, l->name)) != NULL)
        l->holding = 1;
}

static void hold_send(struct chan *l, struct lop *op)
{
    struct link_fault *f = l->lf;
    uint64_t now = uv_now(l->p->loop), t = now;

    if (!f && !l->hq.head) {
        l->holding = 0; /* the fault is over and nothing is held: the sends go straight again */
        chan_send_now(l, op);
        return;
    }
    if (f && now < f->until) {
        f->held++;
        if (f->kind == TPUEMU__FAULT_KIND__FAULT_LINK_DELAY) {
            t = now + f->latency_ms;
        } else if (f->kind == TPUEMU__FAULT_KIND__FAULT_LINK_LOSS) {
            /* each transmission within the fault is lost with the given
             * odds; the next goes a timeout later, doubled each time */
            uint32_t rto = HOLD_RTO_MS;
            while (t < f->until && xorshift32(&f->rng) % 100u < f->percent) {
                f->lost++;
                t += rto;
                rto = rto * 2 > HOLD_RTO_MAX_MS ? HOLD_RTO_MAX_MS : rto * 2;
            }
        } else {
            t = f->until;
        }
    }
    if (l->hq.tail && t < l->hq.tail->release)
        t = l->hq.tail->release; /* in order */
    op->release = t;
    lopq_push(&l->hq, op);
    chan_arm(l);
    arm(l->p, t);
}

/* The fault in slot f is over: its links go on holding only what they hold. */
static void end_fault(struct peers *p, struct link_fault *f)
{
    for (uint32_t i = 0; p->links && i < p->n; i++) {
        struct chan *l = p->links[i];
        if (l && l->lf == f) {
            l->lf = NULL;
            l->holding = l->hq.head != NULL;
        }
    }
    log_info("fault over: the link works again", "kind=%s peer=%s chunks_held=%llu transmissions_lost=%llu",
             kind_name(f->kind), log_q(f->peer), (unsigned long long)f->held, (unsigned long long)f->lost);
    memset(f, 0, sizeof *f);
}

static void on_hold(uv_timer_t *t)
{
    struct peers *p = t->data;
    uint64_t now = uv_now(p->loop), due = UINT64_MAX;

    p->hold_due = 0;
    if (p->stopping)
        return;
    for (int i = 0; i < PEERS_LINK_FAULTS; i++) {
        struct link_fault *f = &p->lfaults[i];
        if (f->kind && f->until <= now)
            end_fault(p, f);
        else if (f->kind && f->until < due)
            due = f->until;
    }
    for (uint32_t i = 0; p->links && i < p->n; i++) {
        struct chan *l = p->links[i];
        struct lop *op;
        if (!l || l->closing)
            continue;
        /* a send may fail a collective and so empty queues of this very
         * link: each one is taken from the queue before it goes */
        while ((op = l->hq.head) != NULL && op->release <= now) {
            lopq_pop(&l->hq);
            if (!l->sq.head && !l->rq.head)
                chan_progress(l); /* its clock starts now that it goes */
            chan_send_now(l, op);
        }
        if (l->hq.head && l->hq.head->release < due)
            due = l->hq.head->release;
        if (!l->lf && !l->hq.head)
            l->holding = 0;
    }
    if (due != UINT64_MAX)
        arm(p, due);
}

static int hold_partitioned(const struct chan *l, uint64_t now, err *e)
{
    const struct link_fault *f = l->lf;
    const struct lop *head;
    uint64_t waited;

    if (!f || f->kind != TPUEMU__FAULT_KIND__FAULT_PARTITION || now >= f->until)
        return 0;
    /* a held send waits since it was posted; a receive, since the link last
     * heard from the peer (the peer's sends may be cut at its end) */
    if ((head = l->hq.head) != NULL)
        waited = (uv_hrtime() - head->t_post) / 1000000u;
    else if ((head = l->rq.head) != NULL)
        waited = now - l->last_progress;
    else
        return 0;
    if (waited < l->p->timeout_ms)
        return 0;
    err_set(e, CODE_UNAVAILABLE,
            "core %s is cut off from core %s/%d by a partition (tpuctl chaos partition, %llu ms left): chunk %u "
            "of %s #%llu cannot pass", l->name, l->p->id->host_id, l->p->id->core,
            (unsigned long long)(f->until - now), head->chunk, head->what, (unsigned long long)head->seq);
    return 1;
}

const struct chan_faults hold_faults = {hold_attach, hold_send, hold_partitioned};

int peers_link_check(const struct peers *p, const char *host, int core, err *e)
{
    if (!host || !*host || core < 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "a link fault needs the core at the other end (host and core)");
    if (!strcmp(host, p->id->host_id) && core == p->id->core)
        return err_set(e, CODE_INVALID_ARGUMENT, "the other end of the link, %s/%d, is this core itself: a link "
                       "joins two cores", host, core);
    if (p->tab && p->self >= 0) {
        for (size_t r = 0; r < peertab_n(p->tab); r++)
            if (!strcmp(peertab_host(p->tab, r), host) && peertab_core(p->tab, r) == core)
                return CODE_OK;
        return err_set(e, CODE_NOT_FOUND, "core %s/%d is not in this core's system (epoch %llu, %u cores)", host,
                       core, (unsigned long long)p->epoch, p->n);
    }
    return CODE_OK;
}

int peers_link_fault(struct peers *p, int kind, const char *host, int core, uint32_t latency_ms, uint32_t percent,
                     uint32_t duration_ms, uint32_t seed, err *e)
{
    struct link_fault *f;
    char name[96];
    int rc;

    if ((rc = peers_link_check(p, host, core, e)) != CODE_OK)
        return rc;
    if (p->stopping)
        return err_set(e, CODE_UNAVAILABLE, "this worker is stopping");
    snprintf(name, sizeof name, "%s/%d", host, core);
    if (!(f = find(p, name)))
        for (int i = 0; i < PEERS_LINK_FAULTS && !f; i++)
            if (!p->lfaults[i].kind)
                f = &p->lfaults[i];
    if (!f)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "%d links of this core are already faulted", PEERS_LINK_FAULTS);
    memset(f, 0, sizeof *f);
    f->kind = kind;
    snprintf(f->peer, sizeof f->peer, "%s", name);
    f->latency_ms = latency_ms;
    f->percent = percent;
    f->until = uv_now(p->loop) + duration_ms;
    f->rng = mix(mix(seed * 2654435761u + 1u, p->id->host_id), name) ^ (uint32_t)p->id->core;
    for (uint32_t i = 0; p->links && i < p->n; i++)
        if (p->links[i] && !p->links[i]->closing && !strcmp(p->links[i]->name, name)) {
            p->links[i]->lf = f;
            p->links[i]->holding = 1;
        }
    arm(p, f->until);
    return CODE_OK;
}
