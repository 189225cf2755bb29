/* Raising RLIMIT_NOFILE (fdlimit.h). */
#include "fdlimit.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "log.h"

long fdlimit_raise(const char *daemon, long want, long need)
{
    struct rlimit rl;
    rlim_t before, target;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        log_warn("cannot read the open-file limit", "daemon=%s reason=%s", daemon, log_q(strerror(errno)));
        return need;
    }
    before = rl.rlim_cur;
    target = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)want ? (rlim_t)want : rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < target) {
        rl.rlim_cur = target;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            log_warn("cannot raise the open-file limit", "daemon=%s soft=%llu hard=%llu reason=%s", daemon,
                     (unsigned long long)before, (unsigned long long)rl.rlim_max, log_q(strerror(errno)));
            rl.rlim_cur = before;
        }
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)need)
        log_warn("open-file limit is low: connections past it are refused", "daemon=%s limit=%llu hard=%llu "
                 "wanted=%ld hint=%s", daemon, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                 need, log_q("raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd, --ulimit nofile= in "
                             "docker)"));
    else if (rl.rlim_cur != before)
        log_debug("open-file limit raised", "daemon=%s from=%llu to=%llu", daemon, (unsigned long long)before,
                  (unsigned long long)rl.rlim_cur);
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)want ? want : (long)rl.rlim_cur;
}

long fdlimit_current(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return -1;
    return (long)rl.rlim_cur;
}
