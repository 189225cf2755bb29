/* shm: links between workers of one host over shared memory, as OpenMPI's
 * vader and NCCL's SHM transport do. Per directed pair the sender creates a
 * sealed memfd holding a ring of SHM_SLOTS slots (head/tail counters, C11
 * atomics) and two eventfds (data ready, space ready), and passes them with
 * SCM_RIGHTS over the receiver's abstract unix socket (WorkerInfo.shm_name,
 * advertised as "@tpuemu-<incarnation hex>", '@' standing for the leading NUL).
 * Set-up: the receiver checks SO_PEERCRED (same uid), sends a challenge; the
 * sender answers with auth_challenge_mac under the cluster key, its replica
 * and the epoch, and the fds; the receiver checks all of it (and the memfd's
 * seals and size: a peer cannot shrink it under us) and answers one byte.
 * A fourth fd, when the sender has one, is its host segment (peers.c), which
 * the receiver maps read-only for the direct all-reduce (coll/direct.c).
 * Anything failing is reported to the channel (chan_tx_failed), which
 * falls back to TCP; this file never dials TCP. A channel's tx half holds
 * chan_shm_tx and its end once set up; its rx half chan_shm_rx and the end
 * the peer's hello made.
 *
 * Data: a chunk goes as pieces of at most SHM_SLOT_BYTES, each with a small
 * header the receiver copies out and checks before trusting it. The receiver
 * consumes only while a receive is posted: a full ring is the back-pressure.
 * The unix socket stays open: its EOF is the peer's death. Completions are
 * delivered through chan_defer (never from inside chan_send/chan_recv). */
#include "chan_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"

#define SHM_SLOTS 16u
#define SHM_SLOT_BYTES (256u * 1024u)
#define SHM_HDR 64u
#define SHM_STRIDE (SHM_HDR + SHM_SLOT_BYTES)
#define SHM_CTL 256u
#define SHM_BYTES ((size_t)SHM_CTL + (size_t)SHM_SLOTS * SHM_STRIDE)
#define SHM_MAGIC 0x74707573686d3032ull /* "tpushm02": the control block with the sleep flags */
#define SHM_PENDING_MAX 64
#define SHM_HELLO_MS 2000u /* a peer sends its hello right after connecting: silence this long is a squatter */
#define SHM_SEG_MAX (1ull << 31) /* a peer's host segment: at most this many bytes */

/* Wake-ups: a side that finds nothing to do sets its flag before it goes
 * back to its event loop and then looks once more; the other side, after
 * publishing, signals the eventfd only if the flag is set (and clears it).
 * Both use sequentially consistent accesses, so either the sleeper sees the
 * new counter or the publisher sees the flag: no wake-up is lost, and a side
 * that is busy anyway is not woken for every piece. */
struct shm_ctl {
    _Atomic uint64_t head;       /* pieces published (sender) */
    _Atomic uint32_t want_space; /* the sender sleeps until the tail moves */
    char pad0[52];
    _Atomic uint64_t tail;       /* pieces consumed (receiver) */
    _Atomic uint32_t want_data;  /* the receiver sleeps until the head moves */
    char pad1[52];
};

struct piece {
    uint64_t seq;
    uint32_t step, chunk;
    uint64_t offset;
    uint64_t chunk_len;
    uint64_t piece_off;
    uint32_t piece_len;
    uint32_t pad;
};

struct hello {
    uint64_t magic;
    int32_t replica;
    uint32_t pad;
    uint64_t epoch;
    unsigned char mac[AUTH_MAC_BYTES];
};

/* one side's mapping and handles; tx and rx share the shape */
struct shm_end {
    struct chan *l;
    int tx;
    int sock, efd_mine, efd_theirs; /* tx: mine = space, theirs = data; rx: the reverse */
    uint8_t *map;
    uv_poll_t pe, ps;               /* on efd_mine, on sock */
    int polls;                      /* open poll handles */
    int ready;                      /* tx: set-up done */
    int dead;
};

