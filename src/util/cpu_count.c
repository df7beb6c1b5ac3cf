/* cpu_count.c — CPUs this process may use (cpu_count.h). */
#include "util/cpu_count.h"
#include "util/cgroup.h"

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tdm_cpu_quota_parse(const char *cpu_max, const char *cfs_period)
{
    char *end;
    long long quota, period;
    if (!cpu_max) return 0;
    while (*cpu_max == ' ')
        cpu_max++;
    if (!strncmp(cpu_max, "max", 3)) return 0;
    quota = strtoll(cpu_max, &end, 10);
    if (end == cpu_max || quota <= 0) return 0;
    if (cfs_period)
        period = strtoll(cfs_period, NULL, 10);
    else
        period = strtoll(end, NULL, 10);
    if (period <= 0) return 0;
    long long n = (quota + period - 1) / period;
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

static int min_quota(int a, int b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

static void visit_cpu(const char *dir, bool v2, void *user)
{
    int *best = user;
    char f[2400], q[128], p[128];
    if (v2) {
        snprintf(f, sizeof f, "%s/cpu.max", dir);
        if (tdm_cgroup_read(f, q, sizeof q) > 0)
            *best = min_quota(*best, tdm_cpu_quota_parse(q, NULL));
    } else {
        snprintf(f, sizeof f, "%s/cpu.cfs_quota_us", dir);
        if (tdm_cgroup_read(f, q, sizeof q) > 0) {
            snprintf(f, sizeof f, "%s/cpu.cfs_period_us", dir);
            if (tdm_cgroup_read(f, p, sizeof p) > 0)
                *best = min_quota(*best, tdm_cpu_quota_parse(q, p));
        }
    }
}

/* The tightest limit from this process's cgroup (v2, or v1's cpu controller) up to the root. */
static int cgroup_quota(void)
{
    int best = 0;
    tdm_cgroup_walk("cpu", visit_cpu, &best);
    return best;
}

tdm_cpu_count tdm_cpu_usable(void)
{
    tdm_cpu_count c = {0};
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) c.affinity = CPU_COUNT(&set);
    c.quota = cgroup_quota();
    int n = c.affinity > 0 ? c.affinity : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (c.quota > 0 && c.quota < n) n = c.quota;
    c.usable = n > 0 ? n : 1;
    return c;
}
