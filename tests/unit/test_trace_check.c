/* Unit tests of the trace-event file checker (tests/support/trace_check.h) and
 * its JSON parser: a valid trace plain and gzip with its stats, each kind of
 * violation named in the message, and damaged JSON and gzip files. Every file
 * is written here, in a fresh temporary directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <zlib.h>

#include "json.h"
#include "trace_check.h"

static char dir[64];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_trace_check.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(trace, .init = mkdir_tmp, .fini = rm_tmp);
TestSuite(json, .init = mkdir_tmp, .fini = rm_tmp);

static const char *write_file(const char *name, const char *text, int gz)
{
    static char p[160];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, text, (unsigned)strlen(text)), (int)strlen(text));
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(p, "w");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
        cr_assert_eq(fclose(f), 0);
    }
    return p;
}

/* Names for pid 1 (threads 1, 2) and pid 2 (thread 1). */
#define NAMES                                                                           \
    "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,\"args\":{\"name\":\"host0\"}},"  \
    "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":2,\"args\":{\"name\":\"host1\"}},"  \
    "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":2,\"args\":{\"sort_index\":1}}," \
    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"core0\"}}," \
    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"core1\"}}," \
    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":2,\"tid\":1,\"args\":{\"name\":\"core0\"}},"

#define X(name, pid, tid, ts, dur)                                                      \
    "{\"ph\":\"X\",\"name\":\"" name "\",\"cat\":\"step\",\"pid\":" #pid ",\"tid\":" #tid \
    ",\"ts\":" #ts ",\"dur\":" #dur "}"

static const char *VALID =
    "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"version\":\"tpuemu\"},\"traceEvents\":["
    NAMES
    X("step", 1, 1, 10, 100) ","
    X("matmul", 1, 1, 20, 30) ","
    X("matmul", 1, 1, 50, 60) "," /* ends exactly with its parent */
    X("allreduce", 1, 2, 26.5, 0.25) ","
    "{\"ph\":\"B\",\"name\":\"recv\",\"pid\":2,\"tid\":1,\"ts\":15},"
    "{\"ph\":\"B\",\"name\":\"copy\",\"pid\":2,\"tid\":1,\"ts\":16},"
    "{\"ph\":\"E\",\"pid\":2,\"tid\":1,\"ts\":17},"
    "{\"ph\":\"E\",\"name\":\"recv\",\"pid\":2,\"tid\":1,\"ts\":40.0004},"
    "{\"ph\":\"s\",\"name\":\"grad\",\"cat\":\"flow\",\"id\":7,\"pid\":1,\"tid\":1,\"ts\":25},"
    "{\"ph\":\"t\",\"name\":\"grad\",\"cat\":\"flow\",\"id\":7,\"pid\":1,\"tid\":2,\"ts\":26.6},"
    "{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"grad\",\"cat\":\"flow\",\"id\":7,\"pid\":2,\"tid\":1,"
    "\"ts\":30},"
    "{\"ph\":\"s\",\"name\":\"x\",\"id\":\"0x1\",\"pid\":1,\"tid\":1,\"ts\":60},"
    "{\"ph\":\"f\",\"name\":\"x\",\"id\":\"0x1\",\"pid\":1,\"tid\":1,\"ts\":108},"
    "{\"ph\":\"i\",\"name\":\"mark \\u00e9\\ud83d\\ude00\",\"s\":\"g\",\"pid\":2,\"tid\":3,"
    "\"ts\":200,\"args\":{}},"
    "{\"ph\":\"C\",\"name\":\"hbm\",\"pid\":1,\"ts\":0,\"tid\":9,\"args\":{\"used\":3}}"
    "],\"metadata\":{}}";

static void check_valid(int gz)
{
    char why[512];
    struct trace_check_stats st;
    const char *p = write_file(gz ? "valid.json.gz" : "valid.json", VALID, gz);
    cr_assert_eq(trace_check_file(p, why, sizeof why, &st), 0, "%s", why);
    cr_assert_eq(st.events, 21);
    cr_assert_eq(st.slices, 4);
    cr_assert_eq(st.flows, 2);
    cr_assert_eq(st.processes, 2);
    cr_assert_eq(st.threads, 5, "(1,1) (1,2) (1,9) (2,1) (2,3)");
    cr_assert_float_eq(st.ts_min, 0, 1e-12);
    cr_assert_float_eq(st.ts_max, 200, 1e-12);
}

Test(trace, valid_plain_passes_with_stats) { check_valid(0); }
Test(trace, valid_gzip_passes_with_stats) { check_valid(1); }

Test(trace, stats_may_be_null)
{
    char why[512];
    const char *p = write_file("v.json", VALID, 0);
    cr_assert_eq(trace_check_file(p, why, sizeof why, NULL), 0, "%s", why);
}

