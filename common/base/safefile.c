/* Replacing a file safely (see safefile.h). */
#include "safefile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#define MAX_LINKS 40
#define TMP_TRIES 8

int safefile_errno_code(int en)
{
    switch (en) {
    case EACCES: case EPERM: case EROFS:
        return CODE_PERMISSION_DENIED;
    case ENOENT: case ENOTDIR:
        return CODE_NOT_FOUND;
    case ENOSPC: case EDQUOT: case EFBIG: case ENOMEM:
        return CODE_RESOURCE_EXHAUSTED;
    case ENAMETOOLONG: case ELOOP:
        return CODE_INVALID_ARGUMENT;
    default:
        return CODE_UNAVAILABLE;
    }
}

static const char *kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

static int io_err(err *e, const char *what, const char *path, const char *doing, int en)
{
    char sbuf[128];
    const char *s = strerror_r(en, sbuf, sizeof sbuf); /* GNU: returns the text */
    return err_set(e, safefile_errno_code(en), "%s %s: %s: %s", what, path, doing, s);
}

int safefile_target(const char *what, const char *path, char *out, size_t outn, err *e)
{
    char link[PATH_MAX];
    struct stat st;

    if (!path || !*path)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: no file name", what);
    if ((size_t)snprintf(out, outn, "%s", path) >= outn)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s %.64s...: the path is too long", what, path);
    for (int hops = 0;; hops++) {
        if (lstat(out, &st) != 0) {
            if (errno == ENOENT)
                return CODE_OK; /* a new file; its directory is checked by the create */
            return io_err(e, what, path, "cannot inspect it", errno);
        }
        if (!S_ISLNK(st.st_mode))
            break;
        if (hops >= MAX_LINKS)
            return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: more than %d symbolic links", what, path,
                           MAX_LINKS);
        ssize_t n = readlink(out, link, sizeof link - 1);
        if (n < 0)
            return io_err(e, what, path, "cannot read the symbolic link", errno);
        link[n] = '\0';
        if (link[0] != '/') { /* relative to the link's own directory */
            char *slash = strrchr(out, '/');
            size_t dl = slash ? (size_t)(slash - out) + 1 : 0;
            if (dl + (size_t)n + 1 > outn)
                return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: the link's target's path is too long", what,
                               path);
            memmove(out + dl, link, (size_t)n + 1);
        } else if ((size_t)n + 1 > outn) {
            return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: the link's target's path is too long", what, path);
        } else {
            memcpy(out, link, (size_t)n + 1);
        }
    }
    if (!S_ISREG(st.st_mode)) {
        if (strcmp(out, path) != 0)
            return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: refusing to write: its target %s is %s", what, path,
                           out, kind(st.st_mode));
        return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: refusing to write: it is %s", what, path,
                       kind(st.st_mode));
    }
    return CODE_OK;
}

int safefile_open_read(const char *what, const char *path, int *fdp, err *e)
{
    struct stat st;
    int fd;

    if (fdp)
        *fdp = -1;
    if (!path || !*path)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: no file name", what);
    /* O_NONBLOCK: a FIFO opens at once instead of waiting for a writer */
    if ((fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)) < 0)
        return io_err(e, what, path, "cannot open it", errno);
    if (fstat(fd, &st) != 0) {
        int en = errno;
        close(fd);
        return io_err(e, what, path, "cannot inspect it", en);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(e, CODE_INVALID_ARGUMENT, "%s %s: it is %s, not a regular file", what, path,
                       kind(st.st_mode));
    }
    if (!fdp) {
        close(fd);
        return CODE_OK;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fdp = fd;
    return CODE_OK;
}

int safefile_open(struct safefile *f, const char *what, const char *path, err *e)
{
    struct stat st;
    int rc, en = 0;

    f->fd = -1;
    f->tmp[0] = '\0';
    f->what = what;
    if ((rc = safefile_target(what, path, f->target, sizeof f->target, e)) != CODE_OK)
        return rc;
    if (sodium_init() < 0)
        return err_set(e, CODE_INTERNAL, "%s %s: libsodium failed to initialize", what, path);
    int have = stat(f->target, &st) == 0;
    for (int i = 0; i < TMP_TRIES && f->fd < 0; i++) {
        if ((size_t)snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld.%08" PRIx32, f->target, (long)getpid(),
                             (uint32_t)randombytes_random()) >= sizeof f->tmp)
            return err_set(e, CODE_INVALID_ARGUMENT, "%s %.64s...: the path is too long", what, path);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        en = errno;
        if (f->fd < 0 && en != EEXIST)
            break;
    }
    if (f->fd < 0) {
        f->tmp[0] = '\0';
        return io_err(e, what, path, "cannot create a temp file beside it", en);
    }
    if (have)
        (void)fchmod(f->fd, st.st_mode & 07777);
    return CODE_OK;
}

void safefile_abort(struct safefile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp[0])
        unlink(f->tmp);
    f->tmp[0] = '\0';
}

int safefile_commit(struct safefile *f, int durable, err *e)
{
    int en = 0;

    if (!f->tmp[0])
        return err_set(e, CODE_FAILED_PRECONDITION, "%s %s: not open", f->what, f->target);
    if (f->fd >= 0) { /* -1: the caller closed it (a FILE or gzFile over it) */
        if (durable && fsync(f->fd) != 0)
            en = errno;
        if (close(f->fd) != 0 && !en)
            en = errno;
        f->fd = -1;
    }
    if (en) {
        safefile_abort(f);
        return io_err(e, f->what, f->target, "writing the temp file failed", en);
    }
    if (rename(f->tmp, f->target) != 0) {
        en = errno;
        safefile_abort(f);
        return io_err(e, f->what, f->target, "cannot replace it", en);
    }
    f->tmp[0] = '\0';
    if (durable) {
        /* make the rename itself durable; some file systems cannot fsync a
         * directory (EINVAL): nothing more to do there */
        char dir[PATH_MAX];
        char *slash;
        snprintf(dir, sizeof dir, "%s", f->target);
        if ((slash = strrchr(dir, '/')))
            slash[slash == dir ? 1 : 0] = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        en = dfd < 0 ? errno : fsync(dfd) != 0 ? errno : 0;
        if (dfd >= 0)
            close(dfd);
        if (en && en != EINVAL)
            return io_err(e, f->what, f->target,
                          "written, but syncing its directory failed (it may not survive a crash)", en);
    }
    return CODE_OK;
}
