/* Envelope sealing and opening. */
#include "wire.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- where opened messages live ----
 *
 * A decoded message (and its envelope) is bump-allocated from one arena:
 * protobuf-c would otherwise make one malloc per field, string and repeated
 * element, 5,000 for a ResetCore at 1,024 cores, each freed again when the
 * message is. wire_msg_free() gives the arena back to a small pool that keeps
 * its largest block, so the next message of that size costs no allocation and
 * touches no fresh page (on a VM a page fault costs microseconds; at 1,024
 * workers that was most of an initialize). The pool and the list of arenas in
 * use are shared by the threads of a process, under one lock. */

#define ARENA_BLOCK_MIN (16u * 1024u)
#define ARENA_KEEP_MAX (4u * 1024u * 1024u) /* a larger block is freed, not pooled */
#define ARENA_POOL_MAX 4u

struct ablock {
    struct ablock *next;
    size_t cap, used;
    max_align_t data[];
};

struct arena {
    struct arena *next;   /* in the pool or the in-use list */
    const wire_msg *msg;  /* what it holds, while in use */
    struct ablock *head;  /* blocks, the one being filled first */
    ProtobufCAllocator pa;
};

static pthread_mutex_t arena_mu = PTHREAD_MUTEX_INITIALIZER;
static struct arena *arena_pool, *arena_used;
static unsigned arena_npool;

/* protobuf-c allocates structs of pointers, integers and doubles, arrays of
 * them and strings: 8-byte alignment serves them all */
#define ARENA_ALIGN 8u

