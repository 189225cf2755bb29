/* HBM accounting: a capacity check and a table of labelled blocks, so that an
 * over-capacity failure can say what filled the memory. */
#include "hbm.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HBM_LIST_MAX 5   /* allocations named in an out-of-memory message */

static const struct {
    const char *name;
    unsigned bytes;
} dtypes[] = {{"f32", 4}, {"bf16", 2}, {"f16", 2}, {"s32", 4}, {"s8", 1}, {"u8", 1}, {"f64", 8}, {"s64", 8}};

static const char *const kind_names[HBM_KINDS] = {
    "weights", "optimizer slots", "gradients", "activations", "infeed buffers", "other",
};

void hbm_init(hbm *h, uint64_t capacity)
{
    memset(h, 0, sizeof *h);
    h->capacity = capacity;
    h->next_id = 1;
}

void hbm_destroy(hbm *h)
{
    free(h->blocks);
    hbm_init(h, h->capacity);
}

void hbm_reset(hbm *h)
{
    h->used = 0;
    h->peak = 0;
    h->ooms = 0;
    h->nblocks = 0;
    memset(h->by_kind, 0, sizeof h->by_kind);
}

const char *hbm_kind_name(enum hbm_kind kind)
{
    return (unsigned)kind < HBM_KINDS ? kind_names[kind] : "unknown";
}

void hbm_format_size(uint64_t bytes, char *buf, size_t n)
{
    static const char units[] = "KMGTPE";
    double v = (double)bytes;
    int u = -1;

    if (bytes < 1024) {
        snprintf(buf, n, "%" PRIu64 "B", bytes);
        return;
    }
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.2f%c", v, units[u]);
}

void hbm_format_shape(const struct hbm_block *b, char *buf, size_t n)
{
    size_t off = (size_t)snprintf(buf, n, "%s[", b->dtype);
    for (int i = 0; i < b->rank && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%" PRId64, i ? "," : "", b->dims[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

static int bigger(const struct hbm_block *a, const struct hbm_block *b)
{
    return a->bytes > b->bytes || (a->bytes == b->bytes && a->id < b->id);
}

/* b into out[0..*k), kept sorted largest first and at most n long: insertion
 * into a short list (n is a message's worth) */
static void top_insert(struct hbm_block *out, size_t *k, size_t n, const struct hbm_block *b)
{
    size_t j;
    if (*k == n && (n == 0 || !bigger(b, &out[n - 1])))
        return;
    j = *k < n ? (*k)++ : n - 1;
    while (j > 0 && bigger(b, &out[j - 1])) {
        out[j] = out[j - 1];
        j--;
    }
    out[j] = *b;
}

size_t hbm_largest(const hbm *h, struct hbm_block *out, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < h->nblocks; i++)
        top_insert(out, &k, n, &h->blocks[i]);
    return k;
}

/* The out-of-memory message: XLA's first sentence, then what did not fit,
 * what is already there, and what to change. */
static int exhausted(const hbm *h, const struct hbm_block *req, err *e)
{
    struct hbm_block top[HBM_LIST_MAX];
    char used[32], cap[32], over[32], sz[32], shape[128], msg[ERR_MSG_MAX];
    uint64_t total = h->used + req->bytes;
    uint64_t batchy = h->by_kind[HBM_ACTIVATIONS] + h->by_kind[HBM_INFEED];
    size_t off, k;

    if (req->kind == HBM_ACTIVATIONS || req->kind == HBM_INFEED)
        batchy += req->bytes;
    if (total < h->used) /* the request alone overflows 64 bits */
        total = UINT64_MAX;
    hbm_format_size(total, used, sizeof used);
    hbm_format_size(h->capacity, cap, sizeof cap);
    hbm_format_size(total - h->capacity, over, sizeof over);
    hbm_format_size(req->bytes, sz, sizeof sz);
    hbm_format_shape(req, shape, sizeof shape);
    off = (size_t)snprintf(msg, sizeof msg,
                           "Ran out of memory in memory space hbm. Used %s of %s hbm. Exceeded hbm capacity "
                           "by %s. Allocating %s for %s '%s' %s.",
                           used, cap, over, sz, hbm_kind_name(req->kind), req->name, shape);
    k = hbm_largest(h, top, HBM_LIST_MAX);
    if (k && off < sizeof msg)
        off += (size_t)snprintf(msg + off, sizeof msg - off, " Largest allocations in hbm:");
    for (size_t i = 0; i < k && off < sizeof msg; i++) {
        hbm_format_size(top[i].bytes, sz, sizeof sz);
        hbm_format_shape(&top[i], shape, sizeof shape);
        off += (size_t)snprintf(msg + off, sizeof msg - off, " %zu. %s %s '%s' %s;", i + 1, sz,
                                hbm_kind_name(top[i].kind), top[i].name, shape);
    }
    if (off < sizeof msg) {
        if (batchy * 2 >= total)
            snprintf(msg + off, sizeof msg - off,
                     " Activations and infeed buffers take most of it and grow with the batch: use a "
                     "smaller per-core batch (or more cores for the same global batch), recompute "
                     "activations in the backward pass instead of keeping them, or use fewer or "
                     "narrower layers.");
        else
            snprintf(msg + off, sizeof msg - off,
                     " Weights, gradients and optimizer slots take most of it: use fewer or narrower "
                     "layers, an optimizer with fewer slots (SGD keeps none, Adam two per weight), or "
                     "bfloat16 weights; a smaller per-core batch saves only the activations.");
    }
    return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s", msg);
}

/* *b from a request, or an INVALID_ARGUMENT naming what is wrong. */
static int make_block(enum hbm_kind kind, const char *name, const char *dtype, const int64_t *dims, int rank,
                      struct hbm_block *b, err *e)
{
    unsigned esize = 0;

    memset(b, 0, sizeof *b);
    if ((unsigned)kind >= HBM_KINDS)
        return err_set(e, CODE_INVALID_ARGUMENT, "HBM allocation kind %d is not one of the %d kinds", (int)kind,
                       HBM_KINDS);
    for (size_t i = 0; dtype && i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype, dtypes[i].name) == 0)
            esize = dtypes[i].bytes;
    if (!esize)
        return err_set(e, CODE_INVALID_ARGUMENT, "HBM allocation '%s': dtype '%s' is not f32, bf16, f16, s32, "
                       "s8, u8, f64 or s64", name ? name : "", dtype ? dtype : "(null)");
    if (rank < 0 || rank > HBM_RANK_MAX || (rank > 0 && !dims))
        return err_set(e, CODE_INVALID_ARGUMENT, "HBM allocation '%s': rank %d is not between 0 and %d",
                       name ? name : "", rank, HBM_RANK_MAX);
    b->kind = kind;
    b->rank = rank;
    snprintf(b->name, sizeof b->name, "%s", name ? name : "");
    snprintf(b->dtype, sizeof b->dtype, "%s", dtype);
    b->bytes = esize;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "HBM allocation '%s': dimension %d is %" PRId64,
                           b->name, i, dims[i]);
        b->dims[i] = dims[i];
        if (dims[i] && b->bytes > UINT64_MAX / (uint64_t)dims[i])
            return err_set(e, CODE_INVALID_ARGUMENT, "HBM allocation '%s': the shape overflows 64 bits",
                           b->name);
        b->bytes *= (uint64_t)dims[i];
    }
    return CODE_OK;
}

