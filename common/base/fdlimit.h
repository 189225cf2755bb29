/* The open-file limit (RLIMIT_NOFILE) of a daemon. Every connection, nanomsg
 * socket and shared-memory segment costs descriptors; a daemon raises its soft
 * limit towards the hard one at start, so it is the hard limit (what an
 * administrator set) that bounds it, not the 1024 most shells hand out. */
#ifndef TPUEMU_COMMON_FDLIMIT_H
#define TPUEMU_COMMON_FDLIMIT_H

/* Raises the soft limit to min(hard, want) when it is lower, and logs the
 * result (a warn line when it stays under `need`, naming what to change).
 * Returns the soft limit in effect afterwards (want when unlimited). */
long fdlimit_raise(const char *daemon, long want, long need);

/* The soft limit in effect (-1 if unknown or unlimited). */
long fdlimit_current(void);

#endif
