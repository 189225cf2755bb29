/* tpuctl: global flags (from the shared settings table), then one command.
 * Exit 0 on success, 1 when the cluster refused or could not be reached
 * (stderr "CODE_NAME: message"), 2 on a bad command line. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "tpuctl.h"

#define USAGE "tpuctl [--tpu ADDR] [--token-file F] [--json] [--timeout-ms T] COMMAND [ARGS]"

static void usage(const struct opt *t, size_t n)
{
    opt_usage(t, n, USAGE,
              "Inspect and drive an emulated TPU cluster through its tpu-resolver.");
    printf("\ncommands:\n");
    for (int i = 0; i < tpuctl_ncmds; i++)
        printf("  %-28s %s\n", tpuctl_cmds[i].name, tpuctl_cmds[i].summary);
    printf("\n'tpuctl COMMAND --help' describes a command's own flags.\n"
           "Exit status: 0 success, 1 error from or reaching the cluster, 2 bad usage.\n");
}

int main(int argc, char **argv)
{
    struct tpuctl g = {0};
    struct opt table[] = {
        {"tpu", "TPU_NAME", OPT_STRING, NULL, 0, 0, "TPU",
         "the resolver's HOST:PORT or grpc://HOST:PORT, a comma list of every host of the slice (the "
         "first is the master), or a TPU name looked up at $TPUEMU_TPU_API (default 127.0.0.1:8470)",
         &g.tpu},
        {"token-file", "TPUEMU_TOKEN_FILE", OPT_STRING, NULL, 0, 0, "FILE",
         "cluster token file (else $TPUEMU_TOKEN)", &g.token_file},
        {"json", NULL, OPT_BOOL, NULL, 0, 0, NULL, "print one JSON object instead of text", &g.json},
        {"timeout-ms", NULL, OPT_INT, "5000", 1, 600000, "MS", "deadline of each call to the resolver",
         &g.timeout_ms},
    };
    size_t n = sizeof table / sizeof table[0];
    int first = argc;
    err e;
    int rc = opt_parse(table, n, argc, argv, &first, &e);

    if (rc == CODE_CANCELLED) {
        usage(table, n);
        return EXIT_OK;
    }
    if (rc != CODE_OK) {
        fprintf(stderr, "tpuctl: %s%s\n", e.msg, strstr(e.msg, "--help") ? "" : " (see tpuctl --help)");
        return EXIT_USAGE;
    }
    if (first >= argc) {
        fprintf(stderr, "tpuctl: no command given (commands: cluster, init, shutdown, forget, chaos, health, version, profile, capture_tpu_profile, bench; "
                        "see tpuctl --help)\n");
        return EXIT_USAGE;
    }
    if (strcmp(argv[first], "help") == 0) {
        usage(table, n);
        return EXIT_OK;
    }
    for (int i = 0; i < tpuctl_ncmds; i++)
        if (strcmp(argv[first], tpuctl_cmds[i].name) == 0)
            return tpuctl_cmds[i].run(&g, argc - first, argv + first);
    fprintf(stderr, "tpuctl: unknown command '%s' (commands: cluster, init, shutdown, forget, chaos, health, version, profile, capture_tpu_profile, bench; "
                    "see tpuctl --help)\n", argv[first]);
    return EXIT_USAGE;
}
