/* The integration-test fixture (see cluster.h): processes, deadlines, logs.
 * Must not leave a process behind, whatever the test does. */
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

const char *const CL_RESOLVER = TPUEMU_RESOLVER_BIN;
const char *const CL_WORKER = TPUEMU_WORKER_BIN;
const char *const CL_TPUCTL = TPUEMU_TPUCTL_BIN;

/* Test-process state: one Criterion test per process, so this is per test. */
#define MAX_LIVE 8
#define MAX_LOOSE 64
static cluster *live[MAX_LIVE];
static cl_proc *loose[MAX_LOOSE]; /* started with cl_spawn outside a cluster */
static char tmpdir[256];
static int hooked;

int64_t cl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static void print_tail(const char *path, int lines)
{
    char *s = cl_read_file(path);
    size_t n = strlen(s);
    const char *p = s + n;
    int seen = 0;
    while (p > s && seen <= lines)
        if (*--p == '\n')
            seen++;
    if (*p == '\n')
        p++;
    fprintf(stderr, "---- tail of %s ----\n%s%s", path, p, (n && s[n - 1] != '\n') ? "\n" : "");
    free(s);
}

static void stop_procs(cl_proc **ps, int n)
{
    int64_t end;
    for (int i = 0; i < n; i++)
        if (ps[i]->pid > 0) {
            kill(ps[i]->pid, SIGTERM);
            kill(ps[i]->pid, SIGCONT);
        }
    end = cl_now_ms() + 2000;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++)
            if (ps[i]->pid > 0 && waitpid(ps[i]->pid, &ps[i]->status, WNOHANG) == ps[i]->pid)
                ps[i]->pid = 0;
            else if (ps[i]->pid > 0)
                left++;
        if (!left || cl_now_ms() >= end)
            break;
        nap_ms(10);
    }
    for (int i = 0; i < n; i++)
        if (ps[i]->pid > 0) {
            kill(ps[i]->pid, SIGKILL);
            waitpid(ps[i]->pid, &ps[i]->status, 0);
            ps[i]->pid = 0;
        }
}

static void cluster_stop_all(cluster *c)
{
    cl_proc *ps[CL_MAX_WORKERS + 1];
    int n = 0;
    if (c->cc)
        tpu_cluster_free(c->cc);
    if (c->cr)
        tpu_resolver_free(c->cr);
    c->cc = NULL;
    c->cr = NULL;
    for (int i = 0; i < c->nworkers; i++)
        ps[n++] = &c->workers[i];
    ps[n++] = &c->resolver;
    stop_procs(ps, n);
}

static void dump_logs(cluster *c)
{
    if (c->resolver.log[0])
        print_tail(c->resolver.log, 40);
    for (int i = 0, shown = 0; i < c->nworkers && shown < 12; i++)
        if (c->workers[i].log[0]) {
            print_tail(c->workers[i].log, 8);
            shown++;
        }
}

/* A test that failed an assertion never reached cluster_free(): show the logs,
 * stop everything, keep the temp dir for a look. */
static void at_exit(void)
{
    int failed = 0;
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i]) {
            failed = 1;
            cluster *c = live[i];
            live[i] = NULL;
            fprintf(stderr, "cluster %s was not torn down by the test (it failed?); logs in %s\n",
                    c->addr, c->dir);
            cluster_stop_all(c);
            dump_logs(c);
        }
    for (int i = 0; i < MAX_LOOSE; i++)
        if (loose[i] && loose[i]->pid > 0) {
            cl_proc *p = loose[i];
            stop_procs(&p, 1);
            if (p->log[0])
                print_tail(p->log, 20);
        }
    if (!failed && tmpdir[0])
        nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void hook(void)
{
    if (!hooked) {
        hooked = 1;
        atexit(at_exit);
        signal(SIGPIPE, SIG_IGN);
    }
}

const char *cl_tmpdir(void)
{
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/tpuemu-test-XXXXXX", base && *base ? base : "/tmp");
        cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    }
    hook();
    return tmpdir;
}

char *cl_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *s;
    long n;
    if (!f || fseek(f, 0, SEEK_END) < 0 || (n = ftell(f)) < 0) {
        if (f)
            fclose(f);
        return calloc(1, 1);
    }
    rewind(f);
    s = malloc((size_t)n + 1);
    n = (long)fread(s, 1, (size_t)n, f);
    s[n] = '\0';
    fclose(f);
    return s;
}

