/* The request head of an HTTP/1.x request, as the metrics server (httpd.h)
 * accepts it: a request line METHOD SP /path SP HTTP/1.0|1.1, header lines
 * of a token name and a value without control bytes (no folding), CRLF or bare
 * LF line ends, exactly one Host in HTTP/1.1, a well-formed Content-Length.
 * Pure functions over a caller's buffer: the fuzzer runs them alone. */
#ifndef TPUEMU_COMMON_HTTPHEAD_H
#define TPUEMU_COMMON_HTTPHEAD_H

#include <stddef.h>

struct http_head {
    char *method, *target, *version; /* into the parsed buffer */
    int hosts;                       /* Host header lines */
    int has_body;                    /* Content-Length > 0 or a Transfer-Encoding */
    int authorizations;              /* Authorization header lines */
    char *authorization;             /* the last one's value (trailing blanks kept); NULL if none */
};

/* Length of the head, through its empty line, in buf[0..len), or 0 when it
 * is not complete yet; from is where the bytes not searched before begin. */
size_t http_head_end(const char *buf, size_t len, size_t from);

/* Parses the head buf[0..len) (as http_head_end measured it; buf[len] must
 * be NUL) in place: line ends and separators become NULs and q points into
 * buf. Returns 0, or the HTTP status to refuse it with (400, 431 for too many
 * header lines, 505 for another HTTP version) and *why, a static string. */
int http_head_parse(char *buf, size_t len, struct http_head *q, const char **why);

#endif
