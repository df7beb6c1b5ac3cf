/* transport.c — ssh/rsync/scp and local execution behind one interface. */
#include "cluster/transport.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/shell_quote.h"

/* A growable argv. */
typedef struct argv_buf {
    char **v;
    size_t n, cap;
    bool nomem;
} argv_buf;

static void push(argv_buf *a, const char *s)
{
    if (a->nomem)
        return;
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        char **v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->nomem = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n] = strdup(s);
    if (!a->v[a->n]) {
        a->nomem = true;
        return;
    }
    a->n++;
    a->v[a->n] = NULL;
}

static void pushf(argv_buf *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pushf(argv_buf *a, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    push(a, buf);
}

static void argv_free(argv_buf *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    memset(a, 0, sizeof *a);
}

static tdm_status make_control_dir(tdm_transport *t, tdm_error *err)
{
    const char *env = getenv("TANDEM_SSH_CONTROL_DIR");
    const char *run = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env)
        n = snprintf(t->control_dir, sizeof t->control_dir, "%s", env);
    else if (run && run[0] == '/')
        n = snprintf(t->control_dir, sizeof t->control_dir, "%s/tandem-ssh", run);
    else
        n = snprintf(t->control_dir, sizeof t->control_dir, "/tmp/tandem-ssh-%u",
                     (unsigned)getuid());
    /* Unix socket paths hold 107 bytes; %C expands to 40 hex digits. */
    if (n < 0 || (size_t)n >= sizeof t->control_dir || n + 42 > 104)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "ssh control directory '%s' is too long for a socket path; set "
                        "TANDEM_SSH_CONTROL_DIR to a short directory",
                        t->control_dir);
    if (mkdir(t->control_dir, 0700) != 0 && errno != EEXIST)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "mkdir %s", t->control_dir);
    struct stat st;
    if (lstat(t->control_dir, &st) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "%s", t->control_dir);
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s must be a directory owned by you with mode 0700 (it holds ssh "
                        "connection sockets)",
                        t->control_dir);
    return TDM_OK;
}

tdm_status tdm_transport_init(tdm_transport *t, const tdm_cluster_node *node,
                              const char *ssh_config, tdm_error *err)
{
    memset(t, 0, sizeof *t);
    t->node = node;
    t->ssh_config = ssh_config;
    t->connect_timeout_s = TDM_TRANSPORT_CONNECT_TIMEOUT_S;
    const char *ct = getenv("TANDEM_SSH_CONNECT_TIMEOUT");
    if (ct && atoi(ct) > 0)
        t->connect_timeout_s = atoi(ct);
    t->accept_new = -1;
    if (node->transport == TDM_TRANSPORT_LOCAL)
        return TDM_OK;
    return make_control_dir(t, err);
}

/* The options before the host that select the node (shared by ssh -G and real connections). */
static void target_options(const tdm_transport *t, argv_buf *a, bool scp_style)
{
    if (t->ssh_config) {
        push(a, "-F");
        push(a, t->ssh_config);
    }
    if (t->node->port) {
        push(a, scp_style ? "-P" : "-p");
        pushf(a, "%d", t->node->port);
    }
    if (t->node->identity_file) {
        push(a, "-i");
        push(a, t->node->identity_file);
    }
    if (t->node->user && !scp_style) {
        push(a, "-l");
        push(a, t->node->user);
    }
}

/* Asks `ssh -G` whether the user's configuration sets StrictHostKeyChecking. */
static void decide_accept_new(tdm_transport *t)
{
    if (t->accept_new >= 0)
        return;
    t->accept_new = 1;
    argv_buf a = {0};
    push(&a, "ssh");
    push(&a, "-G");
    target_options(t, &a, false);
    push(&a, "--");
    push(&a, t->node->host);
    if (a.nomem) {
        argv_free(&a);
        return;
    }
    tdm_spawn_result res;
    tdm_error e = {0};
    if (tdm_spawn_run((const char *const *)a.v, NULL, 0, 10000, &res, &e) == TDM_OK) {
        if (res.exit_code == 0) {
            const char *p = strstr(res.out, "\nstricthostkeychecking ");
            if (p) {
                p += strlen("\nstricthostkeychecking ");
                t->accept_new = strncmp(p, "ask", 3) == 0 ? 1 : 0;
            }
        }
        tdm_spawn_result_free(&res);
    }
    argv_free(&a);
}

