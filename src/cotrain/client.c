/* client.c — the joiner's end of a co-training connection (contract in client.h). */
#include "cotrain/client.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cotrain/endpoint.h"
#include "cotrain/host.h"
#include "util/timeutil.h"

#define MS 1000000LL
#define SEND_TIMEOUT_MS 5000

tdm_status tdm_cotrain_client_connect(tdm_cotrain_client *c, const char *socket_path,
                                      tdm_error *err)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    tdm_status st = tdm_cotrain_connect(socket_path, &c->fd, err);
    c->last_rx_ns = tdm_now_mono_ns();
    return st;
}

static tdm_status gone(tdm_cotrain_client *c, bool eof, tdm_error *err)
{
    c->host_gone = true;
    c->eof = eof;
    if (eof) return tdm_fail(err, TDM_ERR_IO, "the co-training host closed the connection");
    return tdm_fail(err, TDM_ERR_IO,
                    "the co-training host sent nothing for %d ms (it is frozen or stopped)",
                    TDM_COTRAIN_HOST_SILENCE_MS);
}

tdm_status tdm_cotrain_client_send(tdm_cotrain_client *c, const tdm_cotrain_msg *msg,
                                   tdm_error *err)
{
    if (c->host_gone) return tdm_fail(err, TDM_ERR_IO, "the co-training host is gone");
    char *line;
    size_t len;
    tdm_status st = tdm_cotrain_msg_encode(msg, &line, &len, err);
    if (st != TDM_OK) return st;
    int64_t deadline = tdm_now_mono_ns() + SEND_TIMEOUT_MS * MS;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(c->fd, line + off, len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int64_t left = (deadline - tdm_now_mono_ns()) / MS;
            if (left <= 0) {
                free(line);
                return gone(c, false, err);
            }
            struct pollfd p = {.fd = c->fd, .events = POLLOUT};
            poll(&p, 1, (int)left);
            continue;
        }
        /* EPIPE / ECONNRESET: the host closed, usually right after answering (a refused
         * peer). Not host_gone yet: next() still reads the answer, then the EOF. */
        int e = errno;
        free(line);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "the co-training host closed the connection");
    }
    free(line);
    return TDM_OK;
}

/* One complete line from the buffer into *msg; false when there is none. Heartbeats are
 * consumed. */
static bool take_line(tdm_cotrain_client *c, tdm_cotrain_msg *msg, tdm_status *st, tdm_error *err)
{
    for (;;) {
        /* memchr needs a valid pointer even for 0 bytes: in is NULL before the first read */
        char *nl = c->in_len ? memchr(c->in, '\n', c->in_len) : NULL;
        if (!nl) {
            if (c->in_len > TDM_COTRAIN_MSG_MAX) {
                *st =
                    tdm_fail(err, TDM_ERR_INVALID, "the co-training host sent a line over %u bytes",
                             TDM_COTRAIN_MSG_MAX);
                c->in_len = 0;
                return true;
            }
            return false;
        }
        size_t len = (size_t)(nl - c->in);
        *st = tdm_cotrain_msg_parse(c->in, len, msg, err);
        memmove(c->in, nl + 1, c->in_len - len - 1);
        c->in_len -= len + 1;
        if (*st == TDM_OK && msg->type == TDM_COTRAIN_HEARTBEAT) {
            tdm_cotrain_msg_free(msg);
            continue;
        }
        return true;
    }
}

tdm_status tdm_cotrain_client_next(tdm_cotrain_client *c, int timeout_ms, tdm_cotrain_msg *msg,
                                   tdm_error *err)
{
    memset(msg, 0, sizeof *msg);
    tdm_status st;
    if (take_line(c, msg, &st, err)) return st;
    if (c->host_gone) return tdm_fail(err, TDM_ERR_IO, "the co-training host is gone");
    int64_t deadline = tdm_now_mono_ns() + (int64_t)timeout_ms * MS;
    for (;;) {
        int64_t now = tdm_now_mono_ns();
        int64_t silence_at = c->last_rx_ns + TDM_COTRAIN_HOST_SILENCE_MS * MS;
        if (now >= silence_at) return gone(c, false, err);
        int64_t until = deadline < silence_at ? deadline : silence_at;
        int wait_ms = (int)((until - now + MS - 1) / MS);
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int r = poll(&p, 1, wait_ms < 0 ? 0 : wait_ms);
        if (r < 0 && errno == EINTR) return tdm_fail(err, TDM_ERR_TIMEOUT, "interrupted");
        if (r > 0) {
            if (c->in_cap - c->in_len < 4096) {
                size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
                char *np = realloc(c->in, cap);
                if (!np) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
                c->in = np;
                c->in_cap = cap;
            }
            ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n <= 0) return gone(c, true, err);
            c->in_len += (size_t)n;
            c->last_rx_ns = tdm_now_mono_ns();
            if (take_line(c, msg, &st, err)) return st;
            continue;
        }
        if (tdm_now_mono_ns() >= deadline)
            return tdm_fail(err, TDM_ERR_TIMEOUT,
                            "no message from the co-training host within "
                            "%d ms",
                            timeout_ms);
    }
}

void tdm_cotrain_client_keep_waiting(tdm_cotrain_client *c)
{
    if (c->eof || c->fd < 0) return;
    c->host_gone = false;
    c->last_rx_ns = tdm_now_mono_ns();
}

void tdm_cotrain_client_close(tdm_cotrain_client *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->in);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}
