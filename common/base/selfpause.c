/* Stopping this process for a while (selfpause.h). Between fork and _exit the
 * helper calls only async-signal-safe functions. */
#include "selfpause.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

pid_t self_pause(uint32_t ms)
{
    pid_t me = getpid(), child = fork();

    if (child == 0) {
        struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
#ifdef SYS_close_range
        if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
            for (int fd = 3; fd < 65536; fd++)
                close(fd);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me)
            _exit(0);
        kill(me, SIGSTOP);
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        kill(me, SIGCONT);
        _exit(0);
    }
    return child;
}
