/* Builds and runs schedules (schedule.h): op and edge arrays while building, a
 * successor table (CSR) once finished, then a ready stack and per-peer
 * cursors while running. */
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ST_WAIT, ST_READY, ST_ISSUED, ST_DONE };

struct sched *sched_new(uint64_t seq, const char *what, int g, int me, const int *replica,
                        struct xport x, size_t slot_bytes, int nslots)
{
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->seq = seq;
    s->what = what;
    s->g = g;
    s->me = me;
    s->x = x;
    s->slot_bytes = slot_bytes;
    s->nslots = nslots;
    s->replica = malloc(sizeof *s->replica * (size_t)g);
    s->pp = calloc((size_t)g, sizeof *s->pp);
    s->slot_user = malloc(sizeof *s->slot_user * (size_t)(nslots > 0 ? nslots : 1));
    if (!s->replica || !s->pp || !s->slot_user) {
        sched_free(s);
        return NULL;
    }
    memcpy(s->replica, replica, sizeof *s->replica * (size_t)g);
    for (int i = 0; i < nslots; i++)
        s->slot_user[i] = -1;
    return s;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    if (s->zhead) { /* unlink from the owner's list of released schedules */
        if (s->zprev)
            s->zprev->znext = s->znext;
        else
            *s->zhead = s->znext;
        if (s->znext)
            s->znext->zprev = s->zprev;
    }
    for (int i = 0; i < s->nowned; i++)
        free(s->owned[i]);
    if (s->pp)
        for (int i = 0; i < s->g; i++)
            free(s->pp[i].q[0]), free(s->pp[i].q[1]);
    free(s->pp);
    free(s->replica);
    free(s->slot_user);
    free(s->ops);
    free(s->edges);
    free(s->succ);
    free(s->stack);
    free(s);
}

void sched_release(struct sched *s, struct sched **zombies)
{
    if (!s)
        return;
    s->released = 1;
    if (s->outstanding == 0) {
        sched_free(s);
    } else if (zombies) {
        s->zhead = zombies;
        s->zprev = NULL;
        s->znext = *zombies;
        if (*zombies)
            (*zombies)->zprev = s;
        *zombies = s;
    }
}

void sched_free_zombies(struct sched **zombies)
{
    while (*zombies)
        sched_free(*zombies); /* unlinks itself */
}

int sched_own(struct sched *s, void *p)
{
    if (s->nowned == (int)(sizeof s->owned / sizeof s->owned[0]))
        return -1;
    s->owned[s->nowned++] = p;
    return 0;
}

static int add_op(struct sched *s, int type)
{
    if (s->failed)
        return -1;
    if (s->nops == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 256;
        struct sop *o = realloc(s->ops, sizeof *o * cap);
        if (!o) {
            s->failed = 1;
            return -1;
        }
        s->ops = o;
        s->cap = cap;
    }
    memset(&s->ops[s->nops], 0, sizeof s->ops[0]);
    s->ops[s->nops].type = (uint8_t)type;
    s->ops[s->nops].peer = -1;
    return (int)s->nops++;
}

void sched_dep(struct sched *s, int from, int to)
{
    if (from < 0 || to < 0 || s->failed)
        return;
    if (s->nedges == s->ecap) {
        uint32_t cap = s->ecap ? s->ecap * 2 : 512;
        void *e = realloc(s->edges, sizeof s->edges[0] * cap);
        if (!e) {
            s->failed = 1;
            return;
        }
        s->edges = e;
        s->ecap = cap;
    }
    s->edges[s->nedges][0] = (uint32_t)from;
    s->edges[s->nedges][1] = (uint32_t)to;
    s->nedges++;
}

static int xfer(struct sched *s, int type, int peer, int buf, uint64_t off, uint64_t len,
                uint32_t step, uint32_t chunk, uint64_t woff, int dep)
{
    int id = add_op(s, type);
    if (id < 0)
        return -1;
    struct sop *o = &s->ops[id];
    o->peer = peer;
    o->dbuf = (uint8_t)buf;
    o->doff = off;
    o->len = len;
    o->step = step;
    o->chunk = chunk;
    o->woff = woff;
    sched_dep(s, dep, id);
    if (type == SOP_SEND)
        s->nsend_ops++;
    else
        s->nrecv_ops++;
    return id;
}

