/* logfmt lines on stderr, one write(2) each so lines from many processes sharing
 * a terminal or file do not interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_daemon = "tpuemu";
static enum log_level g_min = LOG_INFO;

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

const char *log_q(const char *s)
{
    static char bufs[8][256];
    static unsigned next;
    char *b = bufs[next++ % 8];
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

void log_at(enum log_level lvl, const char *msg, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    struct timespec ts;
    struct tm tm;
    int n;

    if (lvl < g_min)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line,
                 "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s daemon=%s pid=%d msg=%s",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, ts.tv_nsec / 1000000L, names[lvl], g_daemon, (int)getpid(),
                 log_q(msg));
    if (fmt && n > 0 && (size_t)n < sizeof line - 2) {
        va_list ap;
        line[n++] = ' ';
        va_start(ap, fmt);
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0)
            n += m;
    }
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

int log_limit_ok(struct log_limit *l, unsigned long long now_ms, unsigned long long window_ms, unsigned burst,
                 unsigned *suppressed)
{
    if (now_ms - l->window_start >= window_ms || now_ms < l->window_start) {
        l->window_start = now_ms;
        l->logged = 0;
    }
    if (l->logged >= burst) {
        l->suppressed++;
        return 0;
    }
    l->logged++;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return 1;
}
