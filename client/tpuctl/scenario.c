/* tpuctl chaos: a fault's arguments, and scenario files (scenario.h). */
#define _POSIX_C_SOURCE 200809L
#include "scenario.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "safefile.h"
#include "xorshift.h"

static int num(const char *s, long long lo, long long hi, long long *v)
{
    return opt_parse_int(s, lo, hi, v);
}

/* "HOST/CORE" into peer (host) and *core: 0, or -1. */
static int parse_peer(const char *s, char *peer, size_t peern, int *core)
{
    const char *slash = strrchr(s, '/');
    long long v;
    if (!slash || slash == s || (size_t)(slash - s) >= peern || num(slash + 1, 0, 1000000, &v) != 0)
        return -1;
    memcpy(peer, s, (size_t)(slash - s));
    peer[slash - s] = '\0';
    *core = (int)v;
    return 0;
}

int chaos_fault_args(tpu_fault *f, char *const *args, int nargs, char *peer, size_t peern, char *why, size_t errn)
{
    long long v;
    const char *k = tpu_fault_kind_name(f->kind);

    switch (f->kind) {
    case TPU_FAULT_LINK_DELAY:
    case TPU_FAULT_LINK_LOSS:
    case TPU_FAULT_PARTITION: {
        int want = f->kind == TPU_FAULT_PARTITION ? 2 : 3;
        const char *form = f->kind == TPU_FAULT_LINK_DELAY  ? "link-delay needs PEER MS DURATION"
                           : f->kind == TPU_FAULT_LINK_LOSS ? "link-loss needs PEER PCT DURATION"
                                                            : "partition needs PEER DURATION";
        if (nargs != want) {
            snprintf(why, errn, "%s (the other end of the link as HOST/CORE, then %s)", form,
                     f->kind == TPU_FAULT_PARTITION ? "how long in ms"
                     : f->kind == TPU_FAULT_LINK_DELAY ? "how long each chunk is held in ms, and for how long"
                                                       : "the percent of chunks lost, and for how long");
            return -1;
        }
        if (parse_peer(args[0], peer, peern, &f->peer_core) != 0) {
            snprintf(why, errn, "%s: the peer '%s' is not HOST/CORE", form, args[0]);
            return -1;
        }
        f->peer_host = peer;
        if (f->kind == TPU_FAULT_LINK_DELAY) {
            if (num(args[1], 1, 60000, &v) != 0) {
                snprintf(why, errn, "link-delay: '%s' is not a latency in ms from 1 to 60000", args[1]);
                return -1;
            }
            f->latency_ms = (uint32_t)v;
        } else if (f->kind == TPU_FAULT_LINK_LOSS) {
            if (num(args[1], 1, 100, &v) != 0) {
                snprintf(why, errn, "link-loss: '%s' is not a percent of chunks lost from 1 to 100", args[1]);
                return -1;
            }
            f->percent = (uint32_t)v;
        }
        if (num(args[want - 1], 1, 600000, &v) != 0) {
            snprintf(why, errn, "%s: '%s' is not a duration in ms from 1 to 600000", k, args[want - 1]);
            return -1;
        }
        f->duration_ms = (uint32_t)v;
        return 0;
    }
    case TPU_FAULT_KILL:
    case TPU_FAULT_PREEMPT:
        if (nargs != 0) {
            snprintf(why, errn, "%s takes no other argument (got '%s')", k, args[0]);
            return -1;
        }
        return 0;
    case TPU_FAULT_PAUSE:
    case TPU_FAULT_MAINTENANCE:
        if (nargs != 1 || num(args[0], 1, 600000, &v) != 0) {
            snprintf(why, errn, "%s needs a duration in ms from 1 to 600000%s%s%s", k, nargs ? " (got '" : "",
                     nargs ? args[0] : "", nargs ? "')" : "");
            return -1;
        }
        f->duration_ms = (uint32_t)v;
        return 0;
    case TPU_FAULT_SKEW:
        if (nargs < 1 || nargs > 2 || num(args[0], -3600000, 3600000, &v) != 0) {
            snprintf(why, errn, "skew needs a skew in ms from -3600000 to 3600000 and at most a duration in ms%s%s%s",
                     nargs ? " (got '" : "", nargs ? args[0] : "", nargs ? "')" : "");
            return -1;
        }
        f->skew_ms = (int32_t)v;
        if (nargs == 2) {
            if (num(args[1], 0, 600000, &v) != 0) {
                snprintf(why, errn, "'%s' is not a duration in ms from 0 to 600000", args[1]);
                return -1;
            }
            f->duration_ms = (uint32_t)v;
        }
        return 0;
    case TPU_FAULT_SLOW:
    case TPU_FAULT_HBM:
        if (nargs < 1 || nargs > 2 || num(args[0], 1, 100, &v) != 0) {
            snprintf(why, errn, "%s needs a percent from 1 to 100 and at most a duration in ms%s%s%s", k,
                     nargs ? " (got '" : "", nargs ? args[0] : "", nargs ? "')" : "");
            return -1;
        }
        f->percent = (uint32_t)v;
        if (nargs == 2) {
            if (num(args[1], 0, 600000, &v) != 0) {
                snprintf(why, errn, "'%s' is not a duration in ms from 0 to 600000", args[1]);
                return -1;
            }
            f->duration_ms = (uint32_t)v;
        }
        return 0;
    }
    snprintf(why, errn, "fault kind %d is not one", (int)f->kind);
    return -1;
}