int sched_send(struct sched *s, int peer, int buf, uint64_t off, uint64_t len, uint32_t step,
               uint32_t chunk, uint64_t woff, int dep)
{
    return xfer(s, SOP_SEND, peer, buf, off, len, step, chunk, woff, dep);
}

int sched_recv(struct sched *s, int peer, int buf, uint64_t off, uint64_t len, uint32_t step,
               uint32_t chunk, uint64_t woff, int dep)
{
    return xfer(s, SOP_RECV, peer, buf, off, len, step, chunk, woff, dep);
}

int sched_local(struct sched *s, int kern, int dbuf, uint64_t doff, int sbuf, uint64_t soff,
                uint64_t len, uint64_t aux, int dep)
{
    int id = add_op(s, SOP_LOCAL);
    if (id < 0)
        return -1;
    struct sop *o = &s->ops[id];
    o->kern = (uint8_t)kern;
    o->dbuf = (uint8_t)dbuf;
    o->doff = doff;
    o->sbuf = (uint8_t)sbuf;
    o->soff = soff;
    o->len = len;
    o->aux = aux;
    sched_dep(s, dep, id);
    return id;
}

int sched_recv_reduce(struct sched *s, int peer, int kern, int dbuf, uint64_t doff, uint64_t len,
                      uint32_t step, uint32_t chunk, uint64_t woff, int dep, int dep2)
{
    if (s->reduce && len && s->x.ops->recv_reduce && s->x.ops->fuse &&
        s->x.ops->fuse(s->x.self, s->replica[peer], len)) {
        int id = sched_recv(s, peer, dbuf, doff, len, step, chunk, woff, dep);
        if (id >= 0) {
            s->ops[id].fused = 1;
            s->ops[id].kern = (uint8_t)kern;
            sched_dep(s, dep2, id);
        }
        return id;
    }
    int slot = s->slot_next++ % s->nslots;
    uint64_t toff = (uint64_t)slot * s->slot_bytes;
    int r = sched_recv(s, peer, SB_T, toff, len, step, chunk, woff, dep);
    sched_dep(s, s->slot_user[slot], r);
    int red = sched_local(s, kern, dbuf, doff, SB_T, toff, len, 0, r);
    sched_dep(s, dep2, red);
    s->slot_user[slot] = red;
    return red;
}

int sched_barrier(struct sched *s, uint32_t since, int dep)
{
    uint32_t end = s->nops;
    int id = add_op(s, SOP_NOP);
    sched_dep(s, dep, id);
    for (uint32_t i = since; i < end; i++)
        sched_dep(s, (int)i, id);
    return id;
}

int sched_finish(struct sched *s, err *e)
{
    uint32_t i;

    if (s->failed)
        goto oom;
    s->succ = malloc(sizeof *s->succ * (s->nedges ? s->nedges : 1));
    s->stack = malloc(sizeof *s->stack * (s->nops ? s->nops : 1));
    if (!s->succ || !s->stack)
        goto oom;
    for (i = 0; i < s->nops; i++)
        s->ops[i].s = s;
    for (i = 0; i < s->nedges; i++) {
        s->ops[s->edges[i][0]].nsucc++;
        s->ops[s->edges[i][1]].ndeps++;
    }
    uint32_t acc = 0;
    for (i = 0; i < s->nops; i++) {
        s->ops[i].succ0 = acc;
        acc += s->ops[i].nsucc;
        s->ops[i].nsucc = 0;
    }
    for (i = 0; i < s->nedges; i++) {
        struct sop *f = &s->ops[s->edges[i][0]];
        s->succ[f->succ0 + f->nsucc++] = s->edges[i][1];
    }
    free(s->edges);
    s->edges = NULL;
    /* per-peer queues, in build order */
    for (i = 0; i < s->nops; i++) {
        struct sop *o = &s->ops[i];
        if (o->type == SOP_SEND || o->type == SOP_RECV)
            s->pp[o->peer].n[o->type == SOP_RECV]++;
    }
    for (int p = 0; p < s->g; p++)
        for (int d = 0; d < 2; d++) {
            if (s->pp[p].n[d] && !(s->pp[p].q[d] = malloc(sizeof(uint32_t) * s->pp[p].n[d])))
                goto oom;
            s->pp[p].n[d] = 0;
        }
    for (i = 0; i < s->nops; i++) {
        struct sop *o = &s->ops[i];
        if (o->type == SOP_SEND || o->type == SOP_RECV) {
            struct sched_peer *pp = &s->pp[o->peer];
            int d = o->type == SOP_RECV;
            pp->q[d][pp->n[d]++] = i;
        }
    }
    return CODE_OK;
oom:
    s->failed = 1;
    return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory building the schedule of %s #%llu",
                   s->what, (unsigned long long)s->seq);
}

