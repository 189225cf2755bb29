/* Checkpoint files: atomic write (temp file, fsync, rename, fsync dir) and a
 * verified read. The format (little-endian):
 *
 *   "TPUEMUCK" | u32 version | u32 count |
 *   count x { u16 name_len | name | u64 bytes | zero pad to 8 | data } |
 *   BLAKE2b-256 of everything before it: unkeyed in version 1, keyed with a
 *   key derived from the cluster token in version 2
 *
 * (see ckpt.h for the contract). The reader never uses a size from the file
 * before checking it against the file's real size, and trusts nothing before
 * the checksum matches; the table walk it uses to parse is also run on a
 * damaged file, only to say what the damage looks like. */
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "safefile.h"

#define HEADER_BYTES 16u /* magic, version, count */
#define MIN_FILE_BYTES (HEADER_BYTES + CKPT_HASH_BYTES)
#define WBUF_BYTES (64u * 1024u)

struct ckpt_entry {
    char name[CKPT_NAME_MAX + 1];
    const unsigned char *data;
    uint64_t bytes;
};

struct ckpt {
    unsigned char *buf; /* the whole file */
    size_t size;
    size_t n;
    struct ckpt_entry sec[CKPT_MAX_SECTIONS];
};

/* ---- errors ---- */

static int errno_code(int en)
{
    switch (en) {
    case EACCES: case EPERM: case EROFS:
        return CODE_PERMISSION_DENIED;
    case ENOENT: case ENOTDIR:
        return CODE_NOT_FOUND;
    case ENOSPC: case EDQUOT: case EFBIG: case ENOMEM:
        return CODE_RESOURCE_EXHAUSTED;
    default:
        return CODE_UNAVAILABLE;
    }
}

static int io_err(err *e, int en, const char *path, const char *what, const char *file)
{
    char sbuf[128];
    const char *s = strerror_r(en, sbuf, sizeof sbuf); /* GNU: returns the text */
    if (file && strcmp(file, path) != 0)
        return err_set(e, errno_code(en), "checkpoint %s: %s %s: %s", path, what, file, s);
    return err_set(e, errno_code(en), "checkpoint %s: %s: %s", path, what, s);
}

/* ---- little-endian ---- */

static void put_le(unsigned char *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- writing ---- */

/* Buffers small pieces, writes large data straight from the caller, and
 * hashes every byte on the way out. */
struct writer {
    int fd;
    unsigned char *buf;
    size_t len;
    uint64_t off; /* bytes emitted so far (file offset of the next byte) */
    crypto_generichash_state h;
    int keyed;
    int err_no;
};

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (k == 0)
            return ENOSPC; /* a regular file that takes nothing is full */
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int w_flush(struct writer *w)
{
    if (w->err_no == 0 && w->len > 0)
        w->err_no = write_all(w->fd, w->buf, w->len);
    w->len = 0;
    return w->err_no;
}

static int w_put(struct writer *w, const void *p, uint64_t n)
{
    const unsigned char *b = p;

    if (w->err_no)
        return w->err_no;
    while (n > 0) {
        /* crypto_generichash_update takes unsigned long long; chunk anyway to
         * keep the size_t conversions below obviously safe. */
        size_t k = n > (1u << 30) ? (1u << 30) : (size_t)n;
        crypto_generichash_update(&w->h, b, k);
        if (w->len + k <= WBUF_BYTES) {
            memcpy(w->buf + w->len, b, k);
            w->len += k;
        } else if (w_flush(w) == 0) {
            if (k >= WBUF_BYTES) {
                w->err_no = write_all(w->fd, b, k);
            } else {
                memcpy(w->buf, b, k);
                w->len = k;
            }
        }
        if (w->err_no)
            return w->err_no;
        w->off += k;
        b += k;
        n -= k;
    }
    return 0;
}

static int w_put_le(struct writer *w, uint64_t v, size_t n)
{
    unsigned char b[8];
    put_le(b, v, n);
    return w_put(w, b, n);
}

static int check_sections(const char *path, const struct ckpt_section *s, size_t n, err *e)
{
    if (n > CKPT_MAX_SECTIONS)
        return err_set(e, CODE_INVALID_ARGUMENT, "checkpoint %s: %zu sections, at most %d",
                       path, n, CKPT_MAX_SECTIONS);
    if (n > 0 && !s)
        return err_set(e, CODE_INVALID_ARGUMENT, "checkpoint %s: sections is NULL", path);
    for (size_t i = 0; i < n; i++) {
        if (!s[i].name || s[i].name[0] == '\0')
            return err_set(e, CODE_INVALID_ARGUMENT, "checkpoint %s: section %zu has no name",
                           path, i);
        size_t len = strlen(s[i].name);
        if (len > CKPT_NAME_MAX)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "checkpoint %s: section %zu's name is %zu bytes, at most %d", path,
                           i, len, CKPT_NAME_MAX);
        if (!s[i].data && s[i].bytes > 0)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "checkpoint %s: section \"%s\" has NULL data and %" PRIu64 " bytes",
                           path, s[i].name, s[i].bytes);
        for (size_t j = 0; j < i; j++)
            if (strcmp(s[i].name, s[j].name) == 0)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "checkpoint %s: section name \"%s\" appears twice (%zu and %zu)",
                               path, s[i].name, j, i);
    }
    return CODE_OK;
}

