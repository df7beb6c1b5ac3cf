/* spawn.c — posix_spawnp with three pipes and a poll loop. */
#include "cluster/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/timeutil.h"

extern char **environ;

typedef struct sink {
    char *p;
    size_t len, cap;
    bool truncated;
} sink;

static bool sink_add(sink *s, const char *data, size_t n)
{
    size_t room = TDM_SPAWN_OUTPUT_MAX - s->len; /* s->len never exceeds the maximum */
    if (n > room) {
        s->truncated = true;
        n = room;
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p)
            return false;
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
    s->p[s->len] = '\0';
    return true;
}

/* Reads what fd has now; returns -1 on EOF/error (fd to be closed), 0 otherwise. */
static int drain(int fd, sink *s, bool *nomem)
{
    char buf[16384];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0) {
            if (!sink_add(s, buf, (size_t)r))
                *nomem = true;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -1;
    }
}

tdm_status tdm_spawn_run(const char *const *argv, const char *stdin_data, size_t stdin_len,
                         int64_t timeout_ms, tdm_spawn_result *res, tdm_error *err)
{
    memset(res, 0, sizeof *res);
    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(errp, O_CLOEXEC)) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (in[i] >= 0) close(in[i]);
            if (out[i] >= 0) close(out[i]);
            if (errp[i] >= 0) close(errp[i]);
        }
        return tdm_fail_errno(err, TDM_ERR_IO, e, "pipe");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, &attr, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(in[0]);
    close(out[1]);
    close(errp[1]);
    sink so = {0}, se = {0};
    bool nomem = false;
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        close(errp[0]);
        char msg[512];
        snprintf(msg, sizeof msg, "%s: %s\n", argv[0], strerror(rc));
        sink_add(&se, msg, strlen(msg));
        sink_add(&so, "", 0);
        res->exit_code = 127;
        res->out = so.p, res->out_len = so.len;
        res->err = se.p, res->err_len = se.len;
        return (so.p && se.p) ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    /* A child that stops reading stdin must not kill us with SIGPIPE: block it while writing. */
    sigset_t pipe_set, old_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);

    size_t written = 0;
    int fd_in = in[1], fd_out = out[0], fd_err = errp[0];
    if (!stdin_data || stdin_len == 0) {
        close(fd_in);
        fd_in = -1;
    }
    int64_t deadline = timeout_ms > 0 ? tdm_now_mono_ns() + timeout_ms * 1000000 : 0;
    int status = 0;
    bool exited = false;
    while (!exited) {
        struct pollfd p[3];
        int np = 0;
        if (fd_in >= 0) p[np++] = (struct pollfd){.fd = fd_in, .events = POLLOUT};
        if (fd_out >= 0) p[np++] = (struct pollfd){.fd = fd_out, .events = POLLIN};
        if (fd_err >= 0) p[np++] = (struct pollfd){.fd = fd_err, .events = POLLIN};
        poll(p, (nfds_t)np, 20);
        if (fd_in >= 0) {
            ssize_t w = write(fd_in, stdin_data + written, stdin_len - written);
            if (w > 0)
                written += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == stdin_len) {
                close(fd_in);
                fd_in = -1;
            }
        }
        if (fd_out >= 0 && drain(fd_out, &so, &nomem) < 0) {
            close(fd_out);
            fd_out = -1;
        }
        if (fd_err >= 0 && drain(fd_err, &se, &nomem) < 0) {
            close(fd_err);
            fd_err = -1;
        }
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            exited = true;
        } else if (deadline && tdm_now_mono_ns() > deadline && !res->timed_out) {
            res->timed_out = true;
            kill(pid, SIGKILL);
        }
    }
    /* The child is gone: what it wrote is in the pipes; read it without waiting for EOF. */
    if (fd_out >= 0) {
        drain(fd_out, &so, &nomem);
        close(fd_out);
    }
    if (fd_err >= 0) {
        drain(fd_err, &se, &nomem);
        close(fd_err);
    }
    if (fd_in >= 0)
        close(fd_in);
    /* Discard a SIGPIPE raised by our writes before unblocking it. */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_set, NULL);
    if (!sink_add(&so, "", 0) || !sink_add(&se, "", 0))
        nomem = true;
    if (nomem) {
        free(so.p);
        free(se.p);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory collecting %s's output", argv[0]);
    }
    res->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    res->out = so.p, res->out_len = so.len, res->out_truncated = so.truncated;
    res->err = se.p, res->err_len = se.len, res->err_truncated = se.truncated;
    return TDM_OK;
}

void tdm_spawn_result_free(tdm_spawn_result *res)
{
    free(res->out);
    free(res->err);
    memset(res, 0, sizeof *res);
}

const char *tdm_text_tail(const char *text, size_t len, int max_lines)
{
    if (!text || !len)
        return text ? text : "";
    size_t end = len;
    if (text[end - 1] == '\n')
        end--;
    int lines = 0;
    for (size_t i = end; i > 0; i--) {
        if (text[i - 1] == '\n' && ++lines >= max_lines)
            return text + i;
    }
    return text;
}
