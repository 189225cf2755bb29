/* Recursive-descent JSON parser (RFC 8259), depth-bounded, into a tree;
 * files are read through zlib, so gzip and plain files both work. */
#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

typedef struct parser {
    const char *beg, *p, *end;
    char *err;
    size_t errn;
} parser;

__attribute__((format(printf, 3, 4))) static void fail(parser *ps, const char *at,
                                                       const char *fmt, ...)
{
    if (!ps->err || !ps->errn)
        return;
    int line = 1, col = 1;
    for (const char *q = ps->beg; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int k = snprintf(ps->err, ps->errn, "line %d col %d: ", line, col);
    if (k < 0 || (size_t)k >= ps->errn)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->errn - (size_t)k, fmt, ap);
    va_end(ap);
}

static void ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int peek(const parser *ps)
{
    return ps->p < ps->end ? (unsigned char)*ps->p : -1;
}

static json *node(json_type t)
{
    json *v = calloc(1, sizeof *v);
    if (v)
        v->type = t;
    return v;
}

static int hex4(const char *p, const char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of one well-formed UTF-8 sequence at p (no overlongs, no surrogates,
 * nothing above U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* A string at ps->p (on the opening quote): decoded into *out, *outn. */
static int string(parser *ps, char **out, size_t *outn)
{
    const char *start = ps->p++;
    const char *q = ps->p;
    while (q < ps->end && *q != '"')
        q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) {
        fail(ps, start, "unterminated string");
        return -1;
    }
    char *buf = malloc((size_t)(q - ps->p) + 1), *o = buf;
    if (!buf) {
        fail(ps, start, "out of memory");
        return -1;
    }
    while (ps->p < q) {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) {
            fail(ps, ps->p, "control character 0x%02x in a string (must be escaped)", c);
            goto bad;
        }
        if (c >= 0x80) {
            size_t n = utf8_seq((const unsigned char *)ps->p, (const unsigned char *)q);
            if (!n) {
                fail(ps, ps->p, "invalid UTF-8 in a string");
                goto bad;
            }
            memcpy(o, ps->p, n);
            o += n;
            ps->p += n;
            continue;
        }
        if (c != '\\') {
            *o++ = (char)c;
            ps->p++;
            continue;
        }
        const char *esc = ps->p++;
        char e = *ps->p++;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(ps->p, q, &cp)) {
                fail(ps, esc, "bad \\u escape (needs 4 hex digits)");
                goto bad;
            }
            ps->p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(ps, esc, "bad \\u escape: lone low surrogate \\u%04X", cp);
                goto bad;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' ||
                    hex4(ps->p + 2, q, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    fail(ps, esc, "bad \\u escape: high surrogate \\u%04X without a low one",
                         cp);
                    goto bad;
                }
                ps->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o += put_utf8(o, cp);
            break;
        }
        default:
            fail(ps, esc, "bad escape '\\%c'", e);
            goto bad;
        }
    }
    ps->p = q + 1;
    *o = '\0';
    *out = buf;
    *outn = (size_t)(o - buf);
    return 0;
bad:
    free(buf);
    return -1;
}

static int digit(const parser *ps)
{
    return ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9';
}

static json *number(parser *ps)
{
    const char *s = ps->p;
    int integral = 1;
    if (peek(ps) == '-')
        ps->p++;
    if (peek(ps) == '0') {
        ps->p++;
        if (digit(ps)) {
            fail(ps, s, "number with a leading zero");
            return NULL;
        }
    } else if (digit(ps)) {
        while (digit(ps))
            ps->p++;
    } else {
        fail(ps, s, "unexpected %s", peek(ps) < 0 ? "end of input" : "character");
        return NULL;
    }
    if (peek(ps) == '.') {
        ps->p++;
        integral = 0;
        if (!digit(ps)) {
            fail(ps, s, "number with no digit after '.'");
            return NULL;
        }
        while (digit(ps))
            ps->p++;
    }
    if (peek(ps) == 'e' || peek(ps) == 'E') {
        ps->p++;
        integral = 0;
        if (peek(ps) == '+' || peek(ps) == '-')
            ps->p++;
        if (!digit(ps)) {
            fail(ps, s, "number with no digit in the exponent");
            return NULL;
        }
        while (digit(ps))
            ps->p++;
    }
    size_t n = (size_t)(ps->p - s);
    char small[64], *txt = n < sizeof small ? small : malloc(n + 1);
    json *v = node(JSON_NUMBER);
    if (!txt || !v) {
        if (txt != small)
            free(txt);
        free(v);
        fail(ps, s, "out of memory");
        return NULL;
    }
    memcpy(txt, s, n);
    txt[n] = '\0';
    v->num = strtod(txt, NULL);
    if (integral) {
        errno = 0;
        v->ival = strtoll(txt, NULL, 10);
        v->is_int = errno != ERANGE;
    }
    if (txt != small)
        free(txt);
    return v;
}

