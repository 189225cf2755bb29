/* tpuctl board --logdir DIR [--port N] [--host H]: the log directory that
 * tpu_callback_tensorboard and tpuctl profile write, in a browser. Serves
 * the page (board.html, board.js, board.css, built into tpuctl), the charting
 * library (Chart.js, from Debian's libjs-chart.js, read from where Debian
 * installs it), the list of the files under DIR that the page reads
 * (/api/logdir: event files, profile overviews, traces, step pictures) and
 * each of them by its number in that list (/api/file?i=N). The page parses the
 * event files itself (TFRecord, the Event protobuf) and checks their CRCs, so
 * a corrupt file is shown as far as it reads, with its name and what is wrong.
 * Nothing outside DIR is served: a file is asked for by its number in the
 * last list, never by a path. Until SIGINT or SIGTERM. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <uv.h>

#include "addr.h"
#include "config.h"
#include "httpd.h"
#include "tpuctl.h"

#define BOARD_MAX_FILES 4096
#define BOARD_MAX_DEPTH 8
#define BOARD_MAX_FILE (256u << 20) /* bytes of one file served */
#ifndef TPUEMU_CHARTJS
#define TPUEMU_CHARTJS "/usr/share/javascript/chart.js/chart.min.js"
#endif

struct embedded_file {
    const char *name;
    const unsigned char *p;
    size_t n;
};
extern const struct embedded_file board_assets[];

struct bfile {
    char *rel; /* under the logdir */
    const char *kind;
    uint64_t bytes;
};

struct board {
    const char *logdir;
    struct bfile *v;
    size_t n;
    int truncated;
};

static void jstr(hbuf *b, const char *s)
{
    hbuf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            hbuf_printf(b, "\\%c", *p);
        else if (*p < 0x20 || *p == '<' || *p == '>' || *p == '&' || *p == 0x7f)
            hbuf_printf(b, "\\u%04x", *p);
        else
            hbuf_put(b, p, 1);
    }
    hbuf_put(b, "\"", 1);
}

static const char *kind_of(const char *name)
{
    size_t n = strlen(name);
    if (strstr(name, "tfevents"))
        return "events";
    if (n > 14 && !strcmp(name + n - 14, ".overview.json"))
        return "overview";
    if (n > 14 && !strcmp(name + n - 14, ".trace.json.gz"))
        return "trace";
    if (n > 4 && !strcmp(name + n - 4, ".svg"))
        return "svg";
    return NULL;
}

static void clear(struct board *bd)
{
    for (size_t i = 0; i < bd->n; i++)
        free(bd->v[i].rel);
    free(bd->v);
    bd->v = NULL;
    bd->n = 0;
    bd->truncated = 0;
}

/* Regular files only (no symlink followed: lstat), at most BOARD_MAX_DEPTH
 * down and BOARD_MAX_FILES in all, sorted by name within a directory. */
static void walk(struct board *bd, const char *rel, int depth)
{
    char path[4096];
    struct dirent **ents = NULL;
    int n;

    snprintf(path, sizeof path, "%s%s%s", bd->logdir, *rel ? "/" : "", rel);
    if ((n = scandir(path, &ents, NULL, alphasort)) < 0)
        return;
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        char sub[4096], full[8192];
        struct stat st;
        if (nm[0] == '.' || bd->truncated)
            goto next;
        if ((size_t)snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", nm) >= sizeof sub)
            goto next;
        snprintf(full, sizeof full, "%s/%s", bd->logdir, sub);
        if (lstat(full, &st) != 0)
            goto next;
        if (S_ISDIR(st.st_mode) && depth < BOARD_MAX_DEPTH) {
            walk(bd, sub, depth + 1);
        } else if (S_ISREG(st.st_mode) && kind_of(nm)) {
            if (bd->n >= BOARD_MAX_FILES) {
                bd->truncated = 1;
                goto next;
            }
            struct bfile *v = realloc(bd->v, (bd->n + 1) * sizeof *v);
            if (!v)
                goto next;
            bd->v = v;
            if (!(v[bd->n].rel = strdup(sub)))
                goto next;
            v[bd->n].kind = kind_of(nm);
            v[bd->n].bytes = (uint64_t)st.st_size;
            bd->n++;
        }
    next:
        free(ents[i]);
    }
    free(ents);
}

static int api_logdir(void *user, struct httpd_req *q, hbuf *b)
{
    struct board *bd = user;
    (void)q;
    clear(bd);
    walk(bd, "", 0);
    hbuf_printf(b, "{\"logdir\":");
    jstr(b, bd->logdir);
    hbuf_printf(b, ",\"truncated\":%s,\"files\":[", bd->truncated ? "true" : "false");
    for (size_t i = 0; i < bd->n; i++) {
        hbuf_printf(b, "%s{\"i\":%zu,\"kind\":\"%s\",\"bytes\":%llu,\"path\":", i ? ",\n" : "\n", i, bd->v[i].kind,
                    (unsigned long long)bd->v[i].bytes);
        jstr(b, bd->v[i].rel);
        hbuf_printf(b, "}");
    }
    hbuf_printf(b, "]}\n");
    return 200;
}

static int read_into(const char *path, hbuf *b, char *why, size_t wn)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    char buf[65536];
    size_t n, total = 0;

    if (!f) {
        snprintf(why, wn, "cannot open it: %s", strerror(errno));
        return 404;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        snprintf(why, wn, "not a regular file");
        return 404;
    }
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if ((total += n) > BOARD_MAX_FILE) {
            fclose(f);
            snprintf(why, wn, "larger than %u MiB", BOARD_MAX_FILE >> 20);
            return 413;
        }
        hbuf_put(b, buf, n);
    }
    fclose(f);
    return 200;
}

