/* The JSON writer behind tpuctl --json. */
#include "json.h"

#include <math.h>
#include <stdlib.h>

void json_init(json *j, FILE *f)
{
    j->f = f;
    j->depth = 0;
    j->count[0] = 0;
}

static void write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Comma and key before a value. */
static void pre(json *j, const char *key)
{
    if (j->depth > 0 && j->count[j->depth]++ > 0)
        fputc(',', j->f);
    if (key && j->depth > 0 && j->close[j->depth] == '}') {
        write_string(j->f, key);
        fputc(':', j->f);
    }
}

static void begin(json *j, const char *key, char o, char c)
{
    pre(j, key);
    fputc(o, j->f);
    if (j->depth + 1 >= JSON_MAX_DEPTH)
        abort(); /* our own nesting is fixed and shallow */
    j->depth++;
    j->count[j->depth] = 0;
    j->close[j->depth] = c;
}

void json_obj(json *j, const char *key)
{
    begin(j, key, '{', '}');
}

void json_arr(json *j, const char *key)
{
    begin(j, key, '[', ']');
}

void json_end(json *j)
{
    if (j->depth == 0)
        return;
    fputc(j->close[j->depth], j->f);
    j->depth--;
    if (j->depth == 0)
        fputc('\n', j->f);
}

void json_str(json *j, const char *key, const char *s)
{
    pre(j, key);
    write_string(j->f, s);
}

void json_int(json *j, const char *key, long long v)
{
    pre(j, key);
    fprintf(j->f, "%lld", v);
}

void json_uint(json *j, const char *key, unsigned long long v)
{
    pre(j, key);
    fprintf(j->f, "%llu", v);
}

void json_bool(json *j, const char *key, int v)
{
    pre(j, key);
    fputs(v ? "true" : "false", j->f);
}

void json_null(json *j, const char *key)
{
    pre(j, key);
    fputs("null", j->f);
}

void json_double(json *j, const char *key, double v, int digits)
{
    pre(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.*g", digits, v);
    else
        fputs("null", j->f);
}
