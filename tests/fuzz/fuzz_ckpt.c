/* libFuzzer target: the checkpoint loader (client/src/train/ckpt.c) on any
 * file: the bytes land in a memfd read through its /proc path, as a file on
 * disk would be; every section found is read whole. A flipped byte fails
 * the checksum, so the corpus is sealed files and the fuzzer also gets to
 * seal its own (first byte odd: the rest is resealed with the format's
 * BLAKE2b before it is read), which reaches the table walk's checks. With
 * bit 1 of the first byte set the file is read with a key, as a client with
 * a cluster token reads it (and bit 2 then takes unkeyed files too), and a
 * file of format version 2 is sealed with that key. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sodium.h>

#include "ckpt.h"

uint8_t fuzz_ckpt_sum;
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    char path[64];
    ckpt *c;
    err e;

    if (size < 1 || size > (1u << 20))
        return 0;
    if (fd < 0 && ((fd = memfd_create("fuzz_ckpt", 0)) < 0 || sodium_init() < 0))
        return 0;
    uint8_t buf[(1u << 20) + 32];
    size_t n = size - 1;
    memcpy(buf, data + 1, n);
    static const unsigned char key[CKPT_KEY_BYTES] = "fuzz_ckpt: a fixed 32-byte key!";
    const unsigned char *k = (data[0] & 2) ? key : NULL;
    int keyed_file = n >= 12 && buf[8] == CKPT_VERSION_KEYED && buf[9] == 0 && buf[10] == 0 && buf[11] == 0;
    if ((data[0] & 1) && n >= CKPT_HASH_BYTES)
        crypto_generichash(buf + n - CKPT_HASH_BYTES, CKPT_HASH_BYTES, buf, n - CKPT_HASH_BYTES,
                           k && keyed_file ? k : NULL, k && keyed_file ? CKPT_KEY_BYTES : 0);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, n, 0) != (ssize_t)n)
        return 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (ckpt_read_sealed(path, k, (data[0] & 4) != 0, &c, NULL, &e) != CODE_OK)
        return 0;
    for (size_t i = 0; i < ckpt_num_sections(c); i++) {
        uint64_t bytes;
        const uint8_t *d = ckpt_get(c, ckpt_section_name(c, i), &bytes);
        for (uint64_t k = 0; d && k < bytes; k++)
            fuzz_ckpt_sum ^= d[k]; /* every byte of every section is read */
    }
    ckpt_free(c);
    return 0;
}
