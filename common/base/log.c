/* logfmt lines on stderr, one write(2) each so lines from many processes sharing
 * a terminal or file do not interleave. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_daemon = "tpuemu";
static enum log_level g_min = LOG_INFO;

/* the kept lines: a byte ring; written counts every byte ever put in */
static struct {
    pthread_mutex_t mu;
    char *ring;
    size_t cap;
    uint64_t written;
} g_keep = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

void log_keep(unsigned bytes)
{
    char *ring = NULL;
    if (bytes > LOG_KEEP_MAX)
        bytes = LOG_KEEP_MAX;
    if (bytes && !(ring = malloc(bytes)))
        return; /* nothing kept: the lines still go to stderr */
    pthread_mutex_lock(&g_keep.mu);
    free(g_keep.ring);
    g_keep.ring = ring;
    g_keep.cap = bytes;
    g_keep.written = 0;
    pthread_mutex_unlock(&g_keep.mu);
}

static void keep_line(const char *line, size_t n)
{
    pthread_mutex_lock(&g_keep.mu);
    if (g_keep.ring) {
        if (n > g_keep.cap) { /* only its end fits */
            line += n - g_keep.cap;
            g_keep.written += n - g_keep.cap;
            n = g_keep.cap;
        }
        size_t at = (size_t)(g_keep.written % g_keep.cap), first = g_keep.cap - at < n ? g_keep.cap - at : n;
        memcpy(g_keep.ring + at, line, first);
        memcpy(g_keep.ring, line + first, n - first);
        g_keep.written += n;
    }
    pthread_mutex_unlock(&g_keep.mu);
}

size_t log_kept(char *out, size_t n)
{
    size_t len = 0;
    int partial = 0;
    if (!out || !n)
        return 0;
    pthread_mutex_lock(&g_keep.mu);
    if (g_keep.ring && g_keep.written) {
        uint64_t oldest = g_keep.written > g_keep.cap ? g_keep.written - g_keep.cap : 0, from = oldest;
        if (g_keep.written - from > n - 1)
            from = g_keep.written - (n - 1);
        /* a line starts at from only if the byte before it ended one (and
         * that byte is still in the ring to tell) */
        partial = from > 0 && (from == oldest || g_keep.ring[(from - 1) % g_keep.cap] != '\n');
        len = (size_t)(g_keep.written - from);
        size_t at = (size_t)(from % g_keep.cap), first = g_keep.cap - at < len ? g_keep.cap - at : len;
        memcpy(out, g_keep.ring + at, first);
        memcpy(out + first, g_keep.ring, len - first);
    }
    pthread_mutex_unlock(&g_keep.mu);
    out[len] = '\0';
    if (partial) { /* whole lines only */
        char *nl = memchr(out, '\n', len);
        size_t skip = nl ? (size_t)(nl - out) + 1 : len;
        memmove(out, out + skip, len - skip + 1);
        len -= skip;
    }
    return len;
}

void log_init(const char *daemon, enum log_level min)
{
    g_daemon = daemon;
    g_min = min;
}

int log_level_parse(const char *s)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* Quotes s into b (256 bytes); returns b. */
static const char *quote(char *b, const char *s)
{
    size_t n = 0;

    if (!s)
        s = "";
    b[n++] = '"';
    for (; *s && n < 210; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            b[n++] = '\\';
            b[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            n += (size_t)snprintf(b + n, 8, "\\x%02x", c);
        } else {
            b[n++] = (char)c;
        }
    }
    if (*s) {
        memcpy(b + n, "...", 3);
        n += 3;
    }
    b[n++] = '"';
    b[n] = '\0';
    return b;
}

const char *log_q(const char *s)
{
    static char bufs[8][256];
    static unsigned next;
    return quote(bufs[next++ % 8], s);
}

