/* proc_identity.h — who holds a reservation, in a form that survives PID recycling.
 *
 * A holder is (pid, start_time) where start_time is field 22 of /proc/PID/stat (clock ticks since
 * boot). A PID whose current start time differs is a different, recycled process; a zombie counts
 * as dead (it holds no GPU memory any more).
 */
#ifndef TANDEM_GPU_PROC_IDENTITY_H
#define TANDEM_GPU_PROC_IDENTITY_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

typedef struct tdm_holder {
    int32_t pid;
    uint64_t start_time; /* /proc/PID/stat field 22, clock ticks since boot */
} tdm_holder;

/* Start time of pid, or 0 when the process does not exist or is a zombie. */
uint64_t tdm_proc_start_time(pid_t pid);

/* A holder is alive when its pid exists, is not a zombie, and has the recorded start time. */
bool tdm_holder_alive(const tdm_holder *h);

/* True when pid exists, is not a zombie, and started no later than t (Unix time; 2 s of slack for
 * the tick and boot-time roundings). A file written at t by "pid" whose pid now names a process
 * started after t was written by an earlier, dead owner of that recycled pid. */
bool tdm_proc_running_since(pid_t pid, time_t t);

/* The identity of pid right now ({pid, 0} when it does not exist). */
tdm_holder tdm_holder_of(pid_t pid);

/* This machine's host name (cached; "localhost" when unknown). */
const char *tdm_host_name(void);
/* The effective user's name (cached; the numeric uid when it has no name). */
const char *tdm_user_name(void);

/* Collects root and all its descendants (by walking /proc's parent links), root first, breadth
 * first; stores at most max of them in pids and returns how many there are (may exceed max). */
size_t tdm_proc_tree(pid_t root, pid_t *pids, size_t max);
#endif
