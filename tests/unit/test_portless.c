/* A machine with no free local port, and a peer that resets connections,
 * while links are being made again: what 1,024 emulated cores on one
 * machine bring about when a collective stalls and every core probes its
 * silent peers.
 *
 * First the fault is reproduced in nanomsg 1.1.5 itself: its connecting
 * socket binds a local port before each connect, and when that bind fails
 * its retry trips an assertion (usock_posix.inc:195) and aborts the process.
 * Then the project's own SP clients meet the same machine: the worker's
 * liveness probe (spreq) and the client library's calls (spcall) must report
 * the failure and go on, and work again once ports are free.
 *
 * Runs in a user and network namespace of its own, with a small ephemeral
 * port range it can fill without touching the machine's. Not Criterion:
 * entering a user namespace needs a single-threaded process. */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <uv.h>

#include "auth.h"
#include "probe.h"
#include "spcall.h"
#include "wire.h"

#define PEER_PORT 5999         /* outside the ephemeral range below */
#define RANGE "40000 40063"

static int failures;

#define CHECK(cond, ...)                                                                                 \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
            fprintf(stderr, __VA_ARGS__);                                                                \
            fputc('\n', stderr);                                                                         \
            failures++;                                                                                  \
        }                                                                                                \
    } while (0)

static int write_file(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY), ok;
    if (fd < 0)
        return -1;
    ok = write(fd, s, strlen(s)) == (ssize_t)strlen(s);
    close(fd);
    return ok ? 0 : -1;
}

/* A user and network namespace with loopback up and a 64-port ephemeral range. */
static int enter_netns(void)
{
    char map[64];
    uid_t uid = getuid();
    gid_t gid = getgid();
    struct ifreq ifr;
    int s;

    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) < 0) {
        fprintf(stderr, "cannot make a user and network namespace (unshare: %s); this test needs "
                        "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)\n",
                strerror(errno));
        return -1;
    }
    write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
    if (write_file("/proc/self/uid_map", map) < 0)
        return fprintf(stderr, "cannot write uid_map: %s\n", strerror(errno)), -1;
    snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
    if (write_file("/proc/self/gid_map", map) < 0)
        return fprintf(stderr, "cannot write gid_map: %s\n", strerror(errno)), -1;
    s = socket(AF_INET, SOCK_DGRAM, 0);
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0 || (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr) < 0))
        return fprintf(stderr, "cannot bring loopback up: %s\n", strerror(errno)), -1;
    close(s);
    if (write_file("/proc/sys/net/ipv4/ip_local_port_range", RANGE) < 0)
        return fprintf(stderr, "cannot set the ephemeral port range: %s\n", strerror(errno)), -1;
    return 0;
}

/* Binds sockets to port 0 until none is left; returns how many. */
static int held[256], nheld;

static int hold_ports(void)
{
    while (nheld < (int)(sizeof held / sizeof held[0])) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            if (fd >= 0)
                close(fd);
            break;
        }
        held[nheld++] = fd;
    }
    return nheld;
}

static void release_ports(void)
{
    while (nheld)
        close(held[--nheld]);
}

/* A peer at PEER_PORT that accepts each connection and resets it at once. */
static int reset_fd = -1;

static void *reset_peer(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(reset_fd, NULL, NULL);
        struct linger lg = {1, 0};
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(c);
    }
}

static int start_reset_peer(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PEER_PORT)};
    pthread_t t;
    int one = 1;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    reset_fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(reset_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(reset_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(reset_fd, 64) < 0)
        return -1;
    return pthread_create(&t, NULL, reset_peer, NULL) == 0 ? 0 : -1;
}

