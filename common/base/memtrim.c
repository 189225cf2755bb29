/* A daemon's free heap given back to the system (memtrim.h). */
#include "memtrim.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

void mem_resident(void *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4096) /* a write, not a memset a compiler may drop after a calloc */
        ((volatile char *)p)[i] = 0;
}

int mem_trim_every(uint64_t now_ms, uint64_t *last_ms, uint64_t period_ms)
{
    if (!*last_ms || now_ms < *last_ms) { /* the first call, or a clock that went back */
        *last_ms = now_ms ? now_ms : 1;
        return 0;
    }
    if (now_ms - *last_ms < period_ms)
        return 0;
    *last_ms = now_ms;
#ifdef __GLIBC__
    malloc_trim(0);
    return 1;
#else
    return 0;
#endif
}