/* The directory holding path, for the fsync that makes the rename durable. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* Temp files of path that a crash during a save left behind: our own naming
 * only (path.tmp.PID.XXXXXXXX, 8 hex digits), and only when its writer is
 * gone: no process PID on this machine (not this one) and untouched for
 * CKPT_TMP_STALE_S, or untouched for CKPT_TMP_ABANDONED_S whatever the PID (a
 * PID reused, or a writer on another machine sharing the directory, which
 * would have renamed or removed it long before). Best effort: what cannot be
 * read or removed is left. Returns how many were removed. */
int ckpt_sweep_stale(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    char *dir = dir_of(path);
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *de;
    time_t now = time(NULL);
    int removed = 0;

    if (!d || blen == 0) {
        if (d)
            closedir(d);
        free(dir);
        return 0;
    }
    while ((de = readdir(d))) {
        const char *n = de->d_name, *q;
        char *end;
        struct stat st;
        long pid;

        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0)
            continue;
        q = n + blen + 5;
        if (*q < '1' || *q > '9')
            continue;
        errno = 0;
        pid = strtol(q, &end, 10);
        if (errno || pid <= 0 || pid > INT32_MAX || *end != '.' || strlen(end + 1) != 8 ||
            strspn(end + 1, "0123456789abcdef") != 8)
            continue;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        double age = difftime(now, st.st_mtime);
        int gone = pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if ((gone && age >= CKPT_TMP_STALE_S) || age >= CKPT_TMP_ABANDONED_S)
            removed += unlinkat(dirfd(d), n, 0) == 0;
    }
    closedir(d);
    free(dir);
    return removed;
}

static int write_body(struct writer *w, const struct ckpt_section *s, size_t n)
{
    static const unsigned char zeros[8];
    unsigned char hash[CKPT_HASH_BYTES];

    w_put(w, CKPT_MAGIC, 8);
    w_put_le(w, w->keyed ? CKPT_VERSION_KEYED : CKPT_VERSION, 4);
    w_put_le(w, n, 4);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(s[i].name);
        w_put_le(w, len, 2);
        w_put(w, s[i].name, len);
        w_put_le(w, s[i].bytes, 8);
        w_put(w, zeros, (8 - w->off % 8) % 8);
        if (s[i].bytes > 0)
            w_put(w, s[i].data, s[i].bytes);
    }
    if (w->err_no)
        return w->err_no;
    crypto_generichash_final(&w->h, hash, sizeof hash);
    if (w_flush(w) == 0)
        w->err_no = write_all(w->fd, hash, sizeof hash);
    return w->err_no;
}

int ckpt_write(const char *path, const struct ckpt_section *s, size_t n, err *e)
{
    return ckpt_write_sealed(path, s, n, NULL, e);
}

