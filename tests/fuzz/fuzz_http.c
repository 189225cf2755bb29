/* libFuzzer target: the metrics server's HTTP request head parser, fed as the
 * server feeds it (a head only once its empty line has arrived, at most 8 KiB). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "httphead.h"

#define MAX_HEAD 8192

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_head q;
    const char *why = NULL;
    char *buf;
    size_t len = size < MAX_HEAD ? size : MAX_HEAD, hlen;

    if (!(buf = malloc(MAX_HEAD + 1)))
        return 0;
    memcpy(buf, data, len);
    /* bytes arrive in pieces: search from a point inside, as after a short read */
    hlen = http_head_end(buf, len, len > 3 ? len / 2 - 3 : 0);
    if (!hlen)
        hlen = http_head_end(buf, len, 0);
    if (hlen) {
        buf[hlen] = '\0';
        int st = http_head_parse(buf, hlen, &q, &why);
        if (st == 0) {
            if (!q.method || !q.target || !q.version || q.target[0] != '/' || strlen(q.method) == 0)
                abort();
            /* the console's key: one Authorization at most, its value within the head */
            if (q.authorizations > 1 || (q.authorization && (q.authorization < buf || q.authorization >= buf + hlen ||
                                                             strlen(q.authorization) >= hlen)))
                abort();
        } else if (!why || (st != 400 && st != 431 && st != 505)) {
            abort();
        }
    }
    free(buf);
    return 0;
}