static void fail(struct sched *s, const err *e)
{
    if (s->failed)
        return;
    s->failed = 1;
    s->fail = *e;
}

static void push(struct sched *s, uint32_t id)
{
    s->stack[s->nstack++] = id;
}

static void complete(struct sched *s, struct sop *o)
{
    o->state = ST_DONE;
    s->ndone++;
    for (uint32_t i = 0; i < o->nsucc; i++) {
        uint32_t t = s->succ[o->succ0 + i];
        if (--s->ops[t].deps_left == 0)
            push(s, t);
    }
}

static void pump(struct sched *s);

static void on_link(void *arg, const err *e)
{
    struct sop *o = arg;
    struct sched *s = o->s;

    s->outstanding--;
    if (s->released) {
        if (s->outstanding == 0)
            sched_free(s);
        return;
    }
    if (e && e->code != CODE_OK)
        fail(s, e);
    else if (!s->failed)
        complete(s, o);
    pump(s);
}

static void on_piece(void *arg, uint8_t *dst, const uint8_t *src, size_t len)
{
    struct sop *o = arg;
    o->s->reduce(o->s, o->kern, dst, src, len);
}

static void issue(struct sched *s, int peer, int d)
{
    struct sched_peer *pp = &s->pp[peer];
    err e;

    while (!s->failed && pp->cur[d] < pp->n[d]) {
        struct sop *o = &s->ops[pp->q[d][pp->cur[d]]];
        if (o->state != ST_READY)
            return;
        if (!pp->ch && !(pp->ch = s->x.ops->chan(s->x.self, s->replica[peer], &e))) {
            fail(s, &e);
            return;
        }
        struct xport_chunk c = {s->seq, (s->iter << 16) | o->step, o->chunk, o->woff, s->what};
        uint8_t *b = s->buf[o->dbuf] + o->doff;
        int rc = !d        ? s->x.ops->send(pp->ch, &c, b, o->len, on_link, o)
                 : o->fused ? s->x.ops->recv_reduce(pp->ch, &c, b, o->len, on_piece, o, on_link, o)
                            : s->x.ops->recv(pp->ch, &c, b, o->len, on_link, o);
        if (rc != CODE_OK) {
            err_set(&e, rc, "%s #%llu: cannot %s chunk %u %s core %s (%s)", s->what,
                    (unsigned long long)s->seq, d ? "receive" : "send", o->chunk,
                    d ? "from" : "to", s->x.ops->peer_name(pp->ch), code_name(rc));
            fail(s, &e);
            return;
        }
        o->state = ST_ISSUED;
        s->outstanding++;
        pp->cur[d]++;
    }
}

static void pump(struct sched *s)
{
    if (!s->running)
        return;
    while (s->nstack && !s->failed) {
        struct sop *o = &s->ops[s->stack[--s->nstack]];
        switch (o->type) {
        case SOP_LOCAL:
            s->local(s, o);
            complete(s, o);
            break;
        case SOP_NOP:
            complete(s, o);
            break;
        default:
            o->state = ST_READY;
            issue(s, o->peer, o->type == SOP_RECV);
            break;
        }
    }
    if (s->failed) {
        s->running = 0;
        s->done(s, &s->fail);
    } else if (s->ndone == s->nops) {
        err ok;
        err_clear(&ok);
        s->running = 0;
        s->done(s, &ok);
    }
}

void sched_run(struct sched *s, uint32_t iter)
{
    s->iter = iter;
    s->ndone = 0;
    s->nstack = 0;
    for (int p = 0; p < s->g; p++)
        s->pp[p].cur[0] = s->pp[p].cur[1] = 0;
    for (uint32_t i = 0; i < s->nops; i++) {
        s->ops[i].state = ST_WAIT;
        s->ops[i].deps_left = s->ops[i].ndeps;
    }
    for (uint32_t i = s->nops; i-- > 0;)
        if (s->ops[i].ndeps == 0)
            push(s, i);
    s->running = 1;
    pump(s);
}
