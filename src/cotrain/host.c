/* host.c — the co-training host's service thread (contract in host.h). */
#include "cotrain/host.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/timeutil.h"

#define MS 1000000LL
#define STOP_FLUSH_MS 1000
#define CLOSE_FLUSH_MS 1000
#define ELECT_LOCK_MS 10000
#define READS_PER_WAKE 16

typedef struct conn {
    int fd;
    uint64_t id;
    tdm_cotrain_peer peer;
    char *in; /* received bytes not yet parsed */
    size_t in_len, in_cap;
    char *out; /* bytes to send: out[out_off..out_len) */
    size_t out_len, out_cap, out_off;
    bool joined;            /* a join was queued: the trainer may hold adapters of it */
    bool detached;          /* a detach was queued (repeats are dropped: the queue stays bounded) */
    bool closing;           /* send what is queued, then close; ignore input */
    bool dead;              /* close now */
    bool closed_by_trainer; /* tdm_cotrain_host_close: no GONE request */
    int64_t opened_ns, close_deadline_ns;
} conn;

typedef struct rq_node {
    tdm_cotrain_request rq;
    struct rq_node *next;
} rq_node;

struct tdm_cotrain_host {
    char dir[4096];
    tdm_cotrain_advert advert;
    int listen_fd;
    int wake[2]; /* self-pipe: send/close/stop wake the thread's poll */
    pthread_t thread;
    pthread_mutex_t mu;
    bool stopping;
    conn *conns[TDM_COTRAIN_MAX_CONNECTIONS];
    int n_conns;
    uint64_t next_id;
    rq_node *head, *tail;
    int64_t global_step;
    int64_t next_heartbeat_ns;
};

static void wake(tdm_cotrain_host *h)
{
    char c = 1;
    ssize_t r = write(h->wake[1], &c, 1); /* a full pipe is already a pending wake-up */
    (void)r;
}

static void enqueue(tdm_cotrain_host *h, rq_node *n)
{
    n->next = NULL;
    if (h->tail)
        h->tail->next = n;
    else
        h->head = n;
    h->tail = n;
}

static void queue_simple(tdm_cotrain_host *h, tdm_cotrain_request_kind kind, const conn *c,
                         const tdm_cotrain_peer *peer, const char *reason)
{
    rq_node *n = calloc(1, sizeof *n);
    if (!n) return; /* losing a log line or a GONE under OOM; the trainer sees send fail instead */
    n->rq.kind = kind;
    n->rq.conn = c ? c->id : 0;
    if (peer) n->rq.peer = *peer;
    if (reason) snprintf(n->rq.reason, sizeof n->rq.reason, "%s", reason);
    enqueue(h, n);
}

/* Appends bytes to c's outbox; marks c dead when the joiner has stopped reading. */
static bool outbox_put(conn *c, const char *data, size_t len)
{
    if (c->dead) return false;
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len - c->out_off + len > TDM_COTRAIN_OUTBOX_MAX) {
        c->dead = true;
        return false;
    }
    if (c->out_len + len > c->out_cap) {
        if (c->out_off) {
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + len)
            cap *= 2;
        if (cap != c->out_cap) {
            char *p = realloc(c->out, cap);
            if (!p) {
                c->dead = true;
                return false;
            }
            c->out = p;
            c->out_cap = cap;
        }
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    return true;
}

static bool outbox_msg(conn *c, const tdm_cotrain_msg *m)
{
    char *line;
    size_t len;
    tdm_error err = {0};
    if (tdm_cotrain_msg_encode(m, &line, &len, &err) != TDM_OK) return false;
    bool ok = outbox_put(c, line, len);
    free(line);
    return ok;
}

/* Answers "rejected" and closes c once that is sent. */
static void reject(tdm_cotrain_host *h, conn *c, tdm_status status, const char *message)
{
    char text[TDM_COTRAIN_TEXT_MAX];
    snprintf(text, sizeof text, "%s", message);
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_REJECTED};
    m.u.rejected.status = status == TDM_OK ? TDM_ERR_INVALID : status;
    m.u.rejected.message = text;
    outbox_msg(c, &m);
    c->closing = true;
    c->close_deadline_ns = tdm_now_mono_ns() + CLOSE_FLUSH_MS * MS;
    char reason[1024];
    snprintf(reason, sizeof reason, "refused pid %d (user %s): %.900s", (int)c->peer.pid,
             c->peer.user, message);
    queue_simple(h, TDM_COTRAIN_REQ_REFUSED, c, &c->peer, reason);
}

