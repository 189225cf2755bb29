/* tpuctl's TensorFlow view of a topology (tf.tpu.experimental.Topology):
 * device names and device_coordinates in init's output, the places no device
 * holds, the serialized TopologyProto; and `tpuctl topology FILE`, which reads
 * such bytes (written by `tpuctl init --serialized` or by TensorFlow). */
#include "topo.h"

#include "config.h"
#include "safefile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOPO_FILE_MAX (16u << 20)

static void b64(const uint8_t *p, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[k++] = a[v >> 18 & 63];
        out[k++] = a[v >> 12 & 63];
        out[k++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        out[k++] = i + 2 < n ? a[v & 63] : '=';
    }
    out[k] = '\0';
}

const char *tpuctl_topo_device(const tpu_topology *t, const int coords[4], char *buf, size_t n)
{
    if (tpu_topology_tpu_device_name_at_coordinates(t, coords, TPUCTL_TOPO_JOB, buf, n) != TPU_OK)
        snprintf(buf, n, "-");
    return buf;
}

void tpuctl_topo_json(json *j, const tpu_topology *t)
{
    const int *dc;
    int shape[3], c[4];
    const uint8_t *ser;
    size_t nser;

    if (tpu_topology_device_coordinates(t, &dc, shape) == TPU_OK) {
        json_arr(j, "device_coordinates");
        for (int k = 0; k < shape[0]; k++) {
            json_arr(j, NULL);
            for (int d = 0; d < shape[1]; d++) {
                json_arr(j, NULL);
                for (int a = 0; a < 4; a++)
                    json_int(j, NULL, dc[((size_t)k * (size_t)shape[1] + (size_t)d) * 4 + (size_t)a]);
                json_end(j);
            }
            json_end(j);
        }
        json_end(j);
    } else {
        json_null(j, "device_coordinates");
    }
    json_arr(j, "missing_devices");
    for (size_t i = 0; i < tpu_topology_num_missing_devices(t); i++) {
        if (tpu_topology_missing_device(t, i, c) != TPU_OK)
            break;
        json_arr(j, NULL);
        for (int a = 0; a < 4; a++)
            json_int(j, NULL, c[a]);
        json_end(j);
    }
    json_end(j);
    if (tpu_topology_serialized(t, &ser, &nser) == TPU_OK) {
        char *s = malloc(nser / 3 * 4 + 8);
        if (s) {
            b64(ser, nser, s);
            json_str(j, "serialized", s);
            free(s);
        }
    } else {
        json_null(j, "serialized");
    }
}

void tpuctl_topo_text(const tpu_topology *t)
{
    const int *dc;
    int shape[3], c[4];
    const uint8_t *ser;
    size_t nser;

    for (size_t i = 0; i < tpu_topology_num_missing_devices(t); i++)
        if (tpu_topology_missing_device(t, i, c) == TPU_OK)
            printf("no device at [%d, %d, %d, %d]\n", c[0], c[1], c[2], c[3]);
    if (tpu_topology_device_coordinates(t, &dc, shape) != TPU_OK)
        printf("no device_coordinates: %s\n", tpu_last_error());
    else if (tpu_topology_serialized(t, &ser, &nser) == TPU_OK)
        printf("serialized TopologyProto: %zu bytes\n", nser);
}

int tpuctl_topo_save(const tpu_topology *t, const char *path)
{
    const uint8_t *ser;
    size_t nser;
    FILE *f;

    if (tpu_topology_serialized(t, &ser, &nser) != TPU_OK) {
        fprintf(stderr, "tpuctl: not writing %s: %s\n", path, tpu_last_error());
        return EXIT_ERROR;
    }
    struct safefile sf;
    err e;
    if (safefile_open(&sf, "serialized topology", path, &e) != CODE_OK) {
        fprintf(stderr, "tpuctl: %s\n", e.msg);
        return EXIT_ERROR;
    }
    if (!(f = fdopen(sf.fd, "wb"))) {
        fprintf(stderr, "tpuctl: cannot write the serialized topology to %s: %s\n", path, strerror(errno));
        safefile_abort(&sf);
        return EXIT_ERROR;
    }
    sf.fd = -1;
    int bad = fwrite(ser, 1, nser, f) != nser;
    int en = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        en = errno;
    }
    if (bad) {
        fprintf(stderr, "tpuctl: cannot write the serialized topology to %s: %s\n", path, strerror(en));
        safefile_abort(&sf);
        return EXIT_ERROR;
    }
    if (safefile_commit(&sf, 0, &e) != CODE_OK) {
        fprintf(stderr, "tpuctl: %s\n", e.msg);
        return EXIT_ERROR;
    }
    return EXIT_OK;
}