/* nanomsg's own REQ socket on this machine, in a child: its exit status. */
static int nanomsg_child(void)
{
    pid_t pid = fork();
    int st = 0;
    if (pid == 0) {
        int s = nn_socket(AF_SP, NN_REQ), ivl = 10;
        char url[64];
        snprintf(url, sizeof url, "tcp://127.0.0.1:%d", PEER_PORT);
        nn_setsockopt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL, &ivl, sizeof ivl);
        nn_connect(s, url);
        nn_send(s, "x", 1, NN_DONTWAIT);
        usleep(1000 * 1000); /* a hundred reconnects at 10 ms */
        _exit(0);
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

struct probe_result {
    int calls, alive;
    uint64_t at;
};

static void on_probe(void *arg, int alive)
{
    struct probe_result *r = arg;
    r->calls++;
    r->alive = alive;
    r->at = uv_now(uv_default_loop());
}

/* One probe of a core at PEER_PORT with a 1 s deadline: its verdict comes
 * once, by the deadline, and says not alive. */
static void probe_once(const char *when)
{
    uv_loop_t *loop = uv_default_loop();
    struct probe_result r = {0};
    char url[64];
    auth a;
    err e;
    uint64_t t0;
    struct probe *pr;

    memset(&a, 0, sizeof a);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", PEER_PORT);
    uv_update_time(loop);
    t0 = uv_now(loop);
    pr = probe_start(loop, &a, "test", url, "h0", 1, 7, 1000, on_probe, &r, &e);
    CHECK(pr != NULL, "%s: the probe did not start: %s", when, e.msg);
    if (!pr)
        return;
    uv_run(loop, UV_RUN_DEFAULT); /* returns once every handle of the probe is closed */
    CHECK(r.calls == 1, "%s: the probe's verdict came %d times", when, r.calls);
    CHECK(r.alive == 0, "%s: a core that cannot be reached was found alive", when);
    CHECK(r.at >= t0 + 1000, "%s: the verdict came before the deadline (%llu ms)", when,
          (unsigned long long)(r.at - t0));
}

int main(void)
{
    spcall sc;
    err e;
    int st, en = 0, n, rc;
    uint8_t *reply = NULL;
    size_t rlen = 0;

    signal(SIGPIPE, SIG_IGN);
    if (enter_netns() < 0)
        return 1;
    if (start_reset_peer() < 0) {
        fprintf(stderr, "cannot listen on 127.0.0.1:%d: %s\n", PEER_PORT, strerror(errno));
        return 1;
    }

    /* 1. no local port left: nanomsg itself aborts */
    n = hold_ports();
    CHECK(n == 64, "held %d of the 64 ephemeral ports", n);
    st = nanomsg_child();
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)
        printf("reproduced: nanomsg's REQ socket aborted the process (SIGABRT) reconnecting with no "
               "free local port\n");
    else
        printf("the installed nanomsg survived reconnecting with no free local port (status %d)\n", st);

    /* 2. the same machine: the worker's probe reports, and the process goes on */
    probe_once("no free port");

    /* 3. the client library's connection: an error naming the address */
    spcall_init(&sc, 1 << 20);
    rc = spcall_connect(&sc, "127.0.0.1", PEER_PORT, 1000, &en, &e);
    CHECK(rc == CODE_UNAVAILABLE, "connect with no free port: code %d (%s)", rc, e.msg);
    CHECK(en == EADDRNOTAVAIL, "connect with no free port: errno %d, not EADDRNOTAVAIL", en);
    CHECK(strstr(e.msg, "127.0.0.1:5999") != NULL, "the error does not name the address: %s", e.msg);
    release_ports();

    /* 4. ports free, a peer resetting every connection: retried until the
     * deadline, then an error; no abort */
    probe_once("peer resets");
    rc = spcall_connect(&sc, "127.0.0.1", PEER_PORT, 1000, &en, &e);
    CHECK(rc == CODE_UNAVAILABLE && en == ECONNRESET, "connect to a resetting peer: code %d errno %d (%s)",
          rc, en, e.msg);
    rc = spcall_request(&sc, "x", 1, wire_now_ms() + 1000, &reply, &rlen, &e);
    CHECK(rc != CODE_OK && reply == NULL, "a request with no connection succeeded");
    spcall_close(&sc);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