/* ssh options common to ssh, rsync -e and scp. */
static void ssh_options(tdm_transport *t, argv_buf *a, bool scp_style)
{
    decide_accept_new(t);
    target_options(t, a, scp_style);
    push(a, "-o");
    push(a, "BatchMode=yes");
    push(a, "-o");
    pushf(a, "ConnectTimeout=%d", t->connect_timeout_s);
    if (t->accept_new == 1) {
        push(a, "-o");
        push(a, "StrictHostKeyChecking=accept-new");
    }
    push(a, "-o");
    push(a, "ControlMaster=auto");
    push(a, "-o");
    pushf(a, "ControlPath=%s/%%C", t->control_dir);
    push(a, "-o");
    push(a, "ControlPersist=60");
}

/* env NAME=VALUE ... prefix for commands on the node. */
static void env_prefix(const tdm_transport *t, argv_buf *a)
{
    if (!t->node->n_env)
        return;
    push(a, "env");
    for (size_t i = 0; i < t->node->n_env; i++)
        push(a, t->node->env[i]);
}

tdm_status tdm_transport_run(tdm_transport *t, const char *const *argv, size_t argc,
                             const char *stdin_data, size_t stdin_len, int64_t timeout_ms,
                             tdm_spawn_result *res, tdm_error *err)
{
    argv_buf cmd = {0};
    env_prefix(t, &cmd);
    for (size_t i = 0; i < argc; i++)
        push(&cmd, argv[i]);
    if (cmd.nomem) {
        argv_free(&cmd);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    if (t->node->transport == TDM_TRANSPORT_LOCAL) {
        tdm_status st = tdm_spawn_run((const char *const *)cmd.v, stdin_data, stdin_len,
                                      timeout_ms, res, err);
        argv_free(&cmd);
        return st;
    }
    char *line = tdm_shell_join((const char *const *)cmd.v, cmd.n);
    argv_free(&cmd);
    if (!line)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    argv_buf a = {0};
    push(&a, "ssh");
    ssh_options(t, &a, false);
    push(&a, "--");
    push(&a, t->node->host);
    push(&a, line);
    free(line);
    if (a.nomem) {
        argv_free(&a);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    tdm_status st =
        tdm_spawn_run((const char *const *)a.v, stdin_data, stdin_len, timeout_ms, res, err);
    argv_free(&a);
    return st;
}

static void last_line(const char *text, char *buf, size_t size)
{
    const char *tail = tdm_text_tail(text, text ? strlen(text) : 0, 1);
    snprintf(buf, size, "%s", tail);
    buf[strcspn(buf, "\r\n")] = '\0';
}

bool tdm_transport_unreachable(const tdm_transport *t, const tdm_spawn_result *res, char *why,
                               size_t why_size)
{
    if (t->node->transport == TDM_TRANSPORT_LOCAL && !res->timed_out)
        return false;
    if (res->timed_out) {
        snprintf(why, why_size, "no answer (timed out)");
        return true;
    }
    if (res->exit_code != 255)
        return false;
    last_line(res->err, why, why_size);
    if (!why[0])
        snprintf(why, why_size, "ssh failed (exit 255)");
    return true;
}

void tdm_transport_describe(const tdm_transport *t, char *buf, size_t size)
{
    if (t->node->transport == TDM_TRANSPORT_LOCAL) {
        snprintf(buf, size, "local");
        return;
    }
    char port[16] = "";
    if (t->node->port)
        snprintf(port, sizeof port, ":%d", t->node->port);
    snprintf(buf, size, "%s%s%s%s", t->node->user ? t->node->user : "", t->node->user ? "@" : "",
             t->node->host, port);
}

/* "host:path" (IPv6 literals in brackets). */
static char *remote_spec(const tdm_transport *t, const char *path, bool with_user)
{
    const char *host = t->node->host;
    bool v6 = strchr(host, ':') != NULL;
    size_t n = strlen(host) + strlen(path) + (t->node->user ? strlen(t->node->user) : 0) + 8;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s%s%s:%s", with_user && t->node->user ? t->node->user : "",
                 with_user && t->node->user ? "@" : "", v6 ? "[" : "", host, v6 ? "]" : "", path);
    return s;
}

static tdm_status run_local(argv_buf *a, const char *what, tdm_error *err)
{
    if (a->nomem) {
        argv_free(a);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    tdm_spawn_result res;
    tdm_status st = tdm_spawn_run((const char *const *)a->v, NULL, 0, 0, &res, err);
    argv_free(a);
    if (st != TDM_OK)
        return st;
    if (res.exit_code != 0) {
        char line[512];
        last_line(res.err, line, sizeof line);
        st = tdm_fail(err, TDM_ERR_IO, "%s failed (exit %d): %s", what, res.exit_code, line);
    }
    tdm_spawn_result_free(&res);
    return st;
}

/* Makes the parent directory of remote_path on the node. */
static tdm_status remote_mkdir_parent(tdm_transport *t, const char *path, tdm_error *err)
{
    char *parent = strdup(path);
    if (!parent)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent) {
        free(parent);
        return TDM_OK;
    }
    *slash = '\0';
    const char *argv[] = {"mkdir", "-p", "--", parent};
    tdm_spawn_result res;
    tdm_status st = tdm_transport_run(t, argv, 4, NULL, 0, 0, &res, err);
    if (st == TDM_OK && res.exit_code != 0) {
        char line[512];
        last_line(res.err, line, sizeof line);
        st = tdm_fail(err, TDM_ERR_IO, "mkdir -p %s on %s failed: %s", parent, t->node->name,
                      line);
    }
    if (st == TDM_OK)
        tdm_spawn_result_free(&res);
    free(parent);
    return st;
}

/* The -e argument of rsync: ssh and its options, each single-quoted (rsync splits on spaces and
 * honours quotes, not backslashes); NULL when an option holds a quote rsync cannot express. */
static char *rsync_rsh(tdm_transport *t)
{
    argv_buf a = {0};
    push(&a, "ssh");
    ssh_options(t, &a, false);
    if (a.nomem) {
        argv_free(&a);
        return NULL;
    }
    size_t len = 1;
    for (size_t i = 0; i < a.n; i++) {
        if (strpbrk(a.v[i], "'\"")) {
            argv_free(&a);
            return NULL;
        }
        len += strlen(a.v[i]) + 3;
    }
    char *s = malloc(len);
    if (s) {
        s[0] = '\0';
        for (size_t i = 0; i < a.n; i++) {
            if (i)
                strcat(s, " ");
            strcat(s, "'");
            strcat(s, a.v[i]);
            strcat(s, "'");
        }
    }
    argv_free(&a);
    return s;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* One copy between here and the node with rsync, then scp when rsync fails. */
static tdm_status copy_remote(tdm_transport *t, const char *src, const char *dst, bool to_node,
                              bool dir, tdm_error *err)
{
    char *rsh = rsync_rsh(t);
    tdm_error first = {0};
    tdm_status st = TDM_ERR_UNSUPPORTED;
    const char *remote_path = to_node ? dst : src;
    if (rsh) {
        char *spec = remote_spec(t, remote_path, false);
        size_t n = strlen(to_node ? src : dst) + 2;
        char *local = malloc(n);
        if (spec && local) {
            snprintf(local, n, "%s%s", to_node ? src : dst, dir && to_node ? "/" : "");
            char *rspec = spec;
            char *rdir = NULL;
            if (dir && !to_node) {
                size_t m = strlen(spec) + 2;
                rdir = malloc(m);
                if (rdir)
                    snprintf(rdir, m, "%s/", spec);
                rspec = rdir ? rdir : spec;
            }
            argv_buf a = {0};
            push(&a, "rsync");
            push(&a, "-a");
            push(&a, "-s");
            push(&a, "-e");
            push(&a, rsh);
            push(&a, "--");
            push(&a, to_node ? local : rspec);
            push(&a, to_node ? rspec : local);
            st = run_local(&a, "rsync", &first);
            free(rdir);
        } else {
            st = tdm_fail(&first, TDM_ERR_NOMEM, "out of memory");
        }
        free(spec);
        free(local);
        free(rsh);
        if (st == TDM_OK)
            return TDM_OK;
    }
    /* scp (SFTP protocol: the remote path is not seen by a shell). */
    char *spec = remote_spec(t, remote_path, true);
    if (!spec)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    argv_buf a = {0};
    push(&a, "scp");
    push(&a, "-q");
    push(&a, "-p");
    if (dir)
        push(&a, "-r");
    ssh_options(t, &a, true);
    push(&a, "--");
    push(&a, to_node ? src : spec);
    push(&a, to_node ? spec : dst);
    free(spec);
    st = run_local(&a, "scp", err);
    if (st != TDM_OK && first.message[0])
        tdm_error_prefix(err, "%s; then", first.message);
    return st;
}

/* The next component of an absolute path: skips slashes and "." components; sets *len to 0 at
 * the end. */
static const char *next_component(const char *p, size_t *len)
{
    for (;;) {
        while (*p == '/')
            p++;
        *len = strcspn(p, "/");
        if (*len == 1 && p[0] == '.') {
            p++;
            continue;
        }
        return p;
    }
}

tdm_status tdm_transport_check_remote_path(const tdm_cluster_node *node, const char *remote_path,
                                           tdm_error *err)
{
    const char *name = node && node->name ? node->name : "?";
    const char *workdir = node ? node->workdir : NULL;
    if (!remote_path || !remote_path[0])
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: refusing to copy an empty remote path (it would mean the remote "
                        "login's home directory)",
                        name);
    if (remote_path[0] != '/')
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: refusing to copy the relative remote path '%s' (remote paths must "
                        "be absolute and inside the node's workdir)",
                        name, remote_path);
    if (!workdir || workdir[0] != '/')
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: refusing to copy '%s': the node has no absolute workdir", name,
                        remote_path);
    size_t len;
    for (const char *p = next_component(remote_path, &len); len; p = next_component(p + len, &len))
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return tdm_fail(err, TDM_ERR_INVALID,
                            "%s: refusing to copy '%s': remote paths must not contain '..'", name,
                            remote_path);
    /* Every component of the workdir must match, and the path must go on below it. */
    const char *w = next_component(workdir, &len);
    size_t wlen = len;
    const char *p = next_component(remote_path, &len);
    size_t plen = len;
    bool any = wlen > 0;
    while (wlen && plen && wlen == plen && !memcmp(w, p, wlen)) {
        w = next_component(w + wlen, &wlen);
        p = next_component(p + plen, &plen);
    }
    if (!any || wlen || !plen)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: refusing to copy '%s': it is not inside the node's workdir '%s' "
                        "(cluster.yaml); tandem copies only below the workdir",
                        name, remote_path, workdir);
    return TDM_OK;
}

