/* A tiny JSON writer for tpuctl --json: objects, arrays, strings escaped
 * properly, numbers, booleans. Keys are given with each value (NULL inside
 * arrays). No dependency, no allocation. */
#ifndef TPUCTL_JSON_H
#define TPUCTL_JSON_H

#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

typedef struct json {
    FILE *f;
    int depth;
    int count[JSON_MAX_DEPTH]; /* values written at each level */
    char close[JSON_MAX_DEPTH];
} json;

void json_init(json *j, FILE *f);
void json_obj(json *j, const char *key);
void json_arr(json *j, const char *key);
void json_end(json *j); /* closes the innermost object or array; the last one adds "\n" */
void json_str(json *j, const char *key, const char *s);
void json_int(json *j, const char *key, long long v);
void json_uint(json *j, const char *key, unsigned long long v);
void json_bool(json *j, const char *key, int v);
void json_null(json *j, const char *key);
/* A number with that many significant digits; null if not finite. */
void json_double(json *j, const char *key, double v, int digits);

#endif
