/* Prometheus text writers and the lock-free histogram (prom.h). */
#include "prom.h"

#include <inttypes.h>
#include <string.h>

void prom_hist_init(prom_hist *h, const double *bounds, size_t n)
{
    h->bounds = bounds;
    h->n = n > PROM_HIST_MAX ? PROM_HIST_MAX : n;
    for (size_t i = 0; i <= PROM_HIST_MAX; i++)
        atomic_init(&h->counts[i], 0);
    atomic_init(&h->sum_ns, 0);
}

void prom_hist_observe_ns(prom_hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < h->n && s > h->bounds[i])
        i++;
    prom_add(&h->counts[i], 1);
    prom_add(&h->sum_ns, ns);
}

void prom_family(hbuf *b, const char *name, const char *type, const char *help)
{
    hbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_head(hbuf *b, const char *name, const char *labels)
{
    if (labels && *labels)
        hbuf_printf(b, "%s{%s} ", name, labels);
    else
        hbuf_printf(b, "%s ", name);
}

void prom_u64(hbuf *b, const char *name, const char *labels, uint64_t v)
{
    sample_head(b, name, labels);
    hbuf_printf(b, "%" PRIu64 "\n", v);
}

void prom_i64(hbuf *b, const char *name, const char *labels, int64_t v)
{
    sample_head(b, name, labels);
    hbuf_printf(b, "%" PRId64 "\n", v);
}

void prom_hist_write(hbuf *b, const char *name, const char *labels, prom_hist *h)
{
    const char *sep = labels && *labels ? "," : "";
    uint64_t cum = 0, sum = prom_get(&h->sum_ns);

    if (!labels)
        labels = "";
    for (size_t i = 0; i <= h->n; i++) {
        cum += prom_get(&h->counts[i]);
        if (i < h->n)
            hbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n", name, labels, sep, h->bounds[i], cum);
        else
            hbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, sep, cum);
    }
    if (*labels)
        hbuf_printf(b, "%s_sum{%s} %.9f\n%s_count{%s} %" PRIu64 "\n", name, labels, (double)sum / 1e9, name, labels,
                    cum);
    else
        hbuf_printf(b, "%s_sum %.9f\n%s_count %" PRIu64 "\n", name, (double)sum / 1e9, name, cum);
}

const char *prom_escape(const char *v, char *out, size_t n)
{
    size_t k = 0;
    for (; v && *v && k + 3 < n; v++) {
        if (*v == '\\' || *v == '"') {
            out[k++] = '\\';
            out[k++] = *v;
        } else if (*v == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else {
            out[k++] = *v;
        }
    }
    if (n)
        out[k] = '\0';
    return out;
}
