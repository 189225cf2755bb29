/* tpuctl: global flags (from the shared settings table), then one command.
 * Exit 0 on success, 1 when the cluster refused or could not be reached
 * (stderr "CODE_NAME: message"), 2 on a bad command line. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "tpuctl.h"
#include "tpuemu/model.h"

#define USAGE "tpuctl [--tpu ADDR] [--token-file F] [--json] [--timeout-ms T] COMMAND [ARGS]"

/* --help-man: the page, then every command's own flags as a subsection of it */
static void man_page(const struct tpuctl *g)
{
    opt_man_section("COMMANDS", "Each command takes the global options above before it and its own after it "
                                "(tpuctl COMMAND --help).");
    for (int i = 0; i < tpuctl_ncmds; i++)
        opt_man_item(tpuctl_cmds[i].name, tpuctl_cmds[i].summary);
    for (int i = 0; i < tpuctl_ncmds; i++) {
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= tpuctl_cmds[k].run == tpuctl_cmds[i].run; /* an alias: capture_tpu_profile */
        if (seen)
            continue;
        char name[64], sub[] = "allreduce", help[] = "--help-man";
        snprintf(name, sizeof name, "%s", tpuctl_cmds[i].name);
        char *av[] = {name, sub, help, NULL};
        if (!strcmp(name, "bench")) /* bench's collectives each have their flags */
            tpuctl_cmds[i].run(g, 3, av);
        else {
            av[1] = help;
            tpuctl_cmds[i].run(g, 2, av);
        }
    }
    opt_man_section("EXIT STATUS", "0: success.\n\n"
                                   "1: the cluster refused, or could not be reached: CODE: message on stderr "
                                   "(health: a core is unhealthy).\n\n"
                                   "2: a bad command line.");
    opt_man_section("EXAMPLES", "  export TPU_NAME=grpc://127.0.0.1:8470\n"
                                "  tpuctl cluster\n"
                                "  tpuctl init --expect 8\n"
                                "  tpuctl bench allreduce --min 4K --max 16M\n"
                                "  tpuctl chaos --notice-ms 15000 preempt host1");
    opt_man_section("SEE ALSO", "tpu-resolver(8), tpu-worker(8), tpu-slice(8); the manual in the project's docs/ "
                                "directory (docs/api/tpuctl.md).");
}

static void usage(const struct opt *t, size_t n)
{
    opt_usage(t, n, USAGE,
              "Inspect and drive an emulated TPU cluster through its tpu-resolver.");
    if (opt_man_mode())
        return;
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
    tpu_set_warning_handler(tpu_warning_to_file, stderr); /* the library itself never prints */
    size_t n = sizeof table / sizeof table[0];
    int first = argc;
    err e;
    opt_man_page("tpuctl", 1, "inspect and drive an emulated TPU cluster");
    int rc = opt_parse(table, n, argc, argv, &first, &e);

    if (rc == CODE_CANCELLED) {
        usage(table, n);
        if (opt_man_mode())
            man_page(&g);
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