/* a receiver-side connection still authenticating */
struct pend {
    struct pend *next;
    struct peers *p;
    int sock;
    uint64_t since_ms;       /* accepted (uv_now) */
    uv_poll_t poll;
    unsigned char chal[AUTH_CHALLENGE_BYTES];
};

struct shm_listener {
    int fd;
    uv_poll_t poll;
    struct pend *pending;
    int npending;
};

size_t shm_ring_bytes(void)
{
    return (size_t)SHM_SLOTS * SHM_SLOT_BYTES;
}

static struct shm_ctl *ctl_of(uint8_t *map)
{
    return (struct shm_ctl *)map;
}

static uint8_t *slot_of(uint8_t *map, uint64_t i)
{
    return map + SHM_CTL + (size_t)(i % SHM_SLOTS) * SHM_STRIDE;
}

static void signal_fd(int fd)
{
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) < 0 && errno != EAGAIN) {
        /* the eventfd is ours; nothing sensible to do */
    }
}

static void drain_fd(int fd)
{
    uint64_t v;
    if (read(fd, &v, sizeof v) < 0) {
        /* EAGAIN: a wake-up already taken; one read resets the counter */
    }
}

/* After publishing: wake the other side if it said it sleeps. */
static void wake(_Atomic uint32_t *want, int fd)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(want, memory_order_relaxed) &&
        atomic_exchange_explicit(want, 0, memory_order_seq_cst))
        signal_fd(fd);
}

static int abstract_addr(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
    size_t n = strlen(name);
    if (n < 2 || name[0] != '@' || n > sizeof sa->sun_path)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    sa->sun_path[0] = '\0';
    memcpy(sa->sun_path + 1, name + 1, n - 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    return 0;
}

/* ---- ends: closing ---- */

static void end_free_if_done(struct shm_end *e)
{
    if (e->polls > 0)
        return;
    if (e->map)
        munmap(e->map, SHM_BYTES);
    if (e->sock >= 0)
        close(e->sock);
    if (e->efd_mine >= 0)
        close(e->efd_mine);
    if (e->efd_theirs >= 0)
        close(e->efd_theirs);
    chan_unref(e->l);
    free(e);
}

static void on_poll_closed(uv_handle_t *h)
{
    struct shm_end *e = h->data;
    e->polls--;
    end_free_if_done(e);
}

static void end_close(struct shm_end *e)
{
    if (!e || e->dead)
        return;
    e->dead = 1;
    if (e->tx && e->l->tx.st == e)
        chan_tx_lost(e->l); /* TCP takes the later sends */
    else if (!e->tx)
        chan_rx_lost(e->l, e);
    uv_close((uv_handle_t *)&e->pe, on_poll_closed);
    uv_close((uv_handle_t *)&e->ps, on_poll_closed);
}

/* The ends of l's halves (a set-up under way goes on: its end comes with
 * chan_tx_ready as usual). */
static struct shm_end *tx_end(const struct chan *l)
{
    return l->tx.ops == &chan_shm_tx ? l->tx.st : NULL;
}

static struct shm_end *rx_end(const struct chan *l)
{
    return l->rx.ops == &chan_shm_rx ? l->rx.st : NULL;
}

static void shm_tx_close(struct chan *l)
{
    end_close(tx_end(l));
}

static void shm_rx_close(struct chan *l)
{
    end_close(rx_end(l));
}

static void end_lost(struct shm_end *e)
{
    struct chan *l = e->l;
    struct lop *op = e->tx ? l->sq.head : l->rq.head;
    err er;
    end_close(e);
    if (!op || l->closing)
        return;
    err_set(&er, CODE_UNAVAILABLE,
            "core %s closed its connection during chunk %u of %s #%llu (the process died or was cut off)",
            l->name, op->chunk, op->what, (unsigned long long)op->seq);
    chan_fail(l, op->seq, &er);
}

static void on_sock(uv_poll_t *h, int status, int events)
{
    struct shm_end *e = h->data;
    (void)status, (void)events;
    if (e->dead)
        return;
    /* the socket carries nothing after set-up: readable means EOF (or junk) */
    end_lost(e);
}

/* ---- sending ---- */

static void shm_kick_tx(struct chan *l)
{
    struct shm_end *e = tx_end(l);
    struct shm_ctl *c;
    uint64_t head, tail, published = 0;
    struct lop *op;

    if (!e || !e->ready || e->dead)
        return;
    c = ctl_of(e->map);
    head = atomic_load_explicit(&c->head, memory_order_relaxed);
    tail = atomic_load_explicit(&c->tail, memory_order_acquire);
again:
    while ((op = l->sq.head) != NULL && head - tail < SHM_SLOTS) {
        uint8_t *s = slot_of(e->map, head);
        struct piece pc;
        size_t n = op->len - op->done;
        if (n > SHM_SLOT_BYTES)
            n = SHM_SLOT_BYTES;
        pc.seq = op->seq;
        pc.step = op->step;
        pc.chunk = op->chunk;
        pc.offset = op->offset;
        pc.chunk_len = op->len;
        pc.piece_off = op->done;
        pc.piece_len = (uint32_t)n;
        pc.pad = 0;
        memcpy(s, &pc, sizeof pc);
        if (n)
            memcpy(s + SHM_HDR, op->buf + op->done, n);
        op->done += n;
        head++;
        published++;
        if (op->done == op->len) {
            lopq_pop(&l->sq);
            chan_trace_done(l, op);
            chan_defer(l->p, op); /* complete: the bytes are in the segment */
        }
        if (head - tail >= SHM_SLOTS) /* full: look again before waiting */
            tail = atomic_load_explicit(&c->tail, memory_order_acquire);
    }
    if (published) {
        atomic_store_explicit(&c->head, head, memory_order_release);
        wake(&c->want_data, e->efd_theirs);
        published = 0;
    }
    if (l->sq.head && !l->p->spin_on) { /* the ring is full: ask for a wake-up, then look again */
        atomic_store_explicit(&c->want_space, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&c->tail, memory_order_seq_cst) != tail) {
            tail = atomic_load_explicit(&c->tail, memory_order_acquire);
            goto again;
        }
    }
    chan_arm(l);
}