int cl_log_contains(const cl_proc *p, const char *needle)
{
    char *s = cl_read_file(p->log);
    int found = strstr(s, needle) != NULL;
    free(s);
    return found;
}

/* Waits for an event end as soon as it happens, so a long deadline costs a
 * passing test nothing; under valgrind every daemon runs several times
 * slower (and starts in seconds on a loaded machine), so the waits of this
 * fixture stretch by this factor there. Not for bounds a test asserts as the
 * product's own timing: those say so and use the clock themselves. */
int cl_time_scale(void)
{
    static int scale;
    if (!scale) {
        const char *s = getenv("TPUEMU_TEST_TIME_SCALE");
        scale = s && atoi(s) > 0 ? atoi(s) : getenv("TPUEMU_TEST_VALGRIND") ? 6 : 1;
    }
    return scale;
}

int cl_wait_log(const cl_proc *p, const char *s, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    for (;;) {
        if (cl_log_contains(p, s))
            return 1;
        if (cl_now_ms() >= end)
            return 0;
        nap_ms(20);
    }
}

/* The kernel's ephemeral range: where it takes ports for outgoing
 * connections and bind(0). */
static void ephemeral_range(int *lo, int *hi)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    *lo = 32768;
    *hi = 60999;
    if (f) {
        if (fscanf(f, "%d %d", lo, hi) != 2) {
            *lo = 32768;
            *hi = 60999;
        }
        fclose(f);
    }
}

static int bindable(int port)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    cr_assert_geq(fd, 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* A port the kernel gives out, free when asked: the fallback. */
static int kernel_port(void)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;
    cr_assert_geq(fd, 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* A port below the ephemeral range, so that no outgoing connection (of this
 * test's daemons or of a test beside it) takes it between now and the
 * daemon's bind; and claimed with a lock on a file named after it, held until
 * this test process ends, so that no other test picks it too. */
int cl_free_port(void)
{
    static unsigned seed;
    int lo, hi;
    ephemeral_range(&lo, &hi);
    (void)hi;
    int first = lo - 12000 < 10000 ? 10000 : lo - 12000, span = lo - first;
    if (span < 1000)
        return kernel_port();
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tpuemu-test-ports-%u", (unsigned)getuid());
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return kernel_port();
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)cl_now_ms();
    for (int attempt = 0; attempt < 1000; attempt++) {
        int port = first + (int)(rand_r(&seed) % (unsigned)span);
        char path[96];
        snprintf(path, sizeof path, "%s/%d", dir, port);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
            return kernel_port();
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 || !bindable(port)) {
            close(fd);
            continue;
        }
        return port; /* fd stays open: the claim lasts as long as this process */
    }
    return kernel_port();
}

static int tcp_accepts(int port)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* Variables that would make a child depend on the developer's shell. */
static const char *const scrub[] = {
    "TPU_NAME", "TPUEMU_TOKEN", "TPUEMU_TOKEN_FILE", "TPUEMU_LISTEN", "TPUEMU_HEARTBEAT_MS",
    "TPUEMU_DEAD_AFTER", "TPUEMU_MAX_CORES", "TPUEMU_LOG_LEVEL", "TPUEMU_INSECURE",
    "TPUEMU_RESOLVER", "TPUEMU_WORKER_LISTEN", "TPUEMU_ADVERTISE", "TPUEMU_HOST_ID",
    "TPUEMU_CORE", "TPUEMU_TPU_TYPE", "TPUEMU_HBM_BYTES", "TPUEMU_METRICS_PORT",
    "TPUEMU_ACCELERATOR_TYPE", "TPUEMU_TPU_NAME", "TPUEMU_TPU_API", NULL};

/* Open-file limit (soft and hard) of the next child cl_spawn starts; 0: inherit. */
static long next_nofile;

static void child_setup(pid_t parent, const char *const *env)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (next_nofile > 0) {
        struct rlimit rl = {(rlim_t)next_nofile, (rlim_t)next_nofile};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(125);
    }
    if (getppid() != parent)
        _exit(127);
    signal(SIGPIPE, SIG_DFL);
    for (int i = 0; scrub[i]; i++)
        unsetenv(scrub[i]);
    for (int i = 0; env && env[i]; i++)
        putenv((char *)env[i]);
}

/* With $TPUEMU_TEST_VALGRIND set, the daemons run under valgrind's memcheck;
 * every error it finds (definite leaks included) is marked in the daemon's
 * log, and cluster_free() fails the test on it like on a sanitizer report.
 * Only definite leaks are shown: a "possibly lost" block (a library thread's
 * stack still running at exit, as nanomsg's are) would otherwise be printed
 * between the error markers without being an error. */
