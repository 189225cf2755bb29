/* bench_chaos: the faults and the strangers of bench/soak.sh. A TCP proxy for
 * any number of ports that, at random moments drawn from a seed, resets a
 * connection (RST both ways), closes it (FIN both ways) or stalls it (nothing
 * forwarded either way for a while: a burst of lost packets as TCP shows
 * them); and strangers that hold idle connections on given ports, never say a
 * word, and renew them now and then. It knows no protocol: control
 * (nanomsg) and data-plane connections are bytes to it.
 *
 *   bench_chaos --duration-s T [--seed S] [--fault-every-ms M] [--max-stall-ms D]
 *               [--forward LPORT=HOST:PORT]... [--hold HOST:PORT=N]... [--renew-ms R]
 *               [--stats FILE]
 *
 * Listens on 127.0.0.1:LPORT for each --forward. One fault every M ms on
 * average (exponential gaps; 0: none) hits a random forwarded connection.
 * Stops by itself after T seconds (at most 24 h) or on SIGTERM/SIGINT, and
 * then writes one line of counts to stdout (and FILE):
 *   connections=... bytes=... resets=... closes=... stalls=... held=... renewals=... refused=...
 * Loopback addresses only: it refuses any other target. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FORWARDS 64
#define MAX_PAIRS 1024
#define MAX_HOLD_TARGETS 64
#define MAX_HOLD_PER_TARGET 512
#define BUF_BYTES (64 * 1024)

struct fwd {
    int lfd;
    struct sockaddr_in to;
};

struct dir {
    char buf[BUF_BYTES];
    size_t len, off;
};

struct pair {
    int a, b;            /* accepted side, target side; -1: free */
    int connecting;      /* b's connect() is in progress */
    uint64_t stall_until; /* ms: forward nothing before this */
    struct dir ab, ba;
};

struct hold {
    struct sockaddr_in to;
    int n;
    int fds[MAX_HOLD_PER_TARGET];
};

static struct fwd fwds[MAX_FORWARDS];
static int nfwd;
static struct pair *pairs;
static struct hold holds[MAX_HOLD_TARGETS];
static int nhold;
static uint64_t rng;
static volatile sig_atomic_t stop;
static struct {
    long connections, resets, closes, stalls, renewals, refused;
    long long bytes;
} st;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t next_rand(void) /* xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static double uniform(void) /* (0, 1] */
{
    return ((double)(next_rand() >> 11) + 1.0) / 9007199254740992.0;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

__attribute__((format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "bench_chaos: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* "HOST:PORT" with HOST a 127.x.y.z address (or "localhost"). */
static void parse_target(const char *s, struct sockaddr_in *to)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    char *end;
    long port;
    if (!colon || (size_t)(colon - s) >= sizeof host)
        die("'%s' is not HOST:PORT", s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        die("'%s' has no port in 1..65535", s);
    memset(to, 0, sizeof *to);
    to->sin_family = AF_INET;
    to->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &to->sin_addr) != 1)
        die("'%s' is not an IPv4 address", host);
    if ((ntohl(to->sin_addr.s_addr) >> 24) != 127)
        die("'%s' is not a loopback address (127.0.0.0/8): refused", host);
}

static int dial(const struct sockaddr_in *to)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)to, sizeof *to) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static void close_hard(int fd) /* RST instead of FIN */
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static void pair_end(struct pair *p, int hard)
{
    if (hard) {
        close_hard(p->a);
        close_hard(p->b);
    } else {
        close(p->a);
        close(p->b);
    }
    p->a = p->b = -1;
}

static void accept_one(const struct fwd *f)
{
    int a = accept4(f->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), one = 1;
    if (a < 0)
        return;
    for (int i = 0; i < MAX_PAIRS; i++) {
        struct pair *p = &pairs[i];
        if (p->a >= 0)
            continue;
        if ((p->b = dial(&f->to)) < 0)
            break;
        setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        p->a = a;
        p->connecting = 1;
        p->stall_until = 0;
        p->ab.len = p->ab.off = p->ba.len = p->ba.off = 0;
        st.connections++;
        return;
    }
    st.refused++;
    close(a);
}

/* Moves bytes src -> d -> dst as far as they go without blocking; -1: the
 * connection is over. */
static int pump(int src, int dst, struct dir *d, short rev, short wev)
{
    if ((rev & (POLLIN | POLLHUP | POLLERR)) && d->len == 0) {
        ssize_t n = read(src, d->buf, sizeof d->buf);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return -1;
        if (n > 0) {
            d->len = (size_t)n;
            d->off = 0;
            st.bytes += n;
            wev |= POLLOUT; /* try at once */
        }
    }
    if ((wev & (POLLOUT | POLLERR)) && d->len > d->off) {
        ssize_t n = write(dst, d->buf + d->off, d->len - d->off);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (n > 0 && (d->off += (size_t)n) == d->len)
            d->len = d->off = 0;
    }
    return 0;
}