static void on_space(uv_poll_t *h, int status, int events)
{
    struct shm_end *e = h->data;
    (void)events;
    if (e->dead)
        return;
    if (status < 0) {
        end_lost(e);
        return;
    }
    drain_fd(e->efd_mine);
    chan_progress(e->l);
    shm_kick_tx(e->l);
}

/* ---- receiving ---- */

static uint64_t shm_bytes_in(const struct chan *l)
{
    const struct shm_end *e = rx_end(l);
    if (!e || e->dead)
        return 0;
    return atomic_load_explicit(&ctl_of(e->map)->head, memory_order_relaxed);
}

static void rx_protocol_error(struct chan *l, const struct lop *op, const struct piece *pc)
{
    err er;
    err_set(&er, CODE_INTERNAL,
            "core %s sent chunk %u (step %u, offset %llu, %llu bytes) of #%llu where chunk %u (step %u, offset "
            "%llu, %zu bytes) of %s #%llu was expected: the cores disagree about the collective", l->name,
            pc->chunk, pc->step, (unsigned long long)pc->offset, (unsigned long long)pc->chunk_len,
            (unsigned long long)pc->seq, op->chunk, op->step, (unsigned long long)op->offset, op->len,
            op->what, (unsigned long long)op->seq);
    log_warn("collective protocol error", "reason=%s", log_q(er.msg));
    chan_fail(l, op->seq, &er);
}

/* The peer sent pc, of a collective after op's: it is done with op's, so the
 * chunks it sent this core for it were lost on the way. op's collective fails
 * UNAVAILABLE on every core; pc stays for a receive of its own collective. */
static void rx_lost(struct chan *l, const struct lop *op, const struct piece *pc)
{
    err er;
    err_set(&er, CODE_UNAVAILABLE,
            "chunk %u (step %u) of %s #%llu from core %s to core %s/%d was lost on the way: core %s went on to "
            "#%llu and sent its chunk %u (step %u) in its place",
            op->chunk, op->step, op->what, (unsigned long long)op->seq, l->name, l->p->id->host_id, l->p->id->core,
            l->name, (unsigned long long)pc->seq, pc->chunk, pc->step);
    log_warn("collective's chunk lost", "reason=%s", log_q(er.msg));
    l->p->fail_seq(l->p, op->seq, &er, 1, -1);
}