#define MAX_WORDS 16

/* Splits line (changed in place) at blanks, a '#' starting a comment. */
static int words(char *line, char **w)
{
    int n = 0;
    char *save = NULL, *hash = line;
    /* a comment starts with '#' at the start of a word: "5#0" is one word
     * (refused as a number), not 5 and a comment */
    while ((hash = strchr(hash, '#')) && hash != line && !strchr(" \t", hash[-1]))
        hash++;
    if (hash)
        *hash = '\0';
    for (char *t = strtok_r(line, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save)) {
        if (n == MAX_WORDS)
            return -1;
        w[n++] = t;
    }
    return n;
}

/* One "at ..." line into *sf: 0, or -1 with why naming the field. */
static int parse_fault(char **w, int n, struct scen_fault *sf, char *why, size_t errn)
{
    long long v;
    int i = 1, nargs;
    char *args[MAX_WORDS];
    size_t len;

    memset(sf, 0, sizeof *sf);
    if (i < n && !strcmp(w[i], "step")) { /* at step N */
        if (i + 1 >= n || num(w[i + 1], 1, 1000000000000LL, &v) != 0) {
            snprintf(why, errn, "'at step' needs a step number from 1 (got '%s')", i + 1 < n ? w[i + 1] : "");
            return -1;
        }
        sf->f.at_step = (uint64_t)v;
        i += 2;
    } else if (i < n && (len = strlen(w[i])) > 2 && !strcmp(w[i] + len - 2, "ms")) { /* at Nms */
        w[i][len - 2] = '\0';
        if (num(w[i], 0, 3600000, &v) != 0) {
            snprintf(why, errn, "'at %sms' is not a time from 0ms to 3600000ms", w[i]);
            return -1;
        }
        sf->f.delay_ms = (uint32_t)v;
        i++;
    } else {
        snprintf(why, errn, "after 'at' give a time ('at 2000ms') or a step ('at step 30'), not '%s'",
                 i < n ? w[i] : "");
        return -1;
    }
    if (i >= n || tpu_fault_kind_parse(w[i], &sf->f.kind) != TPU_OK) {
        snprintf(why, errn, "'%s' is not a fault kind (kill, pause, slow, hbm, preempt, maintenance, skew, "
                 "link-delay, link-loss, partition)", i < n ? w[i] : "");
        return -1;
    }
    i++;
    if (i >= n) {
        snprintf(why, errn, "%s needs a target (HOST/CORE, HOST, all, random-core or random-host)",
                 tpu_fault_kind_name(sf->f.kind));
        return -1;
    }
    if (strlen(w[i]) >= sizeof sf->target) {
        snprintf(why, errn, "target '%.40s...' is too long", w[i]);
        return -1;
    }
    snprintf(sf->target, sizeof sf->target, "%s", w[i++]);
    nargs = 0;
    int notice = -1;
    for (; i < n; i++) {
        if (!strncmp(w[i], "notice=", 7)) {
            if (num(w[i] + 7, 0, 600000, &v) != 0) {
                snprintf(why, errn, "'%s' is not notice=MS with MS from 0 to 600000", w[i]);
                return -1;
            }
            notice = (int)v;
        } else if (strchr(w[i], '=')) {
            snprintf(why, errn, "'%s': the only named argument is notice=MS", w[i]);
            return -1;
        } else {
            args[nargs++] = w[i];
        }
    }
    if (chaos_fault_args(&sf->f, args, nargs, sf->peer, sizeof sf->peer, why, errn) != 0)
        return -1;
    if (sf->f.peer_host && (!strchr(sf->target, '/') || !strncmp(sf->target, "random-", 7))) {
        snprintf(why, errn, "%s joins two cores: its target is one core, HOST/CORE (not '%s')",
                 tpu_fault_kind_name(sf->f.kind), sf->target);
        return -1;
    }
    if (notice >= 0 && sf->f.kind != TPU_FAULT_PREEMPT && sf->f.kind != TPU_FAULT_MAINTENANCE) {
        snprintf(why, errn, "notice= is for preempt and maintenance, not %s", tpu_fault_kind_name(sf->f.kind));
        return -1;
    }
    if (sf->f.kind == TPU_FAULT_PREEMPT || sf->f.kind == TPU_FAULT_MAINTENANCE)
        sf->f.notice_ms = notice >= 0 ? (uint32_t)notice : sf->f.kind == TPU_FAULT_PREEMPT ? 30000u : 60000u;
    return 0;
}

