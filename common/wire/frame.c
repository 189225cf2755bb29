/* Data-plane frame header codec. */
#include "frame.h"

#include <string.h>

#include "wire.h"

size_t frame_encode(Tpuemu__FrameHeader *h, uint8_t *out, size_t cap)
{
    size_t n;
    h->version = WIRE_VERSION;
    n = tpuemu__frame_header__get_packed_size(h);
    if (n == 0 || n > FRAME_MAX_HEADER || cap < FRAME_PREFIX_BYTES + n)
        return 0;
    out[0] = (uint8_t)n;
    out[1] = (uint8_t)(n >> 8);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 24);
    tpuemu__frame_header__pack(h, out + FRAME_PREFIX_BYTES);
    return FRAME_PREFIX_BYTES + n;
}

int frame_prefix(const uint8_t p[FRAME_PREFIX_BYTES], uint32_t *hlen, err *e)
{
    uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (n == 0 || n > FRAME_MAX_HEADER)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "frame header length %u is outside 1..%u (not a tpuemu data-plane peer?)",
                       n, FRAME_MAX_HEADER);
    *hlen = n;
    return CODE_OK;
}

int frame_decode(const uint8_t *buf, size_t hlen, uint64_t max_payload, Tpuemu__FrameHeader **out,
                 err *e)
{
    Tpuemu__FrameHeader *h;

    *out = NULL;
    if (hlen == 0 || hlen > FRAME_MAX_HEADER)
        return err_set(e, CODE_INVALID_ARGUMENT, "frame header length %zu is outside 1..%u", hlen,
                       FRAME_MAX_HEADER);
    h = tpuemu__frame_header__unpack(NULL, hlen, buf);
    if (!h)
        return err_set(e, CODE_INVALID_ARGUMENT, "could not decode a %zu-byte frame header", hlen);
    if (h->version != WIRE_VERSION) {
        err_set(e, CODE_FAILED_PRECONDITION,
                "peer speaks data-plane protocol version %u, this side speaks %u; run the same "
                "tpuemu release on every host", h->version, WIRE_VERSION);
        goto bad;
    }
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_KIND_UNSPECIFIED || h->kind > TPUEMU__FRAME_KIND__FRAME_PROFILE_RESULT) {
        err_set(e, CODE_INVALID_ARGUMENT, "unknown frame kind %d", (int)h->kind);
        goto bad;
    }
    if (h->payload_bytes > max_payload) {
        err_set(e, CODE_INVALID_ARGUMENT, "frame announces %llu payload bytes, the limit is %llu",
                (unsigned long long)h->payload_bytes, (unsigned long long)max_payload);
        goto bad;
    }
    *out = h;
    return CODE_OK;
bad:
    tpuemu__frame_header__free_unpacked(h, NULL);
    return e ? e->code : CODE_INVALID_ARGUMENT;
}

void frame_header_free(Tpuemu__FrameHeader *h)
{
    if (h)
        tpuemu__frame_header__free_unpacked(h, NULL);
}
