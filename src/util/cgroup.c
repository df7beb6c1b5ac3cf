/* cgroup.c — limits set on this process's cgroups (cgroup.h). */
#include "util/cgroup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tdm_cgroup_read(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

void tdm_cgroup_walk(const char *v1_controller, void (*visit)(const char *dir, bool v2, void *user),
                     void *user)
{
    char cg[4096], want[64];
    if (tdm_cgroup_read("/proc/self/cgroup", cg, sizeof cg) <= 0) return;
    snprintf(want, sizeof want, ",%s,", v1_controller);
    char *save = NULL;
    for (char *line = strtok_r(cg, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        /* "0::/path" (v2) or "N:cpu,cpuacct:/path" (v1) */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        bool v2 = c2 == c1 + 1;
        char ctrl[256];
        snprintf(ctrl, sizeof ctrl, ",%.*s,", (int)(c2 - c1 - 1), c1 + 1);
        if (!v2 && !strstr(ctrl, want)) continue;
        char path[2048], mount[128], dir[2300];
        snprintf(path, sizeof path, "%s", c2 + 1);
        if (v2)
            snprintf(mount, sizeof mount, "/sys/fs/cgroup");
        else
            snprintf(mount, sizeof mount, "/sys/fs/cgroup/%s", v1_controller);
        for (;;) {
            snprintf(dir, sizeof dir, "%s%s", mount, path[0] == '/' && !path[1] ? "" : path);
            visit(dir, v2, user);
            char *slash = strrchr(path, '/');
            if (!slash || !path[1]) break;
            if (slash == path)
                path[1] = 0; /* the root itself next */
            else
                *slash = 0;
        }
    }
}

uint64_t tdm_cgroup_memory_parse(const char *text)
{
    if (!text) return 0;
    while (*text == ' ')
        text++;
    if (*text < '0' || *text > '9') return 0; /* "max", empty, anything else */
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end && *end != '\n' && *end != ' ') return 0;
    /* v1 writes "no limit" as the largest page-aligned value below 2^63 */
    return v == 0 || v >= (1ULL << 62) ? 0 : (uint64_t)v;
}

static void visit_memory(const char *dir, bool v2, void *user)
{
    uint64_t *best = user;
    char f[2400], text[128];
    snprintf(f, sizeof f, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    if (tdm_cgroup_read(f, text, sizeof text) <= 0) return;
    uint64_t v = tdm_cgroup_memory_parse(text);
    if (v && (!*best || v < *best)) *best = v;
}

uint64_t tdm_cgroup_memory_limit(void)
{
    uint64_t best = 0;
    tdm_cgroup_walk("memory", visit_memory, &best);
    return best;
}