static void shm_kick_rx(struct chan *l)
{
    struct shm_end *e = rx_end(l);
    struct shm_ctl *c;
    uint64_t head, tail, consumed = 0;
    err fe;

    if (!e || e->dead)
        return;
    c = ctl_of(e->map);
    tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
    head = atomic_load_explicit(&c->head, memory_order_acquire);
again:
    if (head - tail > SHM_SLOTS) {
        struct lop *op = l->rq.head;
        err_set(&fe, CODE_INTERNAL, "core %s corrupted its shared-memory ring (head %llu, tail %llu)",
                l->name, (unsigned long long)head, (unsigned long long)tail);
        end_close(e);
        if (op)
            chan_fail(l, op->seq, &fe);
        return;
    }
    while (tail != head) {
        struct piece pc;
        const uint8_t *s = slot_of(e->map, tail);
        struct lop *op = l->rq.head;
        memcpy(&pc, s, sizeof pc); /* copy out before checking: the peer can still write */
        if (chan_seq_failed(l->p, pc.seq, NULL) != CODE_OK || (op && pc.seq < op->seq)) {
            tail++, consumed++; /* the rest of a failed or finished collective */
            continue;
        }
        if (!op)
            break;
        if (pc.seq > op->seq) {
            /* a later collective's chunk: what the peer sent for op's was lost
             * (left in a ring that was replaced), not a disagreement */
            rx_lost(l, op, &pc); /* fails op's receives: the loop goes on with the next one, if any */
            if (l->rq.head == op)
                return; /* not failed (the link closes): nothing more to take */
            continue;
        }
        if (pc.seq != op->seq || pc.step != op->step || pc.chunk != op->chunk || pc.offset != op->offset ||
            pc.chunk_len != op->len || pc.piece_off != op->done || pc.piece_len > SHM_SLOT_BYTES ||
            pc.piece_len > op->len - op->done || (pc.piece_len == 0 && op->len != 0)) {
            atomic_store_explicit(&c->tail, tail, memory_order_release);
            rx_protocol_error(l, op, &pc);
            return;
        }
        if (pc.piece_len && op->red)
            op->red(op->red_arg, op->buf + op->done, s + SHM_HDR, pc.piece_len);
        else if (pc.piece_len)
            memcpy(op->buf + op->done, s + SHM_HDR, pc.piece_len);
        op->done += pc.piece_len;
        tail++, consumed++;
        if (op->done == op->len) {
            lopq_pop(&l->rq);
            chan_trace_done(l, op);
            chan_defer(l->p, op);
        }
    }
    if (consumed) {
        atomic_store_explicit(&c->tail, tail, memory_order_release);
        wake(&c->want_space, e->efd_theirs);
        chan_progress(l);
        consumed = 0;
    }
    if (l->p->spin_on) { /* the loop polls the ring again (chan_spin): no wake-up needed */
        chan_arm(l);
        return;
    }
    /* going back to the loop: ask for a wake-up, then look again */
    atomic_store_explicit(&c->want_data, 1, memory_order_seq_cst);
    {
        uint64_t h = atomic_load_explicit(&c->head, memory_order_seq_cst);
        if (h != head && !e->dead && l->rx.st == e) {
            head = atomic_load_explicit(&c->head, memory_order_acquire);
            goto again;
        }
    }
    chan_arm(l);
}

static void on_data(uv_poll_t *h, int status, int events)
{
    struct shm_end *e = h->data;
    (void)events;
    if (e->dead)
        return;
    if (status < 0) {
        end_lost(e);
        return;
    }
    drain_fd(e->efd_mine);
    shm_kick_rx(e->l);
}

