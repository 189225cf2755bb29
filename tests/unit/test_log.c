/* Unit tests of common/base/log: the rate limit of lines about what others send
 * (per kind: the first lines written with their reasons, the rest summed up in
 * one "suppressed" line when the window ends). stderr is a temp file here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "log.h"

static char path[64];

static void to_file(void)
{
    snprintf(path, sizeof path, "/tmp/tpuemu-test-log-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    close(fd);
    log_init("test", LOG_INFO);
}

static char *slurp(void)
{
    FILE *f = fopen(path, "r");
    static char buf[1 << 20];
    size_t n;
    cr_assert_not_null(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fini(void)
{
    unlink(path);
}

TestSuite(log, .init = to_file, .fini = fini);

/* 5000 refusals: 10 lines with their reasons, the rest one line at the end. */
Test(log, flood_is_bounded_and_the_first_refusal_kept)
{
    for (int i = 0; i < 5000; i++)
        log_warn_limited("message refused", "bytes=%d reason=%s", i, log_q("cannot decode the envelope"));
    log_flush_suppressed(1);
    char *out = slurp();
    cr_assert_eq(count(out, "\n"), (int)LOG_LIMIT_BURST + 1, "%s", out);
    cr_assert(strstr(out, "msg=\"message refused\" bytes=0 reason=\"cannot decode the envelope\"\n"),
              "the first refusal, with its reason: %s", out);
    cr_assert(strstr(out, "level=warn daemon=test"), "%s", out);
    cr_assert(strstr(out, "msg=\"message refused: 4990 more like this suppressed in the last "), "%s", out);
    cr_assert(strstr(out, " kind=\"message refused\" suppressed=4990\n"), "%s", out);
    cr_assert_lt(strlen(out), 4000u, "bounded: %zu bytes", strlen(out));
}

/* Each kind has its own budget: a flood of one does not hide another. */
Test(log, kinds_are_limited_apart)
{
    for (int i = 0; i < 100; i++)
        log_warn_limited("message refused", "i=%d", i);
    log_warn_limited("control request refused", "reason=%s", log_q("wrong recipient"));
    log_warn("core dead", "host=h0 core=1");
    char *out = slurp();
    cr_assert_eq(count(out, "msg=\"message refused\""), (int)LOG_LIMIT_BURST, "%s", out);
    cr_assert_eq(count(out, "msg=\"control request refused\" reason=\"wrong recipient\""), 1, "%s", out);
    cr_assert_eq(count(out, "msg=\"core dead\""), 1, "unlimited lines are never held back: %s", out);
}

/* When the window ends the summary comes (at the next line or a flush), and
 * the kind gets its burst again. */
Test(log, window_ends_with_a_summary_and_a_new_burst)
{
    log_limit_set(3, 200);
    for (int i = 0; i < 8; i++)
        log_warn_limited("data-plane connection refused", "i=%d", i);
    log_flush_suppressed(0); /* the window has not ended: nothing yet */
    cr_assert_eq(count(slurp(), "suppressed"), 0, "%s", slurp());
    sleep_ms(250);
    log_flush_suppressed(0);
    char *out = slurp();
    cr_assert_eq(count(out, "msg=\"data-plane connection refused: 5 more like this suppressed in the last "), 1,
                 "%s", out);
    for (int i = 8; i < 12; i++)
        log_warn_limited("data-plane connection refused", "i=%d", i);
    out = slurp();
    cr_assert(strstr(out, " i=8\n") && strstr(out, " i=9\n") && strstr(out, " i=10\n"), "%s", out);
    cr_assert(!strstr(out, " i=11\n"), "%s", out);
    /* the next line of any kind writes a summary that is due */
    sleep_ms(250);
    log_info("something else", NULL);
    out = slurp();
    cr_assert_eq(count(out, "suppressed=1\n"), 1, "%s", out);
    cr_assert_lt(strstr(out, "suppressed=1\n"), strstr(out, "something else"), "the summary first: %s", out);
}

