/* libFuzzer target: address lists as users type them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    addr out[8];
    size_t n;
    err e;
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (addr_parse_list(s, ADDR_DEFAULT_PORT, out, 8, &n, &e) == CODE_OK) {
        char url[ADDR_HOST_MAX + 32];
        for (size_t i = 0; i < n; i++) {
            addr_nn_url(out[i].host, out[i].port, url, sizeof url);
            (void)addr_is_loopback(out[i].host);
        }
    }
    free(s);
    return 0;
}