static const char *const valgrind_argv[] = {
    "valgrind", "-q", "--leak-check=full", "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite",
    "--error-markers=VALGRIND-ERROR-BEGIN,VALGRIND-ERROR-END", NULL};

static char **make_argv(const char *bin, const char *const *tail)
{
    size_t n = 0, v = 0, k = 0;
    int wrap = getenv("TPUEMU_TEST_VALGRIND") &&
               (strcmp(bin, CL_RESOLVER) == 0 || strcmp(bin, CL_WORKER) == 0);
    while (tail && tail[n])
        n++;
    while (wrap && valgrind_argv[v])
        v++;
    char **argv = calloc(v + n + 2, sizeof *argv);
    for (size_t i = 0; i < v; i++)
        argv[k++] = (char *)valgrind_argv[i];
    argv[k++] = (char *)bin;
    for (size_t i = 0; i < n; i++)
        argv[k++] = (char *)tail[i];
    return argv;
}

pid_t cl_spawn_nofile(cl_proc *p, const char *bin, const char *const *tail, const char *const *env, long nofile)
{
    next_nofile = nofile;
    return cl_spawn(p, bin, tail, env);
}

pid_t cl_spawn(cl_proc *p, const char *bin, const char *const *tail, const char *const *env)
{
    pid_t parent = getpid(), pid;
    char **argv = make_argv(bin, tail);
    int loose_slot = 1;

    hook();
    if (!p->log[0]) {
        static int seq;
        snprintf(p->log, sizeof p->log, "%s/proc%d.log", cl_tmpdir(), seq++);
    }
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] && p >= &live[i]->resolver && p < live[i]->workers + CL_MAX_WORKERS)
            loose_slot = 0;
    fflush(NULL);
    pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int nul = open("/dev/null", O_RDONLY);
        child_setup(parent, env);
        if (fd < 0 || nul < 0)
            _exit(126);
        dup2(nul, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        closefrom(3);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free(argv);
    next_nofile = 0;
    p->pid = pid;
    if (loose_slot)
        for (int i = 0; i < MAX_LOOSE; i++)
            if (loose[i] == p || !loose[i]) {
                loose[i] = p;
                break;
            }
    return pid;
}

int cluster_alive(cl_proc *p)
{
    if (p->pid <= 0)
        return 0;
    if (waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
        p->pid = 0;
        return 0;
    }
    return 1;
}

int cluster_wait_exit(cl_proc *p, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    for (;;) {
        if (!cluster_alive(p))
            return 1;
        if (cl_now_ms() >= end)
            return 0;
        nap_ms(10);
    }
}

/* ---- the cluster ---- */

static void start_resolver(cluster *c, int new_port)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        const char *args[48];
        char listen[64], hb[16], da[16];
        int n = 0;
        if (new_port)
            c->port = cl_free_port(); /* someone may take it first: then try another */
        snprintf(c->addr, sizeof c->addr, "127.0.0.1:%d", c->port);
        snprintf(listen, sizeof listen, "127.0.0.1:%d", c->port);
        snprintf(hb, sizeof hb, "%d", c->o.heartbeat_ms);
        snprintf(da, sizeof da, "%d", c->o.dead_after);
        args[n++] = "--listen";
        args[n++] = listen;
        args[n++] = "--heartbeat-ms";
        args[n++] = hb;
        args[n++] = "--dead-after";
        args[n++] = da;
        if (c->token_file[0]) {
            args[n++] = "--token-file";
            args[n++] = c->token_file;
        }
        for (int i = 0; c->o.resolver_args && c->o.resolver_args[i] && n < 46; i++)
            args[n++] = c->o.resolver_args[i];
        args[n] = NULL;
        cl_spawn_nofile(&c->resolver, CL_RESOLVER, args, NULL, c->o.resolver_nofile);
        int64_t end = cl_now_ms() + 15000 * cl_time_scale();
        while (cl_now_ms() < end) {
            if (tcp_accepts(c->port))
                return;
            if (!cluster_alive(&c->resolver))
                break;
            nap_ms(10);
        }
        if (cluster_alive(&c->resolver)) {
            dump_logs(c);
            cr_assert_fail("tpu-resolver did not listen on %s within %d s", c->addr, 15 * cl_time_scale());
        }
        if (!new_port)
            nap_ms(100); /* same port again: give the kernel a moment */
    }
    dump_logs(c);
    cr_assert_fail("tpu-resolver did not start (exit status %d); see %s", c->resolver.status,
                   c->resolver.log);
}

