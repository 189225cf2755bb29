/* The profile as a picture (tpu_profile_plot_svg): where each step's time
 * went, over the steps and per core, as an SVG file any browser shows.
 *
 * Top: a stacked bar per global step (the average over the cores that have
 * the step's whole period), parts in the overview's order and colours; more
 * than PLOT_MAX_BARS steps are binned, each bar then the average of its
 * steps. Bottom: a horizontal stacked bar per core, its average step, with
 * the straggler marked. Every bar segment carries its numbers as data-
 * attributes (data-step or data-core, data-part, data-ms) so that a program
 * can read the figure back. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "safefile.h"
#include "profile_int.h"
#include "tpuemu/profile.h"

#define PLOT_MAX_BARS 200
#define PLOT_W 960.0
#define PLOT_LEFT 70.0  /* room for the y axis' labels */
#define PLOT_RIGHT 150.0 /* room for the legend */
#define PLOT_TOP 40.0
#define PLOT_STEPS_H 260.0
#define PLOT_CORE_H 18.0 /* a core's bar, with its gap */
#define NPART 5

static const char *const part_name[NPART] = {"input", "compute", "all-reduce", "optimizer", "idle"};
static const char *const part_colour[NPART] = {"#e15759", "#4e79a7", "#f28e2b", "#59a14f", "#bab0ac"};

struct bar {
    uint64_t first, last; /* the steps it averages */
    double ms[NPART];
    size_t n; /* core-steps averaged */
};

/* Text content or an attribute value, XML-escaped. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            /* XML 1.0 allows no control characters but tab, CR and LF */
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r')
                fputc('?', f);
            else
                fputc(*s, f);
        }
}

/* The smallest 1, 2 or 5 times a power of ten at least v / 4: a tick step
 * giving 4 or 5 ticks up to v. */
static double tick_step(double v)
{
    double raw = v / 4, mag = pow(10, floor(log10(raw)));
    if (raw <= mag)
        return mag;
    if (raw <= 2 * mag)
        return 2 * mag;
    if (raw <= 5 * mag)
        return 5 * mag;
    return 10 * mag;
}

/* The per-step bars: the average over cores of each step that has a
 * period, binned to at most PLOT_MAX_BARS. *nb 0 when no step has one. */
static struct bar *step_bars(const tpu_profile *p, size_t *nb, tpu_status *st)
{
    size_t nc = tpu_profile_num_cores(p);
    struct profile_step **s = calloc(nc ? nc : 1, sizeof *s);
    size_t *ns = calloc(nc ? nc : 1, sizeof *ns);
    uint64_t lo = UINT64_MAX, hi = 0, per;
    struct bar *b = NULL;

    *nb = 0;
    *st = TPU_OK;
    if (!s || !ns)
        goto oom;
    for (size_t i = 0; i < nc; i++) {
        ns[i] = profile_core_steps(p, i, &s[i]);
        for (size_t j = 0; j < ns[i]; j++)
            if (s[i][j].has_period) {
                lo = s[i][j].step < lo ? s[i][j].step : lo;
                hi = s[i][j].step > hi ? s[i][j].step : hi;
            }
    }
    if (lo > hi)
        goto done;
    per = (hi - lo) / PLOT_MAX_BARS + 1;
    *nb = (size_t)((hi - lo) / per + 1);
    if (!(b = calloc(*nb, sizeof *b)))
        goto oom;
    for (size_t k = 0; k < *nb; k++) {
        b[k].first = lo + k * per;
        b[k].last = b[k].first + per - 1 < hi ? b[k].first + per - 1 : hi;
    }
    for (size_t i = 0; i < nc; i++)
        for (size_t j = 0; j < ns[i]; j++) {
            struct bar *x;
            if (!s[i][j].has_period)
                continue;
            x = &b[(s[i][j].step - lo) / per];
            for (int c = 0; c < NPART; c++)
                x->ms[c] += s[i][j].part_ms[c];
            x->n++;
        }
    for (size_t k = 0; k < *nb; k++)
        for (int c = 0; c < NPART && b[k].n; c++)
            b[k].ms[c] /= (double)b[k].n;
    goto done;
oom:
    *st = cli_failf(TPU_RESOURCE_EXHAUSTED, "profile: out of memory for the plot");
    free(b);
    b = NULL;
    *nb = 0;
done:
    for (size_t i = 0; s && i < nc; i++)
        free(s[i]);
    free(s);
    free(ns);
    return b;
}

