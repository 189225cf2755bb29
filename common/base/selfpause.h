/* Stopping this whole process for a while, as a hung host does (tpuctl chaos
 * pause, on a worker or the resolver): a helper process sends SIGSTOP, sleeps,
 * sends SIGCONT and exits (a stopped process runs nothing, so the helper
 * must). The helper closes every descriptor it inherited (a daemon killed
 * while paused must free its ports at once) and dies with its parent. */
#ifndef TPUEMU_SELFPAUSE_H
#define TPUEMU_SELFPAUSE_H

#include <stdint.h>
#include <sys/types.h>

/* The helper's pid (the caller collects it with waitpid), or -1 with errno. */
pid_t self_pause(uint32_t ms);

#endif
