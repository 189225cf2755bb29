/* Recursive-descent XML well-formedness parser into a tree (see xml.h). */
#include "xml.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XML_MAX_DEPTH 64

typedef struct xparser {
    const char *beg, *p, *end;
    char *err;
    size_t errn;
    int failed;
} xparser;

__attribute__((format(printf, 2, 3))) static void fail(xparser *ps, const char *fmt, ...)
{
    int line = 1, k;
    va_list ap;
    if (ps->failed++ || !ps->err || !ps->errn)
        return;
    for (const char *q = ps->beg; q < ps->p && q < ps->end; q++)
        line += *q == '\n';
    k = snprintf(ps->err, ps->errn, "line %d: ", line);
    if (k < 0 || (size_t)k >= ps->errn)
        return;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->errn - (size_t)k, fmt, ap);
    va_end(ap);
}

static int at(const xparser *ps, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(ps->end - ps->p) >= n && memcmp(ps->p, lit, n) == 0;
}

static void skip_space(xparser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int name_char(char c, int first)
{
    unsigned char u = (unsigned char)c;
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u == ':' || u >= 0x80)
        return 1;
    return !first && ((u >= '0' && u <= '9') || u == '-' || u == '.');
}

static char *parse_name(xparser *ps)
{
    const char *s = ps->p;
    char *out;
    if (ps->p >= ps->end || !name_char(*ps->p, 1)) {
        fail(ps, "a name expected");
        return NULL;
    }
    while (ps->p < ps->end && name_char(*ps->p, 0))
        ps->p++;
    if (!(out = malloc((size_t)(ps->p - s) + 1)))
        return NULL;
    memcpy(out, s, (size_t)(ps->p - s));
    out[ps->p - s] = '\0';
    return out;
}

/* Appends the decoded character data up to stop (a char that ends it) to
 * *buf; refuses '<' inside attribute values, bad references, control
 * characters. */
static int parse_chars(xparser *ps, char stop, char **buf, size_t *len)
{
    while (ps->p < ps->end && *ps->p != stop) {
        char tmp[4];
        size_t k = 0;
        unsigned char c = (unsigned char)*ps->p;
        if (stop != '<' && c == '<') {
            fail(ps, "'<' in an attribute value");
            return -1;
        }
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            fail(ps, "control character 0x%02x", c);
            return -1;
        }
        if (c == '&') {
            static const char *const ent[5][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"},
                                                   {"&quot;", "\""}, {"&apos;", "'"}};
            int found = 0;
            for (int i = 0; i < 5 && !found; i++)
                if (at(ps, ent[i][0])) {
                    tmp[k++] = ent[i][1][0];
                    ps->p += strlen(ent[i][0]);
                    found = 1;
                }
            if (!found && at(ps, "&#")) {
                char *e;
                int hex = ps->p + 2 < ps->end && ps->p[2] == 'x';
                unsigned long v = strtoul(ps->p + 2 + hex, &e, hex ? 16 : 10);
                if (e == ps->p + 2 + hex || e >= ps->end || *e != ';' || v == 0 || v > 0x7f) {
                    fail(ps, "a character reference this parser does not take (ASCII only)");
                    return -1;
                }
                tmp[k++] = (char)v;
                ps->p = e + 1;
                found = 1;
            }
            if (!found) {
                fail(ps, "'&' that is not a predefined entity or character reference");
                return -1;
            }
        } else {
            tmp[k++] = *ps->p++;
        }
        char *nb = realloc(*buf, *len + k + 1);
        if (!nb)
            return -1;
        memcpy(nb + *len, tmp, k);
        *len += k;
        nb[*len] = '\0';
        *buf = nb;
    }
    return 0;
}

/* Comments, processing instructions and white space between elements. */
static int skip_misc(xparser *ps)
{
    for (;;) {
        skip_space(ps);
        if (at(ps, "<!--")) {
            const char *e = NULL;
            for (const char *q = ps->p + 4; q + 3 <= ps->end; q++)
                if (memcmp(q, "--", 2) == 0) {
                    e = q;
                    break;
                }
            if (!e || e + 3 > ps->end || e[2] != '>') {
                fail(ps, "a comment not closed by -->, or '--' inside one");
                return -1;
            }
            ps->p = e + 3;
        } else if (at(ps, "<?")) {
            const char *q = ps->p + 2;
            while (q + 2 <= ps->end && memcmp(q, "?>", 2) != 0)
                q++;
            if (q + 2 > ps->end) {
                fail(ps, "a processing instruction not closed by ?>");
                return -1;
            }
            ps->p = q + 2;
        } else {
            return 0;
        }
    }
}