static void fault(uint64_t now, uint64_t max_stall_ms)
{
    int live[MAX_PAIRS], n = 0;
    for (int i = 0; i < MAX_PAIRS; i++)
        if (pairs[i].a >= 0 && !pairs[i].connecting)
            live[n++] = i;
    if (n == 0)
        return;
    struct pair *p = &pairs[live[next_rand() % (uint64_t)n]];
    uint64_t kind = next_rand() % 10;
    if (kind < 4) {
        pair_end(p, 1);
        st.resets++;
    } else if (kind < 6) {
        pair_end(p, 0);
        st.closes++;
    } else {
        p->stall_until = now + max_stall_ms / 10 + next_rand() % (max_stall_ms - max_stall_ms / 10 + 1);
        st.stalls++;
    }
}

static void renew_holds(void)
{
    for (int t = 0; t < nhold; t++)
        for (int i = 0; i < holds[t].n; i++) {
            if (holds[t].fds[i] >= 0)
                close(holds[t].fds[i]);
            holds[t].fds[i] = dial(&holds[t].to);
        }
    st.renewals++;
}

static long held_now(void) /* connections of the strangers that are open */
{
    long n = 0;
    for (int t = 0; t < nhold; t++)
        for (int i = 0; i < holds[t].n; i++) {
            int fd = holds[t].fds[i], soerr = 0;
            socklen_t sl = sizeof soerr;
            struct sockaddr_in peer;
            socklen_t pl = sizeof peer;
            if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0 &&
                getpeername(fd, (struct sockaddr *)&peer, &pl) == 0)
                n++;
        }
    return n;
}

