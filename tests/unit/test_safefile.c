/* Unit tests of common/base/safefile: every file the project writes whole is
 * replaced through it. Planted names are never followed or overwritten, a
 * non-regular file is refused without blocking, a symbolic link at the name
 * is kept and the file it names is rewritten. Each test works in its own
 * mkdtemp directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "scratch.h"
#include "safefile.h"

static char dir[64], path[128], tmp[160];

static void setup(void)
{
    scratch_make(dir, sizeof dir, "test_safefile");
    snprintf(path, sizeof path, "%s/out.svg", dir);
    snprintf(tmp, sizeof tmp, "%s/out.svg.tmp", dir);
}

static void teardown(void)
{
    scratch_remove(dir);
}

TestSuite(safefile, .init = setup, .fini = teardown, .timeout = 30);

static void put(const char *p, const char *text)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void expect(const char *p, const char *text)
{
    char buf[256] = {0};
    int fd = open(p, O_RDONLY);
    cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    cr_assert_eq(n, (ssize_t)strlen(text), "%s holds %zd bytes", p, n);
    cr_assert_str_eq(buf, text, "%s", p);
}

/* Writes text to p through the helper; returns its code, e filled. */
static int replace(const char *p, const char *text, err *e)
{
    struct safefile f;
    int rc = safefile_open(&f, "plot", p, e);
    if (rc != CODE_OK)
        return rc;
    cr_assert_eq(write(f.fd, text, strlen(text)), (ssize_t)strlen(text));
    return safefile_commit(&f, 1, e);
}

static int entries(void)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

Test(safefile, replaces_a_regular_file_and_keeps_its_mode)
{
    err e;
    put(path, "old");
    chmod(path, 0600);
    cr_assert_eq(replace(path, "new", &e), CODE_OK, "%s", e.msg);
    expect(path, "new");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    cr_assert_eq(entries(), 1, "a temp file was left");
}

/* The old writer used PATH.tmp with fopen "w": a symbolic link planted there
 * had its target overwritten. Nothing at that name is touched now. */
Test(safefile, a_link_planted_at_the_old_temp_name_is_not_followed)
{
    char victim[160];
    err e;
    snprintf(victim, sizeof victim, "%s/victim", dir);
    put(victim, "precious");
    cr_assert_eq(symlink(victim, tmp), 0);
    cr_assert_eq(replace(path, "new", &e), CODE_OK, "%s", e.msg);
    expect(victim, "precious");
    expect(path, "new");
    struct stat st;
    cr_assert_eq(lstat(tmp, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the planted link was replaced");
}

Test(safefile, a_directory_at_the_old_temp_name_is_harmless)
{
    err e;
    cr_assert_eq(mkdir(tmp, 0700), 0);
    cr_assert_eq(replace(path, "new", &e), CODE_OK, "%s", e.msg);
    expect(path, "new");
}

static void refused(const char *p, const char *kind)
{
    err e;
    struct stat before, after;
    cr_assert_eq(lstat(p, &before), 0);
    int rc = replace(p, "new", &e);
    cr_assert_eq(rc, CODE_INVALID_ARGUMENT, "%s was not refused (%d: %s)", kind, rc, e.msg);
    cr_assert_not_null(strstr(e.msg, p), "the message does not name the file: %s", e.msg);
    cr_assert_not_null(strstr(e.msg, kind), "the message does not say '%s': %s", kind, e.msg);
    cr_assert_eq(lstat(p, &after), 0, "%s is gone", kind);
    cr_assert_eq(before.st_ino, after.st_ino, "%s was replaced", kind);
    cr_assert_eq(before.st_mode, after.st_mode, "%s was replaced", kind);
    cr_assert_eq(entries(), 1, "a temp file was left");
}

Test(safefile, refuses_a_directory)
{
    cr_assert_eq(mkdir(path, 0700), 0);
    refused(path, "a directory");
}

/* A FIFO is refused at once: it is never opened, so nothing waits for a writer. */
Test(safefile, refuses_a_fifo_without_blocking)
{
    cr_assert_eq(mkfifo(path, 0600), 0);
    refused(path, "a FIFO");
}

Test(safefile, refuses_a_socket)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_lt(strlen(path), sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    close(s);
    refused(path, "a socket");
}

/* A device node (the null device's numbers, made in the test's directory;
 * creating one needs CAP_MKNOD, without it the FIFO test covers the rule). */
Test(safefile, refuses_a_device_node)
{
    if (mknod(path, S_IFCHR | 0600, makedev(1, 3)) != 0) {
        cr_assert(errno == EPERM, "mknod: %s", strerror(errno));
        cr_assert_eq(mkfifo(path, 0600), 0);
        refused(path, "a FIFO");
        return;
    }
    refused(path, "a character device");
}

/* A symbolic link at the name is kept; the file it names is rewritten. */
Test(safefile, keeps_a_link_and_writes_its_target)
{
    char real[160];
    err e;
    snprintf(real, sizeof real, "%s/real.svg", dir);
    put(real, "old");
    cr_assert_eq(symlink("real.svg", path), 0); /* relative, as users make them */
    cr_assert_eq(replace(path, "new", &e), CODE_OK, "%s", e.msg);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the link was replaced by a regular file");
    expect(real, "new");
    cr_assert_eq(entries(), 2, "a temp file was left");
}

Test(safefile, a_link_to_a_missing_file_creates_it)
{
    char real[160];
    err e;
    snprintf(real, sizeof real, "%s/later.svg", dir);
    cr_assert_eq(symlink(real, path), 0);
    cr_assert_eq(replace(path, "new", &e), CODE_OK, "%s", e.msg);
    expect(real, "new");
}

/* A link to a device is refused naming both the link and its target. */
Test(safefile, refuses_a_link_to_a_fifo)
{
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(symlink(fifo, path), 0);
    err e;
    cr_assert_eq(replace(path, "new", &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, fifo), "%s", e.msg);
    struct stat st;
    cr_assert_eq(stat(fifo, &st), 0);
    cr_assert(S_ISFIFO(st.st_mode));
}

Test(safefile, a_link_loop_is_refused)
{
    cr_assert_eq(symlink("out.svg", path), 0);
    err e;
    cr_assert_eq(replace(path, "new", &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "symbolic links"), "%s", e.msg);
}

Test(safefile, a_missing_directory_is_not_found)
{
    char p[200];
    err e;
    snprintf(p, sizeof p, "%s/no/such/out.svg", dir);
    cr_assert_eq(replace(p, "new", &e), CODE_NOT_FOUND, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, p), "%s", e.msg);
}

/* Opening for reading never blocks on a FIFO and refuses what is not a file. */
Test(safefile, open_read_refuses_a_fifo_without_blocking)
{
    err e;
    int fd;
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_eq(safefile_open_read("token file", path, &fd, &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    cr_assert_eq(fd, -1);
    cr_assert_not_null(strstr(e.msg, "a FIFO"), "%s", e.msg);
    cr_assert_eq(safefile_open_read("token file", dir, &fd, &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "a directory"), "%s", e.msg);
    snprintf(tmp, sizeof tmp, "%s/file", dir);
    put(tmp, "x");
    cr_assert_eq(safefile_open_read("token file", tmp, &fd, &e), CODE_OK, "%s", e.msg);
    char c;
    cr_assert_eq(read(fd, &c, 1), 1);
    cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "left non-blocking");
    close(fd);
}
