#include "uvtcp.h"

#include <stdlib.h>

#include "addr.h"
#include "log.h"

void uvtcp_peer_name(uv_tcp_t *t, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char ip[48] = "";
    int port;

    if (n)
        out[0] = '\0';
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    addr_format(ip, port, out, n);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

int uvtcp_drop(uv_loop_t *loop, uv_stream_t *server, char *peer, size_t n)
{
    uv_tcp_t *t = malloc(sizeof *t);
    int ok;

    if (peer && n)
        peer[0] = '\0';
    if (!t)
        return 0; /* it waits in the backlog until memory comes back */
    uv_tcp_init(loop, t);
    ok = uv_accept(server, (uv_stream_t *)t) == 0;
    if (ok && peer)
        uvtcp_peer_name(t, peer, n);
    uv_close((uv_handle_t *)t, free_handle);
    return ok;
}

void uvtcp_accept_failed(const char *port, const char *listen, int status)
{
    int fds = status == UV_EMFILE || status == UV_ENFILE;
    log_warn_limited("accept failed", "port=%s listen=%s reason=%s hint=%s", port, log_q(listen),
                     log_q(uv_strerror(status)),
                     log_q(fds ? "out of file descriptors: connections are refused until some close; raise "
                                 "the open-file limit (LimitNOFILE=, ulimit -n, docker --ulimit nofile=)"
                               : ""));
}