/* Core i's average step (ms per part); all 0 when it has no step with a
 * period. */
static void core_average(const tpu_profile *p, size_t i, double ms[NPART])
{
    struct profile_step *s;
    size_t n = profile_core_steps(p, i, &s), used = 0;
    memset(ms, 0, NPART * sizeof *ms);
    for (size_t j = 0; j < n; j++)
        if (s[j].has_period) {
            for (int c = 0; c < NPART; c++)
                ms[c] += s[j].part_ms[c];
            used++;
        }
    for (int c = 0; c < NPART && used; c++)
        ms[c] /= (double)used;
    free(s);
}

static void legend(FILE *f, double x, double y)
{
    for (int c = 0; c < NPART; c++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y + 18.0 * c,
                part_colour[c]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 18, y + 18.0 * c + 10, part_name[c]);
    }
}

/* Horizontal grid lines and labels for 0..top ms over a panel of height h
 * whose bottom is at y0. */
static void y_axis(FILE *f, double y0, double h, double top, double tick)
{
    for (double v = 0; v <= top * (1 + 1e-9); v += tick) {
        double y = y0 - v / top * h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", PLOT_LEFT, y,
                PLOT_W - PLOT_RIGHT, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", PLOT_LEFT - 6, y + 4, v);
    }
}

/* core_ms: each core's average step, NPART parts a core. */
static void write_svg(FILE *f, const tpu_profile *p, const tpu_profile_summary *sum, const struct bar *b, size_t nb,
                      const double *core_ms)
{
    size_t nc = tpu_profile_num_cores(p);
    double plot_w = PLOT_W - PLOT_LEFT - PLOT_RIGHT, top = 0, tick, y0, core_top;
    double cmax = 0;
    double height = PLOT_TOP + PLOT_STEPS_H + 70 + PLOT_CORE_H * (double)nc + 30;

    for (size_t k = 0; k < nb; k++) {
        double t = 0;
        for (int c = 0; c < NPART; c++)
            t += b[k].ms[c];
        top = t > top ? t : top;
    }
    for (size_t i = 0; i < nc; i++) {
        double t = 0;
        for (int c = 0; c < NPART; c++)
            t += core_ms[i * NPART + c];
        cmax = t > cmax ? t : cmax;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
               "%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            PLOT_W, height, PLOT_W, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.1f\" y=\"22\" font-size=\"15\">Step time on %zu cores (%s): %.3f ms a step, "
               "bottleneck ",
            PLOT_LEFT, nc, sum->tpu_type && *sum->tpu_type ? sum->tpu_type : "?", sum->step_ms);
    xml_text(f, sum->bottleneck);
    fputs("</text>\n", f);

    /* the steps */
    y0 = PLOT_TOP + PLOT_STEPS_H;
    fprintf(f, "<g class=\"steps\" data-bars=\"%zu\">\n", nb);
    if (nb && top > 0) {
        tick = tick_step(top);
        top = ceil(top / tick * (1 - 1e-9)) * tick;
        y_axis(f, y0, PLOT_STEPS_H, top, tick);
        double w = plot_w / (double)nb;
        for (size_t k = 0; k < nb; k++) {
            double y = y0, x = PLOT_LEFT + w * (double)k;
            fprintf(f, "<g data-step=\"%" PRIu64 "\" data-last-step=\"%" PRIu64 "\" data-core-steps=\"%zu\">",
                    b[k].first, b[k].last, b[k].n);
            for (int c = 0; c < NPART; c++) {
                double h = b[k].ms[c] / top * PLOT_STEPS_H;
                y -= h;
                fprintf(f, "<rect class=\"part\" data-part=\"%s\" data-ms=\"%.6f\" x=\"%.2f\" y=\"%.2f\" "
                           "width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>",
                        part_name[c], b[k].ms[c], x, y, w > 2 ? w - 1 : w, h, part_colour[c]);
            }
            fputs("</g>\n", f);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">global step %" PRIu64 " to %" PRIu64
                   "%s</text>\n",
                PLOT_LEFT + plot_w / 2, y0 + 20, b[0].first, b[nb - 1].last,
                b[0].last > b[0].first ? " (each bar the average of its steps)" : "");
        fprintf(f, "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" text-anchor=\"middle\">ms a "
                   "step, average over cores</text>\n",
                PLOT_TOP + PLOT_STEPS_H / 2, PLOT_TOP + PLOT_STEPS_H / 2);
    } else {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">no training step in the capture</text>\n", PLOT_LEFT,
                PLOT_TOP + PLOT_STEPS_H / 2);
    }
    fputs("</g>\n", f);
    legend(f, PLOT_W - PLOT_RIGHT + 16, PLOT_TOP);

    /* the cores */
    core_top = y0 + 70;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">The average step of each core (ms)</text>\n",
            PLOT_LEFT, core_top - 10);
    fprintf(f, "<g class=\"cores\" data-cores=\"%zu\">\n", nc);
    for (size_t i = 0; i < nc; i++) {
        tpu_profile_core pc;
        double x = PLOT_LEFT, y = core_top + PLOT_CORE_H * (double)i;
        char label[96];
        if (tpu_profile_core_info(p, i, &pc) != TPU_OK)
            continue;
        snprintf(label, sizeof label, "%s/%d", pc.host_id, pc.core);
        fprintf(f, "<g data-core=\"");
        xml_text(f, label);
        fprintf(f, "\" data-straggler=\"%d\">", sum->straggler == (int)i);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", PLOT_LEFT - 6, y + 12);
        xml_text(f, label);
        fputs("</text>", f);
        for (int c = 0; c < NPART; c++) {
            double ms = core_ms[i * NPART + c], w = cmax > 0 ? ms / cmax * plot_w : 0;
            fprintf(f, "<rect class=\"part\" data-part=\"%s\" data-ms=\"%.6f\" x=\"%.2f\" y=\"%.1f\" "
                       "width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>",
                    part_name[c], ms, x, y, w, PLOT_CORE_H - 4, part_colour[c]);
            x += w;
        }
        if (sum->straggler == (int)i)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">straggler</text>", x + 6, y + 12);
        fputs("</g>\n", f);
    }
    fputs("</g>\n", f);
    if (cmax > 0) {
        double t = tick_step(cmax), yb = core_top + PLOT_CORE_H * (double)nc + 14;
        for (double v = 0; v <= cmax * (1 + 1e-9); v += t)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>", PLOT_LEFT + v / cmax * plot_w,
                    yb, v);
        fputc('\n', f);
    }
    fputs("</svg>\n", f);
}