static json *value(parser *ps, int depth);

static int push(json *c, json *item, char *key, size_t klen)
{
    if (c->n == 0 || (c->n >= 4 && (c->n & (c->n - 1)) == 0)) { /* 4, 8, 16, ... */
        size_t cap = c->n ? 2 * c->n : 4;
        json **it = realloc(c->items, cap * sizeof *it);
        if (!it)
            return -1;
        c->items = it;
        if (c->type == JSON_OBJECT) {
            char **k = realloc(c->keys, cap * sizeof *k);
            if (!k)
                return -1;
            c->keys = k;
            size_t *kl = realloc(c->klen, cap * sizeof *kl);
            if (!kl)
                return -1;
            c->klen = kl;
        }
    }
    c->items[c->n] = item;
    if (c->type == JSON_OBJECT) {
        c->keys[c->n] = key;
        c->klen[c->n] = klen;
    }
    c->n++;
    return 0;
}

static json *container(parser *ps, int depth)
{
    const char *open_at = ps->p;
    int obj = *ps->p == '{';
    char close = obj ? '}' : ']';
    if (depth >= JSON_MAX_DEPTH) {
        fail(ps, open_at, "nested deeper than %d", JSON_MAX_DEPTH);
        return NULL;
    }
    ps->p++;
    json *c = node(obj ? JSON_OBJECT : JSON_ARRAY);
    if (!c) {
        fail(ps, open_at, "out of memory");
        return NULL;
    }
    ws(ps);
    if (peek(ps) == close) {
        ps->p++;
        return c;
    }
    for (;;) {
        char *key = NULL;
        size_t klen = 0;
        ws(ps);
        if (obj) {
            const char *kat = ps->p;
            if (peek(ps) == close) {
                fail(ps, ps->p, "trailing comma before '%c'", close);
                goto bad;
            }
            if (peek(ps) != '"') {
                fail(ps, ps->p, "expected a string key");
                goto bad;
            }
            if (string(ps, &key, &klen))
                goto bad;
            for (size_t i = 0; i < c->n; i++)
                if (c->klen[i] == klen && !memcmp(c->keys[i], key, klen)) {
                    fail(ps, kat, "duplicate key \"%s\"", key);
                    free(key);
                    goto bad;
                }
            ws(ps);
            if (peek(ps) != ':') {
                fail(ps, ps->p, "expected ':' after a key");
                free(key);
                goto bad;
            }
            ps->p++;
            ws(ps);
        } else if (peek(ps) == close) {
            fail(ps, ps->p, "trailing comma before '%c'", close);
            goto bad;
        }
        json *item = value(ps, depth + 1);
        if (!item) {
            free(key);
            goto bad;
        }
        if (push(c, item, key, klen)) {
            json_free(item);
            free(key);
            fail(ps, ps->p, "out of memory");
            goto bad;
        }
        ws(ps);
        if (peek(ps) == close) {
            ps->p++;
            return c;
        }
        if (peek(ps) != ',') {
            if (peek(ps) < 0)
                fail(ps, ps->p, "unexpected end of input (unclosed '%c')", obj ? '{' : '[');
            else
                fail(ps, ps->p, "expected ',' or '%c'", close);
            goto bad;
        }
        ps->p++;
    }
bad:
    json_free(c);
    return NULL;
}