static void handle_line(tdm_cotrain_host *h, conn *c, const char *line, size_t len)
{
    tdm_cotrain_msg m;
    tdm_error err = {0};
    tdm_status st = tdm_cotrain_msg_parse(line, len, &m, &err);
    if (st != TDM_OK) {
        reject(h, c, st, err.message);
        return;
    }
    char msg[TDM_COTRAIN_TEXT_MAX];
    switch (m.type) {
    case TDM_COTRAIN_JOIN:
        if (c->joined) {
            reject(h, c, TDM_ERR_INVALID,
                   "a connection carries one join; this one already "
                   "joined");
        } else if (m.u.join.pid != c->peer.pid || m.u.join.uid != c->peer.uid) {
            snprintf(msg, sizeof msg,
                     "the join claims pid %d uid %u but the socket's peer is pid %d uid %u",
                     (int)m.u.join.pid, (unsigned)m.u.join.uid, (int)c->peer.pid,
                     (unsigned)c->peer.uid);
            reject(h, c, TDM_ERR_INVALID, msg);
        } else if (strcmp(m.u.join.identity, h->advert.base.id) != 0) {
            snprintf(msg, sizeof msg,
                     "base identity %s differs from this host's %s (model %.2000s, %s, %s, device "
                     "%s): start a separate job (--no-join)",
                     m.u.join.identity, h->advert.base.id, h->advert.model_dir,
                     h->advert.base.method, h->advert.base.compute_dtype, h->advert.base.device);
            reject(h, c, TDM_ERR_INVALID, msg);
        } else {
            rq_node *n = calloc(1, sizeof *n);
            if (!n) {
                reject(h, c, TDM_ERR_NOMEM, "the host is out of memory");
                break;
            }
            c->joined = true;
            n->rq.kind = TDM_COTRAIN_REQ_JOIN;
            n->rq.conn = c->id;
            n->rq.peer = c->peer;
            n->rq.msg = m; /* moved */
            memset(&m, 0, sizeof m);
            enqueue(h, n);
        }
        break;
    case TDM_COTRAIN_DETACH:
        if (!c->joined)
            reject(h, c, TDM_ERR_INVALID, "detach before join");
        else if (!c->detached) {
            c->detached = true;
            queue_simple(h, TDM_COTRAIN_REQ_DETACH, c, &c->peer, NULL);
        }
        break;
    default:
        snprintf(msg, sizeof msg, "a joiner may not send a \"%s\" message",
                 tdm_cotrain_msg_type_name(m.type));
        reject(h, c, TDM_ERR_INVALID, msg);
        break;
    }
    tdm_cotrain_msg_free(&m);
}

/* Reads what is available and handles every complete line. */
static void conn_read(tdm_cotrain_host *h, conn *c)
{
    /* At most READS_PER_WAKE receives per wake-up: a peer writing as fast as we read cannot keep
     * the thread from the other connections and the heartbeats (poll reports the rest). */
    for (int reads = 0; reads < READS_PER_WAKE; reads++) {
        if (c->in_cap - c->in_len < 4096) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
            char *p = realloc(c->in, cap);
            if (!p) {
                c->dead = true;
                return;
            }
            c->in = p;
            c->in_cap = cap;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) { /* EOF or error: the joiner is gone */
            c->dead = true;
            return;
        }
        if (c->closing) { /* input after a rejection is ignored */
            c->in_len = 0;
            continue;
        }
        c->in_len += (size_t)r;
        size_t start = 0;
        for (;;) {
            char *nl = memchr(c->in + start, '\n', c->in_len - start);
            if (!nl) break;
            size_t len = (size_t)(nl - (c->in + start));
            if (!c->closing) handle_line(h, c, c->in + start, len);
            start += len + 1;
        }
        memmove(c->in, c->in + start, c->in_len - start);
        c->in_len -= start;
        if (c->in_len > TDM_COTRAIN_MSG_MAX && !c->closing) {
            char msg[128];
            snprintf(msg, sizeof msg, "a co-training message line exceeds %u bytes",
                     TDM_COTRAIN_MSG_MAX);
            reject(h, c, TDM_ERR_INVALID, msg);
            c->in_len = 0;
        }
        /* Bound the buffer a peer can make us hold (a rejected peer that keeps sending). */
        if (c->in_cap > 2 * (size_t)TDM_COTRAIN_MSG_MAX + 8192 && c->in_len == 0) {
            free(c->in);
            c->in = NULL;
            c->in_cap = 0;
        }
    }
}

