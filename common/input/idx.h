/* IDX files: the big-endian array format (Fashion-)MNIST ships in, plain or
 * gzip-compressed (detected by its magic bytes). Everything in a file is
 * untrusted: the header is checked before anything is allocated, sizes over
 * 4 GiB are refused, and a gzip stream grows its buffer as data really
 * arrives, so a lying header cannot make us allocate what the file does not
 * hold. Errors name the file and what is wrong: CODE_NOT_FOUND,
 * CODE_PERMISSION_DENIED, CODE_DATA_LOSS (not an IDX file, truncated, corrupt
 * gzip, trailing data), CODE_INVALID_ARGUMENT (rank outside 1..4, a
 * directory), CODE_RESOURCE_EXHAUSTED, CODE_UNKNOWN. */
#ifndef TPUEMU_COMMON_IDX_H
#define TPUEMU_COMMON_IDX_H

#include <stddef.h>

#include "status.h"

struct idx_array {
    int dtype; /* 0x08 u8, 0x09 s8, 0x0B s16, 0x0C s32, 0x0D f32, 0x0E f64 */
    int rank;  /* 1..4 */
    size_t dims[4];
    size_t count; /* product of dims */
    void *data;   /* count elements in host byte order (malloc'd); NULL for a header */
};

/* Reads the whole file into *out (zeroed on failure). */
int idx_read(const char *path, struct idx_array *out, err *e);
/* Reads and checks only the header (type, rank, dims; a plain file's size
 * against them): data stays NULL. */
int idx_read_header(const char *path, struct idx_array *out, err *e);
void idx_clear(struct idx_array *a);

#endif