static void log_v(enum log_level lvl, const char *msg, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* ---- rate limit, per kind (msg) ---- */

#define LIMIT_KINDS 64

struct limit_kind {
    char msg[96];          /* "" : free slot */
    enum log_level lvl;    /* of the last line left out: the summary's level */
    uint64_t start_ms;     /* the window began */
    unsigned lines;        /* written in this window */
    unsigned long skipped; /* left out in this window */
};

static struct limit_kind g_kinds[LIMIT_KINDS];
static unsigned g_burst = LOG_LIMIT_BURST, g_window_ms = LOG_LIMIT_WINDOW_MS;
static unsigned g_pending; /* kinds with lines left out */
static int g_flushing;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void log_limit_set(unsigned burst, unsigned window_ms)
{
    g_burst = burst;
    g_window_ms = window_ms ? window_ms : 1;
}

/* Writes k's summary once: the count is taken and cleared before the line is
 * written, and writing it flushes nothing else (the line's own flush would
 * otherwise summarize k again, inside this call). It quotes into its own
 * buffers, never log_q's, so a caller's quoted fields stay intact. */
static void summarize(struct limit_kind *k, uint64_t now)
{
    char m[256], kq[256];
    unsigned long skipped = k->skipped;
    int was = g_flushing;

    if (!skipped)
        return;
    k->skipped = 0;
    g_pending--;
    snprintf(m, sizeof m, "%s: %lu more like this suppressed in the last %.1f s", k->msg, skipped,
             (double)(now - k->start_ms) / 1000.0);
    g_flushing = 1;
    log_at(k->lvl, m, "kind=%s suppressed=%lu", quote(kq, k->msg), skipped);
    g_flushing = was;
}

void log_flush_suppressed(int all)
{
    uint64_t now;
    if (!g_pending || g_flushing)
        return;
    g_flushing = 1;
    now = mono_ms();
    for (int i = 0; i < LIMIT_KINDS && g_pending; i++) {
        struct limit_kind *k = &g_kinds[i];
        if (k->skipped && (all || now - k->start_ms >= g_window_ms)) {
            summarize(k, now);
            k->start_ms = now;
            k->lines = 0;
        }
    }
    g_flushing = 0;
}

void log_limited(enum log_level lvl, const char *msg, const char *fmt, ...)
{
    struct limit_kind *k = NULL, *free_slot = NULL;
    uint64_t now;
    va_list ap;

    if (lvl < g_min)
        return;
    if (g_burst) {
        for (int i = 0; i < LIMIT_KINDS; i++) {
            if (!g_kinds[i].msg[0]) {
                if (!free_slot)
                    free_slot = &g_kinds[i];
            } else if (strcmp(g_kinds[i].msg, msg) == 0) {
                k = &g_kinds[i];
                break;
            }
        }
        now = mono_ms();
        if (!k && free_slot && strlen(msg) < sizeof free_slot->msg) {
            k = free_slot;
            snprintf(k->msg, sizeof k->msg, "%s", msg);
            k->start_ms = now;
        }
        /* (a kind that finds no slot is written unlimited: kinds are the
         * daemons' own message literals, far fewer than the slots) */
        if (k) {
            if (now - k->start_ms >= g_window_ms) {
                if (k->skipped)
                    summarize(k, now);
                k->start_ms = now;
                k->lines = 0;
            }
            if (k->lines >= g_burst) {
                if (!k->skipped++)
                    g_pending++;
                k->lvl = lvl;
                return;
            }
            k->lines++;
        }
    }
    va_start(ap, fmt);
    log_v(lvl, msg, fmt, ap);
    va_end(ap);
}

/* ---- lines ---- */

void log_at(enum log_level lvl, const char *msg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_v(lvl, msg, fmt, ap);
    va_end(ap);
}

static void log_v(enum log_level lvl, const char *msg, const char *fmt, va_list ap)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048], mq[256];
    struct timespec ts;
    struct tm tm;
    int n;

    if (lvl < g_min)
        return;
    log_flush_suppressed(0); /* a summary due is written before the line after it */
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line,
                 "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s daemon=%s pid=%d msg=%s",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, ts.tv_nsec / 1000000L, names[lvl], g_daemon, (int)getpid(),
                 quote(mq, msg));
    if (fmt && n > 0 && (size_t)n < sizeof line - 2) {
        line[n++] = ' ';
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        if (m > 0)
            n += m;
    }
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    keep_line(line, (size_t)n);
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
