/* Cancelling a cluster handle's blocking call from another thread or a signal
 * handler (tpu_cancel). tpu_cancel bumps gen and writes to an eventfd; a call
 * in progress took a snapshot of gen when it began (the outermost call on the
 * owner thread: CLI_CALL), and every wait of the library polls the eventfd
 * beside its sockets and compares gen with that snapshot. A cancel while no
 * call is in progress is forgotten when the next call begins. Never installed. */
#ifndef TPUEMU_CLIENT_CANCEL_H
#define TPUEMU_CLIENT_CANCEL_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

struct cli_cancel {
    atomic_uint gen; /* bumped by tpu_cancel: any thread, signal handlers */
    unsigned snap;   /* gen when the outermost call in progress began */
    unsigned depth;  /* calls in progress on the owner thread */
    int fd;          /* eventfd (non-blocking): readable once tpu_cancel ran; -1: none */
};

/* 1 when tpu_cancel ran since the call in progress began. NULL: never. */
static inline int cli_cancel_requested(const struct cli_cancel *k)
{
    return k && k->depth && atomic_load_explicit(&k->gen, memory_order_acquire) != k->snap;
}

/* The fd a wait polls for POLLIN beside its own (-1: none). */
static inline int cli_cancel_fd(const struct cli_cancel *k)
{
    return k && k->depth ? k->fd : -1;
}

/* Async-signal-safe: an atomic add and a write(2); errno is kept. */
static inline void cli_cancel_fire(struct cli_cancel *k)
{
    uint64_t one = 1;
    int saved = errno;
    atomic_fetch_add_explicit(&k->gen, 1, memory_order_release);
    if (k->fd >= 0 && write(k->fd, &one, sizeof one) < 0) {
        /* the counter is full or the fd is gone: gen alone still says it */
    }
    errno = saved;
}

/* A call on the owner thread begins: the outermost one takes the snapshot
 * and empties the eventfd (an older cancel is forgotten). */
static inline void cli_cancel_enter(struct cli_cancel *k)
{
    if (k && k->depth++ == 0) {
        uint64_t v;
        k->snap = atomic_load_explicit(&k->gen, memory_order_acquire);
        if (k->fd >= 0 && read(k->fd, &v, sizeof v) < 0) {
            /* nothing to empty */
        }
    }
}

/* The call in progress has taken note of the cancels so far (a clean stop
 * under way): from now on only a newer tpu_cancel counts. */
static inline void cli_cancel_rearm(struct cli_cancel *k)
{
    uint64_t v;
    k->snap = atomic_load_explicit(&k->gen, memory_order_acquire);
    if (k->fd >= 0 && read(k->fd, &v, sizeof v) < 0) {
        /* nothing to empty */
    }
}

static inline void cli_cancel_leave(struct cli_cancel **k)
{
    if (*k)
        (*k)->depth--;
}

/* Marks the rest of the enclosing block as a call on cancel token K (NULL:
 * none): left automatically on every return. */
#define CLI_CANCEL_SCOPE(K)                                                                         \
    struct cli_cancel *cli_cancel_scope_ __attribute__((cleanup(cli_cancel_leave), unused)) = (K); \
    cli_cancel_enter(cli_cancel_scope_)

#endif