static json *literal(parser *ps, const char *word, json_type t)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) {
        fail(ps, ps->p, "unexpected character");
        return NULL;
    }
    ps->p += n;
    json *v = node(t);
    if (!v)
        fail(ps, ps->p, "out of memory");
    return v;
}

static json *value(parser *ps, int depth)
{
    switch (peek(ps)) {
    case '{':
    case '[':
        return container(ps, depth);
    case '"': {
        json *v = node(JSON_STRING);
        if (!v || string(ps, &v->str, &v->len)) {
            free(v);
            return NULL;
        }
        return v;
    }
    case 't':
        return literal(ps, "true", JSON_TRUE);
    case 'f':
        return literal(ps, "false", JSON_FALSE);
    case 'n':
        return literal(ps, "null", JSON_NULL);
    case -1:
        fail(ps, ps->p, "unexpected end of input");
        return NULL;
    default:
        return number(ps);
    }
}

json *json_parse(const char *s, size_t n, char *err, size_t errn)
{
    parser ps = {s, s, s + n, err, errn};
    if (err && errn)
        err[0] = '\0';
    ws(&ps);
    json *v = value(&ps, 0);
    if (!v)
        return NULL;
    ws(&ps);
    if (ps.p != ps.end) {
        fail(&ps, ps.p, "trailing garbage after the value");
        json_free(v);
        return NULL;
    }
    return v;
}

int json_read_file(const char *path, char **out, size_t *outn, char *err, size_t errn)
{
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(err, errn, "%s: %s", path, errno ? strerror(errno) : "cannot open");
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            snprintf(err, errn, "%s: out of memory", path);
            gzclose_r(gz);
            return -1;
        }
        if (cap - n < (1 << 15)) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                continue;
            }
            buf = b;
            cap *= 2;
        }
        int k = gzread(gz, buf + n, (unsigned)(cap - n - 1));
        if (k < 0)
            break;
        if (k == 0)
            break;
        n += (size_t)k;
    }
    int errnum = Z_OK;
    const char *msg = gzerror(gz, &errnum);
    int crc = gzclose_r(gz);
    if (errnum != Z_OK || crc != Z_OK) {
        if (errnum == Z_BUF_ERROR || crc == Z_BUF_ERROR)
            snprintf(err, errn, "%s: truncated gzip stream (unexpected end of file)", path);
        else
            snprintf(err, errn, "%s: %s", path,
                     errnum == Z_ERRNO ? strerror(errno)
                     : errnum != Z_OK  ? msg
                                       : "damaged gzip stream");
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *outn = n;
    return 0;
}

json *json_parse_file(const char *path, char *err, size_t errn)
{
    char *buf, sub[256];
    size_t n;
    if (json_read_file(path, &buf, &n, err, errn))
        return NULL;
    json *v = json_parse(buf, n, sub, sizeof sub);
    if (!v)
        snprintf(err, errn, "%s: JSON %s", path, sub);
    free(buf);
    return v;
}

void json_free(json *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        json_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->klen);
    free(v->str);
    free(v);
}

const json *json_get(const json *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->n; i++)
        if (obj->klen[i] == kl && !memcmp(obj->keys[i], key, kl))
            return obj->items[i];
    return NULL;
}

size_t json_len(const json *v)
{
    return v && (v->type == JSON_ARRAY || v->type == JSON_OBJECT) ? v->n : 0;
}

const json *json_at(const json *arr, size_t i)
{
    return arr && arr->type == JSON_ARRAY && i < arr->n ? arr->items[i] : NULL;
}

int json_is(const json *v, json_type t)
{
    return v && v->type == t;
}

const char *json_str(const json *v)
{
    return v && v->type == JSON_STRING ? v->str : NULL;
}

int json_num(const json *v, double *out)
{
    if (!v || v->type != JSON_NUMBER)
        return -1;
    *out = v->num;
    return 0;
}

int json_int(const json *v, long long *out)
{
    if (!v || v->type != JSON_NUMBER || !v->is_int)
        return -1;
    *out = v->ival;
    return 0;
}

const char *json_type_name(json_type t)
{
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

int json_is_object(const char *s)
{
    json *v = json_parse(s, strlen(s), NULL, 0);
    int ok = json_is(v, JSON_OBJECT);
    json_free(v);
    return ok;
}
