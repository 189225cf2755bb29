/* Training checkpoint files inside libtpuclient: named byte sections written
 * atomically and sealed with a checksum, read back and verified whole.
 * Internal (never installed); it does no I/O other than the one file and its
 * directory, never logs and never exits.
 *
 * File format, version 1 (all integers little-endian):
 *
 *   "TPUEMUCK"                     8 bytes, magic
 *   u32 format version             1
 *   u32 section count              0..CKPT_MAX_SECTIONS
 *   per section, in write order:
 *     u16 name length              1..CKPT_NAME_MAX
 *     name bytes                   no NUL, unique within the file
 *     u64 byte count
 *     zero padding                 0..7 bytes, so the data starts at a file
 *                                  offset that is a multiple of 8
 *     data                         byte count bytes
 *   BLAKE2b-256 (libsodium crypto_generichash) of every byte before it
 *                                  32 bytes
 *
 * Format version 1 is sealed with the unkeyed BLAKE2b-256, version 2 (same
 * layout) with BLAKE2b-256 keyed with CKPT_KEY_BYTES derived from the cluster
 * token: the version says which seal a file carries.
 *
 * Thread safety: ckpt_write() and ckpt_read() share no state and may run in
 * any number of threads at once (two writers of the same path race, and the
 * last rename wins, but neither leaves a damaged file). A ckpt handle may be
 * read from many threads; ckpt_free() must not race with them. */
#ifndef TPUEMU_CLIENT_CKPT_H
#define TPUEMU_CLIENT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define CKPT_MAGIC "TPUEMUCK"
#define CKPT_VERSION 1u
#define CKPT_MAX_SECTIONS 64
#define CKPT_NAME_MAX 255
#define CKPT_VERSION_KEYED 2u
#define CKPT_HASH_BYTES 32
#define CKPT_KEY_BYTES 32

/* One section to write. name is a NUL-terminated string of 1..CKPT_NAME_MAX
 * bytes; data may be NULL only when bytes is 0. Both are only read during
 * ckpt_write(). */
struct ckpt_section {
    const char *name;
    const void *data;
    uint64_t bytes;
};

/* Writes n named sections to path atomically: a temp file in the same
 * directory (path.tmp.PID.RANDOM, created with O_EXCL and mode 0666 & ~umask),
 * write all (section data is streamed, not copied into one buffer, and hashed
 * incrementally), fsync the file, rename over path, fsync the directory.
 * Never leaves a half-written file at path: readers see the old file or the
 * new one. On any failure before the rename, the temp file is removed and the
 * old file at path (if any) is untouched. If only the final directory fsync
 * fails, the new file is already in place but may not survive a power loss;
 * the error says so.
 *
 * Blocks for the disk writes and two fsyncs (milliseconds to seconds).
 * Arguments are all validated before anything is created.
 *
 * Returns CODE_OK or, with e set (message names path and says what failed):
 *   CODE_INVALID_ARGUMENT   path NULL/empty, a name empty, longer than
 *                           CKPT_NAME_MAX or a duplicate, NULL data with
 *                           bytes > 0, n > CKPT_MAX_SECTIONS
 *   CODE_PERMISSION_DENIED  EACCES, EPERM, EROFS
 *   CODE_NOT_FOUND          ENOENT, ENOTDIR (the directory does not exist)
 *   CODE_RESOURCE_EXHAUSTED ENOSPC, EDQUOT, EFBIG, out of memory
 *   CODE_UNAVAILABLE        any other I/O error (with strerror)
 *   CODE_INTERNAL           libsodium could not be initialized */
int ckpt_write(const char *path, const struct ckpt_section *s, size_t n, err *e);
/* Same, sealed with a keyed MAC (format version 2) when key (CKPT_KEY_BYTES)
 * is not NULL; ckpt_write is this with key NULL (format version 1). */
int ckpt_write_sealed(const char *path, const struct ckpt_section *s, size_t n, const unsigned char *key, err *e);

/* A save that crashed (the process killed between creating its temp file and
 * the rename) leaves path.tmp.PID.XXXXXXXX behind. ckpt_write and ckpt_read
 * remove such files of their path first, when their writer is gone: no process
 * PID on this machine and untouched for CKPT_TMP_STALE_S, or untouched for
 * CKPT_TMP_ABANDONED_S whatever the PID. Nothing else in the directory is
 * touched. ckpt_sweep_stale does it alone; returns how many it removed. */
#define CKPT_TMP_STALE_S 60
#define CKPT_TMP_ABANDONED_S (24 * 3600)
int ckpt_sweep_stale(const char *path);

/* A checkpoint read into memory. Opaque. */
typedef struct ckpt ckpt;

/* Reads the whole file at path into one buffer and verifies it: magic and
 * version first, then the checksum, then the section table. No section data
 * is trusted before the checksum matches, and every size is checked against
 * the file's size before it is used (the only allocations are the file's own
 * size and a fixed-size index). On success *out is a new handle the caller
 * frees with ckpt_free(); on failure *out is NULL.
 *
 * Blocks for reading the file.
 *
 * Returns CODE_OK or, with e set (the message names path):
 *   CODE_NOT_FOUND          the file (or its directory) does not exist
 *   CODE_DATA_LOSS          "not a tpuemu checkpoint" (bad magic),
 *                           "unsupported format version N", "truncated",
 *                           "trailing bytes", "section table inconsistent",
 *                           "checksum mismatch: the file is damaged" (with a
 *                           hint when the damage looks like truncation or
 *                           appended bytes)
 *   CODE_INVALID_ARGUMENT   path or out NULL, path not a regular file
 *   CODE_PERMISSION_DENIED  EACCES, EPERM
 *   CODE_RESOURCE_EXHAUSTED the file does not fit in memory
 *   CODE_UNAVAILABLE        any other I/O error */
int ckpt_read(const char *path, ckpt **out, err *e);
/* Same, with a key (CKPT_KEY_BYTES) or NULL. ckpt_read is this with key NULL.
 *   key NULL: a version 1 file is read as ckpt_read does; a version 2
 *     (keyed) file is CODE_UNAUTHENTICATED, "sealed with a cluster token".
 *   key set: a version 2 file must carry the keyed MAC under key, else
 *     CODE_UNAUTHENTICATED "its seal does not match this cluster's token"
 *     (another key and damage look the same); a version 1 (unkeyed) file is
 *     CODE_UNAUTHENTICATED "sealed with an unkeyed checksum only" unless
 *     allow_unkeyed, and then read as ckpt_read does.
 * On success *keyed (if not NULL) is 1 when the file carried a keyed MAC. */
int ckpt_read_sealed(const char *path, const unsigned char *key, int allow_unkeyed, ckpt **out, int *keyed, err *e);

/* The section called name: its data (owned by c, valid until ckpt_free(c),
 * 8-byte aligned, never NULL for a present section, even a 0-byte one) and
 * its size in *bytes (if bytes is not NULL). NULL if c has no such section. */
const void *ckpt_get(const ckpt *c, const char *name, uint64_t *bytes);

/* Number of sections, and the name of section i (0-based, in the order they
 * were written; owned by c; NULL if i is out of range). */
size_t ckpt_num_sections(const ckpt *c);
const char *ckpt_section_name(const ckpt *c, size_t i);

/* Frees c and everything ckpt_get()/ckpt_section_name() returned. NULL is a no-op. */
void ckpt_free(ckpt *c);

#endif
