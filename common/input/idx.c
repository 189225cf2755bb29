/* IDX files (idx.h): the big-endian array format (Fashion-)MNIST ships in,
 * plain or gzip-compressed. The client's tpu_idx_read and the workers'
 * input pipelines read them with this code. Everything in a file is untrusted: the
 * header is checked before anything is allocated, sizes over 4 GiB are
 * refused, and a gzip stream grows its buffer as data really arrives, so a
 * lying header cannot make us allocate what the file does not hold. */
#include "idx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAX_BYTES (4ull << 30)
#define IN_CHUNK 65536u
#define GROW_START (1u << 20)

/* A file read as one byte stream: plain, or inflated from gzip members. */
struct src {
    const char *path;
    FILE *f;
    int gz, zinit, eof;
    int cut; /* the gzip stream ended before its end marker */
    z_stream z;
    unsigned char pre[2]; /* plain: the bytes read to look for the gzip magic */
    size_t npre;
    unsigned long long total; /* bytes of the stream delivered so far */
    unsigned char in[IN_CHUNK];
};

/* Reads more compressed input after what is left unread. Returns the bytes
 * added (0 at the end of the file) or -1. */
static long gz_fill(struct src *s, err *e)
{
    if (s->z.avail_in && s->z.next_in != s->in)
        memmove(s->in, s->z.next_in, s->z.avail_in);
    s->z.next_in = s->in;
    size_t m = fread(s->in + s->z.avail_in, 1, IN_CHUNK - s->z.avail_in, s->f);
    if (m == 0 && ferror(s->f)) {
        err_set(e, CODE_DATA_LOSS, "%s: read error: %s", s->path, strerror(errno));
        return -1;
    }
    s->z.avail_in += (uInt)m;
    return (long)m;
}

/* Up to n bytes of the stream into buf; *got < n only at its end. */
static int src_read(struct src *s, unsigned char *buf, size_t n, size_t *got, err *e)
{
    *got = 0;
    if (!s->gz) {
        while (s->npre && *got < n) {
            buf[(*got)++] = s->pre[0];
            s->pre[0] = s->pre[1];
            s->npre--;
        }
        size_t m = fread(buf + *got, 1, n - *got, s->f);
        if (m < n - *got && ferror(s->f))
            return err_set(e, CODE_DATA_LOSS, "%s: read error: %s", s->path, strerror(errno));
        *got += m;
        s->total += *got;
        return CODE_OK;
    }
    while (*got < n && !s->eof) {
        if (s->z.avail_in == 0) {
            long r = gz_fill(s, e);
            if (r < 0)
                return e->code;
            if (r == 0) {
                s->eof = s->cut = 1;
                break;
            }
        }
        size_t want = n - *got;
        s->z.next_out = buf + *got;
        s->z.avail_out = want > UINT_MAX ? UINT_MAX : (uInt)want;
        uInt before = s->z.avail_out;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        *got += before - s->z.avail_out;
        if (zr == Z_STREAM_END) {
            /* gzip allows several members one after another; anything else is garbage */
            if (s->z.avail_in < 2 && gz_fill(s, e) < 0)
                return e->code;
            if (s->z.avail_in == 0) {
                s->eof = 1;
            } else if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f && s->z.next_in[1] == 0x8b) {
                inflateReset(&s->z);
            } else {
                s->total += *got;
                return err_set(e, CODE_DATA_LOSS, "%s: trailing garbage after the gzip stream (%u bytes or more)",
                               s->path, s->z.avail_in);
            }
        } else if (zr == Z_MEM_ERROR) {
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s: out of memory inflating", s->path);
        } else if (zr != Z_OK && !(zr == Z_BUF_ERROR && s->z.avail_in == 0)) {
            return err_set(e, CODE_DATA_LOSS, "%s: corrupt gzip data after %llu bytes: %s", s->path, s->total + *got,
                           s->z.msg ? s->z.msg : zError(zr));
        }
    }
    s->total += *got;
    return CODE_OK;
}

/* Exactly n bytes, else DATA_LOSS "truncated" against the expected total. */
static int src_read_exact(struct src *s, unsigned char *buf, size_t n, unsigned long long expect, err *e)
{
    size_t got;
    if (src_read(s, buf, n, &got, e) != CODE_OK)
        return e->code;
    if (got < n)
        return err_set(e, CODE_DATA_LOSS, "%s: truncated: %llu bytes of data expected, %llu found%s", s->path, expect,
                       s->total, s->cut ? " (the gzip stream is cut short)" : "");
    return CODE_OK;
}