/* Expects the events to fail with a message containing each of the needles. */
static void rejects(const char *events, const char *n1, const char *n2, int gz)
{
    char text[8192], why[512];
    struct trace_check_stats st;
    snprintf(text, sizeof text, "{\"traceEvents\":[" NAMES "%s]}", events);
    const char *p = write_file(gz ? "bad.json.gz" : "bad.json", text, gz);
    cr_assert_eq(trace_check_file(p, why, sizeof why, &st), -1, "accepted: %s", events);
    cr_assert_not_null(strstr(why, n1), "\"%s\" not in: %s", n1, why);
    if (n2)
        cr_assert_not_null(strstr(why, n2), "\"%s\" not in: %s", n2, why);
    cr_assert_eq(st.events, 0, "stats cleared on failure");
}

Test(trace, partial_overlap_on_a_thread)
{
    rejects(X("a", 1, 1, 10, 10) "," X("b", 1, 1, 15, 10), "partially overlaps", "event 7", 0);
    /* the same intervals on two threads are fine */
    char why[512];
    const char *p = write_file("ok.json", "{\"traceEvents\":[" NAMES X("a", 1, 1, 10, 10) ","
                                          X("b", 1, 2, 15, 10) "]}", 0);
    cr_assert_eq(trace_check_file(p, why, sizeof why, NULL), 0, "%s", why);
}

Test(trace, overlap_within_tolerance_is_allowed)
{
    char why[512];
    const char *p = write_file("ok.json", "{\"traceEvents\":[" NAMES X("a", 1, 1, 10, 10) ","
                                          X("b", 1, 1, 19.9995, 5) ","
                                          X("c", 1, 1, 9.9995, 3) "]}", 0);
    cr_assert_eq(trace_check_file(p, why, sizeof why, NULL), 0, "%s", why);
}

Test(trace, begin_end_unbalanced)
{
    rejects("{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1}", "never closed",
            "event 6", 0);
    rejects("{\"ph\":\"E\",\"pid\":1,\"tid\":1,\"ts\":1}", "no open B", "event 6", 0);
    rejects("{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1},"
            "{\"ph\":\"B\",\"name\":\"b\",\"pid\":1,\"tid\":1,\"ts\":2},"
            "{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":3},"
            "{\"ph\":\"E\",\"name\":\"b\",\"pid\":1,\"tid\":1,\"ts\":4}",
            "does not match the innermost open B \"b\"", "event 8", 0);
    /* a B/E pair crossing an X slice */
    rejects("{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1},"
            "{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":5}," X("x", 1, 1, 3, 5),
            "partially overlaps", NULL, 0);
}

#define FLOW(ph, id, tid, ts)                                                           \
    "{\"ph\":\"" ph "\",\"name\":\"g\",\"cat\":\"c\",\"id\":" id ",\"pid\":1,\"tid\":" #tid \
    ",\"ts\":" #ts "}"

Test(trace, flow_with_two_starts)
{
    rejects(X("a", 1, 1, 0, 100) "," FLOW("s", "3", 1, 10) "," FLOW("s", "3", 1, 20) ","
            FLOW("f", "3", 1, 30),
            "flow id 3 has two starts", "event 8", 0);
}

Test(trace, flow_end_before_start)
{
    rejects(X("a", 1, 1, 0, 100) "," FLOW("s", "\"q\"", 1, 50) "," FLOW("f", "\"q\"", 1, 40),
            "flow id \"q\"", "before its start", 0);
}

Test(trace, flow_without_start)
{
    rejects(X("a", 1, 1, 0, 100) "," FLOW("f", "4", 1, 40), "flow id 4 has no start", NULL, 0);
}

Test(trace, flow_ids_differ_by_cat)
{
    rejects(X("a", 1, 1, 0, 100) "," FLOW("s", "5", 1, 10) ","
            "{\"ph\":\"f\",\"cat\":\"other\",\"name\":\"g\",\"id\":5,\"pid\":1,\"tid\":1,"
            "\"ts\":20}",
            "flow id 5 has no start", "event 8", 0);
}

Test(trace, dangling_flow_outside_any_slice)
{
    rejects(X("a", 1, 1, 0, 10) "," FLOW("s", "9", 1, 5) ","
            "{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"g\",\"cat\":\"c\",\"id\":9,\"pid\":1,"
            "\"tid\":2,\"ts\":20}",
            "flow id 9 is dangling", "outside any slice on pid 1 tid 2", 0);
    rejects(X("a", 1, 1, 0, 10) "," FLOW("s", "9", 1, 50) "," FLOW("f", "9", 1, 60),
            "flow id 9 is dangling", "event 7", 0);
}