static void conn_flush(conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w <= 0) {
            c->dead = true;
            return;
        }
        c->out_off += (size_t)w;
    }
}

static void conn_free(conn *c)
{
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
}

static void accept_all(tdm_cotrain_host *h)
{
    for (;;) {
        int fd = accept4(h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or a transient error: poll tells us again */
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->id = ++h->next_id;
        c->opened_ns = tdm_now_mono_ns();
        tdm_error err = {0};
        if (tdm_cotrain_peer_check(fd, h->dir, &c->peer, &err) != TDM_OK ||
            h->n_conns == TDM_COTRAIN_MAX_CONNECTIONS) {
            if (err.status == TDM_OK)
                tdm_fail(&err, TDM_ERR_BUSY, "the host has %d connections, its limit",
                         TDM_COTRAIN_MAX_CONNECTIONS);
            /* Answer once, without waiting for a peer that may not read. */
            reject(h, c, err.status, err.message);
            conn_flush(c);
            conn_free(c);
            continue;
        }
        h->conns[h->n_conns++] = c;
    }
}

static void heartbeat_all(tdm_cotrain_host *h)
{
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_HEARTBEAT};
    m.u.heartbeat.global_step = h->global_step;
    char *line;
    size_t len;
    tdm_error err = {0};
    if (tdm_cotrain_msg_encode(&m, &line, &len, &err) != TDM_OK) return;
    for (int i = 0; i < h->n_conns; i++)
        if (!h->conns[i]->closing) outbox_put(h->conns[i], line, len);
    free(line);
}

/* Removes dead connections, and closing ones that are flushed or past their deadline. */
static void reap(tdm_cotrain_host *h, int64_t now)
{
    int k = 0;
    for (int i = 0; i < h->n_conns; i++) {
        conn *c = h->conns[i];
        bool flushed = c->out_off == c->out_len;
        if (c->dead || (c->closing && (flushed || now >= c->close_deadline_ns))) {
            if (c->joined && !c->closed_by_trainer)
                queue_simple(h, TDM_COTRAIN_REQ_GONE, c, &c->peer, NULL);
            conn_free(c);
        } else {
            h->conns[k++] = c;
        }
    }
    h->n_conns = k;
}