static void spawn_worker(cluster *c, cl_proc *w)
{
    const char *args[48];
    char core[16];
    int n = 0;
    snprintf(core, sizeof core, "%d", w->core);
    args[n++] = "--resolver";
    args[n++] = c->addr;
    args[n++] = "--host-id";
    args[n++] = w->host;
    args[n++] = "--core";
    args[n++] = core;
    if (c->o.tpu_type) {
        args[n++] = "--tpu-type";
        args[n++] = c->o.tpu_type;
    }
    if (c->token_file[0]) {
        args[n++] = "--token-file";
        args[n++] = c->token_file;
    }
    for (int i = 0; c->o.worker_args && c->o.worker_args[i] && n < 40; i++)
        args[n++] = c->o.worker_args[i];
    for (int i = 0; w->extra && w->extra[i] && n < 46; i++)
        args[n++] = w->extra[i];
    args[n] = NULL;
    cl_spawn(w, CL_WORKER, args, NULL);
}

int cluster_add_worker(cluster *c, const char *host, int core, const char *const *extra)
{
    cr_assert_lt(c->nworkers, CL_MAX_WORKERS);
    int i = c->nworkers++;
    cl_proc *w = &c->workers[i];
    memset(w, 0, sizeof *w);
    snprintf(w->host, sizeof w->host, "%s", host);
    w->core = core;
    char dir[sizeof c->dir];
    memcpy(dir, c->dir, sizeof dir);
    char hostc[sizeof w->host];
    memcpy(hostc, w->host, sizeof hostc);
    snprintf(w->log, sizeof w->log, "%s/worker-%s-%d-%d.log", dir, hostc, core, i);
    if (extra) {
        size_t n = 0;
        while (extra[n])
            n++;
        w->extra = calloc(n + 1, sizeof *w->extra);
        for (size_t k = 0; k < n; k++)
            w->extra[k] = strdup(extra[k]);
    }
    spawn_worker(c, w);
    return i;
}

cluster *cluster_start(const cluster_opts *o)
{
    cluster *c = calloc(1, sizeof *c);
    const char *ext = getenv("TPUEMU_TEST_CLUSTER");
    int slot = -1;

    hook();
    c->o = *o;
    if (!c->o.heartbeat_ms) /* under valgrind a live core can miss 3 x 100 ms on a loaded machine */
        c->o.heartbeat_ms = getenv("TPUEMU_TEST_VALGRIND") ? 500 : 100;
    if (!c->o.dead_after)
        c->o.dead_after = 3;
    for (int i = 0; i < MAX_LIVE; i++)
        if (!live[i]) {
            slot = i;
            break;
        }
    cr_assert_geq(slot, 0, "too many clusters in one test");
    live[slot] = c;
    if (o->shared_ok && ext && *ext) {
        c->external = 1;
        snprintf(c->addr, sizeof c->addr, "%s", ext);
        const char *tf = getenv("TPUEMU_TOKEN_FILE");
        if (tf)
            snprintf(c->token_file, sizeof c->token_file, "%s", tf);
        return c;
    }
    snprintf(c->dir, sizeof c->dir, "%s/cluster%d", cl_tmpdir(), slot);
    cr_assert_eq(mkdir(c->dir, 0700), 0, "mkdir %s: %s", c->dir, strerror(errno));
    if (o->token) {
        snprintf(c->token_file, sizeof c->token_file, "%s/token", c->dir);
        FILE *f = fopen(c->token_file, "w");
        cr_assert_not_null(f);
        fprintf(f, "%s\n", CL_TOKEN);
        fclose(f);
        chmod(c->token_file, 0600); /* as the docs ask: readable by its owner only */
    }
    snprintf(c->resolver.log, sizeof c->resolver.log, "%s/resolver.log", c->dir);
    start_resolver(c, 1);
    for (int h = 0; h < o->hosts; h++)
        for (int k = 0; k < o->cores_per_host; k++) {
            char host[16];
            snprintf(host, sizeof host, "h%d", h);
            cluster_add_worker(c, host, o->auto_core ? -1 : k, NULL);
        }
    if (!o->no_wait && c->nworkers > 0) {
        int budget = (10000 + 200 * c->nworkers) * cl_time_scale();
        if (!cluster_wait_count(c, CL_ALIVE, c->nworkers, budget)) {
            dump_logs(c);
            cr_assert_fail("only %d of %d workers registered within %d ms", cluster_count(c, CL_ALIVE),
                           c->nworkers, budget);
        }
    }
    return c;
}

