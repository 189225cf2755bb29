/* A strict JSON parser (RFC 8259) for the tests: tpuctl --json output, and
 * trace files read back into a tree (plain or gzip). No dependency but zlib. */
#ifndef TPUEMU_TESTS_JSON_H
#define TPUEMU_TESTS_JSON_H

#include <stddef.h>

/* Containers nested deeper than this are rejected. */
#define JSON_MAX_DEPTH 64

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json json;
struct json {
    json_type type;
    double num;     /* JSON_NUMBER (may be +-inf when out of range) */
    int is_int;     /* JSON_NUMBER written without fraction or exponent, fits in ival */
    long long ival; /* JSON_NUMBER when is_int */
    char *str;      /* JSON_STRING: decoded UTF-8, NUL-terminated (may hold \u0000) */
    size_t len;     /* JSON_STRING: bytes in str */
    size_t n;       /* JSON_ARRAY, JSON_OBJECT: number of items */
    json **items;   /* JSON_ARRAY, JSON_OBJECT: the values */
    char **keys;    /* JSON_OBJECT: the keys (decoded, NUL-terminated) */
    size_t *klen;   /* JSON_OBJECT: bytes in each key */
};

/* Parses exactly one JSON value (surrounding whitespace allowed) from s[0..n).
 * Rejects what RFC 8259 rejects (trailing commas, leading zeros, raw control
 * characters and invalid UTF-8 in strings, bad escapes and lone surrogates,
 * trailing garbage), duplicate keys in an object, and nesting deeper than
 * JSON_MAX_DEPTH. NULL on error, with "line L col C: what" in err. */
json *json_parse(const char *s, size_t n, char *err, size_t errn);

/* Reads a whole file, gzip-compressed or not: 0, or -1 (and the reason in err)
 * when it cannot be opened or read, or a gzip stream is damaged or truncated. The
 * caller frees *out; *outn excludes the NUL appended after the data. */
int json_read_file(const char *path, char **out, size_t *outn, char *err, size_t errn);

/* json_read_file then json_parse. */
json *json_parse_file(const char *path, char *err, size_t errn);

void json_free(json *v);

/* Lookups: NULL, 0 or -1 when v is NULL or of another type. */
const json *json_get(const json *obj, const char *key); /* member of an object */
size_t json_len(const json *v);                          /* items of an array or object */
const json *json_at(const json *arr, size_t i);          /* item i of an array */
int json_is(const json *v, json_type t);                 /* 1 if v has type t */
const char *json_str(const json *v);                     /* a string's bytes */
int json_num(const json *v, double *out);                /* 0 and *out for a number */
int json_int(const json *v, long long *out);             /* 0 and *out for an integer */
const char *json_type_name(json_type t);

/* 1 if s is exactly one JSON object (surrounding whitespace allowed). */
int json_is_object(const char *s);

#endif