static struct shm_end *end_new(struct chan *l, int tx, int sock, int efd_mine, int efd_theirs, uint8_t *map)
{
    struct shm_end *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->l = l;
    e->tx = tx;
    e->sock = sock;
    e->efd_mine = efd_mine;
    e->efd_theirs = efd_theirs;
    e->map = map;
    l->refs++;
    /* uv_poll_init can fail (e.g. EEXIST: the loop still watches that fd
     * number); a handle it refused is not initialized (its loop is NULL), so
     * starting or closing it would crash inside libuv. The caller then still
     * owns the fds and the mapping (and falls back to TCP). */
    if (uv_poll_init(l->p->loop, &e->pe, efd_mine) != 0) {
        l->refs--;
        free(e);
        return NULL;
    }
    e->pe.data = e;
    if (uv_poll_init(l->p->loop, &e->ps, sock) != 0) {
        e->sock = e->efd_mine = e->efd_theirs = -1;
        e->map = NULL;
        e->dead = 1;
        e->polls = 1;
        uv_close((uv_handle_t *)&e->pe, on_poll_closed); /* frees e, unrefs l */
        return NULL;
    }
    e->ps.data = e;
    e->polls = 2;
    uv_poll_start(&e->pe, UV_READABLE, tx ? on_space : on_data);
    uv_poll_start(&e->ps, UV_READABLE | UV_DISCONNECT, on_sock);
    return e;
}

/* ---- sender set-up ---- */

struct dial {
    struct chan *l;
    int sock, memfd, efd_data, efd_space;
    uv_poll_t poll;
    int step; /* 0: waiting for the challenge, 1: for the verdict */
};

static void dial_closed(uv_handle_t *h)
{
    struct dial *d = h->data;
    if (d->sock >= 0)
        close(d->sock);
    if (d->memfd >= 0)
        close(d->memfd);
    if (d->efd_data >= 0)
        close(d->efd_data);
    if (d->efd_space >= 0)
        close(d->efd_space);
    chan_unref(d->l);
    free(d);
}

/* Set-up failed after it started: the channel's TCP takes its sends. */
static void dial_fallback(struct dial *d, const char *why)
{
    struct chan *l = d->l;
    uv_close((uv_handle_t *)&d->poll, dial_closed);
    chan_tx_failed(l, why);
}

static void on_dial(uv_poll_t *h, int status, int events)
{
    struct dial *d = h->data;
    struct chan *l = d->l;
    (void)events;

    if (l->closing) {
        uv_close((uv_handle_t *)&d->poll, dial_closed);
        return;
    }
    if (status < 0) {
        dial_fallback(d, uv_strerror(status));
        return;
    }
    if (d->step == 0) {
        unsigned char chal[AUTH_CHALLENGE_BYTES];
        struct hello hm;
        struct msghdr mh;
        struct iovec iov;
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct cmsghdr *cm;
        int fds[4] = {d->memfd, d->efd_data, d->efd_space, l->p->segfd};
        size_t nfds = l->p->segfd >= 0 ? 4 : 3;
        ssize_t n = recv(d->sock, chal, sizeof chal, MSG_DONTWAIT);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n != (ssize_t)sizeof chal) {
            dial_fallback(d, "the peer's shared-memory socket sent no challenge");
            return;
        }
        memset(&hm, 0, sizeof hm);
        hm.magic = SHM_MAGIC;
        hm.replica = l->p->self;
        hm.epoch = l->p->epoch;
        if (l->p->auth->enabled)
            auth_challenge_mac(l->p->auth, chal, hm.mac);
        memset(&mh, 0, sizeof mh);
        memset(&u, 0, sizeof u); /* the control message's padding goes to the kernel too */
        iov.iov_base = &hm;
        iov.iov_len = sizeof hm;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
        if (sendmsg(d->sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof hm) {
            dial_fallback(d, "cannot pass the segment to the peer");
            return;
        }
        d->step = 1;
        return;
    }
    {
        char ok = 0;
        ssize_t n = recv(d->sock, &ok, 1, MSG_DONTWAIT);
        uint8_t *map;
        struct shm_end *e;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n != 1 || ok != 1) {
            dial_fallback(d, "the peer refused the shared-memory segment");
            return;
        }
        map = mmap(NULL, SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, d->memfd, 0);
        if (map == MAP_FAILED) {
            dial_fallback(d, "mmap failed");
            return;
        }
        {
            int sock = d->sock, efd_space = d->efd_space, efd_data = d->efd_data;
            /* one poll handle per fd: the dial's goes before the end's starts */
            d->sock = d->efd_space = d->efd_data = -1; /* the end owns them now */
            uv_close((uv_handle_t *)&d->poll, dial_closed);
            e = end_new(l, 1, sock, efd_space, efd_data, map);
            if (!e) {
                munmap(map, SHM_BYTES);
                close(sock);
                close(efd_space);
                close(efd_data);
                chan_tx_failed(l, NULL); /* TCP takes the sends (as dial_fallback, not logged) */
                return;
            }
        }
        e->ready = 1;
        l->tx.st = e;
        chan_tx_ready(l);
    }
}

