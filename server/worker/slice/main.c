/* tpu-slice: starts every worker of a Cloud TPU slice on this machine, with
 * the slice's real shape: for --accelerator-type v4-16, 2 hosts (host0,
 * host1) of 4 devices, each a tpu-worker --accelerator-type v4-16 --host-id
 * hostH --core C. Arguments after "--" go to every worker. SIGINT/SIGTERM
 * stop them all; it exits once every worker has, with the first failure's
 * status (0 if none failed). Bad settings exit 2. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "slice.h"

#define EXIT_USAGE 2
#define MAX_WORKERS 256 /* a v3-256's or a v4-512's: more than one machine should run */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

/* The tpu-worker beside this program (the build tree, an install), else $PATH's. */
static void worker_path(char out[PATH_MAX])
{
    const size_t n = PATH_MAX;
    char self[PATH_MAX - 16];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    char *slash;

    if (len > 0) {
        self[len] = '\0';
        if ((slash = strrchr(self, '/')) != NULL) {
            *slash = '\0';
            snprintf(out, n, "%s/tpu-worker", self);
            if (access(out, X_OK) == 0)
                return;
        }
    }
    snprintf(out, n, "tpu-worker");
}

int main(int argc, char **argv)
{
    const char *accel = NULL, *resolver = NULL, *prefix = NULL;
    char bin[PATH_MAX], hostbuf[MAX_WORKERS][80], corebuf[MAX_WORKERS][16];
    pid_t pids[MAX_WORKERS];
    struct slice sl;
    struct sigaction sa;
    int first, rc, status = 0, left = 0;
    unsigned n;
    err e;
    const struct opt opts[] = {
        {"accelerator-type", "TPUEMU_ACCELERATOR_TYPE", OPT_STRING, NULL, 0, 0, "SLICE",
         "the Cloud TPU slice to start: v2-8, v3-8, v3-32, v4-8, v4-16, v5p-16, v5litepod-16, ... "
         "(required)", &accel},
        {"resolver", "TPUEMU_RESOLVER", OPT_STRING, NULL, 0, 0, "HOST:PORT",
         "the tpu-resolver the workers register with (required)", &resolver},
        {"host-prefix", NULL, OPT_STRING, "host", 0, 0, "NAME",
         "host ids are NAME0, NAME1, ... (one per host of the slice)", &prefix},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];

    opt_man_page("tpu-slice", 8, "start every tpu-worker of a TPU slice on one machine");
    rc = opt_parse(opts, nopts, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(opts, nopts, "tpu-slice --accelerator-type SLICE --resolver HOST:PORT [-- WORKER OPTIONS]",
                  "Starts every tpu-worker of a TPU slice on this machine: each host of the slice, "
                  "each device of a host, with the slice's real shape.");
        opt_man_section("WORKER OPTIONS",
                        "What follows -- goes to every worker (see tpu-worker(8)); each gets "
                        "--accelerator-type, --resolver, its --host-id and its --core from tpu-slice.");
        opt_man_section("SIGNALS", "SIGTERM or SIGINT: stop every worker, then exit once they have. The workers "
                                   "stop too if tpu-slice dies.");
        opt_man_section("EXIT STATUS", "The first failing worker's exit status, else 0; 2 for a bad flag or "
                                       "environment value.");
        opt_man_section("EXAMPLES", "A v4-16 (2 hosts of 4 devices) on this machine:\n"
                                    "  tpu-resolver --name my-tpu &\n"
                                    "  tpu-slice --accelerator-type v4-16 --resolver 127.0.0.1:8470 &\n"
                                    "  TPU_NAME=my-tpu tpuctl init --expect 8");
        opt_man_section("SEE ALSO", "tpu-resolver(8), tpu-worker(8), tpu-slice(8), tpuctl(1); the manual in the "
                                    "project's docs/ directory (docs/operations/daemons.md for every setting).");
        return 0;
    }
    if (rc != CODE_OK) {
        fprintf(stderr, "tpu-slice: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (first < argc && strcmp(argv[first - 1], "--") != 0) {
        fprintf(stderr, "tpu-slice: unexpected argument '%s' (worker options go after --; see --help)\n",
                argv[first]);
        return EXIT_USAGE;
    }
    if (!accel || !*accel || !resolver || !*resolver) {
        fprintf(stderr, "tpu-slice: --accelerator-type and --resolver are required (see --help)\n");
        return EXIT_USAGE;
    }
    if (slice_parse(accel, &sl, &e) != CODE_OK) {
        fprintf(stderr, "tpu-slice: --accelerator-type: %s\n", e.msg);
        return EXIT_USAGE;
    }
    n = sl.hosts * sl.devices_per_host;
    if (n > MAX_WORKERS) {
        fprintf(stderr, "tpu-slice: a %s is %u workers; this launcher starts at most %d on one machine\n",
                accel, n, MAX_WORKERS);
        return EXIT_USAGE;
    }
    if (strlen(prefix) < 1 || strlen(prefix) > 60) {
        fprintf(stderr, "tpu-slice: --host-prefix: '%s' is not 1..60 characters\n", prefix);
        return EXIT_USAGE;
    }
    worker_path(bin);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fprintf(stderr, "tpu-slice: %s: %u host%s x %u devices, mesh [%u, %u, %u, %u]; starting %u tpu-workers\n",
            accel, sl.hosts, sl.hosts == 1 ? "" : "s", sl.devices_per_host, sl.mesh[0], sl.mesh[1], sl.mesh[2],
            sl.mesh[3], n);
    for (unsigned i = 0; i < n; i++) {
        const int fixed = 9;
        int extra = argc - first;
        char **args = calloc((size_t)(fixed + extra + 1), sizeof *args);
        pid_t p;

        if (!args) {
            fprintf(stderr, "tpu-slice: out of memory\n");
            stop_signal = SIGTERM;
            break;
        }
        snprintf(hostbuf[i], sizeof hostbuf[i], "%s%u", prefix, i / sl.devices_per_host);
        snprintf(corebuf[i], sizeof corebuf[i], "%u", i % sl.devices_per_host);
        args[0] = bin;
        args[1] = "--resolver";
        args[2] = (char *)resolver;
        args[3] = "--accelerator-type";
        args[4] = (char *)accel;
        args[5] = "--host-id";
        args[6] = hostbuf[i];
        args[7] = "--core";
        args[8] = corebuf[i];
        for (int k = 0; k < extra; k++)
            args[fixed + k] = argv[first + k];
        p = fork();
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* the slice's workers go with it */
            execvp(bin, args);
            fprintf(stderr, "tpu-slice: cannot run %s: %s\n", bin, strerror(errno));
            _exit(127);
        }
        free(args);
        if (p < 0) {
            fprintf(stderr, "tpu-slice: fork: %s\n", strerror(errno));
            stop_signal = SIGTERM;
            break;
        }
        pids[left++] = p;
    }
    for (int stopped = 0; left > 0;) {
        int st;
        pid_t p;

        if (stop_signal && !stopped) {
            for (int k = 0; k < left; k++)
                kill(pids[k], SIGTERM);
            stopped = 1;
        }
        p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int k = 0; k < left; k++) {
            if (pids[k] != p)
                continue;
            pids[k] = pids[--left];
            if (!status && WIFEXITED(st) && WEXITSTATUS(st) != 0)
                status = WEXITSTATUS(st);
            else if (!status && WIFSIGNALED(st) && !stop_signal)
                status = 128 + WTERMSIG(st);
            break;
        }
    }
    return status;
}
