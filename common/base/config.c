/* The settings table: parsing flags and environment variables against it. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --help-man: the page being written (opt_usage, opt_man_section) */
static int man_mode, man_started;
static const char *man_name = "tpuemu", *man_summary = "";
static int man_section = 1;

int opt_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    long long v;

    /* digits, with a '-' in front at most: no blank, no '+' (strtoll would
     * take both) */
    if (!s || !*s || !((*s >= '0' && *s <= '9') || (*s == '-' && s[1] >= '0' && s[1] <= '9')))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int opt_parse_bytes(const char *s, long long *out)
{
    char *end;
    unsigned long long v, mult = 1;

    if (!s || !(*s >= '0' && *s <= '9')) /* no sign, no blank */
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    if (*end) {
        static const char *const suf[] = {"K", "M", "G", "T"};
        int found = 0;
        for (int i = 0; i < 4 && !found; i++) {
            char a[4], b[4];
            snprintf(a, sizeof a, "%s", suf[i]);
            snprintf(b, sizeof b, "%siB", suf[i]);
            if (strcasecmp(end, a) == 0 || strcasecmp(end, b) == 0) {
                mult = 1ULL << (10 * (i + 1));
                found = 1;
            }
        }
        if (!found)
            return -1;
    }
    if (v > (unsigned long long)LLONG_MAX / mult)
        return -1;
    *out = (long long)(v * mult);
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
        *out = 1;
    else if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") || !*s)
        *out = 0;
    else
        return -1;
    return 0;
}

/* Applies one value from `origin` ("--flag" or "$ENV" or "default") to the row. */
static int apply(const struct opt *o, const char *val, const char *origin, err *e)
{
    switch (o->type) {
    case OPT_STRING:
        *(const char **)o->dst = val;
        return CODE_OK;
    case OPT_BOOL:
        if (parse_bool(val, (int *)o->dst) < 0)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "%s: '%s' is not a boolean (use 1/0, true/false, yes/no)", origin, val);
        return CODE_OK;
    case OPT_INT:
    case OPT_BYTES: {
        long long v;
        if (o->type == OPT_BYTES) {
            if (opt_parse_bytes(val, &v) < 0)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "%s: '%s' is not a byte count (examples: 1048576, 512M, 16GiB)",
                               origin, val);
        } else if (opt_parse_int(val, LLONG_MIN, LLONG_MAX, &v) < 0) {
            return err_set(e, CODE_INVALID_ARGUMENT, "%s: '%s' is not an integer", origin, val);
        }
        if (v < o->min || v > o->max)
            return err_set(e, CODE_INVALID_ARGUMENT, "%s: %s is out of range (%lld..%lld)",
                           origin, val, o->min, o->max);
        *(long long *)o->dst = v;
        return CODE_OK;
    }
    }
    return err_set(e, CODE_INTERNAL, "%s: unknown option type", origin);
}

/* Writes text for roff: backslashes escaped, every '-' a minus (flags, ranges),
 * a line never starting with a control character. */
static void roff_text(const char *t)
{
    int bol = 1;
    for (; *t; t++) {
        if (bol && (*t == '.' || *t == '\''))
            fputs("\\&", stdout);
        bol = *t == '\n';
        if (*t == '\\')
            fputs("\\e", stdout);
        else if (*t == '-')
            fputs("\\-", stdout);
        else
            putchar(*t);
    }
}

static void opt_usage_man(const struct opt *t, size_t n, const char *usage, const char *about)
{
    char flag[96];

    if (!man_started) {
        man_started = 1;
        printf(".TH ");
        roff_text(man_name);
        printf(" %d \"\" \"tpuemu %s\" \"tpuemu\"\n.nh\n.ad l\n.SH NAME\n", man_section, TPUEMU_VERSION);
        roff_text(man_name);
        printf(" \\- ");
        roff_text(man_summary);
        printf("\n.SH SYNOPSIS\n.B ");
        roff_text(usage);
        printf("\n.SH DESCRIPTION\n");
        roff_text(about ? about : "");
        printf("\n.SH OPTIONS\n");
    } else {
        printf(".SS \"");
        roff_text(usage);
        printf("\"\n");
        if (about) {
            roff_text(about);
            printf("\n");
        }
    }
    for (size_t i = 0; i < n; i++) {
        printf(".TP\n\\fB\\-\\-");
        roff_text(t[i].name);
        printf("\\fR");
        if (t[i].type != OPT_BOOL) {
            printf(" \\fI");
            roff_text(t[i].metavar ? t[i].metavar : "VALUE");
            printf("\\fR");
        }
        printf("\n");
        roff_text(t[i].help);
        if (t[i].defval && t[i].type != OPT_BOOL) {
            printf(" (default ");
            roff_text(t[i].defval);
            printf(")");
        }
        if (t[i].env) {
            snprintf(flag, sizeof flag, " [$%s]", t[i].env);
            roff_text(flag);
        }
        printf("\n");
    }
    if (man_started == 1) {
        man_started = 2;
        printf(".TP\n.B \\-\\-help\nprint the help and exit\n");
        printf(".TP\n.B \\-\\-help\\-man\nprint the help as this manual page (roff) and exit\n");
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            if (!t[i].env)
                continue;
            if (!any++)
                printf(".SH ENVIRONMENT\nEach of these sets the option named; a flag on the command line "
                       "takes precedence, and a value that is not valid is refused at start.\n");
            printf(".TP\n.B ");
            roff_text(t[i].env);
            printf("\n\\-\\-");
            roff_text(t[i].name);
            printf("\n");
        }
    }
}