/* Room in the table for n more blocks. */
static int reserve_table(hbm *h, size_t n, err *e)
{
    if (h->nblocks + n <= h->cap)
        return CODE_OK;
    size_t ncap = h->cap ? h->cap : 16;
    while (ncap < h->nblocks + n)
        ncap *= 2;
    struct hbm_block *nb = realloc(h->blocks, ncap * sizeof *nb);
    if (!nb)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of host memory for the HBM allocation table");
    h->blocks = nb;
    h->cap = ncap;
    return CODE_OK;
}

/* Adds b (it fits, and the table has room); returns its id. */
static uint32_t push_block(hbm *h, struct hbm_block *b)
{
    b->id = h->next_id++;
    if (h->next_id == 0)
        h->next_id = 1;
    h->blocks[h->nblocks++] = *b;
    h->used += b->bytes;
    h->by_kind[b->kind] += b->bytes;
    if (h->used > h->peak)
        h->peak = h->used;
    return b->id;
}

int hbm_alloc(hbm *h, enum hbm_kind kind, const char *name, const char *dtype, const int64_t *dims, int rank,
              uint32_t *id, err *e)
{
    struct hbm_block b;
    int rc;

    if ((rc = make_block(kind, name, dtype, dims, rank, &b, e)) != CODE_OK)
        return rc;
    if (b.bytes > hbm_free_bytes(h)) {
        h->ooms++;
        return exhausted(h, &b, e);
    }
    if ((rc = reserve_table(h, 1, e)) != CODE_OK)
        return rc;
    uint32_t got = push_block(h, &b);
    if (id)
        *id = got;
    return CODE_OK;
}

static int is_argument(enum hbm_kind k)
{
    return k == HBM_WEIGHTS || k == HBM_OPTIMIZER || k == HBM_INFEED;
}

/* XLA's TPU compile-time out-of-memory report for a whole program (blocks
 * bs[0..n), together prog + args bytes) on top of what h holds now. */
