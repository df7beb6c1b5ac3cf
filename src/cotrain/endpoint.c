/* endpoint.c — co-training sockets, advertisements, discovery and peer checks (contract in
 * endpoint.h). */
#include "cotrain/endpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gpu/ledger.h"
#include "gpu/proc_identity.h"
#include "util/atomic_file.h"
#include "util/json_file.h"

#define ADVERT_VERSION 1

tdm_status tdm_cotrain_dir(const char *dir, char *buf, size_t size, tdm_error *err)
{
    /* tdm_ledger_open resolves the default, creates the directory and refuses links: the same
     * directory rules as the ledger, by construction. */
    tdm_ledger ledger;
    if (tdm_ledger_open(&ledger, dir, err) != TDM_OK) return err->status;
    if (snprintf(buf, size, "%s", ledger.dir) >= (int)size)
        return tdm_fail(err, TDM_ERR_INVALID, "ledger directory path is too long");
    return TDM_OK;
}

bool tdm_cotrain_dir_shared(const char *dir)
{
    struct stat st;
    return stat(dir, &st) == 0 && (st.st_mode & S_IWGRP);
}

static int path_of(char *buf, size_t size, const char *dir, int32_t pid, const char *ext)
{
    int n = snprintf(buf, size, "%s/cotrain-%d.%s", dir, (int)pid, ext);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

int tdm_cotrain_advert_path(char *buf, size_t size, const char *dir, int32_t pid)
{
    return path_of(buf, size, dir, pid, "json");
}

static json_t *advert_json(const tdm_cotrain_advert *a)
{
    const char *sock = strrchr(a->socket_path, '/');
    return json_pack(
        "{s:i, s:i, s:I, s:I, s:s, s:s, s:I, s:s, s:{s:s, s:s, s:s, s:b, s:s, s:s}}", "v",
        ADVERT_VERSION, "pid", (int)a->pid, "start_time", (json_int_t)a->start_time, "uid",
        (json_int_t)a->uid, "user", a->user, "socket", sock ? sock + 1 : a->socket_path,
        "started_at", (json_int_t)a->started_at, "model_dir", a->model_dir, "base", "id",
        a->base.id, "model", a->base.model, "method", a->base.method, "double_quant",
        a->base.double_quant, "compute_dtype", a->base.compute_dtype, "device", a->base.device);
}

static bool copy_str(char *dst, size_t size, json_t *v)
{
    const char *s = json_string_value(v);
    if (!s || strlen(s) >= size) return false;
    memcpy(dst, s, strlen(s) + 1);
    return true;
}

/* Parses an advertisement of dir; false when it is not one this version understands. */
static bool advert_parse(const char *dir, const char *text, size_t len, tdm_cotrain_advert *a)
{
    memset(a, 0, sizeof *a);
    json_error_t jerr;
    json_t *o = json_loadb(text, len, 0, &jerr);
    json_t *base = json_object_get(o, "base");
    bool ok = json_is_object(o) && json_integer_value(json_object_get(o, "v")) == ADVERT_VERSION &&
              json_is_integer(json_object_get(o, "pid")) &&
              json_is_integer(json_object_get(o, "start_time")) && json_is_object(base);
    if (ok) {
        json_int_t pid = json_integer_value(json_object_get(o, "pid"));
        a->pid = pid > 0 && pid <= INT32_MAX ? (int32_t)pid : 0;
        a->start_time = (uint64_t)json_integer_value(json_object_get(o, "start_time"));
        a->uid = (uint32_t)json_integer_value(json_object_get(o, "uid"));
        a->started_at = json_integer_value(json_object_get(o, "started_at"));
        copy_str(a->user, sizeof a->user, json_object_get(o, "user"));
        copy_str(a->model_dir, sizeof a->model_dir, json_object_get(o, "model_dir"));
        a->base.double_quant = json_is_true(json_object_get(base, "double_quant"));
        ok = a->pid > 0 && copy_str(a->base.id, sizeof a->base.id, json_object_get(base, "id")) &&
             copy_str(a->base.model, sizeof a->base.model, json_object_get(base, "model")) &&
             copy_str(a->base.method, sizeof a->base.method, json_object_get(base, "method")) &&
             copy_str(a->base.compute_dtype, sizeof a->base.compute_dtype,
                      json_object_get(base, "compute_dtype")) &&
             copy_str(a->base.device, sizeof a->base.device, json_object_get(base, "device"));
        /* The socket is always our own naming of that pid: a hostile file cannot point a
         * joiner at some other socket. */
        ok = ok && path_of(a->socket_path, sizeof a->socket_path, dir, a->pid, "sock") == 0;
    }
    json_decref(o);
    return ok;
}

tdm_status tdm_cotrain_listen(const char *dir, const tdm_base_identity *base, const char *model_dir,
                              int *fd_out, tdm_cotrain_advert *advert, tdm_error *err)
{
    *fd_out = -1;
    tdm_cotrain_advert a;
    memset(&a, 0, sizeof a);
    a.pid = (int32_t)getpid();
    a.start_time = tdm_proc_start_time(getpid());
    a.uid = (uint32_t)geteuid();
    snprintf(a.user, sizeof a.user, "%s", tdm_user_name());
    a.started_at = (int64_t)time(NULL);
    snprintf(a.model_dir, sizeof a.model_dir, "%s", model_dir ? model_dir : "");
    a.base = *base;
    if (path_of(a.socket_path, sizeof a.socket_path, dir, a.pid, "sock") != 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "the co-training socket path %s/cotrain-%d.sock is longer than a Unix "
                        "socket address allows (%d bytes): set TANDEM_LEDGER_DIR to a shorter "
                        "directory, or pass --no-join",
                        dir, (int)a.pid, TDM_COTRAIN_SOCKET_PATH_MAX - 1);
    char advert_path[4200];
    if (path_of(advert_path, sizeof advert_path, dir, a.pid, "json") != 0)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", dir);
    bool shared = tdm_cotrain_dir_shared(dir);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create a Unix socket");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, a.socket_path, strlen(a.socket_path) + 1);
    unlink(a.socket_path); /* a dead process with our pid left it */
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        close(fd);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot bind the co-training socket %s",
                              a.socket_path);
    }
    /* bind created the file with the umask's mode; the peer check in the host is the real gate,
     * the mode keeps others from even connecting. */
    if (chmod(a.socket_path, shared ? 0660 : 0600) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        close(fd);
        unlink(a.socket_path);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot set up the co-training socket %s",
                              a.socket_path);
    }
    tdm_status st = tdm_cotrain_advertise(dir, &a, NULL, err);
    if (st != TDM_OK) {
        close(fd);
        unlink(a.socket_path);
        return st;
    }
    *fd_out = fd;
    if (advert) *advert = a;
    return TDM_OK;
}

