/* The blocking HTTP client of the daemons' --probe (httpd.h): one GET under
 * one deadline for connect, send and read, so a health check never hangs. */
#include "httpd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "addr.h"

#define GET_MAX_ANSWER 65536

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for ev on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        struct pollfd p = {fd, ev, 0};
        int rc;
        if (left <= 0)
            return 0;
        rc = poll(&p, 1, (int)left);
        if (rc > 0)
            return 1;
        if (rc == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

static const char *probe_ip(const char *host)
{
    if (!*host || !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::") ||
        !strcmp(host, "localhost"))
        return "127.0.0.1";
    return host;
}

int httpd_get(const char *host, int port, const char *path, int timeout_ms, int *status, char *body, size_t n,
              err *e)
{
    const char *ip = probe_ip(host);
    struct sockaddr_storage ss;
    socklen_t sl;
    int64_t deadline = now_ms() + timeout_ms;
    char shown[300], req[512], *ans = NULL;
    size_t got = 0, sent = 0, rl;
    int fd = -1, rc, soerr = 0, code = CODE_OK;
    socklen_t el = sizeof soerr;

    *status = 0;
    if (n)
        body[0] = '\0';
    addr_format(ip, port, shown, sizeof shown);
    memset(&ss, 0, sizeof ss);
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        rc = inet_pton(AF_INET6, ip, &a->sin6_addr);
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        rc = inet_pton(AF_INET, ip, &a->sin_addr);
        sl = sizeof *a;
    }
    if (rc != 1)
        return err_set(e, CODE_INVALID_ARGUMENT, "'%s' is not an IP address", host);
    if ((fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return err_set(e, CODE_UNAVAILABLE, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0) {
        if (errno != EINPROGRESS) {
            code = err_set(e, CODE_UNAVAILABLE, "cannot connect to %s: %s", shown, strerror(errno));
            goto out;
        }
        if ((rc = wait_fd(fd, POLLOUT, deadline)) <= 0) {
            code = err_set(e, rc ? CODE_UNAVAILABLE : CODE_DEADLINE_EXCEEDED, "cannot connect to %s: %s", shown,
                           rc ? strerror(errno) : "no answer within the deadline");
            goto out;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el) < 0 || soerr) {
            code = err_set(e, CODE_UNAVAILABLE, "cannot connect to %s: %s", shown, strerror(soerr ? soerr : errno));
            goto out;
        }
    }
    rl = (size_t)snprintf(req, sizeof req,
                          "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tpuemu-probe\r\nConnection: close\r\n\r\n",
                          path, shown);
    while (sent < rl) {
        ssize_t w = send(fd, req + sent, rl - sent, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if ((rc = wait_fd(fd, POLLOUT, deadline)) <= 0) {
                code = err_set(e, CODE_DEADLINE_EXCEEDED, "%s did not take the request within the deadline", shown);
                goto out;
            }
        } else {
            code = err_set(e, CODE_UNAVAILABLE, "sending to %s: %s", shown, strerror(errno));
            goto out;
        }
    }
    if (!(ans = malloc(GET_MAX_ANSWER + 1))) {
        code = err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (;;) {
        ssize_t r = recv(fd, ans + got, GET_MAX_ANSWER - got, 0);
        if (r > 0) {
            got += (size_t)r;
            if (got == GET_MAX_ANSWER)
                break;
        } else if (r == 0) {
            break;
        } else if (errno == EAGAIN || errno == EINTR) {
            if ((rc = wait_fd(fd, POLLIN, deadline)) <= 0) {
                code = err_set(e, CODE_DEADLINE_EXCEEDED, "no complete answer from %s within the deadline", shown);
                goto out;
            }
        } else {
            if (got)
                break; /* a reset after the answer */
            code = err_set(e, CODE_UNAVAILABLE, "reading from %s: %s", shown, strerror(errno));
            goto out;
        }
    }
    ans[got] = '\0';
    {
        int maj, min, st, off = 0;
        char *b = strstr(ans, "\r\n\r\n");
        if (sscanf(ans, "HTTP/%d.%d %3d%n", &maj, &min, &st, &off) != 3 || off != 12 || st < 100 || st > 599) {
            code = err_set(e, CODE_UNAVAILABLE, "%s did not answer in HTTP", shown);
            goto out;
        }
        *status = st;
        if (b && n) {
            b += 4;
            size_t k = strcspn(b, "\r\n");
            if (k >= n)
                k = n - 1;
            memcpy(body, b, k);
            body[k] = '\0';
        }
    }
out:
    free(ans);
    close(fd);
    return code;
}

int httpd_probe_main(const char *prog, const char *host, int port, const char *path)
{
    const char *ip = probe_ip(host);
    const char *flag = strcmp(path, "/healthz") == 0 ? "--probe" : "--probe-ready";
    char body[256], shown[300];
    int status;
    err e;

    if (port <= 0) {
        fprintf(stderr, "%s: %s: no metrics port is configured: give --metrics-port N (or set "
                        "$TPUEMU_METRICS_PORT) as the daemon has it\n", prog, flag);
        return 2;
    }
    addr_format(ip, port, shown, sizeof shown);
    if (httpd_get(ip, port, path, 2000, &status, body, sizeof body, &e) != CODE_OK) {
        fprintf(stderr, "%s: %s: http://%s%s: %s\n", prog, flag, shown, path, e.msg);
        return 1;
    }
    if (status != 200) {
        fprintf(stderr, "%s: %s: http://%s%s: %d: %s\n", prog, flag, shown, path, status, body);
        return 1;
    }
    printf("%s\n", body);
    return 0;
}