static int scan_sanitizer(cluster *c, char *which, size_t n)
{
    cl_proc *ps[CL_MAX_WORKERS + 1];
    int k = 0;
    ps[k++] = &c->resolver;
    for (int i = 0; i < c->nworkers; i++)
        ps[k++] = &c->workers[i];
    for (int i = 0; i < k; i++) {
        if (!ps[i]->log[0])
            continue;
        if (cl_log_contains(ps[i], "ERROR: AddressSanitizer") ||
            cl_log_contains(ps[i], "ERROR: LeakSanitizer") || cl_log_contains(ps[i], "runtime error:") ||
            cl_log_contains(ps[i], "VALGRIND-ERROR-BEGIN")) {
            snprintf(which, n, "%s", ps[i]->log);
            return 1;
        }
    }
    return 0;
}

void cluster_free(cluster *c)
{
    char bad[512];
    if (!c)
        return;
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == c)
            live[i] = NULL;
    cluster_stop_all(c);
    if (!c->external && scan_sanitizer(c, bad, sizeof bad)) {
        print_tail(bad, 60);
        cr_assert_fail("a daemon reported a sanitizer error (see %s)", bad);
    }
    for (int i = 0; i < c->nworkers; i++) {
        for (int k = 0; c->workers[i].extra && c->workers[i].extra[k]; k++)
            free(c->workers[i].extra[k]);
        free(c->workers[i].extra);
    }
    if (!c->external && c->dir[0])
        nftw(c->dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(c);
}

void cluster_signal_worker(cluster *c, int i, int sig)
{
    cr_assert_gt(c->workers[i].pid, 0, "worker %d is not running", i);
    kill(c->workers[i].pid, sig);
}

void cluster_kill_worker(cluster *c, int i)
{
    cl_proc *w = &c->workers[i];
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &w->status, 0);
        w->pid = 0;
    }
}

void cluster_restart_worker(cluster *c, int i)
{
    cluster_kill_worker(c, i);
    spawn_worker(c, &c->workers[i]);
}

void cluster_restart_resolver(cluster *c)
{
    cl_proc *p = &c->resolver;
    if (c->cc)
        tpu_cluster_free(c->cc);
    if (c->cr)
        tpu_resolver_free(c->cr);
    c->cc = NULL;
    c->cr = NULL;
    stop_procs(&p, 1);
    start_resolver(c, 0);
}

/* ---- observing through libtpuclient ---- */

tpu_status cluster_connect(cluster *c, tpu_resolver **r, tpu_cluster **out)
{
    tpu_status st;
    *r = NULL;
    *out = NULL;
    if ((st = tpu_resolver_new(c->addr, r)) != TPU_OK)
        return st;
    if (c->token_file[0] && (st = tpu_resolver_set_token_file(*r, c->token_file)) != TPU_OK)
        goto fail;
    if ((st = tpu_resolver_set_timeout_ms(*r, 2000)) != TPU_OK)
        goto fail;
    if ((st = tpu_connect_to_cluster(*r, out)) != TPU_OK)
        goto fail;
    return TPU_OK;
fail:
    tpu_resolver_free(*r);
    *r = NULL;
    return st;
}

tpu_cluster_spec *cluster_spec(cluster *c)
{
    tpu_cluster_spec *s = NULL;
    if (!c->cc && cluster_connect(c, &c->cr, &c->cc) != TPU_OK)
        return NULL;
    if (tpu_cluster_spec_get(c->cc, &s) != TPU_OK) {
        tpu_cluster_free(c->cc);
        tpu_resolver_free(c->cr);
        c->cc = NULL;
        c->cr = NULL;
        return NULL;
    }
    return s;
}

static int state_matches(tpu_core_state have, tpu_core_state want)
{
    if (want == CL_ALIVE)
        return have == TPU_CORE_IDLE || have == TPU_CORE_READY;
    return have == want;
}

int cluster_count(cluster *c, tpu_core_state st)
{
    tpu_cluster_spec *s = cluster_spec(c);
    int n = 0;
    if (!s)
        return -1;
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++) {
        tpu_core_info ci;
        if (tpu_cluster_spec_core(s, i, &ci) == TPU_OK && state_matches(ci.state, st))
            n++;
    }
    tpu_cluster_spec_free(s);
    return n;
}