int main(int argc, char **argv)
{
    long duration_s = 0, fault_every_ms = 0, max_stall_ms = 2000, renew_ms = 3000;
    const char *stats = NULL;
    uint64_t seed = 1;
    struct rlimit rl;

    if (!(pairs = calloc(MAX_PAIRS, sizeof *pairs)))
        die("%s", "out of memory");
    for (int i = 0; i < MAX_PAIRS; i++)
        pairs[i].a = pairs[i].b = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!v)
            die("%s needs a value", f);
        i++;
        if (strcmp(f, "--duration-s") == 0) {
            duration_s = strtol(v, &end, 10);
            if (*end || duration_s < 1 || duration_s > 86400)
                die("--duration-s: '%s' is not 1..86400", v);
        } else if (strcmp(f, "--seed") == 0) {
            seed = strtoull(v, &end, 10);
            if (*end)
                die("--seed: '%s' is not a number", v);
        } else if (strcmp(f, "--fault-every-ms") == 0) {
            fault_every_ms = strtol(v, &end, 10);
            if (*end || fault_every_ms < 0)
                die("--fault-every-ms: '%s' is not a number of ms", v);
        } else if (strcmp(f, "--max-stall-ms") == 0) {
            max_stall_ms = strtol(v, &end, 10);
            if (*end || max_stall_ms < 1 || max_stall_ms > 600000)
                die("--max-stall-ms: '%s' is not 1..600000", v);
        } else if (strcmp(f, "--renew-ms") == 0) {
            renew_ms = strtol(v, &end, 10);
            if (*end || renew_ms < 100)
                die("--renew-ms: '%s' is not at least 100", v);
        } else if (strcmp(f, "--stats") == 0) {
            stats = v;
        } else if (strcmp(f, "--forward") == 0) {
            const char *eq = strchr(v, '=');
            long lport;
            struct sockaddr_in la;
            int one = 1;
            if (!eq || nfwd == MAX_FORWARDS)
                die("--forward: '%s' is not LPORT=HOST:PORT (or too many)", v);
            lport = strtol(v, &end, 10);
            if (end != eq || lport <= 0 || lport > 65535)
                die("--forward: '%s' has no listening port", v);
            parse_target(eq + 1, &fwds[nfwd].to);
            memset(&la, 0, sizeof la);
            la.sin_family = AF_INET;
            la.sin_port = htons((uint16_t)lport);
            la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            fwds[nfwd].lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            setsockopt(fwds[nfwd].lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (fwds[nfwd].lfd < 0 || bind(fwds[nfwd].lfd, (struct sockaddr *)&la, sizeof la) < 0 ||
                listen(fwds[nfwd].lfd, 128) < 0) {
                fprintf(stderr, "bench_chaos: cannot listen on 127.0.0.1:%ld: %s\n", lport, strerror(errno));
                return 1;
            }
            nfwd++;
        } else if (strcmp(f, "--hold") == 0) {
            char target[128];
            const char *eq = strchr(v, '=');
            long n;
            if (!eq || (size_t)(eq - v) >= sizeof target || nhold == MAX_HOLD_TARGETS)
                die("--hold: '%s' is not HOST:PORT=N (or too many)", v);
            memcpy(target, v, (size_t)(eq - v));
            target[eq - v] = '\0';
            parse_target(target, &holds[nhold].to);
            n = strtol(eq + 1, &end, 10);
            if (*end || n < 1 || n > MAX_HOLD_PER_TARGET)
                die("--hold: '%s' needs N in 1..512", v);
            holds[nhold].n = (int)n;
            for (int k = 0; k < n; k++)
                holds[nhold].fds[k] = -1;
            nhold++;
        } else {
            die("unknown flag '%s' (see the comment at the top of bench/chaos.c)", f);
        }
    }
    if (!duration_s)
        die("%s", "--duration-s is required (it always stops by itself)");
    /* every stranger's socket, two per forwarded connection, a few more */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    rng = seed * 0x9E3779B97F4A7C15ull + 1;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    uint64_t t0 = now_ms(), end_at = t0 + (uint64_t)duration_s * 1000u;
    uint64_t next_fault = fault_every_ms ? t0 + (uint64_t)(-log(uniform()) * (double)fault_every_ms) : UINT64_MAX;
    uint64_t next_renew = nhold ? t0 : UINT64_MAX;
    static struct pollfd pf[MAX_FORWARDS + 2 * MAX_PAIRS];
    static int who[MAX_FORWARDS + 2 * MAX_PAIRS]; /* forward i: -1-i; pair i side a: 2i, side b: 2i+1 */

    while (!stop) {
        uint64_t now = now_ms(), wake = end_at;
        int n = 0, timeout;
        if (now >= end_at)
            break;
        if (now >= next_fault) {
            fault(now, (uint64_t)max_stall_ms);
            next_fault = now + 1 + (uint64_t)(-log(uniform()) * (double)fault_every_ms);
        }
        if (now >= next_renew) {
            renew_holds();
            next_renew = now + (uint64_t)renew_ms;
        }
        for (int i = 0; i < nfwd; i++) {
            pf[n] = (struct pollfd){fwds[i].lfd, POLLIN, 0};
            who[n++] = -1 - i;
        }
        for (int i = 0; i < MAX_PAIRS; i++) {
            struct pair *p = &pairs[i];
            short ea = 0, eb = 0;
            if (p->a < 0)
                continue;
            if (p->connecting) {
                eb = POLLOUT;
            } else if (p->stall_until > now) {
                if (p->stall_until < wake)
                    wake = p->stall_until;
            } else {
                ea = (short)((p->ab.len == 0 ? POLLIN : 0) | (p->ba.len > p->ba.off ? POLLOUT : 0));
                eb = (short)((p->ba.len == 0 ? POLLIN : 0) | (p->ab.len > p->ab.off ? POLLOUT : 0));
            }
            pf[n] = (struct pollfd){p->a, ea, 0};
            who[n++] = 2 * i;
            pf[n] = (struct pollfd){p->b, eb, 0};
            who[n++] = 2 * i + 1;
        }
        if (next_fault < wake)
            wake = next_fault;
        if (next_renew < wake)
            wake = next_renew;
        timeout = wake > now ? (int)(wake - now < 1000 ? wake - now : 1000) : 0;
        if (poll(pf, (nfds_t)n, timeout) < 0 && errno != EINTR)
            break;
        now = now_ms();
        for (int k = 0; k < n; k++) {
            if (who[k] < 0) {
                if (pf[k].revents & POLLIN)
                    accept_one(&fwds[-1 - who[k]]);
                continue;
            }
            if (who[k] & 1)
                continue; /* each pair once, at its side a */
            struct pair *p = &pairs[who[k] / 2];
            short ra = pf[k].revents, rb = pf[k + 1].revents;
            if (p->a < 0)
                continue;
            if (p->connecting) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (!(rb & (POLLOUT | POLLERR | POLLHUP)))
                    continue;
                if (getsockopt(p->b, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
                    pair_end(p, 1); /* the target refused: the client sees a reset */
                    continue;
                }
                p->connecting = 0;
                continue;
            }
            if (p->stall_until > now)
                continue;
            if (pump(p->a, p->b, &p->ab, ra, rb) < 0 || pump(p->b, p->a, &p->ba, rb, ra) < 0)
                pair_end(p, 0);
        }
    }

    long held = held_now();
    char line[512];
    snprintf(line, sizeof line,
             "connections=%ld bytes=%lld resets=%ld closes=%ld stalls=%ld held=%ld renewals=%ld refused=%ld\n",
             st.connections, st.bytes, st.resets, st.closes, st.stalls, held, st.renewals, st.refused);
    fputs(line, stdout);
    if (stats) {
        FILE *fp = fopen(stats, "w");
        if (fp) {
            fputs(line, fp);
            fclose(fp);
        }
    }
    for (int i = 0; i < MAX_PAIRS; i++)
        if (pairs[i].a >= 0)
            pair_end(&pairs[i], 0);
    for (int t = 0; t < nhold; t++)
        for (int i = 0; i < holds[t].n; i++)
            if (holds[t].fds[i] >= 0)
                close(holds[t].fds[i]);
    for (int i = 0; i < nfwd; i++)
        close(fwds[i].lfd);
    free(pairs);
    return 0;
}