static void *service(void *arg)
{
    tdm_cotrain_host *h = arg;
    struct pollfd fds[2 + TDM_COTRAIN_MAX_CONNECTIONS];
    conn *snap[TDM_COTRAIN_MAX_CONNECTIONS];
    int64_t stop_deadline = 0;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        int64_t now = tdm_now_mono_ns();
        if (h->stopping) {
            if (!stop_deadline) stop_deadline = now + STOP_FLUSH_MS * MS;
            bool pending = false;
            for (int i = 0; i < h->n_conns; i++)
                pending |= !h->conns[i]->dead && h->conns[i]->out_off < h->conns[i]->out_len;
            if (!pending || now >= stop_deadline) {
                pthread_mutex_unlock(&h->mu);
                break;
            }
        }
        int64_t next = h->next_heartbeat_ns;
        for (int i = 0; i < h->n_conns; i++) {
            conn *c = h->conns[i];
            int64_t t = c->closing  ? c->close_deadline_ns
                        : c->joined ? next
                                    : c->opened_ns + TDM_COTRAIN_JOIN_TIMEOUT_MS * MS;
            next = t < next ? t : next;
        }
        if (stop_deadline && stop_deadline < next) next = stop_deadline;
        int nfds = 0;
        fds[nfds++] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = h->stopping ? -1 : h->listen_fd, .events = POLLIN};
        int n = h->n_conns;
        for (int i = 0; i < n; i++) {
            snap[i] = h->conns[i];
            short ev = POLLIN;
            if (snap[i]->out_off < snap[i]->out_len) ev |= POLLOUT;
            fds[nfds++] = (struct pollfd){.fd = snap[i]->fd, .events = ev};
        }
        pthread_mutex_unlock(&h->mu);

        int64_t wait_ms = (next - now + MS - 1) / MS;
        if (wait_ms < 0) wait_ms = 0;
        int r = poll(fds, (nfds_t)nfds, (int)(wait_ms > 60000 ? 60000 : wait_ms));
        if (r < 0 && errno != EINTR)
            tdm_sleep_ms(10); /* cannot happen with valid fds; do not spin */

        pthread_mutex_lock(&h->mu);
        if (fds[0].revents & POLLIN) {
            char buf[256];
            while (read(h->wake[0], buf, sizeof buf) > 0) {
            }
        }
        if (fds[1].revents & POLLIN) accept_all(h);
        for (int i = 0; i < n; i++) {
            conn *c = snap[i];
            short re = fds[2 + i].revents;
            if (re & (POLLIN | POLLHUP | POLLERR)) conn_read(h, c);
            if (!c->dead && (re & POLLOUT)) conn_flush(c);
        }
        now = tdm_now_mono_ns();
        if (now >= h->next_heartbeat_ns) {
            heartbeat_all(h);
            h->next_heartbeat_ns = now + TDM_COTRAIN_HEARTBEAT_MS * MS;
        }
        for (int i = 0; i < h->n_conns; i++) {
            conn *c = h->conns[i];
            if (!c->joined && !c->closing && now >= c->opened_ns + TDM_COTRAIN_JOIN_TIMEOUT_MS * MS)
                reject(h, c, TDM_ERR_TIMEOUT, "no join message within 10 seconds");
            if (!c->dead && c->out_off < c->out_len)
                conn_flush(c); /* most writes complete at once; POLLOUT handles the rest */
        }
        reap(h, now);
        pthread_mutex_unlock(&h->mu);
    }
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n_conns; i++)
        conn_free(h->conns[i]);
    h->n_conns = 0;
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