int ckpt_write_sealed(const char *path, const struct ckpt_section *s, size_t n, const unsigned char *key, err *e)
{
    struct writer w = {.fd = -1, .keyed = key != NULL};
    struct safefile sf;
    int rc, en;

    if (!path || path[0] == '\0')
        return err_set(e, CODE_INVALID_ARGUMENT, "checkpoint: empty path");
    if ((rc = check_sections(path, s, n, e)) != CODE_OK)
        return rc;
    if (sodium_init() < 0)
        return err_set(e, CODE_INTERNAL, "checkpoint %s: libsodium failed to initialize", path);

    if (!(w.buf = malloc(WBUF_BYTES)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory", path);
    /* a symbolic link is kept and the file it names is rewritten; a
     * directory, device or FIFO is refused before anything is created */
    if ((rc = safefile_open(&sf, "checkpoint", path, e)) != CODE_OK)
        goto out;
    ckpt_sweep_stale(sf.target); /* a crashed save's leftovers */
    w.fd = sf.fd;

    crypto_generichash_init(&w.h, key, key ? CKPT_KEY_BYTES : 0, CKPT_HASH_BYTES);
    if ((en = write_body(&w, s, n)) != 0) {
        rc = io_err(e, en, path, "writing temp file", sf.tmp);
        safefile_abort(&sf);
        goto out;
    }
    rc = safefile_commit(&sf, 1, e);
out:
    sodium_memzero(&w.h, sizeof w.h);
    free(w.buf);
    return rc;
}

/* ---- reading ---- */

enum walk { WALK_OK, WALK_SHORT, WALK_LONG, WALK_BAD };

/* Walks the section table of buf[0..end) (end = where the hash starts),
 * filling c->sec if c is not NULL. Every length is checked against end
 * before it is used. On WALK_SHORT *need is a lower bound on the bytes the
 * table needs; on WALK_BAD why says what is wrong. */
static enum walk walk(const unsigned char *buf, size_t end, struct ckpt *c, uint64_t *need,
                      char *why, size_t why_max)
{
    uint64_t count = get_le(buf + 12, 4);
    size_t off = HEADER_BYTES;

    if (count > CKPT_MAX_SECTIONS) {
        snprintf(why, why_max, "%" PRIu64 " sections, at most %d", count, CKPT_MAX_SECTIONS);
        return WALK_BAD;
    }
    for (size_t i = 0; i < count; i++) {
        if (end - off < 2) {
            *need = (uint64_t)off + 2;
            return WALK_SHORT;
        }
        size_t len = (size_t)get_le(buf + off, 2);
        off += 2;
        if (len == 0 || len > CKPT_NAME_MAX) {
            snprintf(why, why_max, "section %zu's name is %zu bytes (1..%d)", i, len,
                     CKPT_NAME_MAX);
            return WALK_BAD;
        }
        if (end - off < len + 8) {
            *need = (uint64_t)off + len + 8;
            return WALK_SHORT;
        }
        const unsigned char *name = buf + off;
        if (memchr(name, '\0', len)) {
            snprintf(why, why_max, "section %zu's name contains a NUL byte", i);
            return WALK_BAD;
        }
        off += len;
        uint64_t bytes = get_le(buf + off, 8);
        off += 8;
        size_t pad = (8 - off % 8) % 8;
        if (end - off < pad || bytes > end - off - pad) {
            *need = (uint64_t)off + pad + bytes;
            if (*need < bytes) /* wrapped */
                *need = UINT64_MAX;
            return WALK_SHORT;
        }
        for (size_t k = 0; k < pad; k++)
            if (buf[off + k] != 0) {
                snprintf(why, why_max, "section %zu's padding is not zero", i);
                return WALK_BAD;
            }
        off += pad;
        if (c) {
            for (size_t j = 0; j < i; j++)
                if (strlen(c->sec[j].name) == len && memcmp(c->sec[j].name, name, len) == 0) {
                    snprintf(why, why_max, "section name \"%.*s\" appears twice", (int)len,
                             (const char *)name);
                    return WALK_BAD;
                }
            memcpy(c->sec[i].name, name, len);
            c->sec[i].name[len] = '\0';
            c->sec[i].data = buf + off;
            c->sec[i].bytes = bytes;
            c->n = i + 1;
        }
        off += (size_t)bytes;
    }
    if (off != end) {
        *need = off;
        return WALK_LONG;
    }
    return WALK_OK;
}

static uint64_t with_hash(uint64_t need)
{
    return need > UINT64_MAX - CKPT_HASH_BYTES ? UINT64_MAX : need + CKPT_HASH_BYTES;
}

static int read_file(const char *path, unsigned char **out, size_t *size, err *e)
{
    struct stat st;
    unsigned char *buf = NULL;
    size_t got = 0;
    int rc = CODE_OK, fd;

    *out = NULL;
    /* opened without blocking (a FIFO would wait forever for a writer)
     * and refused unless it is a regular file */
    if ((rc = safefile_open_read("checkpoint", path, &fd, e)) != CODE_OK)
        return rc;
    if (fstat(fd, &st) != 0) {
        rc = io_err(e, errno, path, "fstat", NULL);
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = err_set(e, CODE_INVALID_ARGUMENT, "checkpoint %s: not a regular file", path);
        goto out;
    }
    if ((uintmax_t)st.st_size > SIZE_MAX - 1) {
        rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "checkpoint %s: %jd bytes do not fit in memory",
                     path, (intmax_t)st.st_size);
        goto out;
    }
    *size = (size_t)st.st_size;
    /* malloc's alignment (>= 8) plus 8-aligned file offsets give 8-aligned data. */
    buf = malloc(*size ? *size : 1);
    if (!buf) {
        rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory for %zu bytes",
                     path, *size);
        goto out;
    }
    while (got < *size) {
        ssize_t k = read(fd, buf + got, *size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = io_err(e, errno, path, "reading", NULL);
            goto out;
        }
        if (k == 0)
            break; /* shrank under us: checked as a short file below */
        got += (size_t)k;
    }
    *size = got;
    *out = buf;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

int ckpt_read(const char *path, ckpt **out, err *e)
{
    return ckpt_read_sealed(path, NULL, 0, out, NULL, e);
}

int ckpt_read_sealed(const char *path, const unsigned char *key, int allow_unkeyed, ckpt **out, int *keyed, err *e)
{
    unsigned char *buf = NULL, hash[CKPT_HASH_BYTES];
    size_t size = 0;
    struct ckpt *c = NULL;
    char why[160] = "";
    uint64_t need = 0;
    int rc;

    if (out)
        *out = NULL;
    if (keyed)
        *keyed = 0;
    if (!path || path[0] == '\0' || !out)
        return err_set(e, CODE_INVALID_ARGUMENT, "checkpoint: NULL or empty argument");
    ckpt_sweep_stale(path); /* a crashed save's leftovers */
    if (sodium_init() < 0)
        return err_set(e, CODE_INTERNAL, "checkpoint %s: libsodium failed to initialize", path);
    if ((rc = read_file(path, &buf, &size, e)) != CODE_OK)
        return rc;

    if (memcmp(buf, CKPT_MAGIC, size < 8 ? size : 8) != 0) {
        rc = err_set(e, CODE_DATA_LOSS, "checkpoint %s: not a tpuemu checkpoint (bad magic)",
                     path);
        goto fail;
    }
    if (size < HEADER_BYTES) {
        rc = err_set(e, CODE_DATA_LOSS,
                     "checkpoint %s: truncated: %zu bytes, shorter than the %u-byte header",
                     path, size, HEADER_BYTES);
        goto fail;
    }
    uint64_t version = get_le(buf + 8, 4);
    if (version != CKPT_VERSION && version != CKPT_VERSION_KEYED) {
        rc = err_set(e, CODE_DATA_LOSS,
                     "checkpoint %s: unsupported format version %" PRIu64 " (this build reads %u and %u)", path,
                     version, CKPT_VERSION, CKPT_VERSION_KEYED);
        goto fail;
    }
    if (version == CKPT_VERSION_KEYED && !key) {
        rc = err_set(e, CODE_UNAUTHENTICATED,
                     "checkpoint %s: it is sealed with a cluster token, and none is configured: "
                     "load it with the token of the cluster that wrote it ($TPUEMU_TOKEN_FILE or "
                     "$TPUEMU_TOKEN)",
                     path);
        goto fail;
    }
    if (size < MIN_FILE_BYTES) {
        rc = err_set(e, CODE_DATA_LOSS,
                     "checkpoint %s: truncated: %zu bytes, the smallest checkpoint has %u",
                     path, size, MIN_FILE_BYTES);
        goto fail;
    }

    size_t end = size - CKPT_HASH_BYTES;
    int has_key = version == CKPT_VERSION_KEYED;
    crypto_generichash(hash, sizeof hash, buf, end, has_key ? key : NULL, has_key ? CKPT_KEY_BYTES : 0);
    if (sodium_memcmp(hash, buf + end, sizeof hash) != 0) {
        /* Only to say what the damage looks like; nothing is kept. */
        enum walk w = walk(buf, end, NULL, &need, why, sizeof why);
        if (w == WALK_SHORT)
            snprintf(why, sizeof why, " (it looks truncated: %zu bytes, the section table "
                     "needs at least %" PRIu64 ")", size, with_hash(need));
        else if (w == WALK_LONG)
            snprintf(why, sizeof why, " (it looks like %" PRIu64 " bytes were appended)",
                     (uint64_t)end - need);
        else
            why[0] = '\0';
        if (has_key)
            /* a keyed seal cannot tell another token from damage */
            rc = err_set(e, CODE_UNAUTHENTICATED,
                         "checkpoint %s: its seal does not match this cluster's token: it was "
                         "sealed with another token, or changed or damaged since%s",
                         path, why);
        else
            rc = err_set(e, CODE_DATA_LOSS, "checkpoint %s: checksum mismatch: the file is damaged%s", path, why);
        goto fail;
    }
    if (!has_key && key && !allow_unkeyed) {
        /* whoever can write the file can seal any contents with the
         * unkeyed checksum: taking it would undo the keyed seal */
        rc = err_set(e, CODE_UNAUTHENTICATED,
                     "checkpoint %s: it is sealed with an unkeyed checksum only (written without "
                     "a cluster token, or by an older version), which anyone who can write the "
                     "file can forge; with a cluster token configured it is refused. To take it "
                     "once, set TPUEMU_CHECKPOINT_ALLOW_UNKEYED=1 (the next save seals it with "
                     "the token)",
                     path);
        goto fail;
    }

    /* The checksum holds, but an unkeyed hash proves no intent: a crafted
     * file must still fail cleanly. */
    c = calloc(1, sizeof *c);
    if (!c) {
        rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory", path);
        goto fail;
    }
    switch (walk(buf, end, c, &need, why, sizeof why)) {
    case WALK_OK:
        break;
    case WALK_SHORT:
        rc = err_set(e, CODE_DATA_LOSS,
                     "checkpoint %s: truncated: the section table needs at least %" PRIu64
                     " bytes, the file has %zu", path, with_hash(need), size);
        goto fail;
    case WALK_LONG:
        rc = err_set(e, CODE_DATA_LOSS,
                     "checkpoint %s: trailing bytes: %" PRIu64 " bytes after the last section",
                     path, (uint64_t)end - need);
        goto fail;
    case WALK_BAD:
        rc = err_set(e, CODE_DATA_LOSS, "checkpoint %s: section table inconsistent: %s", path,
                     why);
        goto fail;
    }
    c->buf = buf;
    c->size = size;
    *out = c;
    if (keyed)
        *keyed = has_key;
    return CODE_OK;

fail:
    free(c);
    free(buf);
    return rc;
}

const void *ckpt_get(const ckpt *c, const char *name, uint64_t *bytes)
{
    if (!c || !name)
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->sec[i].name, name) == 0) {
            if (bytes)
                *bytes = c->sec[i].bytes;
            return c->sec[i].data;
        }
    return NULL;
}

size_t ckpt_num_sections(const ckpt *c)
{
    return c ? c->n : 0;
}

const char *ckpt_section_name(const ckpt *c, size_t i)
{
    return c && i < c->n ? c->sec[i].name : NULL;
}

void ckpt_free(ckpt *c)
{
    if (!c)
        return;
    free(c->buf);
    free(c);
}