static void *arena_alloc(void *data, size_t size)
{
    struct arena *a = data;
    struct ablock *b = a->head;
    size_t need = (size + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;

    if (need < size)
        return NULL;
    if (!b || b->cap - b->used < need) {
        size_t cap = b && b->cap * 2 > ARENA_BLOCK_MIN ? b->cap * 2 : ARENA_BLOCK_MIN;
        if (cap < need)
            cap = need;
        if (!(b = malloc(sizeof *b + cap)))
            return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    b->used += need;
    return (char *)b->data + b->used - need;
}

static void arena_free_fn(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* all at once, in arena_put */
}

static void arena_destroy(struct arena *a)
{
    struct ablock *b, *next;
    for (b = a->head; b; b = next) {
        next = b->next;
        free(b);
    }
    free(a);
}

/* An arena for a message of len bytes: from the pool, the one whose block
 * fits it best, else a new one whose first block fits it (decoded, a message
 * takes up to about three times its size: structs, pointers, strings; a block
 * this large is mapped, and a page never touched costs nothing). */
static struct arena *arena_get(size_t len)
{
    struct arena *a = NULL, **pp, **best = NULL;
    size_t need = len * 4 + 4096, cap;

    pthread_mutex_lock(&arena_mu);
    for (pp = &arena_pool; *pp; pp = &(*pp)->next) {
        size_t c = (*pp)->head ? (*pp)->head->cap : 0, bc = best && (*best)->head ? (*best)->head->cap : 0;
        if (!best || (c >= need ? bc < need || c < bc : c > bc))
            best = pp;
    }
    if (best) {
        a = *best;
        *best = a->next;
        arena_npool--;
    }
    pthread_mutex_unlock(&arena_mu);
    if (!a) {
        if (!(a = calloc(1, sizeof *a)))
            return NULL;
        a->pa.alloc = arena_alloc;
        a->pa.free = arena_free_fn;
        a->pa.allocator_data = a;
    }
    cap = a->head ? a->head->cap : 0;
    if (cap < need && need <= ARENA_KEEP_MAX) {
        struct ablock *b = malloc(sizeof *b + need);
        if (b) {
            free(a->head);
            b->cap = need;
            b->used = 0;
            b->next = NULL;
            a->head = b;
        }
    }
    return a;
}

/* Keeps the largest block (emptied) for the next message; the rest is freed. */
static void arena_put(struct arena *a)
{
    struct ablock *b, *next, *keep = NULL;

    for (b = a->head; b; b = next) {
        next = b->next;
        if (!keep || b->cap > keep->cap) {
            free(keep);
            keep = b;
        } else {
            free(b);
        }
    }
    if (keep && keep->cap > ARENA_KEEP_MAX) {
        free(keep);
        keep = NULL;
    }
    if (keep) {
        keep->used = 0;
        keep->next = NULL;
    }
    a->head = keep;
    a->msg = NULL;
    pthread_mutex_lock(&arena_mu);
    if (arena_npool < ARENA_POOL_MAX) {
        a->next = arena_pool;
        arena_pool = a;
        arena_npool++;
        a = NULL;
    }
    pthread_mutex_unlock(&arena_mu);
    if (a)
        arena_destroy(a);
}

static void arena_mark_used(struct arena *a, const wire_msg *m)
{
    a->msg = m;
    pthread_mutex_lock(&arena_mu);
    a->next = arena_used;
    arena_used = a;
    pthread_mutex_unlock(&arena_mu);
}

/* The arena holding m, taken off the in-use list; NULL if m is not in one. */
static struct arena *arena_of(const wire_msg *m)
{
    struct arena **pp, *a = NULL;
    pthread_mutex_lock(&arena_mu);
    for (pp = &arena_used; *pp; pp = &(*pp)->next)
        if ((*pp)->msg == m) {
            a = *pp;
            *pp = a->next;
            break;
        }
    pthread_mutex_unlock(&arena_mu);
    return a;
}

static _Atomic int64_t clock_skew_ms;

void wire_set_clock_skew_ms(int64_t skew_ms)
{
    clock_skew_ms = skew_ms;
}

/* The wall clock as the wire sees it (wire_clock_hold_steps): the steps held
 * off so far, the offset to the peer whose clock is followed, and where the
 * wall clock stood against the boot clock at the last reading. */
static pthread_mutex_t clock_mu = PTHREAD_MUTEX_INITIALIZER;
static int clock_hold, clock_have_base;
static int64_t clock_base_ms, clock_held_ms, clock_offset_ms, clock_stepped_ms;

void wire_clock_hold_steps(int on)
{
    pthread_mutex_lock(&clock_mu);
    clock_hold = on != 0;
    clock_have_base = 0;
    pthread_mutex_unlock(&clock_mu);
}

static int64_t ms_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The wall clock, its steps held off and the offset added: without the skew. */
static int64_t clock_now_locked(void)
{
    int64_t wall = ms_of(CLOCK_REALTIME);
    if (clock_hold) {
        /* against the boot clock, which counts a suspend too: only a step of
         * the wall clock moves this */
        int64_t base = wall - ms_of(CLOCK_BOOTTIME);
        if (clock_have_base &&
            (base - clock_base_ms > WIRE_CLOCK_STEP_MS || clock_base_ms - base > WIRE_CLOCK_STEP_MS)) {
            clock_held_ms -= base - clock_base_ms;
            clock_stepped_ms += base - clock_base_ms;
        }
        clock_base_ms = base;
        clock_have_base = 1;
    }
    return wall + clock_held_ms + clock_offset_ms;
}

uint64_t wire_now_unix_ms(void)
{
    pthread_mutex_lock(&clock_mu);
    int64_t t = clock_now_locked();
    pthread_mutex_unlock(&clock_mu);
    return (uint64_t)(t + clock_skew_ms);
}

int64_t wire_clock_stepped_ms(void)
{
    pthread_mutex_lock(&clock_mu);
    int64_t ms = clock_stepped_ms;
    clock_stepped_ms = 0;
    pthread_mutex_unlock(&clock_mu);
    return ms;
}

int64_t wire_clock_follow(uint64_t their_unix_ms, uint64_t asked_ms, uint64_t answered_ms)
{
    int64_t d = 0;
    if (answered_ms < asked_ms || answered_ms - asked_ms > WIRE_CLOCK_FOLLOW_RTT_MS)
        return 0; /* too slow a round trip to say much */
    pthread_mutex_lock(&clock_mu);
    /* their clock when they answered: halfway through the round trip */
    int64_t mine = clock_now_locked() - (int64_t)(wire_now_ms() - asked_ms) + (int64_t)(answered_ms - asked_ms) / 2;
    int64_t off = (int64_t)their_unix_ms - mine;
    if (off > WIRE_CLOCK_FOLLOW_MS || -off > WIRE_CLOCK_FOLLOW_MS) {
        clock_offset_ms += off;
        d = off;
    }
    pthread_mutex_unlock(&clock_mu);
    return d;
}

uint64_t wire_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int wire_seal(const auth *a, const char *sender, wire_msg *m, uint8_t **out, size_t *outlen,
              uint64_t *nonce_out, err *e)
{
    return wire_seal_at(a, sender, wire_now_unix_ms(), m, out, outlen, nonce_out, e);
}

int wire_seal_at(const auth *a, const char *sender, uint64_t sent_unix_ms, wire_msg *m, uint8_t **out,
                 size_t *outlen, uint64_t *nonce_out, err *e)
{
    Tpuemu__Envelope env = TPUEMU__ENVELOPE__INIT;
    unsigned char mac[AUTH_MAC_BYTES];
    uint8_t *body, *buf;
    size_t blen, elen;

    m->nonce = auth_random64();
    m->sent_unix_ms = sent_unix_ms;
    m->sender = (char *)(sender ? sender : "");
    if (nonce_out)
        *nonce_out = m->nonce;
    blen = tpuemu__message__get_packed_size(m);
    body = malloc(blen ? blen : 1);
    if (!body)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory sealing a %zu-byte message", blen);
    tpuemu__message__pack(m, body);
    env.version = WIRE_VERSION;
    env.body.data = body;
    env.body.len = blen;
    if (a && a->enabled) {
        auth_mac(a, body, blen, mac);
        env.mac.data = mac;
        env.mac.len = sizeof mac;
    }
    elen = tpuemu__envelope__get_packed_size(&env);
    buf = malloc(elen ? elen : 1);
    if (!buf) {
        free(body);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory sealing a %zu-byte message", elen);
    }
    tpuemu__envelope__pack(&env, buf);
    free(body);
    *out = buf;
    *outlen = elen;
    return CODE_OK;
}

/* ---- the envelope, read in place ----
 *
 * Envelope { uint32 version = 1; bytes body = 2; bytes mac = 3; } is decoded
 * here rather than by protobuf-c, which would copy the body (at 1,024 cores a
 * 100 KB ResetCore) before it is decoded again. The same rules: fields in any
 * order, the last of a repeated one wins, unknown fields of the four wire types
 * in use skipped, anything truncated or of the wrong type refused. */

struct envelope_view {
    uint32_t version;
    const uint8_t *body, *mac;
    size_t body_len, mac_len;
};

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        if (shift == 63 && b > 1)
            return 0;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

static int envelope_view(const uint8_t *buf, size_t len, struct envelope_view *v)
{
    const uint8_t *p = buf, *end = buf + len;
    static const uint8_t empty[1];

    memset(v, 0, sizeof *v);
    v->body = v->mac = empty;
    while (p < end) {
        uint64_t key, x;
        if (!read_varint(&p, end, &key) || key >> 3 == 0 || key >> 3 > 0x1fffffffu)
            return 0;
        switch (key & 7) {
        case 0: /* varint */
            if (!read_varint(&p, end, &x))
                return 0;
            if (key >> 3 == 1)
                v->version = (uint32_t)x;
            else if (key >> 3 <= 3)
                return 0;
            break;
        case 2: /* length-delimited */
            if (!read_varint(&p, end, &x) || x > (uint64_t)(end - p))
                return 0;
            if (key >> 3 == 2) {
                v->body = p;
                v->body_len = (size_t)x;
            } else if (key >> 3 == 3) {
                v->mac = p;
                v->mac_len = (size_t)x;
            } else if (key >> 3 == 1) {
                return 0;
            }
            p += x;
            break;
        case 1: /* 64-bit */
        case 5: /* 32-bit */
            if (key >> 3 <= 3 || (size_t)(end - p) < ((key & 7) == 1 ? 8u : 4u))
                return 0;
            p += (key & 7) == 1 ? 8 : 4;
            break;
        default:
            return 0;
        }
    }
    return 1;
}

int wire_open(const auth *a, replay *r, const uint8_t *buf, size_t len, size_t cap,
              wire_msg **out, err *e)
{
    struct envelope_view ev, *env = &ev;
    struct arena *ar;
    wire_msg *m;
    char sample[64];
    int rc;

    *out = NULL;
    if (len > cap)
        return err_set(e, CODE_INVALID_ARGUMENT, "message of %zu bytes exceeds the %zu-byte limit",
                       len, cap);
    if (!envelope_view(buf, len, env)) {
        wire_sample(buf, len, sample, sizeof sample);
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "could not decode a %zu-byte message as a tpuemu envelope (starts %s); "
                       "is the peer a tpuemu daemon or client?", len, sample);
    }
    if (env->version != WIRE_VERSION)
        return err_set(e, CODE_FAILED_PRECONDITION,
                       "peer speaks protocol version %u, this side speaks %u; run the same tpuemu "
                       "release on every host", env->version, WIRE_VERSION);
    if (a && a->enabled) {
        if (env->mac_len == 0)
            return err_set(e, CODE_UNAUTHENTICATED,
                           "message carries no authentication but this cluster requires its token; "
                           "give the sender --token-file or $TPUEMU_TOKEN");
        if (!auth_mac_ok(a, env->body, env->body_len, env->mac, env->mac_len))
            return err_set(e, CODE_UNAUTHENTICATED,
                           "message authentication failed: the sender uses a different cluster token");
    }
    if (!(ar = arena_get(env->body_len)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory opening a %zu-byte message", len);
    m = tpuemu__message__unpack(&ar->pa, env->body_len, env->body);
    if (!m) {
        wire_sample(env->body, env->body_len, sample, sizeof sample);
        rc = err_set(e, CODE_INVALID_ARGUMENT, "could not decode the %zu-byte message body (starts %s)",
                     env->body_len, sample);
        goto fail;
    }
    if (m->body_case == TPUEMU__MESSAGE__BODY__NOT_SET) {
        rc = err_set(e, CODE_INVALID_ARGUMENT, "message has no body (unknown message type?)");
        goto fail;
    }
    if (a && a->enabled && r &&
        (rc = replay_check(r, m->nonce, m->sent_unix_ms, wire_now_unix_ms(), e)) != CODE_OK)
        goto fail;
    arena_mark_used(ar, m);
    *out = m;
    return CODE_OK;
fail:
    arena_put(ar);
    return rc;
}

int wire_vouches(const auth *a, const uint8_t *buf, size_t len)
{
    struct envelope_view ev;

    /* The envelope and its MAC say who sent it; decoding the body as well
     * would double the cost of a large first request (a ResetCore) for no
     * more trust: the handler decodes it next and answers what is wrong. */
    if (len > WIRE_MAX_CONTROL || !envelope_view(buf, len, &ev) || ev.version != WIRE_VERSION ||
        ev.body_len == 0)
        return 0;
    if (a && a->enabled)
        return ev.mac_len > 0 && auth_mac_ok(a, ev.body, ev.body_len, ev.mac, ev.mac_len);
    return 1;
}

void wire_msg_free(wire_msg *m)
{
    struct arena *a;
    if (!m)
        return;
    if ((a = arena_of(m)) != NULL)
        arena_put(a);
    else
        tpuemu__message__free_unpacked(m, NULL);
}

uint64_t wire_peek_nonce(const uint8_t *buf, size_t len, size_t cap)
{
    Tpuemu__Envelope *env;
    wire_msg *m;
    uint64_t nonce = 0;

    if (len > cap || !(env = tpuemu__envelope__unpack(NULL, len, buf)))
        return 0;
    if ((m = tpuemu__message__unpack(NULL, env->body.len, env->body.data)) != NULL) {
        nonce = m->nonce;
        tpuemu__message__free_unpacked(m, NULL);
    }
    tpuemu__envelope__free_unpacked(env, NULL);
    return nonce;
}

int wire_seal_error(const auth *a, const char *sender, uint64_t request_id, int code,
                    const char *message, uint8_t **out, size_t *outlen)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;

    st.code = (Tpuemu__Code)code;
    st.message = (char *)message;
    m.request_id = request_id;
    m.body_case = TPUEMU__MESSAGE__BODY_ERROR;
    m.error = &st;
    return wire_seal(a, sender, &m, out, outlen, NULL, NULL);
}

void wire_sample(const uint8_t *buf, size_t len, char *out, size_t outlen)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < len && i < 8 && n + 4 < outlen; i++)
        n += (size_t)snprintf(out + n, outlen - n, "%s%02x", i ? " " : "", buf[i]);
    if (len > 8 && n + 4 < outlen)
        snprintf(out + n, outlen - n, " ...");
}

const char *wire_body_name(const wire_msg *m)
{
    static char unknown[32];
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&tpuemu__message__descriptor, (unsigned)m->body_case);
    if (f)
        return f->name;
    snprintf(unknown, sizeof unknown, "unknown(%d)", (int)m->body_case);
    return unknown;
}
