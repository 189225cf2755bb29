/* libFuzzer target: byte counts with suffixes ("16GiB"). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    long long v;
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (opt_parse_bytes(s, &v) == 0 && v < 0)
        abort(); /* a parsed count is never negative */
    free(s);
    return 0;
}
