/* The cluster console on the resolver's metrics port (console.c): GET / is
 * the page, /console.js and /console.css its script and style (built into
 * the daemon), /api/cluster[?since=N] the JSON the page polls. With a cluster
 * token, /api/cluster wants "Authorization: Bearer KEY", KEY being the
 * console key (auth_console_key_hex; tpuctl console prints the URL with it).
 * Handlers of the metrics server (metrics.c); loop thread only. */
#ifndef TPUEMU_RESOLVER_CONSOLE_H
#define TPUEMU_RESOLVER_CONSOLE_H

#include "httpd.h"

int console_page(void *user, struct httpd_req *q, hbuf *b);
int console_script(void *user, struct httpd_req *q, hbuf *b);
int console_style(void *user, struct httpd_req *q, hbuf *b);
int console_api(void *user, struct httpd_req *q, hbuf *b);

#endif
