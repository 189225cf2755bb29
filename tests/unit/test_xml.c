/* Unit tests of the tests' XML parser (tests/support/xml.h), which reads the
 * profiler's SVG pictures back: a document with what SVG uses is read into
 * its tree, and each kind of malformed document is refused with a message. */
#include <string.h>

#include <criterion/criterion.h>

#include "xml.h"

static xml *parse(const char *s, char *err, size_t n)
{
    return xml_parse(s, strlen(s), err, n);
}

Test(xml, a_document_and_its_tree)
{
    char err[256] = "";
    const char *doc = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- a picture -->\n"
                      "<svg xmlns=\"http://www.w3.org/2000/svg\" width='10'>\n"
                      "  <g data-core=\"h&amp;0/1\"><rect x=\"1\"/><text>a &lt; b &#65;</text></g>\n"
                      "  <rect/>\n</svg>\n";
    xml *x = parse(doc, err, sizeof err);
    cr_assert_not_null(x, "%s", err);
    cr_assert_str_eq(x->name, "svg");
    cr_assert_str_eq(xml_attr(x, "width"), "10");
    cr_assert_eq(x->n, 2u);
    cr_assert_str_eq(xml_attr(x->kids[0], "data-core"), "h&0/1");
    cr_assert_eq(x->kids[0]->n, 2u);
    cr_assert_str_eq(x->kids[0]->kids[1]->text, "a < b A");
    cr_assert_null(xml_attr(x, "height"));
    xml_free(x);
}

Test(xml, malformed_documents_are_refused)
{
    static const char *const bad[][2] = {
        {"<svg>", "not closed"},
        {"<svg><g></svg>", "closed by another tag"},
        {"<svg a=1/>", "not quoted"},
        {"<svg a=\"1\" a=\"2\"/>", "twice"},
        {"<svg a=\"x<y\"/>", "'<' in an attribute"},
        {"<svg>&nbsp;</svg>", "predefined entity"},
        {"<svg/><svg/>", "after the root"},
        {"<svg/>trailing", "after the root"},
        {"", "an element expected"},
        {"<svg a=\"1\"b=\"2\"/>", "white space"},
        {"<svg><!-- a -- b --></svg>", "comment"},
        {"<svg>\x01</svg>", "control character"},
        {"<svg a=\"1/>", "not closed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        xml *x = parse(bad[i][0], err, sizeof err);
        cr_assert_null(x, "accepted: %s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]) != NULL, "%s: the message \"%s\" does not say \"%s\"", bad[i][0], err,
                  bad[i][1]);
    }
}