void opt_usage(const struct opt *t, size_t n, const char *usage, const char *about)
{
    if (man_mode) {
        opt_usage_man(t, n, usage, about);
        return;
    }
    printf("usage: %s\n", usage);
    if (about)
        printf("\n%s\n", about);
    printf("\noptions (each also read from the environment variable shown):\n");
    for (size_t i = 0; i < n; i++) {
        char flag[96];
        if (t[i].type == OPT_BOOL)
            snprintf(flag, sizeof flag, "--%s", t[i].name);
        else
            snprintf(flag, sizeof flag, "--%s %s", t[i].name, t[i].metavar ? t[i].metavar : "VALUE");
        printf("  %-28s %s", flag, t[i].help);
        if (t[i].defval && t[i].type != OPT_BOOL)
            printf(" (default %s)", t[i].defval);
        if (t[i].env)
            printf(" [$%s]", t[i].env);
        printf("\n");
    }
    printf("  %-28s %s\n", "--help", "print this help and exit");
    printf("  %-28s %s\n", "--help-man", "print this help as a manual page (roff) and exit");
}

void opt_man_page(const char *name, int section, const char *summary)
{
    man_name = name;
    man_section = section;
    man_summary = summary;
}

int opt_man_mode(void)
{
    return man_mode;
}

void opt_man_section(const char *title, const char *text)
{
    if (!man_mode)
        return;
    printf(".SH ");
    roff_text(title);
    printf("\n");
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        if (!*line)
            printf(".PP\n");
        else if (line[0] == ' ' && line[1] == ' ') {
            printf(".RS 4\n.nf\n");
            roff_text(line + 2);
            printf("\n.fi\n.RE\n");
        } else {
            roff_text(line);
            printf("\n");
        }
        p += len + (nl ? 1 : 0);
    }
}

void opt_man_item(const char *tag, const char *text)
{
    if (!man_mode)
        return;
    printf(".TP\n.B ");
    roff_text(tag);
    printf("\n");
    roff_text(text);
    printf("\n");
}

int opt_parse(const struct opt *t, size_t n, int argc, char **argv, int *first_arg, err *e)
{
    int i, rc;
    char origin[128];

    /* defaults, then the environment */
    for (size_t k = 0; k < n; k++) {
        if (t[k].type == OPT_BOOL)
            *(int *)t[k].dst = 0;
        if (t[k].defval && (rc = apply(&t[k], t[k].defval, "default", e)) != CODE_OK)
            return rc;
        const char *ev = t[k].env ? getenv(t[k].env) : NULL;
        if (ev) {
            snprintf(origin, sizeof origin, "$%s", t[k].env);
            if ((rc = apply(&t[k], ev, origin, e)) != CODE_OK)
                return rc;
        }
    }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        size_t len;
        const struct opt *o = NULL;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strncmp(a, "--", 2) != 0)
            break; /* first positional */
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return CODE_CANCELLED;
        if (strcmp(a, "--help-man") == 0) {
            man_mode = 1;
            return CODE_CANCELLED;
        }
        a += 2;
        len = strcspn(a, "=");
        for (size_t k = 0; k < n; k++)
            if (strlen(t[k].name) == len && strncmp(t[k].name, a, len) == 0)
                o = &t[k];
        if (!o)
            return err_set(e, CODE_INVALID_ARGUMENT, "unknown option '--%.*s' (see --help)", (int)len, a);
        snprintf(origin, sizeof origin, "--%s", o->name);
        if (a[len] == '=') {
            val = a + len + 1;
        } else if (o->type == OPT_BOOL) {
            val = "1";
        } else {
            if (i + 1 >= argc)
                return err_set(e, CODE_INVALID_ARGUMENT, "--%s needs a value (%s)", o->name,
                               o->metavar ? o->metavar : "VALUE");
            val = argv[++i];
        }
        if ((rc = apply(o, val, origin, e)) != CODE_OK)
            return rc;
    }
    *first_arg = i;
    return CODE_OK;
}
