/* The data-plane frame reader of the client (frame_rd.h). */
#include "frame_rd.h"

#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>

int frame_rd_pump(struct frame_rd *r, int fd, int one, const struct frame_rd_ops *ops, void *arg, char *why,
                  size_t whyn)
{
    uint8_t scratch[16 * 1024];
    for (;;) {
        uint8_t *buf;
        size_t want;
        err e;
        switch (r->rd) {
        case FRD_PREFIX:
            buf = r->pre + r->got;
            want = sizeof r->pre - r->got;
            break;
        case FRD_HEADER:
            buf = r->rh + r->got;
            want = r->rhlen - r->got;
            break;
        case FRD_PAYLOAD:
            if (r->dst) {
                buf = r->dst + r->got;
                want = (size_t)r->left;
            } else {
                buf = scratch;
                want = r->left < sizeof scratch ? (size_t)r->left : sizeof scratch;
            }
            break;
        default:
            return one ? FRD_ONE : FRD_AGAIN;
        }
        ssize_t n = want ? recv(fd, buf, want, MSG_DONTWAIT) : 0;
        if (want && n == 0) {
            snprintf(why, whyn, "closed");
            return FRD_CLOSED;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return FRD_AGAIN;
            snprintf(why, whyn, "%s", errno == ECONNRESET ? "reset" : "lost");
            return FRD_BROKEN;
        }
        r->got += (size_t)n;
        if (r->rd == FRD_PREFIX && r->got == sizeof r->pre) {
            if (frame_prefix(r->pre, &r->rhlen, &e) != CODE_OK) {
                snprintf(why, whyn, "%.900s", e.msg);
                return FRD_BAD;
            }
            r->rd = FRD_HEADER;
            r->got = 0;
        } else if (r->rd == FRD_HEADER && r->got == r->rhlen) {
            r->dst = NULL;
            r->left = 0;
            if (ops->on_header(arg, r->rh, r->rhlen, &r->dst, &r->left) != 0)
                return FRD_STOPPED;
            r->rd = FRD_PAYLOAD;
            r->got = 0;
        } else if (r->rd == FRD_PAYLOAD) {
            r->left -= (size_t)n;
            if (!r->dst)
                r->got = 0;
        }
        if (r->rd == FRD_PAYLOAD && r->left == 0) {
            uint64_t got = r->dst ? r->got : 0;
            r->rd = one ? FRD_DONE : FRD_PREFIX;
            r->got = 0;
            if (ops->on_payload)
                ops->on_payload(arg, got);
            if (one)
                return FRD_ONE;
        }
    }
}
