/* Data-plane framing: a little-endian u32 header length, a packed FrameHeader,
 * then header->payload_bytes raw bytes. The header is bounded before it is
 * decoded and the payload size is checked against the receiver's limit before
 * anything is allocated for it. */
#ifndef TPUEMU_COMMON_FRAME_H
#define TPUEMU_COMMON_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tpuemu.pb-c.h"

#define FRAME_PREFIX_BYTES 4u
/* Room for a training answer's per-step statistics (128 steps per execution). */
#define FRAME_MAX_HEADER 16384u
/* Largest tensor payload a frame may carry (a receiver may set a lower one). */
#define FRAME_MAX_PAYLOAD (256ull * 1024 * 1024)

/* Writes prefix + header into out (cap >= FRAME_PREFIX_BYTES + FRAME_MAX_HEADER);
 * returns bytes written, 0 if the header is too large. Sets version. */
size_t frame_encode(Tpuemu__FrameHeader *h, uint8_t *out, size_t cap);

/* Reads the prefix: CODE_OK with *hlen set, or INVALID_ARGUMENT if 0 or over the cap. */
int frame_prefix(const uint8_t prefix[FRAME_PREFIX_BYTES], uint32_t *hlen, err *e);

/* Decodes a header of hlen bytes and checks version, kind and payload size.
 * *out is freed with frame_header_free(). */
int frame_decode(const uint8_t *buf, size_t hlen, uint64_t max_payload, Tpuemu__FrameHeader **out,
                 err *e);
void frame_header_free(Tpuemu__FrameHeader *h);

#endif