static int shm_connect(struct chan *l, err *er)
{
    struct sockaddr_un sa;
    socklen_t sl;
    struct dial *d;
    char name[PEERTAB_MAX_SHM + 1];
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

    peertab_shm_name(l->p->tab, (size_t)l->replica, name, sizeof name);
    if (abstract_addr(name, &sa, &sl) < 0)
        return err_set(er, CODE_INVALID_ARGUMENT, "'%s' is not a shared-memory socket name", name);
    if (!(d = calloc(1, sizeof *d)))
        return err_set(er, CODE_RESOURCE_EXHAUSTED, "out of memory");
    d->l = l;
    d->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    d->memfd = memfd_create("tpuemu-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    d->efd_data = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->efd_space = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (d->sock < 0 || d->memfd < 0 || d->efd_data < 0 || d->efd_space < 0 ||
        ftruncate(d->memfd, (off_t)SHM_BYTES) < 0 || fcntl(d->memfd, F_ADD_SEALS, seals) < 0) {
        err_set(er, CODE_UNAVAILABLE, "cannot make a shared-memory segment: %s", strerror(errno));
        goto fail;
    }
    if (connect(d->sock, (struct sockaddr *)&sa, sl) < 0) {
        err_set(er, CODE_UNAVAILABLE, "cannot reach the shared-memory socket %s: %s", name, strerror(errno));
        goto fail;
    }
    if (uv_poll_init(l->p->loop, &d->poll, d->sock) != 0) {
        err_set(er, CODE_UNAVAILABLE, "cannot watch the shared-memory socket %s", name);
        goto fail;
    }
    l->refs++;
    d->poll.data = d;
    uv_poll_start(&d->poll, UV_READABLE, on_dial);
    return CODE_OK;
fail:
    if (d->sock >= 0)
        close(d->sock);
    if (d->memfd >= 0)
        close(d->memfd);
    if (d->efd_data >= 0)
        close(d->efd_data);
    if (d->efd_space >= 0)
        close(d->efd_space);
    free(d);
    return er->code;
}

/* ---- receiver: listener and set-up ---- */

static void pend_closed(uv_handle_t *h)
{
    struct pend *pd = h->data;
    if (pd->sock >= 0)
        close(pd->sock);
    free(pd);
}

static void pend_drop(struct pend *pd)
{
    struct shm_listener *s = pd->p->shm;
    struct pend **pp;
    if (s) {
        for (pp = &s->pending; *pp; pp = &(*pp)->next)
            if (*pp == pd) {
                *pp = pd->next;
                s->npending--;
                break;
            }
    }
    uv_close((uv_handle_t *)&pd->poll, pend_closed);
}

