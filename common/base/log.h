/* Daemon logging: one logfmt line per event on stderr.
 *
 *   ts=2026-12-02T15:04:30.123Z level=info daemon=resolver msg="worker registered" host=h0 core=3
 *
 * Libraries never log; daemons and tools do. Keys and values are given as a
 * printf format of key=value pairs; log_q() quotes a value for it. */
#ifndef TPUEMU_COMMON_LOG_H
#define TPUEMU_COMMON_LOG_H

#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Name shown as daemon=NAME on every line; level below which lines are dropped. */
void log_init(const char *daemon, enum log_level min);
/* Parses "debug", "info", "warn", "error"; -1 if it is none of them. */
int log_level_parse(const char *s);

/* msg is quoted for you; fmt (may be NULL) adds " key=value ..." pairs. */
void log_at(enum log_level lvl, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_debug(msg, ...) log_at(LOG_DEBUG, msg, __VA_ARGS__)
#define log_info(msg, ...) log_at(LOG_INFO, msg, __VA_ARGS__)
#define log_warn(msg, ...) log_at(LOG_WARN, msg, __VA_ARGS__)
#define log_error(msg, ...) log_at(LOG_ERROR, msg, __VA_ARGS__)

/* Lines about what others send (refusals, bad input) are rate limited per
 * kind, the kind being msg: the first LOG_LIMIT_BURST lines of a kind in a
 * window of LOG_LIMIT_WINDOW_MS are written, the rest of that window counted,
 * and when it ends (at the next line of any kind, or log_flush_suppressed) one
 * line says how many were left out:
 *   msg="message refused: 4990 more like this suppressed in the last 10.0 s"
 *   kind="message refused" suppressed=4990
 * so a flood of garbage costs a bounded amount of log while its first lines,
 * with their reasons, are all there. Loop thread only (as log_q). */
#define LOG_LIMIT_BURST 10u
#define LOG_LIMIT_WINDOW_MS 10000u
void log_limited(enum log_level lvl, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define log_warn_limited(msg, ...) log_limited(LOG_WARN, msg, __VA_ARGS__)
#define log_info_limited(msg, ...) log_limited(LOG_INFO, msg, __VA_ARGS__)
/* Writes the "suppressed" line of every kind whose window ended (all: of every
 * kind with lines left out, window ended or not: at exit). Daemons call it from
 * a periodic timer, so a flood that stops is still summed up. */
void log_flush_suppressed(int all);
/* Changes the burst and window (tests); 0 burst turns limiting off. */
void log_limit_set(unsigned burst, unsigned window_ms);

/* The last lines written, kept in memory too (a daemon's /log page): after
 * log_keep(bytes) every line written is also copied into a ring of that
 * many bytes (at most LOG_KEEP_MAX; 0 stops keeping). log_kept copies the
 * whole lines in it, oldest first, into out (size n, NUL-terminated; the
 * oldest are left out when out is smaller) and returns the bytes copied.
 * Both are thread-safe. */
#define LOG_KEEP_MAX (1u << 20)
void log_keep(unsigned bytes);
size_t log_kept(char *out, size_t n);

/* Quotes s for a logfmt value into one of a few rotating static buffers
 * (so several can be used in one log call); escapes quotes, backslashes and
 * control bytes; truncates at 200 bytes. Not thread-safe: loop thread only. */
const char *log_q(const char *s);

#endif
