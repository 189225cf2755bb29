/* Unit tests of common/wire/frame: the data-plane frame header codec. */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "frame.h"
#include "wire.h"

Test(frame, round_trip)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER], chal[AUTH_CHALLENGE_BYTES];
    uint32_t hlen;
    Tpuemu__FrameHeader *out;
    err e;

    memset(chal, 0x5a, sizeof chal);
    h.kind = TPUEMU__FRAME_KIND__FRAME_HELLO;
    h.step = 9;
    h.payload_bytes = 1000;
    h.challenge.data = chal;
    h.challenge.len = sizeof chal;
    size_t n = frame_encode(&h, buf, sizeof buf);
    cr_assert_gt(n, FRAME_PREFIX_BYTES);
    cr_assert_eq(frame_prefix(buf, &hlen, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(hlen + FRAME_PREFIX_BYTES, n);
    cr_assert_eq(frame_decode(buf + FRAME_PREFIX_BYTES, hlen, 1000, &out, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(out->kind, TPUEMU__FRAME_KIND__FRAME_HELLO);
    cr_assert_eq(out->version, WIRE_VERSION);
    cr_assert_eq(out->step, 9);
    cr_assert_eq(out->payload_bytes, 1000);
    cr_assert_eq(out->challenge.len, sizeof chal);
    cr_assert_arr_eq(out->challenge.data, chal, sizeof chal);
    frame_header_free(out);
    frame_header_free(NULL);
}

Test(frame, payload_over_limit)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER];
    Tpuemu__FrameHeader *out;
    err e;
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    h.payload_bytes = 1ull << 40;
    size_t n = frame_encode(&h, buf, sizeof buf);
    cr_assert_gt(n, 0);
    cr_assert_eq(frame_decode(buf + 4, n - 4, FRAME_MAX_PAYLOAD, &out, &e), CODE_INVALID_ARGUMENT);
    cr_assert_null(out);
    cr_assert(strstr(e.msg, "1099511627776"), "%s", e.msg);
}

Test(frame, prefix_bounds)
{
    uint8_t zero[4] = {0, 0, 0, 0}, big[4] = {0, 0, 0, 0x80}, cap[4] = {0, 0x40, 0, 0}, over[4] = {1, 0x40, 0, 0};
    uint32_t hlen = 77;
    err e;
    cr_assert_eq(frame_prefix(zero, &hlen, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(frame_prefix(big, &hlen, &e), CODE_INVALID_ARGUMENT, "2^31");
    cr_assert(strstr(e.msg, "2147483648"), "%s", e.msg);
    cr_assert_eq(frame_prefix(over, &hlen, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(hlen, 77, "untouched on failure");
    cr_assert_eq(frame_prefix(cap, &hlen, &e), CODE_OK);
    cr_assert_eq(hlen, FRAME_MAX_HEADER);
}

Test(frame, bad_headers)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER];
    Tpuemu__FrameHeader *out;
    err e;
    size_t n;

    /* unknown kind */
    h.kind = (Tpuemu__FrameKind)99;
    n = frame_encode(&h, buf, sizeof buf);
    cr_assert_eq(frame_decode(buf + 4, n - 4, 0, &out, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "kind"), "%s", e.msg);
    h.kind = TPUEMU__FRAME_KIND__FRAME_KIND_UNSPECIFIED;
    h.step = 1;
    n = frame_encode(&h, buf, sizeof buf);
    cr_assert_eq(frame_decode(buf + 4, n - 4, 0, &out, &e), CODE_INVALID_ARGUMENT);

    /* version 2 */
    h.kind = TPUEMU__FRAME_KIND__FRAME_PING;
    n = frame_encode(&h, buf, sizeof buf);
    Tpuemu__FrameHeader *d = tpuemu__frame_header__unpack(NULL, n - 4, buf + 4);
    d->version = 2;
    n = tpuemu__frame_header__pack(d, buf + 4);
    tpuemu__frame_header__free_unpacked(d, NULL);
    cr_assert_eq(frame_decode(buf + 4, n, 0, &out, &e), CODE_FAILED_PRECONDITION);

    /* garbage, empty, over the cap */
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    cr_assert_eq(frame_decode(junk, sizeof junk, 0, &out, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(frame_decode(junk, 0, 0, &out, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(frame_decode(junk, FRAME_MAX_HEADER + 1, 0, &out, &e), CODE_INVALID_ARGUMENT);
    cr_assert_null(out);
}

Test(frame, truncated_header)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER], mac[32];
    Tpuemu__FrameHeader *out;
    err e;
    memset(mac, 1, sizeof mac);
    h.kind = TPUEMU__FRAME_KIND__FRAME_AUTH;
    h.mac.data = mac;
    h.mac.len = sizeof mac;
    h.peer = "client 1@test";
    size_t n = frame_encode(&h, buf, sizeof buf);
    for (size_t k = 1; k < n - 4; k++) {
        int rc = frame_decode(buf + 4, k, 0, &out, &e);
        if (rc == CODE_OK)
            frame_header_free(out); /* a prefix may decode; it must not crash */
    }
}

Test(frame, encode_refuses_oversized_header)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    uint8_t buf[FRAME_PREFIX_BYTES + FRAME_MAX_HEADER];
    char peer[2 * FRAME_MAX_HEADER];
    memset(peer, 'p', sizeof peer - 1);
    peer[sizeof peer - 1] = '\0';
    h.kind = TPUEMU__FRAME_KIND__FRAME_AUTH;
    h.peer = peer;
    cr_assert_eq(frame_encode(&h, buf, sizeof buf), 0);
    h.peer = "short";
    cr_assert_eq(frame_encode(&h, buf, 8), 0, "output buffer too small");
}