static void pend_refuse(struct pend *pd, const char *why)
{
    char no = 0;
    log_warn_limited("shared-memory link refused", "reason=%s", log_q(why));
    if (send(pd->sock, &no, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        /* the peer falls back to TCP either way */
    }
    pend_drop(pd);
}

/* The peer's host segment (the optional fourth fd of its hello): kept
 * read-only only when sealed against shrinking (no SIGBUS under us) and of a
 * sane size; the first one of the channel stays (the peer passes the same
 * segment for the whole epoch). Without it the direct all-reduce is not
 * agreed on (coll/direct.c) and the rings serve alone. */
static void map_peer_seg(struct chan *l, int fd)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    void *m;
    if (l->pseg || seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) < 0 || st.st_size <= 0 ||
        (uint64_t)st.st_size > SHM_SEG_MAX) {
        if (!l->pseg)
            log_warn_limited("peer's host segment refused", "peer=%s", log_q(l->name));
        return;
    }
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return;
    l->pseg = m;
    l->pseg_len = (size_t)st.st_size;
}

static void on_pend(uv_poll_t *h, int status, int events)
{
    struct pend *pd = h->data;
    struct peers *p = pd->p;
    struct hello hm;
    struct msghdr mh;
    struct iovec iov;
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct cmsghdr *cm;
    int fds[4] = {-1, -1, -1, -1}, seals;
    struct stat st;
    struct chan *l;
    struct shm_end *e;
    uint8_t *map;
    ssize_t n;
    char yes = 1;

    (void)events;
    if (status < 0) {
        pend_drop(pd);
        return;
    }
    memset(&mh, 0, sizeof mh);
    iov.iov_base = &hm;
    iov.iov_len = sizeof hm;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    n = recvmsg(pd->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EAGAIN)
        return;
    for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int got[8];
            if (k > 8)
                k = 8;
            memcpy(got, CMSG_DATA(cm), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (i < 4 && fds[i] < 0)
                    fds[i] = got[i];
                else
                    close(got[i]);
            }
        }
#define REFUSE(why)                                                                                        \
    do {                                                                                                   \
        for (int i_ = 0; i_ < 4; i_++)                                                                     \
            if (fds[i_] >= 0)                                                                              \
                close(fds[i_]);                                                                            \
        pend_refuse(pd, why);                                                                              \
        return;                                                                                            \
    } while (0)
    if (n != (ssize_t)sizeof hm || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || hm.magic != SHM_MAGIC ||
        fds[0] < 0 || fds[1] < 0 || fds[2] < 0)
        REFUSE("malformed shared-memory hello");
    if (p->auth->enabled) {
        /* constant time: a byte-by-byte compare tells a local stranger how many
         * leading bytes of its guess were right */
        if (!auth_challenge_mac_ok(p->auth, pd->chal, hm.mac, sizeof hm.mac))
            REFUSE("wrong MAC on a shared-memory hello (a different cluster token)");
    }
    if (p->self < 0 || hm.epoch != p->epoch)
        REFUSE("shared-memory hello from another system epoch");
    if (!(l = chan_get(p, hm.replica)))
        REFUSE("shared-memory hello from a replica that is not a peer");
    seals = fcntl(fds[0], F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fds[0], &st) < 0 || (size_t)st.st_size < SHM_BYTES)
        REFUSE("the shared-memory segment is not sealed against shrinking or too small");
    map = mmap(NULL, SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    fds[0] = -1;
    if (map == MAP_FAILED)
        REFUSE("mmap of the shared-memory segment failed");
    if (send(pd->sock, &yes, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) {
        munmap(map, SHM_BYTES);
        REFUSE("cannot answer the shared-memory hello");
    }
#undef REFUSE
    {
        int sock = pd->sock;
        pd->sock = -1; /* the end owns it; one poll handle per fd: the pending one goes first */
        pend_drop(pd);
        e = end_new(l, 0, sock, fds[1], fds[2], map);
        if (!e) {
            munmap(map, SHM_BYTES);
            close(sock);
            close(fds[1]);
            close(fds[2]);
            if (fds[3] >= 0)
                close(fds[3]);
            return;
        }
    }
    chan_rx_use(l, &chan_shm_rx, e); /* the end of an earlier hello closes */
    if (fds[3] >= 0) {
        map_peer_seg(l, fds[3]);
        close(fds[3]);
    }
    log_debug("shared-memory link up", "peer=%s", log_q(l->name));
    shm_kick_rx(l);
}

static void on_listen(uv_poll_t *h, int status, int events)
{
    struct peers *p = h->data;
    struct shm_listener *s = p->shm;
    (void)events;
    if (status < 0 || !s)
        return;
    for (;;) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        struct pend *pd;
        int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.uid != getuid()) {
            close(fd);
            continue;
        }
        /* connections that never sent their hello are dropped once silent
         * for SHM_HELLO_MS, and when the table is full the oldest one goes
         * (as the data-plane port evicts its slowest handshakes): holding
         * the slots no longer keeps the host's cores on TCP */
        uint64_t now = uv_now(p->loop);
        for (struct pend *q = s->pending, *nx; q; q = nx) {
            nx = q->next;
            if (now - q->since_ms >= SHM_HELLO_MS) {
                log_warn_limited("shared-memory link refused", "reason=%s",
                                 log_q("no hello within 2 s of connecting: closed"));
                pend_drop(q);
            }
        }
        if (s->npending >= SHM_PENDING_MAX) {
            struct pend *old = s->pending;
            for (struct pend *q = s->pending; q; q = q->next)
                if (q->since_ms <= old->since_ms)
                    old = q;
            log_warn_limited("shared-memory link refused", "reason=%s",
                             log_q("the hello table is full: the oldest silent connection closed"));
            pend_drop(old);
        }
        if (!(pd = calloc(1, sizeof *pd))) {
            close(fd);
            continue;
        }
        pd->p = p;
        pd->sock = fd;
        pd->since_ms = now;
        auth_random(pd->chal, sizeof pd->chal);
        if (send(fd, pd->chal, sizeof pd->chal, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof pd->chal) {
            close(fd);
            free(pd);
            continue;
        }
        if (uv_poll_init(p->loop, &pd->poll, fd) != 0) {
            close(fd);
            free(pd);
            continue;
        }
        pd->poll.data = pd;
        uv_poll_start(&pd->poll, UV_READABLE | UV_DISCONNECT, on_pend);
        pd->next = s->pending;
        s->pending = pd;
        s->npending++;
    }
}