static xml *parse_element(xparser *ps, int depth)
{
    xml *x;
    if (depth > XML_MAX_DEPTH) {
        fail(ps, "elements nested deeper than %d", XML_MAX_DEPTH);
        return NULL;
    }
    if (ps->p >= ps->end || *ps->p != '<') {
        fail(ps, "an element expected");
        return NULL;
    }
    ps->p++;
    if (!(x = calloc(1, sizeof *x)) || !(x->text = calloc(1, 1)) || !(x->name = parse_name(ps)))
        goto bad;
    for (;;) {
        const char *before = ps->p;
        skip_space(ps);
        if (at(ps, "/>")) {
            ps->p += 2;
            return x;
        }
        if (at(ps, ">")) {
            ps->p++;
            break;
        }
        if (ps->p == before) {
            fail(ps, "white space, '>' or '/>' expected in <%s>", x->name);
            goto bad;
        }
        char *k = parse_name(ps), *v = NULL;
        size_t vlen = 0;
        char q;
        if (!k)
            goto bad;
        for (size_t i = 0; i < x->nattr; i++)
            if (strcmp(x->keys[i], k) == 0) {
                fail(ps, "attribute %s twice in <%s>", k, x->name);
                free(k);
                goto bad;
            }
        skip_space(ps);
        if (!at(ps, "=")) {
            fail(ps, "'=' expected after attribute %s", k);
            free(k);
            goto bad;
        }
        ps->p++;
        skip_space(ps);
        q = ps->p < ps->end ? *ps->p : 0;
        if (q != '"' && q != '\'') {
            fail(ps, "attribute %s: value not quoted", k);
            free(k);
            goto bad;
        }
        ps->p++;
        if (!(v = calloc(1, 1)) || parse_chars(ps, q, &v, &vlen) < 0 || ps->p >= ps->end) {
            if (!ps->failed)
                fail(ps, "attribute %s: value not closed", k);
            free(k);
            free(v);
            goto bad;
        }
        ps->p++;
        char **nk = realloc(x->keys, (x->nattr + 1) * sizeof *nk);
        if (nk)
            x->keys = nk;
        char **nv = realloc(x->vals, (x->nattr + 1) * sizeof *nv);
        if (nv)
            x->vals = nv;
        if (!nk || !nv) {
            free(k);
            free(v);
            goto bad;
        }
        x->keys[x->nattr] = k;
        x->vals[x->nattr++] = v;
    }
    /* content */
    size_t tlen = 0;
    for (;;) {
        if (parse_chars(ps, '<', &x->text, &tlen) < 0)
            goto bad;
        if (ps->p >= ps->end) {
            fail(ps, "<%s> not closed", x->name);
            goto bad;
        }
        if (at(ps, "</")) {
            ps->p += 2;
            char *n = parse_name(ps);
            int same = n && strcmp(n, x->name) == 0;
            free(n);
            skip_space(ps);
            if (!same || !at(ps, ">")) {
                fail(ps, "<%s> closed by another tag", x->name);
                goto bad;
            }
            ps->p++;
            return x;
        }
        if (at(ps, "<!--") || at(ps, "<?")) {
            if (skip_misc(ps) < 0)
                goto bad;
            continue;
        }
        if (at(ps, "<!")) {
            fail(ps, "CDATA and declarations are not taken");
            goto bad;
        }
        xml *kid = parse_element(ps, depth + 1);
        if (!kid)
            goto bad;
        xml **nk = realloc(x->kids, (x->n + 1) * sizeof *nk);
        if (!nk) {
            xml_free(kid);
            goto bad;
        }
        x->kids = nk;
        x->kids[x->n++] = kid;
    }
bad:
    if (!ps->failed)
        fail(ps, "out of memory");
    xml_free(x);
    return NULL;
}

xml *xml_parse(const char *s, size_t n, char *err, size_t errn)
{
    xparser ps = {s, s, s + n, err, errn, 0};
    xml *root;
    if (skip_misc(&ps) < 0 || !(root = parse_element(&ps, 0)))
        return NULL;
    if (skip_misc(&ps) < 0 || ps.p != ps.end) {
        if (!ps.failed)
            fail(&ps, "content after the root element");
        xml_free(root);
        return NULL;
    }
    return root;
}

xml *xml_parse_file(const char *path, char *err, size_t errn)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0, k;
    xml *x;
    if (!f) {
        snprintf(err, errn, "%s: cannot open", path);
        return NULL;
    }
    do {
        if (n + 65536 > cap) {
            char *nb = realloc(buf, cap = n + 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                snprintf(err, errn, "%s: out of memory", path);
                return NULL;
            }
            buf = nb;
        }
        k = fread(buf + n, 1, cap - n, f);
        n += k;
    } while (k > 0);
    fclose(f);
    x = xml_parse(buf ? buf : "", n, err, errn);
    free(buf);
    return x;
}

void xml_free(xml *x)
{
    if (!x)
        return;
    for (size_t i = 0; i < x->nattr; i++) {
        free(x->keys[i]);
        free(x->vals[i]);
    }
    for (size_t i = 0; i < x->n; i++)
        xml_free(x->kids[i]);
    free(x->keys);
    free(x->vals);
    free(x->kids);
    free(x->name);
    free(x->text);
    free(x);
}

const char *xml_attr(const xml *x, const char *key)
{
    for (size_t i = 0; x && i < x->nattr; i++)
        if (strcmp(x->keys[i], key) == 0)
            return x->vals[i];
    return NULL;
}

int xml_walk(const xml *x, int (*fn)(const xml *e, void *user), void *user)
{
    int rc = fn(x, user);
    for (size_t i = 0; !rc && i < x->n; i++)
        rc = xml_walk(x->kids[i], fn, user);
    return rc;
}
