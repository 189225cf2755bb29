/* Replacing a file safely: every file the project writes whole (checkpoints,
 * profile traces and overviews, plots, step tables, serialized topologies)
 * goes through here.
 *
 *   safefile_open   resolves path (a symbolic link is followed to the file it
 *                   names, so the link itself is kept and its target is
 *                   rewritten), refuses a target that exists and is not a
 *                   regular file (a directory, a device, a FIFO, a socket)
 *                   without opening it, and creates a new temp file beside the
 *                   target, TARGET.tmp.PID.XXXXXXXX (8 random hex digits),
 *                   with O_CREAT|O_EXCL|O_NOFOLLOW: never a planted file or
 *                   link. An existing target's permission bits are kept, a
 *                   new file gets 0666 & ~umask.
 *   safefile_commit closes the temp file (after fsync when durable; fd may
 *                   be set to -1 by a caller that closed it through a FILE
 *                   or gzFile) and
 *                   renames it over the target; with durable, the directory
 *                   is synced too.
 *   safefile_abort  closes and removes the temp file.
 *
 * what ("checkpoint", "profile plot", ...) starts every error message, which
 * names path and says what failed. Codes:
 *   CODE_INVALID_ARGUMENT   path empty or too long, target not a regular file,
 *                           too many symbolic links
 *   CODE_PERMISSION_DENIED  EACCES, EPERM, EROFS
 *   CODE_NOT_FOUND          the directory does not exist
 *   CODE_RESOURCE_EXHAUSTED ENOSPC, EDQUOT, EFBIG, out of memory
 *   CODE_UNAVAILABLE        any other I/O error */
#ifndef TPUEMU_COMMON_SAFEFILE_H
#define TPUEMU_COMMON_SAFEFILE_H

#include <limits.h>
#include <sys/types.h>

#include "status.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

struct safefile {
    int fd;                   /* the temp file, open for writing; -1 when closed */
    char target[PATH_MAX];    /* the file that will be replaced (links followed) */
    char tmp[PATH_MAX + 32];  /* the temp file beside it */
    const char *what;
};

/* The errno's code, as listed above. */
int safefile_errno_code(int en);

/* Resolves path's symbolic links into out (what is written), fails as above
 * when the result exists and is not a regular file. Does not open anything. */
int safefile_target(const char *what, const char *path, char *out, size_t outn, err *e);

/* Whether path can be opened for reading without blocking on it: it must be
 * a regular file (links followed). CODE_OK, or CODE_NOT_FOUND,
 * CODE_INVALID_ARGUMENT ("is a directory", "is a FIFO", ...), ... with e
 * naming path. Opens path with O_NONBLOCK and returns the descriptor in *fd
 * (cleared of O_NONBLOCK) if fd is not NULL. */
int safefile_open_read(const char *what, const char *path, int *fd, err *e);

int safefile_open(struct safefile *f, const char *what, const char *path, err *e);
int safefile_commit(struct safefile *f, int durable, err *e);
void safefile_abort(struct safefile *f);

#endif
