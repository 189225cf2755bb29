/* A daemon's memory kept level (memtrim.h): when it trims, that the pages of
 * freed blocks between live ones leave the RSS, and that a table made
 * resident counts at once. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrim.h"

Test(memtrim, trims_once_a_period)
{
    uint64_t last = 0;
    cr_assert_eq(mem_trim_every(5000, &last, 30000), 0, "the first call only starts the count");
    cr_assert_eq(last, 5000);
    cr_assert_eq(mem_trim_every(34999, &last, 30000), 0, "before the period");
    cr_assert_eq(mem_trim_every(4000, &last, 30000), 0, "a clock that went back starts the count again");
    cr_assert_eq(last, 4000);
#if defined(__GLIBC__)
    cr_assert_eq(mem_trim_every(34000, &last, 30000), 1, "a period later");
    cr_assert_eq(last, 34000);
    cr_assert_eq(mem_trim_every(34001, &last, 30000), 0, "and not again at once");
#endif
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#if !defined(UNDER_ASAN)
static long rss_kib(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%ld %ld", &size, &res), 2);
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}
#endif

/* glibc's own allocator only: ASan's has its own heap, which malloc_trim does not touch */
#if defined(__GLIBC__) && !defined(UNDER_ASAN)
Test(memtrim, freed_blocks_between_live_ones_leave_the_rss)
{
#define N 512
#define SIZE (64 * 1024) /* 32 MiB in blocks under the mmap threshold: from the heap */
    static char *b[N], *keep[N];
    uint64_t last = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_not_null(b[i] = malloc(SIZE));
        memset(b[i], 1, SIZE);
        cr_assert_not_null(keep[i] = malloc(64)); /* between them: free() alone gives nothing back */
    }
    for (int i = 0; i < N; i++)
        free(b[i]);
    long held = rss_kib();
    mem_trim_every(1, &last, 1);
    cr_assert_eq(mem_trim_every(2, &last, 1), 1);
    long after = rss_kib();
    cr_log_info("RSS %ld KiB with 32 MiB freed between live blocks, %ld KiB after the trim", held, after);
    cr_assert_gt(held - after, 24 * 1024, "the trim gave back %ld KiB of the 32 MiB freed (RSS %ld KiB before)",
                 held - after, held);
    for (int i = 0; i < N; i++)
        free(keep[i]);
}
#endif

/* a fixed table made resident at once: its pages count from the start */
#if !defined(UNDER_ASAN)
Test(memtrim, a_table_is_resident_at_once)
{
    size_t n = 16u << 20;
    char *t = calloc(1, n); /* beyond the mmap threshold: pages the kernel gives on first touch */
    cr_assert_not_null(t);
    long before = rss_kib();
    mem_resident(t, n);
    long after = rss_kib();
    cr_log_info("RSS %ld KiB before, %ld KiB after making 16 MiB resident", before, after);
    cr_assert_gt(after - before, 15 * 1024, "RSS grew %ld KiB for a 16 MiB table", after - before);
    for (size_t i = 0; i < n; i += 4096)
        cr_assert_eq(t[i], 0, "byte %zu is not zero", i);
    free(t);
}
#endif
