/* Unit tests of common/base/addr: HOST:PORT, grpc://, [::1]:p, lists, bad ones. */
#include <string.h>

#include <criterion/criterion.h>

#include "addr.h"

Test(addr, host_port)
{
    addr a;
    err e;
    cr_assert_eq(addr_parse("10.0.0.2:9000", 8470, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "10.0.0.2");
    cr_assert_eq(a.port, 9000);
}

Test(addr, default_port)
{
    addr a;
    err e;
    cr_assert_eq(addr_parse("tpu-host", ADDR_DEFAULT_PORT, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "tpu-host");
    cr_assert_eq(a.port, 8470);
}

Test(addr, schemes)
{
    addr a;
    err e;
    cr_assert_eq(addr_parse("grpc://h1:8471", 8470, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "h1");
    cr_assert_eq(a.port, 8471);
    cr_assert_eq(addr_parse("tcp://127.0.0.1:5", 8470, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "127.0.0.1");
    cr_assert_eq(a.port, 5);
    cr_assert_eq(addr_parse("http://h1:80", 8470, &a, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "scheme"), "%s", e.msg);
}

Test(addr, ipv6)
{
    addr a;
    err e;
    cr_assert_eq(addr_parse("[::1]:8470", 1, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "::1");
    cr_assert_eq(a.port, 8470);
    cr_assert_eq(addr_parse("[fe80::1]", 9, &a, &e), CODE_OK);
    cr_assert_str_eq(a.host, "fe80::1");
    cr_assert_eq(a.port, 9);
    cr_assert_eq(addr_parse("grpc://[::1]:7", 9, &a, &e), CODE_OK);
    cr_assert_eq(a.port, 7);
}

Test(addr, bad_ones)
{
    addr a;
    err e;
    const char *bad[] = {"", ":8470", "h:", "h:x", "h:65536", "h:-1", "::1:8470", "[::1",
                         "[::1]x", "[::1]:", "h o:1", "h/1:2", "h:1:2", "grpc://", "a;b:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(addr_parse(bad[i], 8470, &a, &e), CODE_INVALID_ARGUMENT, "'%s' accepted", bad[i]);
        cr_assert_str_not_empty(e.msg);
    }
    cr_assert_eq(addr_parse(NULL, 8470, &a, &e), CODE_INVALID_ARGUMENT);
}

Test(addr, long_host_is_refused)
{
    addr a;
    err e;
    char big[ADDR_HOST_MAX + 10];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(addr_parse(big, 8470, &a, &e), CODE_INVALID_ARGUMENT);
}

Test(addr, port_range_edges)
{
    addr a;
    err e;
    cr_assert_eq(addr_parse("h:0", 1, &a, &e), CODE_OK);
    cr_assert_eq(a.port, 0);
    cr_assert_eq(addr_parse("h:65535", 1, &a, &e), CODE_OK);
    cr_assert_eq(a.port, 65535);
}

Test(addr, lists)
{
    addr a[4];
    size_t n;
    err e;
    cr_assert_eq(addr_parse_list("h0:1, grpc://h1:2 ,[::1]:3,h3", 8470, a, 4, &n, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(a[0].host, "h0");
    cr_assert_eq(a[1].port, 2);
    cr_assert_str_eq(a[2].host, "::1");
    cr_assert_eq(a[3].port, 8470);
}

Test(addr, bad_lists)
{
    addr a[2];
    size_t n;
    err e;
    cr_assert_eq(addr_parse_list("", 1, a, 2, &n, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(addr_parse_list("h:1,,h:2", 1, a, 2, &n, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "empty item"), "%s", e.msg);
    cr_assert_eq(addr_parse_list("h:1,", 1, a, 2, &n, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(addr_parse_list("a,b,c", 1, a, 2, &n, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "more than 2"), "%s", e.msg);
    cr_assert_eq(addr_parse_list("a,b:x", 1, a, 2, &n, &e), CODE_INVALID_ARGUMENT);
}

Test(addr, format_and_url)
{
    char buf[300];
    addr_format("h0", 1, buf, sizeof buf);
    cr_assert_str_eq(buf, "h0:1");
    addr_format("::1", 2, buf, sizeof buf);
    cr_assert_str_eq(buf, "[::1]:2");
    addr_nn_url("127.0.0.1", 8470, buf, sizeof buf);
    cr_assert_str_eq(buf, "tcp://127.0.0.1:8470");
    addr_nn_url("::1", 3, buf, sizeof buf);
    cr_assert_str_eq(buf, "tcp://[::1]:3");
}

Test(addr, loopback)
{
    cr_assert(addr_is_loopback("127.0.0.1"));
    cr_assert(addr_is_loopback("127.3.2.1"));
    cr_assert(addr_is_loopback("::1"));
    cr_assert(addr_is_loopback("localhost"));
    cr_assert_not(addr_is_loopback("0.0.0.0"));
    cr_assert_not(addr_is_loopback("::"));
    cr_assert_not(addr_is_loopback("*"));
    cr_assert_not(addr_is_loopback("10.0.0.1"));
    cr_assert_not(addr_is_loopback("128.0.0.1"));
    cr_assert_not(addr_is_loopback("example.com"));
}