static int api_file(void *user, struct httpd_req *q, hbuf *b)
{
    struct board *bd = user;
    const char *s = q->query;
    char path[8192], why[200];
    size_t i = 0;
    int st;

    q->content_type = "text/plain; charset=utf-8";
    if (strncmp(s, "i=", 2) != 0 || !s[2] || strlen(s + 2) > 6 || strspn(s + 2, "0123456789") != strlen(s + 2)) {
        hbuf_printf(b, "400 Bad Request: the query is i=N, a file's number in /api/logdir's list\n");
        return 400;
    }
    i = (size_t)strtoul(s + 2, NULL, 10);
    if (i >= bd->n) {
        hbuf_printf(b, "404 Not Found: the last list has %zu files; ask /api/logdir again\n", bd->n);
        return 404;
    }
    snprintf(path, sizeof path, "%s/%s", bd->logdir, bd->v[i].rel);
    if ((st = read_into(path, b, why, sizeof why)) != 200) {
        hbuf_free(b);
        hbuf_printf(b, "%d: %s: %s\n", st, bd->v[i].rel, why);
        return st;
    }
    q->content_type = !strcmp(bd->v[i].kind, "overview") ? "application/json"
                      : !strcmp(bd->v[i].kind, "svg")    ? "image/svg+xml"
                                                         : "application/octet-stream";
    return 200;
}

static int asset(hbuf *b, const char *name)
{
    for (const struct embedded_file *f = board_assets; f->name; f++)
        if (!strcmp(f->name, name)) {
            hbuf_put(b, f->p, f->n);
            return 200;
        }
    return 404;
}

static int page(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    q->extra_headers = "Content-Security-Policy: default-src 'self'; img-src 'self' blob:; frame-ancestors 'none'\r\n"
                       "X-Content-Type-Options: nosniff\r\n";
    return asset(b, "board.html");
}

static int script(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    (void)q;
    return asset(b, "board.js");
}

static int style(void *user, struct httpd_req *q, hbuf *b)
{
    (void)user;
    (void)q;
    return asset(b, "board.css");
}

static int chartjs(void *user, struct httpd_req *q, hbuf *b)
{
    char why[200];
    int st;
    (void)user;
    if ((st = read_into(TPUEMU_CHARTJS, b, why, sizeof why)) != 200) {
        hbuf_free(b);
        q->content_type = "text/plain; charset=utf-8";
        hbuf_printf(b, "404: the charting library %s: %s (apt-get install libjs-chart.js)\n", TPUEMU_CHARTJS, why);
        return 404;
    }
    return 200;
}

static const struct httpd_route routes[] = {
    {"/", "text/html; charset=utf-8", page},
    {"/board.js", "text/javascript; charset=utf-8", script},
    {"/board.css", "text/css; charset=utf-8", style},
    {"/chart.js", "text/javascript; charset=utf-8", chartjs},
    {"/api/logdir", "application/json", api_logdir},
    {"/api/file", "application/octet-stream", api_file},
};

static void on_signal(uv_signal_t *s, int signum)
{
    (void)signum;
    uv_stop(s->loop);
}

int tpuctl_cmd_board(const struct tpuctl *g, int argc, char **argv)
{
    const char *logdir = NULL, *host = "127.0.0.1";
    long long port = 6006;
    struct opt flags[] = {
        {"logdir", NULL, OPT_STRING, NULL, 0, 0, "DIR",
         "the log directory (fit's TensorBoard callback's and tpuctl profile's --logdir; required)", &logdir},
        {"port", NULL, OPT_INT, "6006", 1, 65535, "N", "the port to serve on (TensorBoard's by default)", &port},
        {"host", NULL, OPT_STRING, "127.0.0.1", 0, 0, "H", "the address to serve on", &host},
    };
    int first = argc;
    err e;
    struct board bd = {0};
    struct stat st;
    uv_loop_t loop;
    uv_signal_t sint, sterm;
    httpd *h = NULL;
    char shown[300];
    (void)g;

    int rc = opt_parse(flags, 3, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(flags, 3, "tpuctl board --logdir DIR [--port N] [--host H]",
                  "Serve the log directory in a browser: the epoch scalars of its event files as charts per run, "
                  "and each profile's overview with its bottleneck, until Ctrl-C.");
        return EXIT_OK;
    }
    if (rc != CODE_OK || first < argc) {
        fprintf(stderr, "tpuctl board: %s (see tpuctl board --help)\n",
                rc != CODE_OK ? e.msg : "unexpected argument");
        return EXIT_USAGE;
    }
    if (!logdir || !*logdir) {
        fprintf(stderr, "tpuctl board: give --logdir DIR\n");
        return EXIT_USAGE;
    }
    if (stat(logdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tpuctl board: --logdir %s is not a directory\n", logdir);
        return EXIT_USAGE;
    }
    bd.logdir = logdir;
    uv_loop_init(&loop);
    if (httpd_start(&loop, "board", host, (int)port, routes, sizeof routes / sizeof routes[0], &bd, &h, &e) !=
        CODE_OK) {
        fprintf(stderr, "tpuctl board: %s\n", e.msg);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        return EXIT_ERROR;
    }
    uv_signal_init(&loop, &sint);
    uv_signal_init(&loop, &sterm);
    uv_signal_start(&sint, on_signal, SIGINT);
    uv_signal_start(&sterm, on_signal, SIGTERM);
    addr_format(host, (int)port, shown, sizeof shown);
    printf("the board of %s: http://%s/ (Ctrl-C stops it)\n", logdir, shown);
    fflush(stdout);
    uv_run(&loop, UV_RUN_DEFAULT);
    httpd_close(h);
    uv_close((uv_handle_t *)&sint, NULL);
    uv_close((uv_handle_t *)&sterm, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    clear(&bd);
    return EXIT_OK;
}