tdm_status tdm_cotrain_advertise(const char *dir, const tdm_cotrain_advert *a, const json_t *status,
                                 tdm_error *err)
{
    char path[4200];
    if (path_of(path, sizeof path, dir, a->pid, "json") != 0)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", dir);
    json_t *j = advert_json(a);
    if (j && status) json_object_set(j, "status", (json_t *)status);
    tdm_status st = tdm_atomic_write_json(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER, false,
                                          tdm_cotrain_dir_shared(dir) ? 0640 : 0600, err);
    json_decref(j);
    return st;
}

void tdm_cotrain_unadvertise(const char *dir, int32_t pid)
{
    char path[4200];
    /* Advertisement first: a joiner that finds it finds a listening socket. */
    if (path_of(path, sizeof path, dir, pid, "json") == 0) unlink(path);
    if (path_of(path, sizeof path, dir, pid, "sock") == 0) unlink(path);
}

/* pid from "cotrain-<pid>.<ext>", or 0. */
static int32_t name_pid(const char *name, const char *ext)
{
    if (strncmp(name, "cotrain-", 8) != 0) return 0;
    char *end;
    errno = 0;
    long pid = strtol(name + 8, &end, 10);
    if (errno || end == name + 8 || pid <= 0 || pid > INT32_MAX || *end != '.' ||
        strcmp(end + 1, ext) != 0)
        return 0;
    return (int32_t)pid;
}

static int cmp_advert(const void *pa, const void *pb)
{
    const tdm_cotrain_advert *a = pa, *b = pb;
    if (a->start_time != b->start_time) return a->start_time < b->start_time ? -1 : 1;
    return (a->pid > b->pid) - (a->pid < b->pid);
}

tdm_status tdm_cotrain_discover(const char *dir, tdm_cotrain_advert **hosts, size_t *n_out,
                                tdm_error *err)
{
    *hosts = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "cannot list %s", dir);
    size_t n = 0, cap = 0;
    tdm_cotrain_advert *list = NULL;
    tdm_status st = TDM_OK;
    int32_t self = (int32_t)getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int32_t pid = name_pid(e->d_name, "json");
        int32_t sock_pid = name_pid(e->d_name, "sock");
        if (sock_pid) {
            /* A socket whose host died before (or while) advertising, or after removing its
             * advertisement: no process of that pid means nobody will ever accept on it. */
            if (sock_pid != self && tdm_proc_start_time(sock_pid) == 0) {
                char path[4200];
                path_of(path, sizeof path, dir, sock_pid, "sock");
                unlink(path);
            }
            continue;
        }
        if (!pid || pid == self) continue;
        char path[4200];
        if (path_of(path, sizeof path, dir, pid, "json") != 0) continue;
        char *text = NULL;
        size_t len = 0;
        tdm_error rerr = {0};
        tdm_cotrain_advert a;
        bool parsed = tdm_read_file(path, &text, &len, &rerr) == TDM_OK &&
                      advert_parse(dir, text, len, &a) && a.pid == pid;
        free(text);
        tdm_holder h = {.pid = pid, .start_time = parsed ? a.start_time : 0};
        bool alive = parsed ? tdm_holder_alive(&h) : tdm_proc_start_time(pid) != 0;
        if (!alive) {
            tdm_cotrain_unadvertise(dir, pid);
            continue;
        }
        if (!parsed) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            tdm_cotrain_advert *nl = realloc(list, nc * sizeof *nl);
            if (!nl) {
                st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory listing %s", dir);
                break;
            }
            list = nl;
            cap = nc;
        }
        list[n++] = a;
    }
    closedir(d);
    if (st != TDM_OK) {
        free(list);
        return st;
    }
    if (n > 1) qsort(list, n, sizeof *list, cmp_advert); /* list is NULL when no host */
    *hosts = list;
    *n_out = n;
    return TDM_OK;
}

