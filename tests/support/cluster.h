/* The integration-test fixture: a resolver and N workers on loopback, started
 * as real processes with fast test settings, and helpers to kill, stop,
 * restart and observe them and to run tpuctl.
 *
 * Every wait has a deadline and polls the resolver through libtpuclient; no
 * sleep is a guess. Children die with the test process (PR_SET_PDEATHSIG), and
 * a cluster the test did not free (an assertion failed first) is torn down by
 * an atexit hook that prints the tail of each daemon's log.
 *
 * If $TPUEMU_TEST_CLUSTER=HOST:PORT is set, cluster_start() with .shared_ok
 * uses that cluster instead of starting one (tests that kill or restart
 * daemons never set .shared_ok). */
#ifndef TPUEMU_TESTS_CLUSTER_H
#define TPUEMU_TESTS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tpuemu/tpuemu.h>

#define CL_MAX_WORKERS 264 /* a 256-core pod and a few strangers */
#define CL_TOKEN "tpuemu-test-token-0123456789abcdef"

typedef struct cl_proc {
    pid_t pid;      /* 0 when not running */
    int status;     /* waitpid status once it exited */
    char log[512];  /* stderr+stdout of every incarnation, appended */
    char host[64];  /* workers */
    int core;       /* workers: the --core given (-1: auto) */
    char **extra;   /* extra args (owned) */
} cl_proc;

typedef struct cluster_opts {
    int hosts;                       /* h0..h{hosts-1} */
    int cores_per_host;              /* --core 0..n-1 each; 0 hosts/cores: no workers */
    int auto_core;                   /* give --core -1 instead of explicit indices */
    const char *tpu_type;            /* NULL: the worker's default */
    int heartbeat_ms;                /* 0: 100 (500 under valgrind) */
    int dead_after;                  /* 0: 3 */
    int token;                       /* write CL_TOKEN to DIR/token; daemons get --token-file */
    const char *const *resolver_args; /* extra resolver args, NULL-terminated */
    const char *const *worker_args;   /* extra args for every worker */
    int shared_ok;                   /* may use $TPUEMU_TEST_CLUSTER */
    int no_wait;                     /* return without waiting for the workers */
    long resolver_nofile;            /* the resolver's open-file limit, soft and hard (0: inherited) */
} cluster_opts;

typedef struct cluster {
    char dir[256];        /* per-test temp dir: logs, token */
    char addr[64];        /* "127.0.0.1:PORT" */
    int port;
    int external;         /* using $TPUEMU_TEST_CLUSTER */
    char token_file[300]; /* "" without token */
    cluster_opts o;
    cl_proc resolver;
    cl_proc workers[CL_MAX_WORKERS];
    int nworkers;
    tpu_resolver *cr;     /* the fixture's own client, made lazily */
    tpu_cluster *cc;
} cluster;

/* Starts everything and waits (10 s deadline) until every worker is registered
 * alive. Fails the test (cr_assert) if that does not happen. */
cluster *cluster_start(const cluster_opts *o);
/* Normal teardown: SIGTERM, SIGKILL after 2 s, waitpid; removes the temp dir. */
void cluster_free(cluster *c);

/* Starts another worker (index returned); extra args NULL-terminated or NULL. */
int cluster_add_worker(cluster *c, const char *host, int core, const char *const *extra);
void cluster_signal_worker(cluster *c, int i, int sig); /* SIGSTOP, SIGCONT, ... */
/* kill -9 and reap. */
void cluster_kill_worker(cluster *c, int i);
/* Starts the worker again with the same args (a new pid). */
void cluster_restart_worker(cluster *c, int i);
/* Waits for process exit up to timeout_ms; 1 if it exited (status in p->status). */
int cluster_wait_exit(cl_proc *p, int timeout_ms);
/* SIGTERM the resolver, wait for it, start it again on the same port. */
void cluster_restart_resolver(cluster *c);
/* 1 if the process is still running (reaps it if it exited). */
int cluster_alive(cl_proc *p);

/* A fresh client connection with the cluster's token (caller frees both). */
tpu_status cluster_connect(cluster *c, tpu_resolver **r, tpu_cluster **out);
/* Current spec via a fresh connection, or NULL. */
tpu_cluster_spec *cluster_spec(cluster *c);
/* Cores in a state (TPU_CORE_IDLE|READY counted as alive with state 0 meaning alive). */
int cluster_count(cluster *c, tpu_core_state st);
#define CL_ALIVE ((tpu_core_state)100)
/* Finds host/core in a spec: 1 and *out filled if present. */
int cluster_find_core(const tpu_cluster_spec *s, const char *host, int core, tpu_core_info *out);
/* State of host/core, TPU_CORE_UNKNOWN if not listed; pid too if pid != NULL. */
tpu_core_state cluster_core_state(cluster *c, const char *host, int core, uint32_t *pid);

/* Polls pred every 20 ms until it returns non-zero or timeout_ms passes. */
int cluster_wait_until(int (*pred)(cluster *c, void *arg), cluster *c, void *arg, int timeout_ms);
/* Waits until `n` cores are in state st (CL_ALIVE: IDLE or READY). */
int cluster_wait_count(cluster *c, tpu_core_state st, int n, int timeout_ms);
int cluster_wait_core_state(cluster *c, const char *host, int core, tpu_core_state st, int timeout_ms);

/* Running a program with a deadline, capturing its output. */
typedef struct run_result {
    int exited;      /* 1 if it exited by itself (not killed at the deadline) */
    int code;        /* exit status, or 128+signal */
    char *out, *err; /* NUL-terminated, malloc'd (at most 1 MiB each) */
    int64_t ms;      /* how long it ran */
} run_result;
/* argv[0] is a path; env entries "K=V" are added (NULL-terminated or NULL). */
int run_cmd(const char *const *argv, const char *const *env, int timeout_ms, run_result *r);
/* tpuctl --tpu ADDR [--token-file F] ARGS...; NULL-terminated varargs. */
int cluster_tpuctl(cluster *c, run_result *r, int timeout_ms, ...);
void run_result_free(run_result *r);

/* Starts a daemon directly (no cluster): bin is CL_RESOLVER/CL_WORKER; its
 * output goes to p->log in dir. */
pid_t cl_spawn(cl_proc *p, const char *bin, const char *const *argv_tail, const char *const *env);
/* The same with the child's open-file limit (soft and hard) set to nofile
 * before exec (0: inherited). */
pid_t cl_spawn_nofile(cl_proc *p, const char *bin, const char *const *argv_tail, const char *const *env,
                      long nofile);
extern const char *const CL_RESOLVER;
extern const char *const CL_WORKER;
extern const char *const CL_TPUCTL;

/* A loopback TCP port nobody has bound, below the kernel's ephemeral range,
 * claimed against other tests until this test process ends. */
int cl_free_port(void);
/* Reads the whole log file (malloc'd, NUL-terminated, "" if missing). */
char *cl_read_file(const char *path);
/* 1 if the process's log contains s. */
int cl_log_contains(const cl_proc *p, const char *s);
/* Waits until the log contains s. */
int cl_wait_log(const cl_proc *p, const char *s, int timeout_ms);
/* The factor by which the fixture's waits (cl_wait_log, cluster_wait_*, the
 * start of the daemons) stretch: 6 with $TPUEMU_TEST_VALGRIND (the daemons
 * under memcheck), else 1; $TPUEMU_TEST_TIME_SCALE sets it. */
int cl_time_scale(void);
int64_t cl_now_ms(void);
/* A temp dir for tests that start daemons themselves (removed at exit). */
const char *cl_tmpdir(void);

#endif
