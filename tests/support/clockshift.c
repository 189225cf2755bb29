/* A preload library that steps a process's wall clock, for tests: loaded
 * with LD_PRELOAD, it adds an offset to what clock_gettime(CLOCK_REALTIME and
 * its coarse variant), gettimeofday() and time() return. The offset is the
 * int64_t (milliseconds, native byte order) in the first 8 bytes of the file
 * named by $TPUEMU_TEST_CLOCK_FILE, mapped shared, so a test steps the clock
 * of a running process by writing the file. The monotonic and boot clocks
 * are left as they are, as a step of the wall clock leaves them. Without the
 * variable, or when the file cannot be mapped, it changes nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default"))) /* the build hides symbols by default */

static const volatile int64_t *shift_ms;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void clockshift_init(void)
{
    const char *path = getenv("TPUEMU_TEST_CLOCK_FILE");
    int fd;
    void *p;

    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (!path || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return;
    p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        shift_ms = p;
}

static int64_t shift(void)
{
    return shift_ms ? __atomic_load_n(shift_ms, __ATOMIC_RELAXED) : 0;
}

static int raw_clock_gettime(clockid_t id, struct timespec *ts)
{
    if (real_clock_gettime)
        return real_clock_gettime(id, ts);
    return (int)syscall(SYS_clock_gettime, id, ts);
}

EXPORT int clock_gettime(clockid_t id, struct timespec *ts)
{
    int rc = raw_clock_gettime(id, ts);
    if (rc == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t by = shift(), ns = (int64_t)ts->tv_nsec + (by % 1000) * 1000000;
        ts->tv_sec += (time_t)(by / 1000) + (time_t)(ns >= 1000000000 ? 1 : ns < 0 ? -1 : 0);
        ts->tv_nsec = (long)(ns >= 1000000000 ? ns - 1000000000 : ns < 0 ? ns + 1000000000 : ns);
    }
    return rc;
}

EXPORT int gettimeofday(struct timeval *__restrict tv, void *__restrict tz)
{
    struct timespec ts;
    (void)tz;
    if (!tv)
        return 0;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = (suseconds_t)(ts.tv_nsec / 1000);
    return 0;
}

EXPORT time_t time(time_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