Test(trace, missing_ph)
{
    rejects("{\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1}", "event 6: missing \"ph\"", NULL, 0);
}

Test(trace, negative_dur)
{
    rejects(X("a", 1, 1, 0, -1), "event 6", "negative", 0);
    rejects("{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1}", "without \"dur\"",
            NULL, 0);
}

Test(trace, unknown_phase)
{
    rejects("{\"ph\":\"Q\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1}",
            "event 6: unknown phase \"ph\":\"Q\"", NULL, 0);
    rejects("{\"ph\":\"XX\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1}", "unknown phase", NULL,
            0);
}

Test(trace, missing_thread_name)
{
    rejects(X("a", 1, 7, 0, 1), "pid 1 tid 7 has slices but no thread_name",
            "this project requires", 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":5,\"tid\":1,\"ts\":1}",
            "pid 5 has no process_name", "this project requires", 0);
}

Test(trace, event_fields)
{
    rejects("{\"ph\":\"i\",\"pid\":1,\"tid\":1,\"ts\":1}", "missing \"name\"", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":1.5,\"tid\":1,\"ts\":1}",
            "\"pid\" is not an integer", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":1,\"ts\":1}", "missing \"tid\"", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":-1}", "\"ts\"", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":1,\"tid\":1}", "missing \"ts\"", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1,\"args\":[]}",
            "\"args\" is not an object", NULL, 0);
    rejects("{\"ph\":\"i\",\"name\":\"a\",\"cat\":3,\"pid\":1,\"tid\":1,\"ts\":1}",
            "\"cat\" is not a string", NULL, 0);
    rejects("{\"ph\":\"M\",\"name\":\"thread_color\",\"pid\":1,\"tid\":1,\"args\":{}}",
            "unknown metadata", NULL, 0);
    rejects("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{}}",
            "thread_name needs args.name", NULL, 0);
    rejects("{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":1,\"tid\":1,"
            "\"args\":{\"sort_index\":\"1\"}}",
            "args.sort_index (an integer)", NULL, 0);
    rejects("[]", "event 6: not an object", NULL, 1);
}

static void rejects_file(const char *text, const char *needle, int gz)
{
    char why[512];
    const char *p = write_file("t.json", text, gz);
    cr_assert_eq(trace_check_file(p, why, sizeof why, NULL), -1, "accepted: %s", text);
    cr_assert_not_null(strstr(why, needle), "\"%s\" not in: %s", needle, why);
}

Test(trace, top_level)
{
    rejects_file("[]", "not an object", 0);
    rejects_file("{}", "no \"traceEvents\"", 0);
    rejects_file("{\"traceEvents\":{}}", "not an array", 0);
    rejects_file("{\"traceEvents\":[],\"displayTimeUnit\":\"s\"}", "displayTimeUnit", 0);
    rejects_file("{\"traceEvents\":[],\"metadata\":[]}", "\"metadata\"", 0);
    rejects_file("{\"traceEvents\":[],\"otherData\":1}", "\"otherData\"", 0);
}

Test(trace, trailing_comma_json)
{
    rejects_file("{\"traceEvents\":[" NAMES "]}", "trailing comma", 0);
    rejects_file("{\"traceEvents\":[],}", "trailing comma", 1);
}

Test(trace, bad_u_escape)
{
    rejects_file("{\"traceEvents\":[],\"otherData\":{\"a\":\"\\u12G4\"}}", "bad \\u escape", 0);
    rejects_file("{\"traceEvents\":[],\"otherData\":{\"a\":\"\\ud800x\"}}", "surrogate", 0);
    rejects_file("{\"traceEvents\":[],\"otherData\":{\"a\":\"\\udc00\"}}", "lone low surrogate",
                 0);
}

Test(trace, truncated_gzip)
{
    char why[512];
    const char *p = write_file("t.json.gz", VALID, 1);
    char path[160];
    snprintf(path, sizeof path, "%s", p);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(n, 40);
    f = fopen(path, "wb");
    cr_assert_eq(fwrite(buf, 1, n / 2, f), n / 2);
    fclose(f);
    cr_assert_eq(trace_check_file(path, why, sizeof why, NULL), -1);
    cr_assert_not_null(strstr(why, "truncated gzip"), "%s", why);
    /* only the 8-byte trailer missing */
    f = fopen(path, "wb");
    cr_assert_eq(fwrite(buf, 1, n - 4, f), n - 4);
    fclose(f);
    cr_assert_eq(trace_check_file(path, why, sizeof why, NULL), -1);
    cr_assert_not_null(strstr(why, "truncated gzip"), "%s", why);
}

