/* cpu_count.h — how many CPUs this process may use: the CPU backend's default thread count.
 *
 * The host's core count is the wrong default in a container or a Slurm step: the affinity mask
 * (taskset, cpusets, Slurm's binding) and the cgroup CPU quota (docker --cpus, Kubernetes
 * limits, systemd CPUQuota) both cut it, and OpenMP threads beyond them only wait for each
 * other's time slices. tdm_cpu_usable() = min(CPUs in sched_getaffinity's mask, ceil(quota /
 * period) of the tightest cgroup limit from this process's cgroup up to the root), at least 1. */
#ifndef TANDEM_UTIL_CPU_COUNT_H
#define TANDEM_UTIL_CPU_COUNT_H

typedef struct tdm_cpu_count {
    int usable;   /* min of the two below (those known), >= 1 */
    int affinity; /* CPUs in the affinity mask; 0 when unknown */
    int quota;    /* ceil(quota / period) of the tightest cgroup CPU limit; 0 when none */
} tdm_cpu_count;

tdm_cpu_count tdm_cpu_usable(void);

/* One cgroup limit as its file holds it: v2 cpu.max ("max 100000", "150000 100000") when
 * cfs_period is NULL, else v1's cpu.cfs_quota_us text ("-1", "200000") with cpu.cfs_period_us.
 * Returns ceil(quota / period), or 0 for no limit or text it does not understand. */
int tdm_cpu_quota_parse(const char *cpu_max, const char *cfs_period);

#endif
