/* The duplicate-request cache: a resend gets the first answer, a resend
 * while the first is being answered gets it too, bounds and expiry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "auth.h"
#include "drc.h"

static int freed;
static void count_free(void *ctl)
{
    (void)ctl;
    freed++;
}

static const uint8_t req1[] = "request one", req2[] = "request two";
static const uint8_t rep1[] = "reply one";

Test(drc, resend_gets_the_first_answer)
{
    auth_global_init();
    drc *d = drc_new(8, 1024, 1000, count_free);
    const uint8_t *r;
    size_t n;
    int ctl;
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &ctl, 0, &r, &n), DRC_MISS);
    drc_begin(d, req1, sizeof req1, 11, 0);
    cr_assert_null(drc_answer(d, 11, rep1, sizeof rep1));
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &ctl, 10, &r, &n), DRC_DONE);
    cr_assert_eq(n, sizeof rep1);
    cr_assert_eq(memcmp(r, rep1, n), 0);
    cr_assert_eq(drc_lookup(d, req2, sizeof req2, &ctl, 10, &r, &n), DRC_MISS, "other bytes");
    cr_assert_eq(drc_lookup(d, req1, sizeof req1 - 1, &ctl, 10, &r, &n), DRC_MISS, "a prefix");
    /* kept for keep_ms, then forgotten */
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &ctl, 1001, &r, &n), DRC_MISS);
    cr_assert_eq(drc_count(d), 0);
    drc_free(d);
}

Test(drc, resend_while_pending_waits_for_the_answer)
{
    auth_global_init();
    freed = 0;
    drc *d = drc_new(8, 1024, 1000, count_free);
    const uint8_t *r;
    size_t n;
    int a, b;
    drc_begin(d, req1, sizeof req1, 11, 0);
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &a, 1, &r, &n), DRC_PENDING);
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &b, 2, &r, &n), DRC_PENDING);
    cr_assert_eq(freed, 1, "the earlier resend's header is freed");
    cr_assert_eq(drc_answer(d, 11, rep1, sizeof rep1), &b, "the latest resend gets the answer");
    cr_assert_null(drc_answer(d, 11, rep1, sizeof rep1), "answered once");
    /* a pending entry dropped unanswered frees its waiting header */
    drc_begin(d, req2, sizeof req2, 12, 3);
    cr_assert_eq(drc_lookup(d, req2, sizeof req2, &a, 4, &r, &n), DRC_PENDING);
    drc_free(d);
    cr_assert_eq(freed, 2);
}

Test(drc, bounded_in_entries_and_bytes)
{
    auth_global_init();
    drc *d = drc_new(4, 100, 60000, count_free);
    uint8_t req[8], rep[40];
    const uint8_t *r;
    size_t n;
    int ctl;
    memset(rep, 7, sizeof rep);
    for (uint64_t i = 1; i <= 10; i++) {
        memcpy(req, &i, sizeof i);
        drc_begin(d, req, sizeof req, i, i);
        drc_answer(d, i, rep, sizeof rep);
        cr_assert_leq(drc_count(d), 4);
    }
    /* 100 bytes hold two 40-byte replies: the newest two are answered again */
    for (uint64_t i = 1; i <= 10; i++) {
        memcpy(req, &i, sizeof i);
        cr_assert_eq(drc_lookup(d, req, sizeof req, &ctl, 11, &r, &n), i >= 9 ? DRC_DONE : DRC_MISS,
                     "request %llu", (unsigned long long)i);
    }
    /* a reply larger than the whole budget is not kept: its resend is a miss */
    uint8_t big[200] = {0};
    drc_begin(d, req1, sizeof req1, 99, 12);
    drc_answer(d, 99, big, sizeof big);
    cr_assert_eq(drc_lookup(d, req1, sizeof req1, &ctl, 13, &r, &n), DRC_MISS);
    drc_free(d);
}

/* The index through many wraps of the ring: every kept request is found with
 * its own answer, every dropped one is not, whatever the order of eviction
 * and the runs of colliding slots in between. */
Test(drc, index_finds_what_the_ring_keeps)
{
    enum { CAP = 64, N = 5000 };
    drc *d = drc_new(CAP, 1 << 20, 600000, count_free);
    cr_assert_not_null(d);
    for (uint64_t i = 0; i < N; i++) {
        char req[32], rep[32];
        const uint8_t *r;
        size_t rl;
        int n = snprintf(req, sizeof req, "request %llu", (unsigned long long)i);
        int m = snprintf(rep, sizeof rep, "reply %llu", (unsigned long long)i);
        cr_assert_eq(drc_lookup(d, (const uint8_t *)req, (size_t)n, NULL, i, &r, &rl), DRC_MISS);
        drc_begin(d, (const uint8_t *)req, (size_t)n, i + 1, i);
        cr_assert_null(drc_answer(d, i + 1, (const uint8_t *)rep, (size_t)m));
        if (i % 97 != 0)
            continue;
        /* check every request so far */
        for (uint64_t k = 0; k <= i; k++) {
            char q[32], want[32];
            int qn = snprintf(q, sizeof q, "request %llu", (unsigned long long)k);
            int wn = snprintf(want, sizeof want, "reply %llu", (unsigned long long)k);
            int st = drc_lookup(d, (const uint8_t *)q, (size_t)qn, NULL, i, &r, &rl);
            if (i - k < CAP) {
                cr_assert_eq(st, DRC_DONE, "request %llu of %llu not found", (unsigned long long)k,
                             (unsigned long long)i);
                cr_assert(rl == (size_t)wn && memcmp(r, want, rl) == 0, "request %llu got another answer",
                          (unsigned long long)k);
            } else {
                cr_assert_eq(st, DRC_MISS, "request %llu was dropped but found", (unsigned long long)k);
            }
        }
    }
    cr_assert_eq(drc_count(d), CAP);
    drc_free(d);
}
