/* Column-aligned text tables. */
#include "table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void push(table *t, char *s)
{
    if (!s) {
        fprintf(stderr, "tpuctl: out of memory\n");
        exit(1);
    }
    if (t->ncells == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **c = realloc(t->cells, cap * sizeof *c);
        if (!c) {
            fprintf(stderr, "tpuctl: out of memory\n");
            exit(1);
        }
        t->cells = c;
        t->cap = cap;
    }
    t->cells[t->ncells++] = s;
}

void table_init(table *t, size_t ncols, const char *const *headers)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols < TABLE_MAX_COLS ? ncols : TABLE_MAX_COLS;
    for (size_t i = 0; i < t->ncols; i++)
        push(t, strdup(headers[i]));
}

void table_cell(table *t, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    push(t, s);
}

void table_print(const table *t, FILE *f)
{
    size_t w[TABLE_MAX_COLS] = {0};
    for (size_t i = 0; i < t->ncells; i++) {
        size_t l = strlen(t->cells[i]);
        if (l > w[i % t->ncols])
            w[i % t->ncols] = l;
    }
    for (size_t i = 0; i < t->ncells; i++) {
        size_t col = i % t->ncols;
        if (col + 1 == t->ncols || i + 1 == t->ncells)
            fprintf(f, "%s\n", t->cells[i]);
        else
            fprintf(f, "%-*s  ", (int)w[col], t->cells[i]);
    }
}

void table_free(table *t)
{
    for (size_t i = 0; i < t->ncells; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}
