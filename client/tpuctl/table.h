/* Plain-text tables for tpuctl: add cells row by row, print with every column
 * as wide as its widest cell, two spaces apart. */
#ifndef TPUCTL_TABLE_H
#define TPUCTL_TABLE_H

#include <stddef.h>
#include <stdio.h>

#define TABLE_MAX_COLS 16

typedef struct table {
    size_t ncols;
    size_t ncells, cap;
    char **cells; /* row-major, the header first */
} table;

/* headers: ncols strings. Exits the program when out of memory (a CLI). */
void table_init(table *t, size_t ncols, const char *const *headers);
void table_cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void table_print(const table *t, FILE *f);
void table_free(table *t);

#endif