static int esize_of(int dtype)
{
    switch (dtype) {
    case 0x08:
    case 0x09:
        return 1;
    case 0x0B:
        return 2;
    case 0x0C:
    case 0x0D:
        return 4;
    case 0x0E:
        return 8;
    default:
        return 0;
    }
}

/* Big-endian elements to host order, whatever the host is. */
static void to_host(unsigned char *p, size_t count, int esize)
{
    for (size_t i = 0; i < count; i++, p += esize) {
        if (esize == 2) {
            uint16_t v = (uint16_t)(p[0] << 8 | p[1]);
            memcpy(p, &v, 2);
        } else if (esize == 4) {
            uint32_t v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
            memcpy(p, &v, 4);
        } else if (esize == 8) {
            uint64_t v = 0;
            for (int k = 0; k < 8; k++)
                v = v << 8 | p[k];
            memcpy(p, &v, 8);
        }
    }
}

static int open_src(struct src *s, const char *path, long long *size, err *e)
{
    struct stat st;
    int fd;
    s->path = path;
    /* opened without blocking: a FIFO (or a device) named by mistake is
     * refused below instead of hanging the reader */
    if ((fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0) {
        int er = errno;
        if (er == ENOENT || er == ENOTDIR)
            return err_set(e, CODE_NOT_FOUND, "%s: no such file", path);
        if (er == EACCES || er == EPERM)
            return err_set(e, CODE_PERMISSION_DENIED, "%s: not readable: %s", path, strerror(er));
        return err_set(e, CODE_UNKNOWN, "%s: cannot open: %s", path, strerror(er));
    }
    if (fstat(fd, &st) != 0) {
        int er = errno;
        close(fd);
        return err_set(e, CODE_UNKNOWN, "%s: cannot stat: %s", path, strerror(er));
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: is a %s, not an IDX file", path,
                       S_ISDIR(st.st_mode) ? "directory" : "FIFO, device or socket");
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(s->f = fdopen(fd, "rb"))) {
        int er = errno;
        close(fd);
        return err_set(e, CODE_UNKNOWN, "%s: cannot open: %s", path, strerror(er));
    }
    *size = (long long)st.st_size;
    unsigned char m[2];
    size_t got = fread(m, 1, 2, s->f);
    if (got < 2 && ferror(s->f))
        return err_set(e, CODE_DATA_LOSS, "%s: read error: %s", path, strerror(errno));
    if (got == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        s->gz = 1;
        s->z.next_in = s->in;
        memcpy(s->in, m, 2);
        s->z.avail_in = 2;
        int zr = inflateInit2(&s->z, 15 + 16); /* gzip wrapper only */
        if (zr != Z_OK)
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s: cannot start inflating: %s", path, zError(zr));
        s->zinit = 1;
        *size = -1; /* the file's size says nothing about the data's */
    } else {
        memcpy(s->pre, m, got);
        s->npre = got;
    }
    return CODE_OK;
}

