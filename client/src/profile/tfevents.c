/* TensorBoard event files (tfevents.h): a TFRecord writer and the few
 * protobuf fields of Event, Summary and TensorProto a scalar needs, encoded
 * by hand (field numbers from tensorflow/core/util/event.proto,
 * tensorflow/core/framework/summary.proto, tensor.proto and types.proto). */
#include "tfevents.h"
#include "safefile.h"

#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define DT_FLOAT 1 /* tensorflow/core/framework/types.proto */

uint32_t tfevents_crc32c(const void *p, size_t n)
{
    static uint32_t table[256];
    static atomic_int ready;
    const unsigned char *b = p;
    uint32_t c = 0xffffffffu;
    if (!atomic_load(&ready)) { /* the same table from every thread: a race writes the same values */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t v = i;
            for (int k = 0; k < 8; k++)
                v = v & 1 ? (v >> 1) ^ 0x82f63b78u : v >> 1;
            table[i] = v;
        }
        atomic_store(&ready, 1);
    }
    for (size_t i = 0; i < n; i++)
        c = table[(c ^ b[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/* tensorflow/core/lib/hash/crc32c.h Mask(): rotate right by 15, add a constant */
uint32_t tfevents_masked_crc(const void *p, size_t n)
{
    uint32_t c = tfevents_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

int tfevents_mkdirs(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (char *s = path + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(path, 0755) < 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(path, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* ---- a growing protobuf buffer ---- */

struct pb {
    unsigned char b[1024];
    size_t n;
    int full;
};

static void put(struct pb *p, const void *d, size_t n)
{
    if (p->n + n > sizeof p->b) {
        p->full = 1;
        return;
    }
    memcpy(p->b + p->n, d, n);
    p->n += n;
}

static void varint(struct pb *p, uint64_t v)
{
    unsigned char t[10];
    size_t k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v)
            t[k] |= 0x80;
        k++;
    } while (v);
    put(p, t, k);
}

static void key(struct pb *p, unsigned field, unsigned wire)
{
    varint(p, (uint64_t)field << 3 | wire);
}

static void bytes(struct pb *p, unsigned field, const void *d, size_t n)
{
    key(p, field, 2);
    varint(p, n);
    put(p, d, n);
}

static void fixed64(struct pb *p, unsigned field, const void *d8)
{
    key(p, field, 1);
    put(p, d8, 8); /* little-endian hosts only, as the rest of the wire code */
}

static int record(tfevents *w, const struct pb *ev, err *e)
{
    unsigned char hdr[12];
    uint64_t len = ev->n;
    uint32_t c;
    if (ev->full)
        return err_set(e, CODE_INTERNAL, "event too large for %s", w->path);
    memcpy(hdr, &len, 8);
    c = tfevents_masked_crc(hdr, 8);
    memcpy(hdr + 8, &c, 4);
    if (fwrite(hdr, 1, 12, w->f) != 12 || fwrite(ev->b, 1, ev->n, w->f) != ev->n)
        goto bad;
    c = tfevents_masked_crc(ev->b, ev->n);
    if (fwrite(&c, 1, 4, w->f) != 4 || fflush(w->f) != 0)
        goto bad;
    return CODE_OK;
bad:
    return err_set(e, CODE_UNAVAILABLE, "writing %s: %s", w->path, strerror(errno));
}

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static int open_file(tfevents *w, const char *dir, const char *suffix, err *e);

int tfevents_open(tfevents *w, const char *dir, err *e)
{
    static atomic_uint uid;
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".%d.%u.v2", (int)getpid(), atomic_fetch_add(&uid, 1) + 1);
    return open_file(w, dir, suffix, e);
}

int tfevents_profile_empty(const char *dir, err *e)
{
    tfevents w;
    DIR *d;
    struct dirent *de;
    if (tfevents_mkdirs(dir) < 0)
        return err_set(e, safefile_errno_code(errno), "cannot create %s: %s", dir, strerror(errno));
    if (!(d = opendir(dir)))
        return err_set(e, safefile_errno_code(errno), "cannot read %s: %s", dir, strerror(errno));
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n >= 14 && strcmp(de->d_name + n - 14, ".profile-empty") == 0) {
            closedir(d);
            return CODE_OK;
        }
    }
    closedir(d);
    if (open_file(&w, dir, ".profile-empty", e) != CODE_OK)
        return e->code == CODE_ALREADY_EXISTS ? CODE_OK : e->code; /* another writer made it first */
    return tfevents_close(&w, e);
}

static int open_file(tfevents *w, const char *dir, const char *suffix, err *e)
{
    char host[256] = "localhost";
    time_t now = time(NULL);
    struct pb ev = {.n = 0};
    double wt = (double)now; /* EventsWriter dates its first event in whole seconds */
    static const char version[] = "brain.Event:2";

    memset(w, 0, sizeof *w);
    gethostname(host, sizeof host - 1);
    if (tfevents_mkdirs(dir) < 0)
        return err_set(e, safefile_errno_code(errno), "TensorBoard: cannot create %s: %s", dir, strerror(errno));
    if ((size_t)snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s%s", dir, (long long)now, host,
                         suffix) >= sizeof w->path)
        return err_set(e, CODE_INVALID_ARGUMENT, "TensorBoard: the log directory's path is too long");
    if (!(w->f = fopen(w->path, "wbx")))
        return err_set(e, errno == EEXIST ? CODE_ALREADY_EXISTS : safefile_errno_code(errno), "TensorBoard: cannot create %s: %s", w->path, strerror(errno));
    fixed64(&ev, 1, &wt);                        /* Event.wall_time */
    bytes(&ev, 3, version, sizeof version - 1);  /* Event.file_version */
    if (record(w, &ev, e) != CODE_OK) {
        fclose(w->f);
        w->f = NULL;
        return e->code;
    }
    return CODE_OK;
}

int tfevents_scalar(tfevents *w, const char *tag, int64_t step, float v, err *e)
{
    static const char plugin[] = "scalars";
    struct pb pd = {.n = 0}, md = {.n = 0}, tp = {.n = 0}, val = {.n = 0}, sum = {.n = 0}, ev = {.n = 0};
    double wt = wall_now();

    if (!w->f)
        return err_set(e, CODE_FAILED_PRECONDITION, "TensorBoard: the event file is not open");
    bytes(&pd, 1, plugin, sizeof plugin - 1);   /* PluginData.plugin_name */
    bytes(&md, 1, pd.b, pd.n);                  /* SummaryMetadata.plugin_data */
    key(&tp, 1, 0);                             /* TensorProto.dtype */
    varint(&tp, DT_FLOAT);
    bytes(&tp, 2, "", 0);                       /* tensor_shape: rank 0 */
    bytes(&tp, 4, &v, sizeof v);                /* tensor_content: the float, little-endian */
    bytes(&val, 1, tag, strlen(tag));           /* Value.tag */
    bytes(&val, 8, tp.b, tp.n);                 /* Value.tensor */
    bytes(&val, 9, md.b, md.n);                 /* Value.metadata */
    bytes(&sum, 1, val.b, val.n);               /* Summary.value */
    fixed64(&ev, 1, &wt);                       /* Event.wall_time */
    if (step) {                                 /* Event.step (proto3: 0 is not written) */
        key(&ev, 2, 0);
        varint(&ev, (uint64_t)step);
    }
    bytes(&ev, 5, sum.b, sum.n);                /* Event.summary */
    if (pd.full || md.full || tp.full || val.full || sum.full)
        ev.full = 1;
    return record(w, &ev, e);
}

int tfevents_close(tfevents *w, err *e)
{
    int rc = CODE_OK;
    if (w->f && fclose(w->f) != 0)
        rc = err_set(e, CODE_UNAVAILABLE, "closing %s: %s", w->path, strerror(errno));
    w->f = NULL;
    return rc;
}
