/* cgroup.h — limits set on this process's cgroups (a container, a Slurm job, a systemd slice).
 *
 * A limit may be set on any cgroup from the process's own up to the root, so the one that binds
 * is the tightest along that path. Both layouts are read: v2 (one hierarchy, "0::/path" in
 * /proc/self/cgroup, files under /sys/fs/cgroup/path) and v1 (one hierarchy per controller,
 * "N:ctrl,...:/path", files under /sys/fs/cgroup/CTRL/path). Users: the CPU backend's default
 * thread count (util/cpu_count.h: cpu.max, cpu.cfs_quota_us) and a CPU run's memory check
 * (run/device_open.h: memory.max, memory.limit_in_bytes). */
#ifndef TANDEM_UTIL_CGROUP_H
#define TANDEM_UTIL_CGROUP_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Calls visit(dir, v2, user) for every cgroup directory of this process, from its own up to the
 * root: the v2 hierarchy's, and the v1 hierarchy that lists controller v1_controller ("cpu",
 * "memory"). Nothing when /proc/self/cgroup cannot be read. */
void tdm_cgroup_walk(const char *v1_controller, void (*visit)(const char *dir, bool v2, void *user),
                     void *user);

/* Reads a small file (a cgroup's one-line value) into buf, NUL-terminated; its length, or -1. */
int tdm_cgroup_read(const char *path, char *buf, size_t size);

/* One memory limit as its file holds it (v2 memory.max: "max" or bytes; v1
 * memory.limit_in_bytes: bytes, where "no limit" is a value near 2^63): bytes, or 0 for no limit
 * or text it does not understand. */
uint64_t tdm_cgroup_memory_parse(const char *text);

/* The tightest memory limit on this process's cgroups, in bytes; 0 when none. */
uint64_t tdm_cgroup_memory_limit(void);

#endif
