/* peertab: the peer table every core of a system gets at an initialize. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "peertab.h"
#include "tpuemu.pb-c.h"

static struct peertab *roundtrip(const struct peertab_row *rows, size_t n, size_t *packed)
{
    uint8_t *buf;
    size_t len;
    struct peertab *t;
    err e;

    cr_assert_eq(peertab_pack(rows, n, &buf, &len, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(peertab_open(buf, len, n, &t, &e), CODE_OK, "%s", e.msg);
    free(buf);
    if (packed)
        *packed = len;
    return t;
}

static void expect_rows(const struct peertab *t, const struct peertab_row *rows, size_t n)
{
    char a[PEERTAB_MAX_ADDR + 1];
    cr_assert_eq(peertab_n(t), n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(peertab_host(t, i), rows[i].host ? rows[i].host : "", "replica %zu", i);
        cr_assert_eq(peertab_core(t, i), rows[i].core, "replica %zu", i);
        cr_assert_eq(peertab_incarnation(t, i), rows[i].incarnation, "replica %zu", i);
        cr_assert_str_eq(peertab_data_addr(t, i, a, sizeof a), rows[i].data_addr ? rows[i].data_addr : "",
                         "replica %zu", i);
        cr_assert_str_eq(peertab_control_addr(t, i, a, sizeof a),
                         rows[i].control_addr ? rows[i].control_addr : "", "replica %zu", i);
        cr_assert_str_eq(peertab_shm_name(t, i, a, sizeof a), rows[i].shm_name ? rows[i].shm_name : "",
                         "replica %zu", i);
        cr_assert_eq(peertab_has_shm(t, i), rows[i].shm_name && rows[i].shm_name[0], "replica %zu", i);
        for (size_t j = 0; j < i; j++)
            cr_assert_eq(peertab_host_index(t, i) == peertab_host_index(t, j),
                         strcmp(peertab_host(t, i), peertab_host(t, j)) == 0, "replicas %zu and %zu", i, j);
    }
}

/* Every kind of address and shared-memory name a worker may report comes
 * back byte for byte: ports that are not numbers, leading zeros, IPv6,
 * names, no port at all, empty fields, the usual and unusual socket names. */
Test(peertab, every_field_comes_back_as_it_was)
{
    static const struct peertab_row rows[] = {
        {"h0", 0, "127.0.0.1:20001", "tcp://127.0.0.1:30001", "@tpuemu-00000000000000ab", 0xab},
        {"h0", 1, "127.0.0.1:20002", "tcp://127.0.0.1:30002", "@tpuemu-00000000000000ab", 0xcd},
        {"h1", 0, "[::1]:65535", "tcp://[::1]:1", "", 0xffffffffffffffffull},
        {"h1", 1, "[::1]:65536", "tcp://[::1]:0", "@custom-name", 7},
        {"h2", 7, "worker-3.pod:0080", "tcp://worker-3.pod:", "@x", 8},
        {"h2", -1, "no-port", "tcp://a:b:c", NULL, 9},
        {NULL, 3, NULL, NULL, "", 10},
        {"", 2, ":9", "tcp://:99999", "@tpuemu-000000000000000b", 11},
    };
    size_t n = sizeof rows / sizeof rows[0];
    struct peertab *t = roundtrip(rows, n, NULL);
    expect_rows(t, rows, n);
    cr_assert_eq(peertab_host_index(t, 0), peertab_host_index(t, 1));
    cr_assert_neq(peertab_host_index(t, 0), peertab_host_index(t, 2));
    peertab_free(t);
}

/* A pod's table is small: host ids and address hosts are kept once, and the
 * usual shared-memory name costs nothing. 1,024 cores of 8 per host on
 * loopback: the list of messages it replaces was about 100 bytes a core. */
Test(peertab, a_pod_table_is_a_fifth_of_a_message_list)
{
    enum { N = 1024 };
    struct peertab_row *rows = calloc(N, sizeof *rows);
    char (*host)[16] = calloc(N, sizeof *host), (*data)[32] = calloc(N, sizeof *data),
         (*ctl)[40] = calloc(N, sizeof *ctl), (*shm)[32] = calloc(N, sizeof *shm);
    size_t len;

    for (size_t i = 0; i < N; i++) {
        uint64_t inc = 0x9e3779b97f4a7c15ull * (i + 1);
        snprintf(host[i], sizeof host[i], "h%zu", i / 8);
        snprintf(data[i], sizeof data[i], "127.0.0.1:%zu", 30000 + 2 * i);
        snprintf(ctl[i], sizeof ctl[i], "tcp://127.0.0.1:%zu", 30001 + 2 * i);
        snprintf(shm[i], sizeof shm[i], "@tpuemu-%016" PRIx64, inc);
        rows[i] = (struct peertab_row){host[i], (int)(i % 8), data[i], ctl[i], shm[i], inc};
    }
    struct peertab *t = roundtrip(rows, N, &len);
    expect_rows(t, rows, N);
    cr_assert_lt(len, (size_t)N * 24, "%zu bytes for %d cores", len, N);
    peertab_free(t);
    free(rows), free(host), free(data), free(ctl), free(shm);
}