int scenario_load(const char *path, struct scenario *s, char *why, size_t errn)
{
    FILE *fp = NULL;
    char line[1024], msg[400], *w[MAX_WORDS];
    int lineno = 0, n, fd;
    err e;

    memset(s, 0, sizeof *s);
    /* never blocks on a FIFO, refuses a directory naming it */
    if (safefile_open_read("scenario", path, &fd, &e) != CODE_OK) {
        snprintf(why, errn, "%s", e.msg);
        return -1;
    }
    if (!(fp = fdopen(fd, "r"))) {
        close(fd);
        snprintf(why, errn, "cannot read scenario %s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        size_t got = strlen(line);
        /* fgets stops at a newline, not at a NUL: a NUL inside the line
         * leaves bytes after it, and the line without its newline */
        if (got + 1 < sizeof line && !strchr(line, '\n') && !feof(fp)) {
            snprintf(why, errn, "%s:%d: the line holds a NUL byte (column %zu): not a text file", path, lineno,
                     got + 1);
            goto bad;
        }
        if (!strchr(line, '\n') && !feof(fp)) {
            snprintf(why, errn, "%s:%d: the line is longer than %zu characters", path, lineno, sizeof line - 2);
            goto bad;
        }
        if ((n = words(line, w)) < 0) {
            snprintf(why, errn, "%s:%d: more than %d words", path, lineno, MAX_WORDS);
            goto bad;
        }
        if (n == 0)
            continue;
        if (!strcmp(w[0], "seed")) {
            long long v;
            if (n != 2 || num(w[1], 0, 4294967295LL, &v) != 0) {
                snprintf(why, errn, "%s:%d: 'seed' takes one number from 0 to 4294967295", path, lineno);
                goto bad;
            }
            s->seed = (uint32_t)v;
            s->has_seed = 1;
        } else if (!strcmp(w[0], "at")) {
            if (s->n == SCENARIO_MAX) {
                snprintf(why, errn, "%s:%d: more than %d faults", path, lineno, SCENARIO_MAX);
                goto bad;
            }
            if (parse_fault(w, n, &s->v[s->n], msg, sizeof msg) != 0) {
                snprintf(why, errn, "%s:%d: %s", path, lineno, msg);
                goto bad;
            }
            s->v[s->n++].line = lineno;
        } else {
            snprintf(why, errn, "%s:%d: a line is 'seed N' or 'at WHEN KIND TARGET [ARGS]', not '%s ...'", path,
                     lineno, w[0]);
            goto bad;
        }
    }
    if (ferror(fp)) {
        snprintf(why, errn, "cannot read scenario %s", path);
        goto bad;
    }
    fclose(fp);
    if (!s->n) {
        snprintf(why, errn, "%s has no faults ('at WHEN KIND TARGET [ARGS]' lines)", path);
        return -1;
    }
    return 0;
bad:
    fclose(fp);
    return -1;
}

int scenario_pick(const char *target, const struct chaos_core *live, int nlive, uint32_t *rng, char *out,
                  size_t outn)
{
    if (!strcmp(target, "random-core")) {
        if (!nlive)
            return -1;
        const struct chaos_core *c = &live[xorshift32(rng) % (uint32_t)nlive];
        snprintf(out, outn, "%s/%d", c->host, c->core);
        return 0;
    }
    if (!strcmp(target, "random-host")) {
        int hosts = 0, k;
        for (int i = 0; i < nlive; i++)
            hosts += i == 0 || strcmp(live[i].host, live[i - 1].host) != 0;
        if (!hosts)
            return -1;
        k = (int)(xorshift32(rng) % (uint32_t)hosts);
        for (int i = 0; i < nlive; i++)
            if ((i == 0 || strcmp(live[i].host, live[i - 1].host) != 0) && k-- == 0) {
                snprintf(out, outn, "%s", live[i].host);
                return 0;
            }
        return -1;
    }
    snprintf(out, outn, "%s", target);
    return 0;
}
