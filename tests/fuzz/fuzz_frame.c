/* libFuzzer target: the data-plane frame reader (prefix, then header). */
#include <stddef.h>
#include <stdint.h>

#include "frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t hlen;
    Tpuemu__FrameHeader *h;
    err e;

    if (size < FRAME_PREFIX_BYTES)
        return 0;
    if (frame_prefix(data, &hlen, &e) == CODE_OK && hlen <= size - FRAME_PREFIX_BYTES &&
        frame_decode(data + FRAME_PREFIX_BYTES, hlen, FRAME_MAX_PAYLOAD, &h, &e) == CODE_OK)
        frame_header_free(h);
    /* the header decoder alone, on everything after the prefix */
    if (size - FRAME_PREFIX_BYTES <= FRAME_MAX_HEADER &&
        frame_decode(data + FRAME_PREFIX_BYTES, size - FRAME_PREFIX_BYTES, 1u << 20, &h, &e) == CODE_OK)
        frame_header_free(h);
    return 0;
}