int cluster_find_core(const tpu_cluster_spec *s, const char *host, int core, tpu_core_info *out)
{
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++)
        if (tpu_cluster_spec_core(s, i, out) == TPU_OK && strcmp(out->host_id, host) == 0 &&
            out->core == core)
            return 1;
    return 0;
}

tpu_core_state cluster_core_state(cluster *c, const char *host, int core, uint32_t *pid)
{
    tpu_cluster_spec *s = cluster_spec(c);
    tpu_core_info ci;
    tpu_core_state st = TPU_CORE_UNKNOWN;
    if (!s)
        return st;
    if (cluster_find_core(s, host, core, &ci)) {
        st = ci.state;
        if (pid)
            *pid = ci.pid;
    }
    tpu_cluster_spec_free(s);
    return st;
}

int cluster_wait_until(int (*pred)(cluster *c, void *arg), cluster *c, void *arg, int timeout_ms)
{
    int64_t end = cl_now_ms() + (int64_t)timeout_ms * cl_time_scale();
    for (;;) {
        if (pred(c, arg))
            return 1;
        if (cl_now_ms() >= end)
            return 0;
        nap_ms(20);
    }
}

struct count_arg {
    tpu_core_state st;
    int n;
};

static int count_pred(cluster *c, void *arg)
{
    struct count_arg *a = arg;
    return cluster_count(c, a->st) == a->n;
}

int cluster_wait_count(cluster *c, tpu_core_state st, int n, int timeout_ms)
{
    struct count_arg a = {st, n};
    return cluster_wait_until(count_pred, c, &a, timeout_ms);
}

struct core_arg {
    const char *host;
    int core;
    tpu_core_state st;
};

static int core_pred(cluster *c, void *arg)
{
    struct core_arg *a = arg;
    return state_matches(cluster_core_state(c, a->host, a->core, NULL), a->st);
}

int cluster_wait_core_state(cluster *c, const char *host, int core, tpu_core_state st, int timeout_ms)
{
    struct core_arg a = {host, core, st};
    return cluster_wait_until(core_pred, c, &a, timeout_ms);
}

/* ---- running commands ---- */

#define RUN_CAP (1 << 20)

int run_cmd(const char *const *tail_argv, const char *const *env, int timeout_ms, run_result *r)
{
    int po[2], pe[2];
    pid_t parent = getpid(), pid;
    size_t lo = 0, le = 0;
    int64_t start = cl_now_ms(), end = start + timeout_ms;
    int status = 0;

    hook();
    memset(r, 0, sizeof *r);
    r->out = calloc(1, RUN_CAP + 1);
    r->err = calloc(1, RUN_CAP + 1);
    cr_assert_eq(pipe(po), 0);
    cr_assert_eq(pipe(pe), 0);
    fflush(NULL);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        child_setup(parent, env);
        dup2(nul, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        closefrom(3);
        execv(tail_argv[0], (char *const *)tail_argv);
        fprintf(stderr, "exec %s: %s\n", tail_argv[0], strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        int64_t left = end - cl_now_ms();
        if (left <= 0)
            break;
        if (poll(fds, 2, (int)left) < 0 && errno != EINTR)
            break;
        for (int k = 0; k < 2; k++) {
            if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t got = read(fds[k].fd, buf, sizeof buf);
            if (got <= 0) {
                close(fds[k].fd);
                fds[k].fd = -1;
                open_fds--;
                continue;
            }
            char *dst = k ? r->err : r->out;
            size_t *len = k ? &le : &lo;
            size_t take = (size_t)got;
            if (*len + take > RUN_CAP)
                take = RUN_CAP - *len;
            memcpy(dst + *len, buf, take);
            *len += take;
        }
    }
    for (int k = 0; k < 2; k++)
        if (fds[k].fd >= 0)
            close(fds[k].fd);
    /* output closed: give the process the rest of the deadline to exit */
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            r->exited = 1;
            break;
        }
        if (cl_now_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        nap_ms(5);
    }
    r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->ms = cl_now_ms() - start;
    return r->code;
}

int cluster_tpuctl(cluster *c, run_result *r, int timeout_ms, ...)
{
    const char *argv[64];
    int n = 0;
    va_list ap;
    argv[n++] = CL_TPUCTL;
    argv[n++] = "--tpu";
    argv[n++] = c->addr;
    if (c->token_file[0]) {
        argv[n++] = "--token-file";
        argv[n++] = c->token_file;
    }
    va_start(ap, timeout_ms);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && n < 63;)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return run_cmd(argv, NULL, timeout_ms, r);
}

void run_result_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