tdm_status tdm_cotrain_host_start(tdm_cotrain_host **out, const char *dir,
                                  const tdm_base_identity *base, const char *model_dir,
                                  tdm_error *err)
{
    *out = NULL;
    tdm_cotrain_host *h = calloc(1, sizeof *h);
    if (!h) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    h->listen_fd = h->wake[0] = h->wake[1] = -1;
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    if (pipe2(h->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        free(h);
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create a pipe");
    }
    tdm_status st = tdm_cotrain_listen(dir, base, model_dir, &h->listen_fd, &h->advert, err);
    if (st != TDM_OK) {
        close(h->wake[0]);
        close(h->wake[1]);
        free(h);
        return st;
    }
    pthread_mutex_init(&h->mu, NULL);
    h->next_heartbeat_ns = tdm_now_mono_ns() + TDM_COTRAIN_HEARTBEAT_MS * MS;
    int e = pthread_create(&h->thread, NULL, service, h);
    if (e != 0) {
        tdm_cotrain_unadvertise(dir, h->advert.pid);
        close(h->listen_fd);
        close(h->wake[0]);
        close(h->wake[1]);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot start the co-training service thread");
    }
    *out = h;
    return TDM_OK;
}

bool tdm_cotrain_host_take(tdm_cotrain_host *h, tdm_cotrain_request *rq)
{
    pthread_mutex_lock(&h->mu);
    rq_node *n = h->head;
    if (n) {
        h->head = n->next;
        if (!h->head) h->tail = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    if (!n) return false;
    *rq = n->rq;
    free(n);
    return true;
}

void tdm_cotrain_request_free(tdm_cotrain_request *rq)
{
    tdm_cotrain_msg_free(&rq->msg);
    memset(rq, 0, sizeof *rq);
}

static conn *find_conn(tdm_cotrain_host *h, uint64_t id)
{
    for (int i = 0; i < h->n_conns; i++)
        if (h->conns[i]->id == id) return h->conns[i];
    return NULL;
}

tdm_status tdm_cotrain_host_send(tdm_cotrain_host *h, uint64_t id, const tdm_cotrain_msg *msg,
                                 tdm_error *err)
{
    char *line;
    size_t len;
    tdm_status st = tdm_cotrain_msg_encode(msg, &line, &len, err);
    if (st != TDM_OK) return st;
    pthread_mutex_lock(&h->mu);
    conn *c = find_conn(h, id);
    bool ok = c && !c->closing && outbox_put(c, line, len);
    pthread_mutex_unlock(&h->mu);
    free(line);
    if (!ok)
        return tdm_fail(err, TDM_ERR_NOT_FOUND,
                        "co-training connection %llu is closed (the joiner left or stopped "
                        "reading)",
                        (unsigned long long)id);
    wake(h);
    return TDM_OK;
}

void tdm_cotrain_host_close(tdm_cotrain_host *h, uint64_t id)
{
    pthread_mutex_lock(&h->mu);
    conn *c = find_conn(h, id);
    if (c && !c->closing) {
        c->closing = true;
        c->closed_by_trainer = true;
        c->close_deadline_ns = tdm_now_mono_ns() + CLOSE_FLUSH_MS * MS;
    }
    pthread_mutex_unlock(&h->mu);
    wake(h);
}

void tdm_cotrain_host_set_step(tdm_cotrain_host *h, int64_t global_step)
{
    pthread_mutex_lock(&h->mu);
    h->global_step = global_step;
    pthread_mutex_unlock(&h->mu);
}

const tdm_cotrain_advert *tdm_cotrain_host_advert(const tdm_cotrain_host *h)
{
    return &h->advert;
}

tdm_status tdm_cotrain_host_publish(tdm_cotrain_host *h, const json_t *status, tdm_error *err)
{
    return tdm_cotrain_advertise(h->dir, &h->advert, status, err);
}

void tdm_cotrain_host_stop(tdm_cotrain_host *h)
{
    if (!h) return;
    /* No new joiner finds us from here on; connected ones get what is queued. */
    tdm_cotrain_unadvertise(h->dir, h->advert.pid);
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    pthread_mutex_unlock(&h->mu);
    wake(h);
    pthread_join(h->thread, NULL);
    close(h->listen_fd);
    close(h->wake[0]);
    close(h->wake[1]);
    rq_node *n = h->head;
    while (n) {
        rq_node *next = n->next;
        tdm_cotrain_request_free(&n->rq);
        free(n);
        n = next;
    }
    pthread_mutex_destroy(&h->mu);
    free(h);
}

tdm_status tdm_cotrain_elect(const char *dir, const tdm_base_identity *base, const char *model_dir,
                             tdm_cotrain_host **out, tdm_cotrain_advert *found, const char **why,
                             tdm_error *err)
{
    *out = NULL;
    if (why) *why = "";
    char path[4200];
    if (snprintf(path, sizeof path, "%s/cotrain.lock", dir) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
                  tdm_cotrain_dir_shared(dir) ? 0660 : 0600);
    if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open %s", path);
    int64_t deadline = tdm_now_mono_ns() + ELECT_LOCK_MS * MS;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || tdm_now_mono_ns() >= deadline) {
            int e = errno;
            close(fd);
            return tdm_fail_errno(err, TDM_ERR_TIMEOUT, e,
                                  "cannot lock %s within %d s (a process holds it: see fuser)",
                                  path, ELECT_LOCK_MS / 1000);
        }
        tdm_sleep_ms(2);
    }
    const char *mismatch = "";
    tdm_status st = tdm_cotrain_find_host(dir, base, found, &mismatch, err);
    if (st == TDM_ERR_NOT_FOUND) {
        if (why) *why = mismatch;
        st = tdm_cotrain_host_start(out, dir, base, model_dir, err);
    }
    close(fd); /* releases the lock: the advertisement is already in place */
    return st;
}