static int read_idx(struct src *s, const char *path, struct idx_array *out, int header_only, err *e)
{
    long long fsize = -1;
    unsigned char h[4 + 16];
    if (open_src(s, path, &fsize, e) != CODE_OK)
        return e->code;
    size_t got;
    if (src_read(s, h, 4, &got, e) != CODE_OK)
        return e->code;
    if (got == 0)
        return err_set(e, CODE_DATA_LOSS, "%s: not an IDX file: it is empty", path);
    if (got >= 2 && (h[0] || h[1]))
        return err_set(e, CODE_DATA_LOSS, "%s: not an IDX file: it starts with %02x %02x, not two zero bytes", path,
                       h[0], h[1]);
    if (got < 4)
        return err_set(e, CODE_DATA_LOSS, "%s: truncated: 4 bytes of header expected, %zu found", path, got);
    int dtype = h[2], rank = h[3], esize = esize_of(dtype);
    if (!esize)
        return err_set(e, CODE_DATA_LOSS,
                       "%s: not an IDX file: unknown data type 0x%02x (0x08, 0x09, 0x0B, "
                       "0x0C, 0x0D or 0x0E expected)",
                       path, dtype);
    if (rank < 1 || rank > 4)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: rank %d outside 1..4", path, rank);
    unsigned long long hdr = 4 + 4ull * (unsigned)rank;
    if (src_read_exact(s, h + 4, 4 * (size_t)rank, hdr, e) != CODE_OK)
        return e->code;
    unsigned long long count = 1, bytes;
    char shape[96] = "";
    int overflow = 0;
    for (int i = 0; i < rank; i++) {
        const unsigned char *p = h + 4 + 4 * i;
        uint32_t d = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        out->dims[i] = d;
        if (d && count > IDX_MAX_BYTES / d)
            overflow = 1;
        else
            count *= d;
        size_t l = strlen(shape);
        snprintf(shape + l, sizeof shape - l, "%s%u", i ? " x " : "", (unsigned)d);
    }
    bytes = count * (unsigned)esize;
    if (overflow || bytes > IDX_MAX_BYTES)
        return err_set(e, CODE_RESOURCE_EXHAUSTED,
                       "%s: dims %s of %d-byte elements are larger than the 4 GiB "
                       "an IDX file may hold here",
                       path, shape, esize);
    unsigned long long expect = hdr + bytes;
    if (fsize >= 0 && (unsigned long long)fsize < expect)
        return err_set(e, CODE_DATA_LOSS, "%s: truncated: %llu bytes of data expected, %lld found (dims %s)", path,
                       expect, fsize, shape);
    if (fsize >= 0 && (unsigned long long)fsize > expect)
        return err_set(e, CODE_DATA_LOSS, "%s: trailing data: %llu bytes expected (dims %s), %lld found", path, expect,
                       shape, fsize);
    if (header_only) {
        out->dtype = dtype;
        out->rank = rank;
        out->count = (size_t)count;
        return CODE_OK;
    }

    /* Known size: allocate it. A gzip stream: grow as data really arrives. */
    size_t cap = fsize >= 0 || bytes < GROW_START ? (size_t)bytes : GROW_START, have = 0;
    unsigned char *data = malloc(cap ? cap : 1);
    if (!data)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s: out of memory for %llu bytes", path, bytes);
    while (have < bytes) {
        if (have == cap) {
            size_t ncap = cap * 2 < bytes ? cap * 2 : (size_t)bytes;
            unsigned char *nd = realloc(data, ncap);
            if (!nd) {
                free(data);
                return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s: out of memory for %llu bytes", path, bytes);
            }
            data = nd;
            cap = ncap;
        }
        if (src_read_exact(s, data + have, cap - have, expect, e) != CODE_OK) {
            free(data);
            return e->code;
        }
        have = cap;
    }
    /* Nothing may follow the array (and the gzip stream must end cleanly, CRC checked). */
    unsigned long long extra = 0;
    for (;;) {
        unsigned char tmp[4096];
        if (src_read(s, tmp, sizeof tmp, &got, e) != CODE_OK) {
            free(data);
            return e->code;
        }
        extra += got;
        if (got < sizeof tmp)
            break;
    }
    if (s->cut && !extra) {
        free(data);
        return err_set(e, CODE_DATA_LOSS,
                       "%s: truncated: the gzip stream is cut short after its %llu bytes of "
                       "data (its checksum is missing)",
                       path, expect);
    }
    if (extra) {
        free(data);
        return err_set(e, CODE_DATA_LOSS, "%s: trailing data: %llu bytes expected (dims %s), %llu found", path, expect,
                       shape, expect + extra);
    }
    to_host(data, (size_t)count, esize);
    out->dtype = dtype;
    out->rank = rank;
    out->count = (size_t)count;
    out->data = data;
    return CODE_OK;
}

static int idx_run(const char *path, struct idx_array *out, int header_only, err *e)
{
    memset(out, 0, sizeof *out);
    if (!path || !*path)
        return err_set(e, CODE_INVALID_ARGUMENT, "no path");
    struct src *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    int rc = read_idx(s, path, out, header_only, e);
    if (s->zinit)
        inflateEnd(&s->z);
    if (s->f)
        fclose(s->f);
    free(s);
    if (rc != CODE_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

int idx_read(const char *path, struct idx_array *out, err *e)
{
    return idx_run(path, out, 0, e);
}

int idx_read_header(const char *path, struct idx_array *out, err *e)
{
    return idx_run(path, out, 1, e);
}

void idx_clear(struct idx_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
