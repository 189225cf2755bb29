/* A strict, small XML 1.0 parser for the tests: the profiler's SVG pictures
 * read back into a tree. Well-formedness only (no DTD, no namespaces beyond
 * keeping xmlns as an attribute): one root element, tags balanced and
 * matching, attribute values quoted and unique per element, no '<' in them,
 * only the five predefined entities and character references, comments and
 * an XML declaration / processing instructions where they may be. */
#ifndef TPUEMU_TESTS_XML_H
#define TPUEMU_TESTS_XML_H

#include <stddef.h>

typedef struct xml xml;
struct xml {
    char *name;          /* the element's tag */
    size_t nattr;
    char **keys, **vals; /* its attributes, values decoded */
    size_t n;
    xml **kids;          /* its child elements, in order */
    char *text;          /* its character data, decoded and concatenated ("" when none) */
};

/* The root element of s[0..n), or NULL with "line L: what" in err. */
xml *xml_parse(const char *s, size_t n, char *err, size_t errn);
/* Reads and parses a file. */
xml *xml_parse_file(const char *path, char *err, size_t errn);
void xml_free(xml *x);

/* The value of attribute key of x, or NULL. */
const char *xml_attr(const xml *x, const char *key);
/* Calls fn on x and every element under it, depth first, in document order;
 * stops and returns fn's value when it is not 0. */
int xml_walk(const xml *x, int (*fn)(const xml *e, void *user), void *user);

#endif
