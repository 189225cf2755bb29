/* Unit tests of client/src/train/ckpt.c: atomic checkpoint files with a checksum.
 * Every test works in its own mkdtemp directory under /tmp, removed after. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <sodium.h>

#include "scratch.h"
#include "auth.h"
#include "ckpt.h"

static char dir[64];
static char path[128];

static void setup(void)
{
    scratch_make(dir, sizeof dir, "test_ckpt");
    snprintf(path, sizeof path, "%s/model.ckpt", dir);
}

static void teardown(void)
{
    scratch_remove(dir);
}

TestSuite(ckpt, .init = setup, .fini = teardown, .timeout = 60);

/* Directory entries that are temp files of ours. */
static int count_tmp(void)
{
    DIR *dp = opendir(dir);
    struct dirent *de;
    int n = 0;

    cr_assert_not_null(dp);
    while ((de = readdir(dp)))
        if (strstr(de->d_name, ".tmp."))
            n++;
    closedir(dp);
    return n;
}

static unsigned char *slurp(const char *p, size_t *size)
{
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void spit(const char *p, const void *buf, size_t size)
{
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    cr_assert_eq(fwrite(buf, 1, size, f), size);
    cr_assert_eq(fclose(f), 0);
}

/* Re-seals a hand-edited file so the checks behind the checksum get tested. */
static void rehash(unsigned char *buf, size_t size)
{
    cr_assert_geq(size, CKPT_HASH_BYTES);
    crypto_generichash(buf + size - CKPT_HASH_BYTES, CKPT_HASH_BYTES, buf,
                       size - CKPT_HASH_BYTES, NULL, 0);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Reads p expecting failure with code and a message naming p and containing want. */
static void expect_fail(const char *p, int code, const char *want)
{
    ckpt *c = (ckpt *)&c;
    err e;
    int rc = ckpt_read(p, &c, &e);
    cr_assert_eq(rc, code, "want %s, got %s: %s", code_name(code), code_name(rc),
                 rc ? e.msg : "");
    cr_assert_eq(e.code, code);
    cr_assert_null(c);
    cr_assert_not_null(strstr(e.msg, p), "message does not name the file: %s", e.msg);
    if (want)
        cr_assert_not_null(strstr(e.msg, want), "'%s' not in: %s", want, e.msg);
}

/* A small file: "a" (3 bytes), "bb" (0 bytes), "ccc" (8 bytes); 104 bytes:
 * header 16 | 2+1+8 +5 pad | 3 | 2+2+8 +1 pad | 0 | 2+3+8 +3 pad | 8 | hash 32. */
static void write_small(const char *p)
{
    const uint64_t step = 0x0102030405060708ull;
    struct ckpt_section s[] = {
        {"a", "xyz", 3},
        {"bb", NULL, 0},
        {"ccc", &step, 8},
    };
    err e;
    cr_assert_eq(ckpt_write(p, s, 3, &e), CODE_OK, "%s", e.msg);
}

static void expect_small(const char *p)
{
    ckpt *c;
    err e;
    uint64_t n;
    cr_assert_eq(ckpt_read(p, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_num_sections(c), 3);
    const void *d = ckpt_get(c, "a", &n);
    cr_assert_eq(n, 3);
    cr_assert_arr_eq(d, "xyz", 3);
    cr_assert_eq(*(const uint64_t *)ckpt_get(c, "ccc", &n), 0x0102030405060708ull);
    ckpt_free(c);
}

Test(ckpt, round_trip)
{
    const size_t big = (5u << 20) + 3; /* multi-MB, odd size */
    unsigned char *params = malloc(big);
    char longname[CKPT_NAME_MAX + 1];
    uint32_t x = 2463534242u;
    double lr = 0.125;
    ckpt *c;
    err e;

    cr_assert_not_null(params);
    for (size_t i = 0; i < big; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        params[i] = (unsigned char)x;
    }
    memset(longname, 'n', CKPT_NAME_MAX);
    longname[CKPT_NAME_MAX] = '\0';
    struct ckpt_section s[] = {
        {"params", params, big},
        {"empty", NULL, 0},
        {"lr", &lr, sizeof lr},
        {"odd", "hello", 5},
        {longname, "L", 1},
        {"after", "tail", 4},
    };
    size_t ns = sizeof s / sizeof s[0];
    cr_assert_eq(ckpt_write(path, s, ns, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(count_tmp(), 0);

    cr_assert_eq(ckpt_read(path, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_num_sections(c), ns);
    for (size_t i = 0; i < ns; i++) {
        uint64_t n = 12345;
        cr_assert_str_eq(ckpt_section_name(c, i), s[i].name);
        const void *d = ckpt_get(c, s[i].name, &n);
        cr_assert_not_null(d, "%s", s[i].name);
        cr_assert_eq((uintptr_t)d % 8, 0, "%s not 8-byte aligned", s[i].name);
        cr_assert_eq(n, s[i].bytes, "%s", s[i].name);
        if (n)
            cr_assert_eq(memcmp(d, s[i].data, n), 0, "%s differs", s[i].name);
    }
    cr_assert_eq(*(const double *)ckpt_get(c, "lr", NULL), 0.125);
    cr_assert_null(ckpt_section_name(c, ns));
    cr_assert_null(ckpt_get(c, "missing", NULL));
    cr_assert_null(ckpt_get(c, "para", NULL));
    ckpt_free(c);
    ckpt_free(NULL);
    free(params);
}

Test(ckpt, zero_sections_and_relative_path)
{
    ckpt *c;
    err e;
    cr_assert_eq(chdir(dir), 0);
    cr_assert_eq(ckpt_write("rel.ckpt", NULL, 0, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_read("rel.ckpt", &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_num_sections(c), 0);
    cr_assert_null(ckpt_get(c, "x", NULL));
    ckpt_free(c);
    cr_assert_eq(count_tmp(), 0);
}

Test(ckpt, small_layout)
{
    size_t size;
    write_small(path);
    unsigned char *buf = slurp(path, &size);
    cr_assert_eq(size, 104);
    cr_assert_arr_eq(buf, "TPUEMUCK\1\0\0\0\3\0\0\0\1\0a\3\0\0\0\0\0\0\0", 27);
    cr_assert_arr_eq(buf + 32, "xyz\2\0bb", 7);
    free(buf);
    expect_small(path);
}

Test(ckpt, overwrite_is_atomic)
{
    struct ckpt_section v2[] = {{"v", "two", 3}};
    struct ckpt_section dup[] = {{"v", "three", 5}, {"w", "", 0}, {"v", "x", 1}};
    ckpt *c;
    err e;
    uint64_t n;

    write_small(path);
    cr_assert_eq(ckpt_write(path, v2, 1, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_read(path, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_num_sections(c), 1);
    cr_assert_arr_eq(ckpt_get(c, "v", &n), "two", 3);
    ckpt_free(c);

    /* A failed write leaves the old file as it was. */
    cr_assert_eq(ckpt_write(path, dup, 3, &e), CODE_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(e.msg, path), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "\"v\""), "%s", e.msg);
    cr_assert_eq(ckpt_read(path, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_arr_eq(ckpt_get(c, "v", &n), "two", 3);
    ckpt_free(c);
    cr_assert_eq(count_tmp(), 0);
}

/* A write that fails half way (the file-size limit makes write() fail with
 * EFBIG, which works as root too) removes its temp file and leaves the old
 * checkpoint intact. */
Test(ckpt, failure_mid_write_keeps_old_file)
{
    const size_t big = 2u << 20;
    unsigned char *data = calloc(1, big);
    struct ckpt_section s[] = {{"hdr", "h", 1}, {"params", data, big}};
    struct rlimit old, lim;
    err e;

    cr_assert_not_null(data);
    write_small(path);
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = ckpt_write(path, s, 2, &e);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(rc, CODE_RESOURCE_EXHAUSTED, "%s: %s", code_name(rc), e.msg);
    cr_assert_not_null(strstr(e.msg, path), "%s", e.msg);
    cr_assert_eq(count_tmp(), 0);
    expect_small(path);
    free(data);
}

Test(ckpt, read_only_directory)
{
    struct ckpt_section s[] = {{"v", "new", 3}};
    err e;

    if (geteuid() == 0) {
        teardown(); /* a skipped test does not get its .fini */
        cr_skip_test("root ignores directory permissions");
    }
    write_small(path);
    cr_assert_eq(chmod(dir, 0555), 0);
    cr_assert_eq(ckpt_write(path, s, 1, &e), CODE_PERMISSION_DENIED, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, path), "%s", e.msg);
    cr_assert_eq(count_tmp(), 0);
    expect_small(path);
}

Test(ckpt, missing_directory)
{
    struct ckpt_section s[] = {{"v", "new", 3}};
    char p[256];
    err e;

    snprintf(p, sizeof p, "%s/no/such/dir/x.ckpt", dir);
    cr_assert_eq(ckpt_write(p, s, 1, &e), CODE_NOT_FOUND, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, p), "%s", e.msg);
    expect_fail(p, CODE_NOT_FOUND, NULL);
}

Test(ckpt, invalid_arguments)
{
    char longname[CKPT_NAME_MAX + 2];
    struct ckpt_section many[CKPT_MAX_SECTIONS + 1];
    char names[CKPT_MAX_SECTIONS + 1][8];
    err e;

    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    struct ckpt_section empty[] = {{"", "x", 1}};
    struct ckpt_section null_name[] = {{NULL, "x", 1}};
    struct ckpt_section too_long[] = {{longname, "x", 1}};
    struct ckpt_section null_data[] = {{"d", NULL, 1}};
    for (int i = 0; i <= CKPT_MAX_SECTIONS; i++) {
        snprintf(names[i], sizeof names[i], "s%d", i);
        many[i] = (struct ckpt_section){names[i], NULL, 0};
    }

    cr_assert_eq(ckpt_write(path, empty, 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write(path, null_name, 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write(path, too_long, 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write(path, null_data, 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write(path, NULL, 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write(path, many, CKPT_MAX_SECTIONS + 1, &e), CODE_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(e.msg, path), "%s", e.msg);
    cr_assert_eq(ckpt_write(NULL, empty, 0, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_write("", empty, 0, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(access(path, F_OK), -1, "a failed write created the file");
    cr_assert_eq(count_tmp(), 0);

    /* exactly the limits */
    cr_assert_eq(ckpt_write(path, many, CKPT_MAX_SECTIONS, &e), CODE_OK, "%s", e.msg);
    ckpt *c;
    cr_assert_eq(ckpt_read(path, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(ckpt_num_sections(c), CKPT_MAX_SECTIONS);
    cr_assert_str_eq(ckpt_section_name(c, CKPT_MAX_SECTIONS - 1), "s63");
    ckpt_free(c);
    cr_assert_eq(ckpt_read(NULL, &c, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(ckpt_read(path, NULL, &e), CODE_INVALID_ARGUMENT);
}

Test(ckpt, missing_file)
{
    char p[256];
    snprintf(p, sizeof p, "%s/absent.ckpt", dir);
    expect_fail(p, CODE_NOT_FOUND, NULL);
}

Test(ckpt, directory_is_not_a_checkpoint)
{
    expect_fail(dir, CODE_INVALID_ARGUMENT, "regular file");
}

/* A FIFO given as the checkpoint is refused at once, for loading and for
 * saving: opening it for reading would wait forever for a writer. */
Test(ckpt, fifo_is_refused_without_blocking, .timeout = 10)
{
    cr_assert_eq(mkfifo(path, 0600), 0);
    expect_fail(path, CODE_INVALID_ARGUMENT, "FIFO");
    struct ckpt_section s = {"a", "xyz", 3};
    err e;
    cr_assert_eq(ckpt_write(path, &s, 1, &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "a FIFO"), "%s", e.msg);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced");
}

/* A checkpoint path that is a symbolic link stays one: the save rewrites the
 * file it names (before, the link was replaced by a regular file and its
 * target went stale). */
Test(ckpt, symlinked_checkpoint_keeps_its_link)
{
    char real[256];
    snprintf(real, sizeof real, "%s/real.ckpt", dir);
    write_small(real);
    cr_assert_eq(symlink("real.ckpt", path), 0);
    const uint64_t v = 42;
    struct ckpt_section s = {"v", &v, 8};
    err e;
    cr_assert_eq(ckpt_write(path, &s, 1, &e), CODE_OK, "%s", e.msg);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the link was replaced by a regular file");
    ckpt *c;
    uint64_t n;
    cr_assert_eq(ckpt_read(real, &c, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(*(const uint64_t *)ckpt_get(c, "v", &n), 42, "the link's target was not written");
    ckpt_free(c);
    cr_assert_eq(count_tmp(), 0);
}

Test(ckpt, every_bit_flipped)
{
    char bad[192];
    size_t size;

    write_small(path);
    unsigned char *buf = slurp(path, &size);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    for (size_t i = 0; i < size; i++)
        for (int b = 0; b < 8; b++) {
            buf[i] ^= (unsigned char)(1u << b);
            spit(bad, buf, size);
            expect_fail(bad, CODE_DATA_LOSS, NULL);
            buf[i] ^= (unsigned char)(1u << b);
        }
    for (size_t i = 0; i < size; i++) { /* and every byte inverted */
        buf[i] ^= 0xff;
        spit(bad, buf, size);
        expect_fail(bad, CODE_DATA_LOSS, NULL);
        buf[i] ^= 0xff;
    }
    /* a flip in a section's data is caught by the checksum */
    buf[33] ^= 1;
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "checksum mismatch: the file is damaged");
    buf[0] = 'X';
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "not a tpuemu checkpoint");
    free(buf);
    expect_small(path);
}

Test(ckpt, truncated_at_every_length)
{
    char bad[192];
    size_t size;

    write_small(path);
    unsigned char *buf = slurp(path, &size);
    snprintf(bad, sizeof bad, "%s/short.ckpt", dir);
    for (size_t len = 0; len < size; len++) {
        spit(bad, buf, len);
        expect_fail(bad, CODE_DATA_LOSS, len < 48 ? "truncated" : NULL);
    }
    spit(bad, buf, size - 1);
    expect_fail(bad, CODE_DATA_LOSS, "looks truncated");
    free(buf);
}

Test(ckpt, trailing_garbage)
{
    char bad[192];
    size_t size;

    write_small(path);
    unsigned char *buf = slurp(path, &size);
    unsigned char *big = malloc(2 * size);
    cr_assert_not_null(big);
    snprintf(bad, sizeof bad, "%s/long.ckpt", dir);
    size_t extra[] = {1, 7, 8, 32, size};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
        memcpy(big, buf, size);
        memcpy(big + size, buf, extra[k]);
        spit(bad, big, size + extra[k]);
        expect_fail(bad, CODE_DATA_LOSS, NULL);
    }
    /* zeros appended before a hash that matches: the table does not reach the end */
    memcpy(big, buf, size - CKPT_HASH_BYTES);
    memset(big + size - CKPT_HASH_BYTES, 0, 8);
    rehash(big, size + 8);
    spit(bad, big, size + 8);
    expect_fail(bad, CODE_DATA_LOSS, "trailing bytes");
    free(big);
    free(buf);
}

/* Files whose checksum holds but whose content is wrong (an unkeyed hash is
 * no proof of intent): every check behind the checksum. */
Test(ckpt, sealed_but_inconsistent)
{
    char bad[192];
    size_t size;
    struct ckpt_section dup[] = {{"aa", "1", 1}, {"ab", "2", 1}};
    err e;

    write_small(path);
    unsigned char *orig = slurp(path, &size);
    unsigned char *buf = malloc(size);
    cr_assert_not_null(buf);
    snprintf(bad, sizeof bad, "%s/sealed.ckpt", dir);

    memcpy(buf, orig, size);
    buf[8] = 3; /* version */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "unsupported format version 3");

    memcpy(buf, orig, size);
    buf[12] = CKPT_MAX_SECTIONS + 1; /* count */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "section table inconsistent");

    memcpy(buf, orig, size);
    buf[12] = 4; /* one more section than there is */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "truncated");

    memcpy(buf, orig, size);
    buf[12] = 2; /* one fewer */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "trailing bytes");

    memcpy(buf, orig, size);
    put_u64(buf + 19, UINT64_MAX); /* a huge size is rejected, never allocated */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "truncated");

    memcpy(buf, orig, size);
    put_u64(buf + 19, 1u << 20);
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "truncated");

    memcpy(buf, orig, size);
    buf[27] = 1; /* padding */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "padding");

    memcpy(buf, orig, size);
    buf[16] = 0; /* empty name */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "section table inconsistent");

    memcpy(buf, orig, size);
    buf[37] = '\0'; /* NUL inside "bb" */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "NUL");

    free(buf);
    free(orig);

    cr_assert_eq(ckpt_write(path, dup, 2, &e), CODE_OK, "%s", e.msg);
    buf = slurp(path, &size);
    unsigned char *name = memmem(buf, size, "ab", 2);
    cr_assert_not_null(name);
    name[1] = 'a';
    rehash(buf, size);
    spit(bad, buf, size);
    expect_fail(bad, CODE_DATA_LOSS, "appears twice");
    free(buf);
}

/* Sets a file's modification time s seconds into the past. */
static void age_file(const char *p, int s)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= s;
    ts[1] = ts[0];
    cr_assert_eq(utimensat(AT_FDCWD, p, ts, 0), 0, "%s: %s", p, strerror(errno));
}

static void touch(const char *p)
{
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs("partial", f);
    fclose(f);
}

/* The one temp file in dir (its name in out), or 0 if none or several. */
static int the_tmp(char *out, size_t n)
{
    DIR *dp = opendir(dir);
    struct dirent *de;
    int k = 0;
    while ((de = readdir(dp)))
        if (strstr(de->d_name, "model.ckpt.tmp.") == de->d_name && k++ == 0)
            snprintf(out, n, "%s/%s", dir, de->d_name);
    closedir(dp);
    return k == 1;
}

/* A save killed half way (SIGXFSZ at the file-size limit, its default action
 * kills) leaves its temp file behind; the next save, or load, of that path
 * removes it once its writer is gone and it sat for a minute, and touches
 * nothing else: not a live writer's temp file, not a fresh one, not another
 * name. */
Test(ckpt, crashed_save_leftovers_are_removed)
{
    const size_t big = 2u << 20;
    char *data = calloc(1, big), left[600], live[600], fresh[600], other[600], other2[600];
    struct ckpt_section s[] = {{"w", data, big}};
    int status;
    ckpt *c;
    err e;

    write_small(path);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct rlimit rl = {1u << 20, 1u << 20};
        signal(SIGXFSZ, SIG_DFL);
        setrlimit(RLIMIT_FSIZE, &rl);
        ckpt_write(path, s, 1, &e);
        _exit(0); /* not reached: killed at the limit */
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "the save was not killed half way: %d", status);
    cr_assert(the_tmp(left, sizeof left), "the crash left no temp file");

    /* younger than a minute: it stays (the writer might be on another machine) */
    cr_assert_eq(ckpt_write(path, s, 0, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(access(left, F_OK), 0, "a fresh temp file was removed");

    /* a live writer's (this process's parent), a fresh one of a dead writer,
     * and names that are not ours, all old */
    snprintf(live, sizeof live, "%s/model.ckpt.tmp.%ld.0123abcd", dir, (long)getppid());
    snprintf(fresh, sizeof fresh, "%s/model.ckpt.tmp.%ld.89abcdef", dir, (long)pid);
    snprintf(other, sizeof other, "%s/model.ckpt.tmp.%ld.notours", dir, (long)pid);
    snprintf(other2, sizeof other2, "%s/other.ckpt.tmp.%ld.0123abcd", dir, (long)pid);
    touch(live);
    touch(fresh);
    touch(other);
    touch(other2);
    age_file(left, 120);
    age_file(live, 120);
    age_file(other, 120);
    age_file(other2, 120);

    cr_assert_eq(ckpt_write(path, s, 0, &e), CODE_OK, "%s", e.msg);
    cr_assert_neq(access(left, F_OK), 0, "the crashed save's temp file is still there");
    cr_assert_eq(access(live, F_OK), 0, "a live writer's temp file was removed");
    cr_assert_eq(access(fresh, F_OK), 0, "a fresh temp file was removed");
    cr_assert_eq(access(other, F_OK), 0, "a name not of ours was removed");
    cr_assert_eq(access(other2, F_OK), 0, "another checkpoint's file was removed");

    /* a load cleans too */
    age_file(fresh, 120);
    cr_assert_eq(ckpt_read(path, &c, &e), CODE_OK, "%s", e.msg);
    ckpt_free(c);
    cr_assert_neq(access(fresh, F_OK), 0, "a load left the crashed save's temp file");
    cr_assert_eq(access(live, F_OK), 0);
    free(data);
}

/* ---- checkpoints sealed with the cluster token ---- */

/* The checkpoint key of a cluster token, as the client derives it. */
static void token_key(const char *token, unsigned char key[CKPT_KEY_BYTES])
{
    auth a;
    err e;
    cr_assert_eq(auth_from_token(&a, token, strlen(token), &e), CODE_OK, "%s", e.msg);
    auth_subkey(&a, "tpuemu checkpoint seal v1", key);
}

static const char token_a[] = "Zq3v9LmX2pR7tY1wK8bN4cH6dF0gJ5sA";
static const char token_b[] = "Qw8eR4tY6uI2oP0aS9dF3gH7jK1lZ5xC";

static void write_small_sealed(const char *p, const unsigned char *key)
{
    const uint64_t step = 0x0102030405060708ull;
    struct ckpt_section s[] = {
        {"a", "xyz", 3},
        {"bb", NULL, 0},
        {"ccc", &step, 8},
    };
    err e;
    cr_assert_eq(ckpt_write_sealed(p, s, 3, key, &e), CODE_OK, "%s", e.msg);
}

/* Reads p with key expecting failure with code and a message naming p and containing want. */
static void expect_sealed_fail(const char *p, const unsigned char *key, int allow_unkeyed, int code, const char *want)
{
    ckpt *c = (ckpt *)&c;
    int keyed = -1;
    err e;
    int rc = ckpt_read_sealed(p, key, allow_unkeyed, &c, &keyed, &e);
    cr_assert_eq(rc, code, "want %s, got %s: %s", code_name(code), code_name(rc), rc ? e.msg : "");
    cr_assert_null(c);
    cr_assert_eq(keyed, 0);
    cr_assert_not_null(strstr(e.msg, p), "message does not name the file: %s", e.msg);
    if (want)
        cr_assert_not_null(strstr(e.msg, want), "'%s' not in: %s", want, e.msg);
}

static void expect_small_sealed(const char *p, const unsigned char *key, int allow_unkeyed, int want_keyed)
{
    ckpt *c;
    int keyed = -1;
    uint64_t n;
    err e;
    cr_assert_eq(ckpt_read_sealed(p, key, allow_unkeyed, &c, &keyed, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(keyed, want_keyed);
    cr_assert_eq(ckpt_num_sections(c), 3);
    cr_assert_arr_eq(ckpt_get(c, "a", &n), "xyz", 3);
    cr_assert_eq(*(const uint64_t *)ckpt_get(c, "ccc", &n), 0x0102030405060708ull);
    ckpt_free(c);
}

Test(ckpt, keyed_seal_loads_with_its_token_only)
{
    unsigned char ka[CKPT_KEY_BYTES], kb[CKPT_KEY_BYTES];
    size_t size;

    token_key(token_a, ka);
    token_key(token_b, kb);
    cr_assert(memcmp(ka, kb, sizeof ka) != 0);
    write_small_sealed(path, ka);
    unsigned char *buf = slurp(path, &size);
    cr_assert_eq(size, 104, "a keyed seal takes no more room than the checksum");
    cr_assert_eq(buf[8], CKPT_VERSION_KEYED, "the header says which seal the file carries");
    free(buf);

    expect_small_sealed(path, ka, 0, 1);
    expect_sealed_fail(path, kb, 0, CODE_UNAUTHENTICATED, "its seal does not match this cluster's token");
    expect_sealed_fail(path, kb, 1, CODE_UNAUTHENTICATED, "its seal does not match this cluster's token");
    /* without a token: refused, saying it needs one (ckpt_read is the same) */
    expect_sealed_fail(path, NULL, 0, CODE_UNAUTHENTICATED, "sealed with a cluster token");
    expect_fail(path, CODE_UNAUTHENTICATED, "sealed with a cluster token");
}

Test(ckpt, keyed_seal_every_bit_flipped)
{
    unsigned char ka[CKPT_KEY_BYTES];
    char bad[192];
    size_t size;

    token_key(token_a, ka);
    write_small_sealed(path, ka);
    unsigned char *buf = slurp(path, &size);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    for (size_t i = 0; i < size; i++)
        for (int b = 0; b < 8; b++) {
            buf[i] ^= (unsigned char)(1u << b);
            spit(bad, buf, size);
            ckpt *c = NULL;
            err e;
            int rc = ckpt_read_sealed(bad, ka, 1, &c, NULL, &e);
            cr_assert_neq(rc, CODE_OK, "byte %zu bit %d flipped and the file still loads", i, b);
            cr_assert_null(c);
            cr_assert_not_null(strstr(e.msg, bad), "%s", e.msg);
            buf[i] ^= (unsigned char)(1u << b);
        }
    buf[33] ^= 1; /* a section's data */
    spit(bad, buf, size);
    expect_sealed_fail(bad, ka, 0, CODE_UNAUTHENTICATED, "changed or damaged");
    free(buf);
    expect_small_sealed(path, ka, 0, 1);
}

/* Whoever can write the file can change it and seal it again with the
 * unkeyed checksum (or put the unkeyed checksum under the keyed version):
 * with a token, neither loads. */
Test(ckpt, tampered_and_resealed_unkeyed_is_refused_with_a_token)
{
    unsigned char ka[CKPT_KEY_BYTES];
    char bad[192];
    size_t size;

    token_key(token_a, ka);
    write_small_sealed(path, ka);
    unsigned char *buf = slurp(path, &size);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    buf[33] = 'Q'; /* "xyz" -> "Qyz" */

    buf[8] = CKPT_VERSION; /* downgraded to the unkeyed seal */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_sealed_fail(bad, ka, 0, CODE_UNAUTHENTICATED, "sealed with an unkeyed checksum only");
    expect_sealed_fail(bad, ka, 0, CODE_UNAUTHENTICATED, "TPUEMU_CHECKPOINT_ALLOW_UNKEYED=1");

    buf[8] = CKPT_VERSION_KEYED; /* the keyed version, an unkeyed checksum */
    rehash(buf, size);
    spit(bad, buf, size);
    expect_sealed_fail(bad, ka, 0, CODE_UNAUTHENTICATED, "its seal does not match this cluster's token");
    expect_sealed_fail(bad, ka, 1, CODE_UNAUTHENTICATED, "its seal does not match this cluster's token");
    free(buf);
}

/* A checkpoint written without a token (or before keyed seals) loads as
 * before without one; with one only when the user says so. */
Test(ckpt, unkeyed_file_with_and_without_a_token)
{
    unsigned char ka[CKPT_KEY_BYTES];
    size_t size;

    token_key(token_a, ka);
    write_small(path);
    unsigned char *buf = slurp(path, &size);
    cr_assert_eq(buf[8], CKPT_VERSION);
    free(buf);
    expect_small(path);
    expect_small_sealed(path, NULL, 0, 0);
    expect_sealed_fail(path, ka, 0, CODE_UNAUTHENTICATED, "sealed with an unkeyed checksum only");
    expect_small_sealed(path, ka, 1, 0);
    /* and once saved again with the token, it is sealed with it */
    write_small_sealed(path, ka);
    expect_small_sealed(path, ka, 0, 1);
}