int tpuctl_cmd_topology(const struct tpuctl *g, int argc, char **argv)
{
    static const char *const head[] = {"TASK", "DEVICE", "COORDS", "NAME", "HOST"};
    static const char usage[] = "tpuctl topology FILE";
    struct opt flags[1] = {{"help-only", NULL, OPT_BOOL, NULL, 0, 0, NULL, "(unused)", NULL}};
    int first = argc, mesh[4] = {0}, shape[3], rc;
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    tpu_topology *t;
    const int *dc;
    FILE *f;
    err e;

    rc = opt_parse(flags, 0, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(flags, 0, usage, "Read a serialized TopologyProto (TensorFlow's "
                  "tf.tpu.experimental.Topology.serialized(), or the file `tpuctl init --serialized "
                  "FILE` writes) and print it: mesh shape, each task's TPU devices with their "
                  "coordinates and names, the places of the mesh no device holds. A malformed file "
                  "is refused with TensorFlow's message.");
        return EXIT_OK;
    }
    if (rc != CODE_OK || argc - first != 1) {
        fprintf(stderr, "tpuctl topology: %s (usage: %s)\n",
                rc != CODE_OK ? e.msg : "one FILE expected", usage);
        return EXIT_USAGE;
    }
    int fd;
    if (safefile_open_read("topology", argv[first], &fd, &e) != CODE_OK) {
        fprintf(stderr, "tpuctl topology: %s\n", e.msg);
        return EXIT_ERROR;
    }
    if (!(f = fdopen(fd, "rb"))) {
        fprintf(stderr, "tpuctl topology: cannot open %s: %s\n", argv[first], strerror(errno));
        close(fd);
        return EXIT_ERROR;
    }
    for (;;) {
        if (n == cap) {
            uint8_t *nb;
            if (cap >= TOPO_FILE_MAX) {
                fprintf(stderr, "tpuctl topology: %s is larger than %u bytes: not a topology\n",
                        argv[first], TOPO_FILE_MAX);
                fclose(f);
                free(buf);
                return EXIT_ERROR;
            }
            cap = cap ? cap * 2 : 4096;
            if (!(nb = realloc(buf, cap))) {
                fclose(f);
                free(buf);
                fprintf(stderr, "tpuctl topology: out of memory\n");
                return EXIT_ERROR;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    fclose(f);
    if (tpu_topology_from_serialized(buf, n, &t) != TPU_OK) {
        fprintf(stderr, "tpuctl topology: %s: %s: %s\n", argv[first],
                tpu_status_name(tpu_last_status()), tpu_last_error());
        free(buf);
        return EXIT_ERROR;
    }
    free(buf);
    tpu_topology_mesh_shape(t, mesh);
    if (tpu_topology_device_coordinates(t, &dc, shape) != TPU_OK) { /* parsed: always rectangular */
        tpu_topology_free(t);
        fprintf(stderr, "tpuctl topology: %s\n", tpu_last_error());
        return EXIT_ERROR;
    }
    if (g->json) {
        json j;
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_arr(&j, "mesh_shape");
        for (int a = 0; a < 4; a++)
            json_int(&j, NULL, mesh[a]);
        json_end(&j);
        json_int(&j, "num_tasks", tpu_topology_num_tasks(t));
        json_int(&j, "num_tpus_per_task", tpu_topology_num_tpus_per_task(t));
        tpuctl_topo_json(&j, t);
        json_end(&j);
    } else {
        table tb;
        char name[256];
        printf("Topology: mesh [%d, %d, %d, %d], %d tasks x %d TPU devices per task\n", mesh[0], mesh[1],
               mesh[2], mesh[3], shape[0], shape[1]);
        table_init(&tb, sizeof head / sizeof head[0], head);
        for (int k = 0; k < shape[0]; k++)
            for (int d = 0; d < shape[1]; d++) {
                const int *c = &dc[((size_t)k * (size_t)shape[1] + (size_t)d) * 4];
                table_cell(&tb, "%d", k);
                table_cell(&tb, "%d", d);
                table_cell(&tb, "[%d, %d, %d, %d]", c[0], c[1], c[2], c[3]);
                table_cell(&tb, "%s", tpuctl_topo_device(t, c, name, sizeof name));
                if (tpu_topology_cpu_device_name_at_coordinates(t, c, TPUCTL_TOPO_JOB, name,
                                                                sizeof name) != TPU_OK)
                    snprintf(name, sizeof name, "-");
                table_cell(&tb, "%s", name);
            }
        table_print(&tb, stdout);
        table_free(&tb);
        tpuctl_topo_text(t);
    }
    tpu_topology_free(t);
    return EXIT_OK;
}
