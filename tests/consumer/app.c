/* A program outside the tree that uses the installed libtpuclient, built both
 * with pkg-config and with find_package(tpuemu). Prints the cluster size, or
 * the error when no resolver answers (exit 1). */
#include <stdio.h>
#include <tpuemu/tpuemu.h>

int main(int argc, char **argv)
{
    tpu_resolver *r = NULL;
    tpu_cluster *c = NULL;
    int n = 0, rc = 0;

    printf("tpuemu %s (library %s)\n", TPUEMU_VERSION_STRING, tpu_version());
    if (tpu_resolver_new(argc > 1 ? argv[1] : NULL, &r) || tpu_connect_to_cluster(r, &c) ||
        tpu_num_accelerators(c, &n)) {
        fprintf(stderr, "%s: %s\n", tpu_status_name(tpu_last_status()), tpu_last_error());
        rc = 1;
    } else {
        printf("%s: %d cores\n", tpu_resolver_master(r), n);
    }
    tpu_cluster_free(c);
    tpu_resolver_free(r);
    return rc;
}
