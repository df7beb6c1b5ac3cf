#include "gpu/proc_identity.h"

#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Reads /proc/PID/stat. The command name (field 2) is in parentheses and may itself contain spaces
 * and parentheses, so parsing starts after the LAST ')'. Fields after it: 3 state, ..., 22 start. */
static bool read_stat(pid_t pid, char *state, uint64_t *start_time)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return false;
    p += 2;
    *state = *p;
    /* p is at field 3; advance to field 22. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return false;
        p++;
    }
    char *end;
    *start_time = strtoull(p, &end, 10);
    return end != p;
}

uint64_t tdm_proc_start_time(pid_t pid)
{
    char state;
    uint64_t start;
    if (pid <= 0 || !read_stat(pid, &state, &start))
        return 0;
    if (state == 'Z' || state == 'X')
        return 0;
    return start;
}

bool tdm_holder_alive(const tdm_holder *h)
{
    uint64_t now = tdm_proc_start_time(h->pid);
    return now != 0 && now == h->start_time;
}

/* Boot time (Unix seconds) from /proc/stat's btime line; 0 when unknown. */
static time_t boot_time(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return 0;
    char line[256];
    long long btime = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lld", &btime) == 1)
            break;
    fclose(f);
    return (time_t)btime;
}

bool tdm_proc_running_since(pid_t pid, time_t t)
{
    uint64_t ticks = tdm_proc_start_time(pid);
    if (ticks == 0)
        return false;
    time_t boot = boot_time();
    long hz = sysconf(_SC_CLK_TCK);
    if (boot == 0 || hz <= 0)
        return true; /* cannot tell: assume the same process (keeps the file) */
    time_t started = boot + (time_t)(ticks / (uint64_t)hz);
    return started <= t + 2;
}

tdm_holder tdm_holder_of(pid_t pid)
{
    tdm_holder h = {.pid = pid, .start_time = tdm_proc_start_time(pid)};
    return h;
}

const char *tdm_host_name(void)
{
    static char host[256];
    if (!host[0]) {
        if (gethostname(host, sizeof host - 1) != 0 || !host[0])
            snprintf(host, sizeof host, "localhost");
    }
    return host;
}

const char *tdm_user_name(void)
{
    static char user[64];
    if (!user[0]) {
        struct passwd pw, *res = NULL;
        char buf[4096];
        if (getpwuid_r(geteuid(), &pw, buf, sizeof buf, &res) == 0 && res)
            snprintf(user, sizeof user, "%s", res->pw_name);
        else
            snprintf(user, sizeof user, "%ld", (long)geteuid());
    }
    return user;
}

#include <dirent.h>

/* Parent pid of pid from /proc/PID/stat (field 4), or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    char state;
    long ppid;
    if (sscanf(p + 1, " %c %ld", &state, &ppid) != 2)
        return -1;
    return (pid_t)ppid;
}

size_t tdm_proc_tree(pid_t root, pid_t *pids, size_t max)
{
    /* One pass over /proc collecting (pid, ppid), then a breadth-first closure from root. */
    size_t cap = 1024, n_all = 0;
    pid_t *all = malloc(cap * sizeof *all), *parent = malloc(cap * sizeof *parent);
    DIR *d = all && parent ? opendir("/proc") : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long v = strtol(e->d_name, &end, 10);
            if (*end || v <= 0)
                continue;
            if (n_all == cap) {
                pid_t *na = realloc(all, 2 * cap * sizeof *na);
                if (na)
                    all = na;
                pid_t *np = na ? realloc(parent, 2 * cap * sizeof *np) : NULL;
                if (np)
                    parent = np;
                if (!na || !np)
                    break; /* out of memory: a partial tree, never a crash */
                cap *= 2;
            }
            all[n_all] = (pid_t)v;
            parent[n_all] = parent_of((pid_t)v);
            n_all++;
        }
        closedir(d);
    }
    /* Breadth-first over the whole tree (each process appears once: parent links form a tree),
     * then the first max entries go to the caller. */
    pid_t *tree = malloc((n_all + 1) * sizeof *tree);
    size_t found = 1;
    if (tree) {
        tree[0] = root;
        for (size_t head = 0; head < found; head++)
            for (size_t i = 0; i < n_all && found <= n_all; i++)
                if (parent[i] == tree[head] && all[i] != root)
                    tree[found++] = all[i];
        for (size_t i = 0; i < found && i < max; i++)
            pids[i] = tree[i];
        free(tree);
    } else if (max > 0) {
        pids[0] = root;
    }
    free(all);
    free(parent);
    return found;
}
