/* Scratch directories for tests (scratch.h). */
#define _XOPEN_SOURCE 700
#include "scratch.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

void scratch_make(char *buf, size_t n, const char *tag)
{
    int len = snprintf(buf, n, "/tmp/%s.XXXXXX", tag);
    cr_assert(len > 0 && (size_t)len < n, "scratch directory name too long for its buffer: %s", tag);
    cr_assert_not_null(mkdtemp(buf), "mkdtemp %s: %s", buf, strerror(errno));
}

static int open_up(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)f;
    if (flag == FTW_D || flag == FTW_DNR)
        chmod(p, (sb->st_mode & 07777) | 0700);
    return 0;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    remove(p);
    return 0;
}

void scratch_remove(const char *dir)
{
    if (!dir || !dir[0])
        return;
    chmod(dir, 0700);
    nftw(dir, open_up, 16, FTW_PHYS);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
