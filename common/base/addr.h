/* Addresses as users write them: "HOST:PORT", "grpc://HOST:PORT", "HOST",
 * "[::1]:PORT", and comma lists of those. */
#ifndef TPUEMU_COMMON_ADDR_H
#define TPUEMU_COMMON_ADDR_H

#include <stddef.h>

#include "status.h"

#define ADDR_HOST_MAX 256
#define ADDR_DEFAULT_PORT 8470 /* the port Cloud TPU uses */

typedef struct addr {
    char host[ADDR_HOST_MAX]; /* without brackets */
    int port;
} addr;

/* Parses one address; default_port is used when none is given. Accepts an
 * optional grpc:// or tcp:// scheme. */
int addr_parse(const char *s, int default_port, addr *out, err *e);

/* Parses a comma list into out[0..max-1]; *n gets the count. Empty items are an error. */
int addr_parse_list(const char *s, int default_port, addr *out, size_t max, size_t *n, err *e);

/* "tcp://host:port", IPv6 hosts in brackets. */
void addr_nn_url(const char *host, int port, char *out, size_t n);
/* "host:port", IPv6 hosts in brackets. */
void addr_format(const char *host, int port, char *out, size_t n);

/* 1 for 127.0.0.0/8, ::1 and "localhost". */
int addr_is_loopback(const char *host);

#endif
