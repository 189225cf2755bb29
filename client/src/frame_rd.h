/* A non-blocking reader of data-plane frames from one socket, shared by the
 * collectives' exchange (coll_io.c) and the training requests (train_io.c):
 * the 4-byte prefix, the header (bounded by FRAME_MAX_HEADER), then the
 * payload straight into the buffer the owner picks once it has seen the
 * header, or read and dropped. Never installed. */
#ifndef TPUEMU_CLIENT_FRAME_RD_H
#define TPUEMU_CLIENT_FRAME_RD_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"

struct frame_rd {
    int rd;                          /* FRD_PREFIX, FRD_HEADER, FRD_PAYLOAD, FRD_DONE */
    uint8_t pre[FRAME_PREFIX_BYTES];
    uint8_t rh[FRAME_MAX_HEADER];
    size_t got;
    uint32_t rhlen;
    uint8_t *dst;                    /* payload destination; NULL: discard */
    uint64_t left;                   /* payload bytes still to read */
};

enum { FRD_PREFIX = 0, FRD_HEADER, FRD_PAYLOAD, FRD_DONE };

/* What the owner does with a frame. on_header gets the whole header's bytes
 * and sets *dst (NULL: drop the payload) and *left (the payload's size, from
 * the decoded header); a non-zero return stops reading. on_payload (may be
 * NULL) is called once the payload is in (also for an empty one). */
struct frame_rd_ops {
    int (*on_header)(void *arg, const uint8_t *hdr, uint32_t len, uint8_t **dst, uint64_t *left);
    void (*on_payload)(void *arg, uint64_t got);
};

/* Why frame_rd_pump stopped reading. */
enum frame_rd_end {
    FRD_AGAIN = 0,    /* nothing more to read now */
    FRD_ONE = 1,      /* one == 1 and a whole frame is in: r is in FRD_DONE */
    FRD_CLOSED = -1,  /* the peer closed (why: "closed") */
    FRD_BROKEN = -2,  /* reset or lost (why: "reset" or "lost") */
    FRD_BAD = -3,     /* a bad prefix (why: what was wrong) */
    FRD_STOPPED = -4, /* on_header said so */
};

/* Reads what the socket has. With one set, stops after one whole frame. */
int frame_rd_pump(struct frame_rd *r, int fd, int one, const struct frame_rd_ops *ops, void *arg, char *why,
                  size_t whyn);

#endif