tpu_status tpu_profile_plot_svg(const tpu_profile *p, const char *path)
{
    tpu_profile_summary sum;
    struct bar *b;
    size_t nb;
    tpu_status st;
    FILE *f;

    if (!p || !path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "profile plot: no file name");
    if ((st = tpu_profile_summarize(p, &sum)) != TPU_OK)
        return st;
    b = step_bars(p, &nb, &st);
    if (st != TPU_OK)
        return st;
    size_t nc = tpu_profile_num_cores(p);
    double *core_ms = calloc(nc ? nc : 1, NPART * sizeof *core_ms);
    if (!core_ms) {
        free(b);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "profile: out of memory for the plot");
    }
    for (size_t i = 0; i < nc; i++)
        core_average(p, i, core_ms + i * NPART);
    /* written beside it and renamed: a reader never sees half a picture,
     * and nothing planted at either name is followed or overwritten */
    struct safefile sf;
    err e;
    if (safefile_open(&sf, "profile plot", path, &e) != CODE_OK) {
        free(b);
        free(core_ms);
        return cli_fail(&e);
    }
    if (!(f = fdopen(sf.fd, "w"))) {
        safefile_abort(&sf);
        free(b);
        free(core_ms);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "profile plot %s: %s", path, strerror(errno));
    }
    sf.fd = -1; /* the FILE owns it now */
    write_svg(f, p, &sum, b, nb, core_ms);
    free(b);
    free(core_ms);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad) {
        safefile_abort(&sf);
        return cli_failf(TPU_UNAVAILABLE, "profile plot: writing %s failed", path);
    }
    if (safefile_commit(&sf, 0, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}