Test(log, below_the_level_nothing_is_counted)
{
    log_init("test", LOG_ERROR);
    for (int i = 0; i < 50; i++)
        log_warn_limited("message refused", "i=%d", i);
    log_flush_suppressed(1);
    cr_assert_str_eq(slurp(), "");
}

/* A line of a kind whose window has ended and that has lines left out,
 * arriving before any flush: its summary is written once, before it, and the
 * line keeps its own quoted fields. (The summary used to be written from
 * inside its own line's flush as well: twice, the count of kinds pending
 * taken down twice, and log_q's buffers reused under the caller, so the line
 * showed another message's text in its fields.) */
Test(log, a_line_after_the_window_before_the_flush)
{
    log_limit_set(1, 100);
    log_warn_limited("http request refused", "path=%s", log_q("/first"));
    log_warn_limited("http request refused", "path=%s", log_q("/left-out"));
    sleep_ms(150); /* any time past the window: nothing flushes meanwhile */
    log_warn_limited("http request refused", "a=%s b=%s c=%s d=%s e=%s f=%s path=%s", log_q("1"), log_q("2"),
                     log_q("3"), log_q("4"), log_q("5"), log_q("6"), log_q("/after"));
    char *out = slurp();
    cr_assert_eq(count(out, "suppressed=1\n"), 1, "one summary: %s", out);
    cr_assert(strstr(out, " a=\"1\" b=\"2\" c=\"3\" d=\"4\" e=\"5\" f=\"6\" path=\"/after\"\n"),
              "the line's own fields: %s", out);
    cr_assert_lt(strstr(out, "suppressed=1\n"), strstr(out, "path=\"/after\""), "the summary first: %s", out);
    /* the count of kinds pending stayed right: another kind's flood is still
     * summed up at the end, once */
    log_warn_limited("message refused", "i=%d", 0);
    log_warn_limited("message refused", "i=%d", 1);
    log_warn_limited("message refused", "i=%d", 2);
    log_flush_suppressed(1);
    out = slurp();
    cr_assert_eq(count(out, "kind=\"message refused\" suppressed=2\n"), 1, "%s", out);
    cr_assert_eq(count(out, "suppressed="), 2, "%s", out);
    cr_assert_eq(count(out, "\n"), 5, "%s", out);
}

/* The kept lines: the newest whole lines, oldest first, as stderr has them. */
Test(log, kept_lines_are_the_newest_whole_lines)
{
    static char out[8192];
    cr_assert_eq(log_kept(out, sizeof out), 0u, "nothing is kept before log_keep");
    log_keep(4096);
    cr_assert_eq(log_kept(out, sizeof out), 0u);
    for (int i = 0; i < 200; i++)
        log_info("kept line", "i=%d pad=%s", i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    size_t n = log_kept(out, sizeof out);
    cr_assert(n > 3000 && n <= 4096, "%zu bytes kept of a 4096-byte ring", n);
    cr_assert_eq(strlen(out), n);
    cr_assert(!strncmp(out, "ts=", 3), "the first kept line is cut: %.60s", out);
    cr_assert_eq(out[n - 1], '\n');
    cr_assert(strstr(out, "i=199 "), "the newest line is not kept");
    cr_assert_null(strstr(out, "i=0 "), "the oldest lines are still kept in 4096 bytes");
    /* every kept line is a line of stderr, whole */
    char *all = slurp();
    for (char *line = out, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        cr_assert(strstr(all, line), "a kept line is not on stderr: %s", line);
    }
    /* a smaller buffer gets the newest whole lines that fit */
    char small[300];
    n = log_kept(small, sizeof small);
    cr_assert(n > 0 && n < sizeof small && !strncmp(small, "ts=", 3) && small[n - 1] == '\n', "%s", small);
    cr_assert(strstr(small, "i=199 "), "%s", small);
    /* a line longer than the ring keeps nothing cut */
    log_keep(64);
    log_info("a line longer than the ring", "pad=%s", "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy");
    cr_assert_eq(log_kept(out, sizeof out), 0u, "a cut line was given: %s", out);
    log_keep(0);
    cr_assert_eq(log_kept(out, sizeof out), 0u);
}