Test(peertab, the_empty_table)
{
    struct peertab *t = roundtrip(NULL, 0, NULL);
    cr_assert_eq(peertab_n(t), 0);
    peertab_free(t);
}

Test(peertab, a_string_past_the_limits_is_refused_by_name)
{
    char long_host[PEERTAB_MAX_HOST + 2];
    struct peertab_row rows[2] = {{"h0", 0, "127.0.0.1:1", "", "", 1}, {long_host, 0, "127.0.0.1:2", "", "", 2}};
    uint8_t *buf;
    size_t len;
    err e;

    memset(long_host, 'x', sizeof long_host - 1);
    long_host[sizeof long_host - 1] = '\0';
    cr_assert_eq(peertab_pack(rows, 2, &buf, &len, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "replica 1"), "%s", e.msg);
}

/* What a core must refuse, each with a message that says what is wrong. */
static void expect_refused(const Tpuemu__PeerTable *pb, size_t n, const char *why)
{
    size_t len = tpuemu__peer_table__get_packed_size(pb);
    uint8_t *buf = malloc(len ? len : 1);
    struct peertab *t = NULL;
    err e;

    tpuemu__peer_table__pack(pb, buf);
    cr_assert_eq(peertab_open(buf, len, n, &t, &e), CODE_INVALID_ARGUMENT, "accepted: expected '%s'", why);
    cr_assert_null(t);
    cr_assert(strstr(e.msg, why), "'%s' does not say '%s'", e.msg, why);
    free(buf);
}

Test(peertab, a_bad_table_is_refused_and_says_why)
{
    char *strs[] = {"h0", "127.0.0.1", "tcp://127.0.0.1"};
    uint32_t host[] = {0, 0}, dh[] = {1, 1}, dp[] = {1, 2}, ch[] = {2, 2}, cp[] = {3, 4}, shm[] = {0, 1};
    int32_t core[] = {0, 1};
    uint64_t inc[] = {1, 2};
    Tpuemu__PeerTable ok = TPUEMU__PEER_TABLE__INIT, b;
    uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    struct peertab *t = NULL;
    err e;

    ok.n_strs = 3, ok.strs = strs;
    ok.n_host = 2, ok.host = host;
    ok.n_core = 2, ok.core = core;
    ok.n_data_host = 2, ok.data_host = dh;
    ok.n_data_port = 2, ok.data_port = dp;
    ok.n_control_host = 2, ok.control_host = ch;
    ok.n_control_port = 2, ok.control_port = cp;
    ok.n_incarnation = 2, ok.incarnation = inc;
    ok.n_shm = 2, ok.shm = shm;
    {
        size_t len = tpuemu__peer_table__get_packed_size(&ok);
        uint8_t *buf = malloc(len);
        char a[PEERTAB_MAX_ADDR + 1];
        tpuemu__peer_table__pack(&ok, buf);
        cr_assert_eq(peertab_open(buf, len, 2, &t, &e), CODE_OK, "%s", e.msg);
        cr_assert_str_eq(peertab_control_addr(t, 1, a, sizeof a), "tcp://127.0.0.1:4");
        peertab_free(t);
        expect_refused(&ok, 3, "column 'host' has 2 entries for 3 cores");
        free(buf);
    }

    cr_assert_eq(peertab_open(junk, sizeof junk, 2, &t, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "is not a PeerTable"), "%s", e.msg);

    b = ok, b.n_shm = 1;
    expect_refused(&b, 2, "column 'shm' has 1 entries for 2 cores");
    {
        uint32_t bad[] = {0, 3};
        b = ok, b.host = bad;
        expect_refused(&b, 2, "host id of replica 1");
        b = ok, b.data_host = bad;
        expect_refused(&b, 2, "data address of replica 1");
        b = ok, b.control_host = bad;
        expect_refused(&b, 2, "control address of replica 1");
    }
    {
        uint32_t bad[] = {70000, 1};
        b = ok, b.data_port = bad;
        expect_refused(&b, 2, "data address of replica 0");
    }
    {
        uint32_t bad[] = {0, 5}; /* strs[3]: past the strings */
        b = ok, b.shm = bad;
        expect_refused(&b, 2, "shared-memory name of replica 1");
    }
    {
        char big[PEERTAB_MAX_ADDR + 10];
        char *bstrs[] = {"h0", big, "tcp://127.0.0.1"};
        memset(big, 'a', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        b = ok, b.strs = bstrs;
        expect_refused(&b, 2, "data address of replica 0");
        b.host = dh; /* a 264-byte host id */
        expect_refused(&b, 2, "host id of replica 0");
    }
}
