/* The profile's overview: a table on a FILE (tpu_profile_print_overview) and
 * the same figures as JSON (tpu_profile_write_overview_json). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "summary.h"

#define GIB_D (1024.0 * 1024.0 * 1024.0)

static const char *layer_name(const tpu_profile *p, size_t l)
{
    static _Thread_local char nm[48];
    return profile_layer_name(p, l, nm, sizeof nm);
}

void tpu_profile_print_overview(const tpu_profile *p, FILE *f)
{
    tpu_profile_summary sum;
    fprintf(f, "Profile of %zu cores over %.1f ms (%zu events)\n", p->n, (double)(p->end - p->start) / 1e6,
            tpu_profile_num_events(p));
    fprintf(f, "%-14s %6s %9s %8s %8s %10s %9s %8s %6s %s\n", "core", "steps", "step ms", "input", "compute",
            "all-reduce", "optimizer", "idle", "MXU", "clock offset");
    for (size_t i = 0; i < p->n; i++) {
        char name[96];
        struct csum cs;
        size_t nr;
        free(profile_core_rows(&p->c[i], p->n, &cs, &nr));
        snprintf(name, sizeof name, "%s/%d", p->c[i].peer.host, p->c[i].peer.core);
        if (!cs.steps) {
            fprintf(f, "%-14s %6s   (no training steps in the capture)\n", name, "0");
            continue;
        }
        fprintf(f, "%-14s %6zu %9.3f", name, cs.steps, cs.period / (double)cs.steps / 1e6);
        for (int c = 0; c < NCAT; c++)
            fprintf(f, " %*.1f%%", c == CAT_ALLREDUCE ? 9 : c == CAT_OPT ? 8 : 7, 100.0 * cs.cat[c] / cs.period);
        fprintf(f, " %5.1f%% %+7.0fus +-%.0fus\n", cs.padded > 0 ? 100.0 * cs.flops / cs.padded : 0.0,
                (double)p->c[i].offset / 1e3, (double)p->c[i].err_ns / 1e3);
    }
    if (tpu_profile_summarize(p, &sum) != TPU_OK || !sum.steps) {
        fprintf(f, "No training step was captured: %s.\n", sum.advice);
        return;
    }
    fprintf(f, "%-14s %6zu %9.3f", "all cores", sum.steps, sum.step_ms);
    for (int c = 0; c < NCAT; c++)
        fprintf(f, " %*.1f%%", c == CAT_ALLREDUCE ? 9 : c == CAT_OPT ? 8 : 7, 100.0 * sum.fraction[c]);
    fprintf(f, " %5.1f%%\n", 100.0 * sum.mxu_utilization);
    if (p->n > 1 && sum.last_share > 0)
        fprintf(f, "Last at the all-reduce: core %s/%d in %.0f%% of the steps, %.3f ms after the next latest%s\n",
                p->c[sum.last_core].peer.host, p->c[sum.last_core].peer.core, 100.0 * sum.last_share,
                sum.last_by_ms, sum.straggler >= 0 ? ": a straggler, the other cores wait for it" : "");
    if (p->n > 1 && (sum.ar_spread_ms > 0 || sum.ar_after_last_ms > 0))
        fprintf(f, "All-reduce: the cores reach it %.3f ms apart (first to last, median step) and it ends %.3f ms "
                   "after the last one arrives\n",
                sum.ar_spread_ms, sum.ar_after_last_ms);
    if (sum.shared_cores)
        fprintf(f, "CPUs: %u emulated cores share %u CPU%s of one machine: at most %u compute at once, and the "
                   "others wait for their turn inside the all-reduce (the exchange itself is what runs after the "
                   "last core arrives)\n",
                sum.shared_cores, sum.shared_cpus, sum.shared_cpus == 1 ? "" : "s", sum.shared_cpus);
    for (size_t l = 0; l < sum.num_layers; l++)
        if (sum.layers[l].mxu_utilization < PROF_MXU_GOOD && sum.layers[l].padding[0])
            fprintf(f, "MXU of %-9s %5.1f%%: %s\n", layer_name(p, l), 100.0 * sum.layers[l].mxu_utilization,
                    sum.layers[l].padding);
    if (sum.mxu_advice[0])
        fprintf(f, "MXU advice: %s\n", sum.mxu_advice);
    if (p->c[sum.hbm_core].hbm_cap)
        fprintf(f, "HBM: peak %.2f of %.2f GiB (%.1f%%) on core %s/%d\n",
                (double)p->c[sum.hbm_core].hbm_peak / GIB_D, (double)p->c[sum.hbm_core].hbm_cap / GIB_D,
                100.0 * sum.hbm_peak_fraction, p->c[sum.hbm_core].peer.host, p->c[sum.hbm_core].peer.core);
    if (sum.est_step_ms > 0) {
        char other[96] = "";
        if (sum.est_other_ms > 0)
            snprintf(other, sizeof other, " + layers without matmuls %.4f ms (bound by HBM bandwidth)",
                     sum.est_other_ms);
        fprintf(f,
                "Estimate on a real %s (roofline, not a measurement): %.4f ms per step = matmuls %.4f ms "
                "(%zu ops, %zu bound by HBM bandwidth)%s + optimizer %.4f ms + all-reduce %.4f ms over ICI; "
                "measured here %.3f ms\n",
                sum.tpu_type, sum.est_step_ms, sum.est_matmul_ms, sum.est_ops, sum.est_hbm_bound_ops, other,
                sum.est_optimizer_ms, sum.est_allreduce_ms, sum.step_ms);
    }
    fprintf(f, "Input (the overview page's classes): %s. %s\n", sum.input_bound, sum.input_statement);
    if (strcmp(sum.bottleneck, "memory") == 0)
        fprintf(f, "Bottleneck: memory (HBM peak %.0f%% of capacity): %s\n", 100.0 * sum.hbm_peak_fraction,
                sum.advice);
    else
        fprintf(f, "Bottleneck: %s (%.0f%% of the step): %s\n", sum.bottleneck,
                100.0 * sum.fraction[strcmp(sum.bottleneck, "input") == 0        ? CAT_INPUT
                                     : strcmp(sum.bottleneck, "compute") == 0    ? CAT_COMPUTE
                                     : strcmp(sum.bottleneck, "all-reduce") == 0 ? CAT_ALLREDUCE
                                                                                 : CAT_IDLE],
                sum.advice);
}

static void fjstr(FILE *f, const char *s)
{
    char q[1024];
    fputs(profile_json_quote(s, q, sizeof q), f);
}

static void fsplit(FILE *f, const double *part, double whole)
{
    static const char *const key[NCAT] = {"input", "compute", "all_reduce", "optimizer", "idle"};
    fputc('{', f);
    for (int c = 0; c < NCAT; c++)
        fprintf(f, "%s\"%s\":%.6f", c ? "," : "", key[c], whole > 0 ? part[c] / whole : 0.0);
    fputc('}', f);
}

static void fcore(FILE *f, const tpu_profile *p, int i)
{
    char nm[96];
    snprintf(nm, sizeof nm, "%s/%d", p->c[i].peer.host, p->c[i].peer.core);
    fjstr(f, nm);
}

tpu_status tpu_profile_write_overview_json(const tpu_profile *p, FILE *f)
{
    tpu_profile_summary sum;
    tpu_status st = tpu_profile_summarize(p, &sum);
    double one[NCAT];

    if (st != TPU_OK)
        return st;
    fprintf(f, "{\"cores\":%zu,\"capture_ms\":%.3f,\"events\":%zu,\"steps\":%zu,\"step_ms\":%.6f,\"split\":",
            p->n, (double)(p->end - p->start) / 1e6, tpu_profile_num_events(p), sum.steps, sum.step_ms);
    for (int c = 0; c < NCAT; c++)
        one[c] = sum.fraction[c];
    fsplit(f, one, 1.0);
    fprintf(f, ",\"mxu_utilization\":%.6f,\"layers\":[", sum.mxu_utilization);
    for (size_t l = 0; l < sum.num_layers; l++) {
        fprintf(f, "%s{\"name\":", l ? "," : "");
        fjstr(f, layer_name(p, l));
        fprintf(f, ",\"mxu_utilization\":%.6f,\"padding\":", sum.layers[l].mxu_utilization);
        fjstr(f, sum.layers[l].padding);
        fputc('}', f);
    }
    fprintf(f, "],\"mxu_advice\":");
    fjstr(f, sum.mxu_advice);
    fprintf(f, ",\"last_at_allreduce\":");
    if (p->n > 1 && sum.last_share > 0) {
        fprintf(f, "{\"core\":");
        fcore(f, p, sum.last_core);
        fprintf(f, ",\"share\":%.6f,\"by_ms\":%.6f}", sum.last_share, sum.last_by_ms);
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\"allreduce_spread_ms\":%.6f,\"allreduce_after_last_ms\":%.6f", sum.ar_spread_ms,
            sum.ar_after_last_ms);
    fprintf(f, ",\"shared_cores\":%u,\"shared_cpus\":%u", sum.shared_cores, sum.shared_cpus);
    fprintf(f, ",\"missing\":["); /* cores that did not answer during the capture, and why */
    for (size_t i = 0, k = 0; i < p->n; i++)
        if (p->c[i].missing[0]) {
            fprintf(f, "%s{\"core\":", k++ ? "," : "");
            fcore(f, p, (int)i);
            fprintf(f, ",\"why\":");
            fjstr(f, p->c[i].missing);
            fprintf(f, "}");
        }
    fprintf(f, "]");
    fprintf(f, ",\"straggler\":");
    if (sum.straggler >= 0)
        fcore(f, p, sum.straggler);
    else
        fprintf(f, "null");
    fprintf(f, ",\"hbm\":{\"peak_fraction\":%.6f,\"core\":", sum.hbm_peak_fraction);
    fcore(f, p, sum.hbm_core);
    fprintf(f, "},\"input_bound\":");
    fjstr(f, sum.input_bound);
    fprintf(f, ",\"input_classification\":");
    fjstr(f, sum.input_classification);
    fprintf(f, ",\"input_statement\":");
    fjstr(f, sum.input_statement);
    fprintf(f, ",\"bottleneck\":");
    fjstr(f, sum.bottleneck);
    fprintf(f, ",\"advice\":");
    fjstr(f, sum.advice);
    fprintf(f, ",\"estimate\":{\"what\":\"roofline estimate on the real generation, not a measurement\","
               "\"tpu_type\":");
    fjstr(f, sum.tpu_type);
    fprintf(f,
            ",\"step_ms\":%.6f,\"matmul_ms\":%.6f,\"optimizer_ms\":%.6f,\"all_reduce_ms\":%.6f,"
            "\"other_layers_ms\":%.6f,\"matmuls\":%zu,\"hbm_bound_matmuls\":%zu},\"per_core\":[",
            sum.est_step_ms, sum.est_matmul_ms, sum.est_optimizer_ms, sum.est_allreduce_ms, sum.est_other_ms,
            sum.est_ops, sum.est_hbm_bound_ops);
    for (size_t i = 0; i < p->n; i++) {
        const struct pcore *pc = &p->c[i];
        struct csum cs;
        size_t nr;
        free(profile_core_rows(pc, p->n, &cs, &nr));
        fprintf(f, "%s{\"host\":", i ? "," : "");
        fjstr(f, pc->peer.host);
        fprintf(f, ",\"core\":%d,\"replica\":%d,\"steps\":%zu,\"step_ms\":%.6f,\"split\":", pc->peer.core,
                pc->replica, cs.steps, cs.steps ? cs.period / (double)cs.steps / 1e6 : 0.0);
        fsplit(f, cs.cat, cs.period);
        fprintf(f, ",\"mxu_utilization\":%.6f,\"clock_offset_us\":%.3f,\"clock_error_us\":%.3f,"
                   "\"events\":%zu,\"dropped\":%" PRIu64 ",\"hbm_used\":%" PRIu64 ",\"hbm_peak\":%" PRIu64
                   ",\"hbm_capacity\":%" PRIu64 "}",
                cs.padded > 0 ? cs.flops / cs.padded : 0.0, (double)pc->offset / 1e3, (double)pc->err_ns / 1e3,
                pc->n, pc->dropped, pc->hbm_used, pc->hbm_peak, pc->hbm_cap);
    }
    fprintf(f, "]}\n");
    return ferror(f) ? cli_failf(TPU_UNAVAILABLE, "profile: writing the overview failed") : TPU_OK;
}