tdm_status tdm_transport_push(tdm_transport *t, const char *local_path, const char *remote_path,
                              tdm_error *err)
{
    tdm_status guard = tdm_transport_check_remote_path(t->node, remote_path, err);
    if (guard != TDM_OK)
        return guard;
    bool dir = is_dir(local_path);
    if (t->node->transport == TDM_TRANSPORT_LOCAL) {
        argv_buf a = {0};
        if (dir) {
            push(&a, "mkdir");
            push(&a, "-p");
            push(&a, "--");
            push(&a, remote_path);
            tdm_status st = run_local(&a, "mkdir", err);
            if (st != TDM_OK)
                return st;
            size_t n = strlen(local_path) + 3;
            char *src = malloc(n);
            if (!src)
                return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            snprintf(src, n, "%s/.", local_path);
            push(&a, "cp");
            push(&a, "-a");
            push(&a, "--");
            push(&a, src);
            push(&a, remote_path);
            free(src);
            return run_local(&a, "cp", err);
        }
        tdm_status st = remote_mkdir_parent(t, remote_path, err);
        if (st != TDM_OK)
            return st;
        push(&a, "cp");
        push(&a, "-a");
        push(&a, "--");
        push(&a, local_path);
        push(&a, remote_path);
        return run_local(&a, "cp", err);
    }
    tdm_status st = remote_mkdir_parent(t, remote_path, err);
    if (st != TDM_OK)
        return st;
    return copy_remote(t, local_path, remote_path, true, dir, err);
}

tdm_status tdm_transport_pull(tdm_transport *t, const char *remote_path, const char *local_path,
                              tdm_error *err)
{
    tdm_status guard = tdm_transport_check_remote_path(t->node, remote_path, err);
    if (guard != TDM_OK)
        return guard;
    /* Is the remote path a directory? */
    const char *argv[] = {"test", "-d", remote_path};
    tdm_spawn_result res;
    tdm_status st = tdm_transport_run(t, argv, 3, NULL, 0, 0, &res, err);
    if (st != TDM_OK)
        return st;
    char why[512];
    if (tdm_transport_unreachable(t, &res, why, sizeof why)) {
        tdm_spawn_result_free(&res);
        return tdm_fail(err, TDM_ERR_IO, "%s: unreachable: %s", t->node->name, why);
    }
    bool dir = res.exit_code == 0;
    tdm_spawn_result_free(&res);
    if (t->node->transport == TDM_TRANSPORT_LOCAL) {
        argv_buf a = {0};
        push(&a, "cp");
        push(&a, "-a");
        push(&a, "--");
        push(&a, remote_path);
        push(&a, local_path);
        return run_local(&a, "cp", err);
    }
    return copy_remote(t, remote_path, local_path, false, dir, err);
}
