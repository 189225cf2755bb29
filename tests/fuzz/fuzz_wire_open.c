/* libFuzzer target: wire_open on arbitrary bytes, with and without a token
 * and a replay cache (what a daemon does with every control message). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static auth none, keyed;
    static replay *r;
    static int ready;
    wire_msg *m;
    err e;

    if (!ready) {
        auth_global_init();
        auth_from_token(&keyed, "fuzz-token-0123456789", 21, &e);
        r = replay_new(1024);
        ready = 1;
    }
    if (wire_open(&none, NULL, data, size, WIRE_MAX_REQUEST, &m, &e) == CODE_OK) {
        (void)wire_body_name(m);
        wire_msg_free(m);
    }
    if (wire_open(&keyed, r, data, size, WIRE_MAX_REQUEST, &m, &e) == CODE_OK)
        wire_msg_free(m);
    else
        (void)wire_peek_nonce(data, size, WIRE_MAX_REQUEST); /* what a refusal is bound to */
    return 0;
}
