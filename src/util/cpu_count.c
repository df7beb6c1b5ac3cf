/* cpu_count.c — CPUs this process may use (cpu_count.h). */
#include "util/cpu_count.h"

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

static int read_small(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

static int min_quota(int a, int b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

/* The tightest limit from this process's cgroup (v2, or v1's cpu controller) up to the root. */
static int cgroup_quota(void)
{
    char cg[4096];
    if (read_small("/proc/self/cgroup", cg, sizeof cg) <= 0) return 0;
    int best = 0;
    for (char *line = strtok(cg, "\n"); line; line = strtok(NULL, "\n")) {
        /* "0::/path" (v2) or "N:cpu,cpuacct:/path" (v1) */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        bool v2 = c2 == c1 + 1;
        char ctrl[256];
        snprintf(ctrl, sizeof ctrl, ",%.*s,", (int)(c2 - c1 - 1), c1 + 1);
        if (!v2 && !strstr(ctrl, ",cpu,")) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s", c2 + 1);
        const char *mount = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/cpu";
        for (;;) {
            char f[2300], q[128], p[128];
            if (v2) {
                snprintf(f, sizeof f, "%s%s/cpu.max", mount, path);
                if (read_small(f, q, sizeof q) > 0)
                    best = min_quota(best, tdm_cpu_quota_parse(q, NULL));
            } else {
                snprintf(f, sizeof f, "%s%s/cpu.cfs_quota_us", mount, path);
                if (read_small(f, q, sizeof q) > 0) {
                    snprintf(f, sizeof f, "%s%s/cpu.cfs_period_us", mount, path);
                    if (read_small(f, p, sizeof p) > 0)
                        best = min_quota(best, tdm_cpu_quota_parse(q, p));
                }
            }
            char *slash = strrchr(path, '/');
            if (!slash || !path[1]) break;
            if (slash == path)
                path[1] = 0; /* the root itself next */
            else
                *slash = 0;
        }
    }
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