int shm_listen(struct peers *p, err *er)
{
    struct shm_listener *s = calloc(1, sizeof *s);
    struct sockaddr_un sa;
    socklen_t sl;
    char name[64];

    if (!s)
        return err_set(er, CODE_RESOURCE_EXHAUSTED, "out of memory");
    snprintf(name, sizeof name, "@tpuemu-%016llx", (unsigned long long)p->id->incarnation);
    abstract_addr(name, &sa, &sl);
    s->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&sa, sl) < 0 || listen(s->fd, 64) < 0) {
        err_set(er, CODE_UNAVAILABLE, "cannot listen on the shared-memory socket %s: %s", name, strerror(errno));
        if (s->fd >= 0)
            close(s->fd);
        free(s);
        return er->code;
    }
    uv_poll_init(p->loop, &s->poll, s->fd);
    s->poll.data = p;
    uv_poll_start(&s->poll, UV_READABLE, on_listen);
    p->open_handles++;
    p->shm = s;
    snprintf(p->shm_name, sizeof p->shm_name, "%s", name);
    return CODE_OK;
}

static void listener_closed(uv_handle_t *h)
{
    struct peers *p = h->data;
    struct shm_listener *s = p->shm;
    p->shm = NULL;
    close(s->fd);
    free(s);
    p->open_handles--; /* peers_free frees p once the loop ran dry */
}

void shm_listener_close(struct peers *p)
{
    struct shm_listener *s = p->shm;
    if (!s)
        return;
    while (s->pending)
        pend_drop(s->pending);
    uv_close((uv_handle_t *)&s->poll, listener_closed);
}

const struct chan_ops chan_shm_tx = {
    .name = "shm",
    .shm = 1,
    .start = shm_connect,
    .kick = shm_kick_tx,
    .poll = shm_kick_tx,
    .close = shm_tx_close,
};
const struct chan_ops chan_shm_rx = {
    .name = "shm",
    .shm = 1,
    .kick = shm_kick_rx,
    .poll = shm_kick_rx,
    .bytes_in = shm_bytes_in,
    .close = shm_rx_close,
};