static int program_exhausted(const hbm *h, const struct hbm_block *bs, size_t n, uint64_t prog, uint64_t args,
                             err *e)
{
    struct hbm_block top[HBM_LIST_MAX];
    char used[32], avail[32], over[32], total[32], res[32], p[32], a[32], sz[32], shape[128], msg[ERR_MSG_MAX];
    uint64_t reserved = h->used, need = prog + args, room = h->capacity - reserved, batchy = 0;
    size_t off, k = 0;

    if (need < prog)
        need = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (bs[i].kind == HBM_ACTIVATIONS || bs[i].kind == HBM_INFEED)
            batchy += bs[i].bytes;
    hbm_format_size(need, used, sizeof used);
    hbm_format_size(room, avail, sizeof avail);
    hbm_format_size(need - room, over, sizeof over);
    hbm_format_size(need > UINT64_MAX - reserved ? UINT64_MAX : need + reserved, total, sizeof total);
    hbm_format_size(reserved, res, sizeof res);
    hbm_format_size(prog, p, sizeof p);
    hbm_format_size(args, a, sizeof a);
    off = (size_t)snprintf(msg, sizeof msg,
                           "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used %s of %s hbm. "
                           "Exceeded hbm capacity by %s.\n\nTotal hbm usage >= %s:\n    reserved  %10s\n    program   "
                           "%10s\n    arguments %10s\n\n  Largest allocations in hbm:\n",
                           used, avail, over, total, res, p, a);
    /* the largest of the program's blocks and of what is there already */
    for (size_t i = 0; i < n + h->nblocks; i++)
        top_insert(top, &k, HBM_LIST_MAX, i < n ? &bs[i] : &h->blocks[i - n]);
    for (size_t i = 0; i < k && off < sizeof msg; i++) {
        hbm_format_size(top[i].bytes, sz, sizeof sz);
        hbm_format_shape(&top[i], shape, sizeof shape);
        off += (size_t)snprintf(msg + off, sizeof msg - off, "  %zu. %s %s '%s' %s\n", i + 1, sz,
                                hbm_kind_name(top[i].kind), top[i].name, shape);
    }
    if (off < sizeof msg) {
        if (batchy * 2 >= need)
            snprintf(msg + off, sizeof msg - off,
                     "Activations and infeed buffers take most of it and grow with the batch: use a smaller "
                     "per-core batch (or more cores for the same global batch), recompute activations in the "
                     "backward pass instead of keeping them (gradient checkpointing: "
                     "tpu_model_set_gradient_checkpointing), or use fewer or narrower layers.");
        else if (reserved * 2 >= need + reserved)
            snprintf(msg + off, sizeof msg - off,
                     "What was on the core before the compile takes most of it: free it, or use a core with "
                     "more HBM.");
        else
            snprintf(msg + off, sizeof msg - off,
                     "Weights, gradients and optimizer slots take most of it: use fewer or narrower layers, an "
                     "optimizer with fewer slots (SGD keeps none, Adam two per weight), or bfloat16 weights; a "
                     "smaller per-core batch saves only the activations.");
    }
    return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s", msg);
}

int hbm_alloc_program(hbm *h, const struct hbm_req *req, size_t n, uint32_t *ids, err *e)
{
    struct hbm_block *bs = calloc(n ? n : 1, sizeof *bs);
    uint64_t prog = 0, args = 0;
    int rc = CODE_OK;

    if (!bs)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of host memory for the HBM allocation table");
    for (size_t i = 0; i < n && rc == CODE_OK; i++) {
        uint64_t *sum = is_argument(req[i].kind) ? &args : &prog;
        if ((rc = make_block(req[i].kind, req[i].name, req[i].dtype, req[i].dims, req[i].rank, &bs[i], e)) !=
            CODE_OK)
            break;
        *sum = *sum + bs[i].bytes < *sum ? UINT64_MAX : *sum + bs[i].bytes;
    }
    if (rc == CODE_OK && (prog + args < prog || prog + args > hbm_free_bytes(h))) {
        h->ooms++;
        rc = program_exhausted(h, bs, n, prog, args, e);
    }
    if (rc == CODE_OK)
        rc = reserve_table(h, n, e);
    for (size_t i = 0; rc == CODE_OK && i < n; i++)
        ids[i] = push_block(h, &bs[i]);
    free(bs);
    return rc;
}

int hbm_release(hbm *h, uint32_t id, err *e)
{
    for (size_t i = 0; i < h->nblocks; i++) {
        struct hbm_block *b = &h->blocks[i];
        if (b->id != id)
            continue;
        h->used -= b->bytes;
        h->by_kind[b->kind] -= b->bytes;
        *b = h->blocks[--h->nblocks];
        return CODE_OK;
    }
    return err_set(e, CODE_NOT_FOUND, "HBM allocation %u is not live (released already, or from before the "
                   "last initialize)", id);
}