Test(trace, missing_file)
{
    char why[512], path[160];
    snprintf(path, sizeof path, "%s/none.json", dir);
    cr_assert_eq(trace_check_file(path, why, sizeof why, NULL), -1);
    cr_assert_not_null(strstr(why, "none.json"), "%s", why);
}

static void json_bad(const char *text, const char *needle)
{
    char err[256];
    json *v = json_parse(text, strlen(text), err, sizeof err);
    cr_assert_null(v, "accepted: %s", text);
    cr_assert_not_null(strstr(err, needle), "\"%s\" not in: %s (for %s)", needle, err, text);
}

Test(json, rejects_what_rfc8259_rejects)
{
    json_bad("[1,2,]", "trailing comma");
    json_bad("{\"a\":1,}", "trailing comma");
    json_bad("[01]", "leading zero");
    json_bad("[-01]", "leading zero");
    json_bad("[1.]", "after '.'");
    json_bad("[1e]", "exponent");
    json_bad("[.5]", "unexpected");
    json_bad("[+1]", "unexpected");
    json_bad("[\"a\tb\"]", "control character");
    json_bad("[\"\\x\"]", "bad escape");
    json_bad("[\"\\u00\"]", "bad \\u escape");
    json_bad("[\"\xff\"]", "UTF-8");
    json_bad("[\"\xc0\xaf\"]", "UTF-8");
    json_bad("{} x", "trailing garbage");
    json_bad("{}{}", "trailing garbage");
    json_bad("[1 2]", "expected ','");
    json_bad("{\"a\" 1}", "':'");
    json_bad("{1:2}", "string key");
    json_bad("[tru]", "unexpected");
    json_bad("[\"abc", "unterminated");
    json_bad("[1,", "end of input");
    json_bad("", "end of input");
    json_bad("{\"a\":1,\"a\":2}", "duplicate key");
    json_bad("\n\n  [1,]", "line 3 col 6");
}

Test(json, depth_limit)
{
    char deep[200];
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    deep[128] = '\0';
    json *v = json_parse(deep, 128, NULL, 0);
    cr_assert_not_null(v, "64 levels are allowed");
    json_free(v);
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = '\0';
    json_bad(deep, "nested deeper than 64");
}

Test(json, tree_and_lookups)
{
    const char *t = " {\"a\":[1,-2.5e1,\"x\\n\\u00e9\\ud83d\\ude00\",true,false,null],"
                    "\"b\":{\"c\":9007199254740993},\"z\\u0000\":0} ";
    char err[256];
    json *v = json_parse(t, strlen(t), err, sizeof err);
    cr_assert_not_null(v, "%s", err);
    cr_assert(json_is(v, JSON_OBJECT));
    cr_assert_eq(json_len(v), 3);
    const json *a = json_get(v, "a");
    cr_assert_eq(json_len(a), 6);
    long long i;
    double d;
    cr_assert_eq(json_int(json_at(a, 0), &i), 0);
    cr_assert_eq(i, 1);
    cr_assert_eq(json_int(json_at(a, 1), &i), -1, "not an integer");
    cr_assert_eq(json_num(json_at(a, 1), &d), 0);
    cr_assert_float_eq(d, -25.0, 1e-12);
    cr_assert_str_eq(json_str(json_at(a, 2)), "x\n\xc3\xa9\xf0\x9f\x98\x80");
    cr_assert(json_is(json_at(a, 3), JSON_TRUE));
    cr_assert(json_is(json_at(a, 4), JSON_FALSE));
    cr_assert(json_is(json_at(a, 5), JSON_NULL));
    cr_assert_null(json_at(a, 6));
    cr_assert_eq(json_int(json_get(json_get(v, "b"), "c"), &i), 0);
    cr_assert_eq(i, 9007199254740993LL, "integers kept exactly");
    cr_assert_null(json_get(v, "z"), "key with a NUL is not \"z\"");
    cr_assert_eq(json_get(v, "a")->type, JSON_ARRAY);
    cr_assert_null(json_get(a, "a"), "json_get on an array");
    cr_assert_null(json_str(a));
    json_free(v);
    cr_assert(json_is_object("{\"a\":[]}"));
    cr_assert(!json_is_object("[]"));
    cr_assert(!json_is_object("{\"a\":[],}"));
}

Test(json, files_plain_and_gzip)
{
    char err[256];
    for (int gz = 0; gz <= 1; gz++) {
        const char *p = write_file(gz ? "f.json.gz" : "f.json", "{\"k\":\"v\"}", gz);
        json *v = json_parse_file(p, err, sizeof err);
        cr_assert_not_null(v, "%s", err);
        cr_assert_str_eq(json_str(json_get(v, "k")), "v");
        json_free(v);
    }
}