tdm_status tdm_cotrain_find_host(const char *dir, const tdm_base_identity *want,
                                 tdm_cotrain_advert *out, const char **why, tdm_error *err)
{
    if (why) *why = "";
    tdm_cotrain_advert *hosts;
    size_t n;
    tdm_status st = tdm_cotrain_discover(dir, &hosts, &n, err);
    if (st != TDM_OK) return st;
    /* The nearest mismatch: the one differing latest in the order model, method, ..., device. */
    static const char *const order[] = {"model",         "method", "double quantization",
                                        "compute dtype", "device", "identity"};
    int best = -1;
    for (size_t i = 0; i < n; i++) {
        const char *m = tdm_base_identity_mismatch(&hosts[i].base, want);
        if (!*m) {
            *out = hosts[i];
            free(hosts);
            return TDM_OK;
        }
        for (int k = 0; k < 6; k++)
            if (strcmp(m, order[k]) == 0 && k > best) {
                best = k;
                if (why) *why = order[k];
            }
    }
    free(hosts);
    return tdm_fail(err, TDM_ERR_NOT_FOUND, "no co-training host with this base identity in %s",
                    dir);
}

/* Whether /proc/pid/status lists gid among "Groups:". */
static bool proc_in_group(int32_t pid, gid_t gid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(buf, sizeof buf, f)) {
        if (strncmp(buf, "Groups:", 7) != 0) continue;
        char *p = buf + 7, *end;
        for (;;) {
            errno = 0;
            unsigned long g = strtoul(p, &end, 10);
            if (end == p || errno) break;
            if ((gid_t)g == gid) found = true;
            p = end;
        }
        break;
    }
    fclose(f);
    return found;
}

tdm_status tdm_cotrain_peer_check(int fd, const char *dir, tdm_cotrain_peer *peer, tdm_error *err)
{
    memset(peer, 0, sizeof *peer);
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno,
                              "cannot read the co-training peer's "
                              "credentials");
    peer->pid = (int32_t)cred.pid;
    peer->uid = (uint32_t)cred.uid;
    peer->gid = (uint32_t)cred.gid;
    struct passwd pw, *res = NULL;
    char pwbuf[1024];
    if (getpwuid_r(cred.uid, &pw, pwbuf, sizeof pwbuf, &res) == 0 && res)
        snprintf(peer->user, sizeof peer->user, "%s", pw.pw_name);
    else
        snprintf(peer->user, sizeof peer->user, "%u", (unsigned)cred.uid);
    if (cred.uid == geteuid()) return TDM_OK;
    struct stat st;
    if (stat(dir, &st) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot inspect %s", dir);
    if (!(st.st_mode & S_IWGRP))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "user %s (pid %d) may not join: the ledger directory %s is private to "
                        "its owner (make it group-writable for a shared group to allow others)",
                        peer->user, (int)peer->pid, dir);
    if (cred.gid == st.st_gid || proc_in_group(cred.pid, st.st_gid)) return TDM_OK;
    struct group gr, *gres = NULL;
    char grbuf[1024], gname[64];
    if (getgrgid_r(st.st_gid, &gr, grbuf, sizeof grbuf, &gres) == 0 && gres)
        snprintf(gname, sizeof gname, "%s", gr.gr_name);
    else
        snprintf(gname, sizeof gname, "%u", (unsigned)st.st_gid);
    return tdm_fail(err, TDM_ERR_INVALID,
                    "user %s (pid %d) may not join: not a member of group %s, which shares the "
                    "ledger directory %s",
                    peer->user, (int)peer->pid, gname, dir);
}

tdm_status tdm_cotrain_connect(const char *socket_path, int *fd_out, tdm_error *err)
{
    *fd_out = -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof addr.sun_path)
        return tdm_fail(err, TDM_ERR_INVALID, "co-training socket path too long: %s", socket_path);
    memcpy(addr.sun_path, socket_path, strlen(socket_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create a Unix socket");
    int r;
    do
        r = connect(fd, (struct sockaddr *)&addr, sizeof addr);
    while (r != 0 && errno == EINTR);
    if (r != 0) {
        int e = errno;
        close(fd);
        return tdm_fail_errno(err,
                              e == ENOENT || e == ECONNREFUSED ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, e,
                              "cannot connect to the co-training host at %s", socket_path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot configure the co-training socket");
    }
    *fd_out = fd;
    return TDM_OK;
}
