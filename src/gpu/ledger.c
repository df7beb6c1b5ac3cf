/* ledger.c — the VRAM ledger's file protocol and JSON format (contract in ledger.h). */
#include "gpu/ledger.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "obs/obs.h"
#include "util/atomic_file.h"
#include "util/json_file.h"
#include "util/fault.h"
#include "util/mkdir_p.h"
#include "util/timeutil.h"

#define LEDGER_VERSION 1
#define DEFAULT_LOCK_TIMEOUT_MS 30000

int64_t tdm_ledger_lease_sec(void)
{
    const char *s = getenv("TANDEM_LEASE_SEC");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (!*end && v > 0)
            return v;
    }
    return 24 * 3600;
}

int64_t tdm_ledger_recovery_sec(void)
{
    const char *s = getenv("TANDEM_RENEW_SEC");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (!*end && v > 0)
            return v;
    }
    return 300;
}

tdm_status tdm_ledger_default_dir(char *buf, size_t size, tdm_error *err)
{
    const char *dir = getenv("TANDEM_LEDGER_DIR");
    int n;
    if (dir && *dir) {
        n = snprintf(buf, size, "%s", dir);
    } else {
        const char *cache = getenv("XDG_CACHE_HOME");
        if (cache && *cache) {
            n = snprintf(buf, size, "%s/tandem", cache);
        } else {
            const char *home = getenv("HOME");
            if (!home || !*home)
                return tdm_fail(err, TDM_ERR_INVALID,
                                "cannot place the GPU ledger: neither TANDEM_LEDGER_DIR, "
                                "XDG_CACHE_HOME nor HOME is set");
            n = snprintf(buf, size, "%s/.cache/tandem", home);
        }
    }
    if (n < 0 || (size_t)n >= size)
        return tdm_fail(err, TDM_ERR_INVALID, "ledger directory path is too long");
    return TDM_OK;
}

tdm_status tdm_ledger_open(tdm_ledger *ledger, const char *dir, tdm_error *err)
{
    memset(ledger, 0, sizeof *ledger);
    ledger->lock_fd = -1;
    ledger->lock_timeout_ms = DEFAULT_LOCK_TIMEOUT_MS;
    const char *t = getenv("TANDEM_LOCK_TIMEOUT_MS");
    if (t && atoll(t) > 0)
        ledger->lock_timeout_ms = atoll(t);
    if (dir) {
        if (snprintf(ledger->dir, sizeof ledger->dir, "%s", dir) >= (int)sizeof ledger->dir)
            return tdm_fail(err, TDM_ERR_INVALID, "ledger directory path is too long");
    } else if (tdm_ledger_default_dir(ledger->dir, sizeof ledger->dir, err) != TDM_OK) {
        return err->status;
    }
    struct stat st;
    if (lstat(ledger->dir, &st) != 0) {
        if (errno != ENOENT)
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot inspect %s", ledger->dir);
        if (tdm_mkdir_p(ledger->dir, 0700, err) != TDM_OK)
            return err->status;
        if (lstat(ledger->dir, &st) != 0)
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot inspect %s", ledger->dir);
    }
    if (S_ISLNK(st.st_mode))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "ledger directory %s is a symbolic link; refusing it (a link could redirect "
                        "the ledger into another user's files). Point TANDEM_LEDGER_DIR at a real "
                        "directory",
                        ledger->dir);
    if (!S_ISDIR(st.st_mode))
        return tdm_fail(err, TDM_ERR_INVALID, "ledger path %s is not a directory", ledger->dir);
    snprintf(ledger->data_path, sizeof ledger->data_path, "%s/gpu-ledger.json", ledger->dir);
    snprintf(ledger->lock_path, sizeof ledger->lock_path, "%s/gpu-ledger.lock", ledger->dir);
    const char *paths[] = {ledger->data_path, ledger->lock_path};
    for (int i = 0; i < 2; i++)
        if (lstat(paths[i], &st) == 0 && S_ISLNK(st.st_mode))
            return tdm_fail(err, TDM_ERR_INVALID, "%s is a symbolic link; refusing it", paths[i]);
    return TDM_OK;
}

/* 0660 when an administrator prepared a group-writable directory for several users, else 0600. */
static mode_t ledger_file_mode(const tdm_ledger *ledger)
{
    struct stat st;
    if (stat(ledger->dir, &st) == 0 && (st.st_mode & S_IWGRP))
        return 0660;
    return 0600;
}

/* Opens the lock file, creating it with the data file's mode. open()'s mode is narrowed by the
 * umask (0660 became 0640 under umask 022), which locked every other member of a shared group
 * directory out of the ledger, so the mode is set with fchmod as well: on creation, and on a lock
 * file of ours that an older tandem created too narrow. */
static int open_lock_file(const tdm_ledger *ledger, tdm_error *err)
{
    mode_t mode = ledger_file_mode(ledger);
    int fd = open(ledger->lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        int saved = errno;
        struct stat st;
        if (saved == EACCES && lstat(ledger->lock_path, &st) == 0)
            return tdm_fail_errno(err, TDM_ERR_IO, saved,
                                  "cannot open the GPU ledger's lock file %s: it has mode %04o "
                                  "and owner uid %ld, so you may not write it. In a directory "
                                  "shared by a group, its owner (or root) must run `chmod 0660 "
                                  "%s`; TANDEM_LEDGER_DIR chooses another ledger",
                                  ledger->lock_path, (unsigned)(st.st_mode & 07777),
                                  (long)st.st_uid, ledger->lock_path),
                   -1;
        return tdm_fail_errno(err, TDM_ERR_IO, saved,
                              "cannot open the GPU ledger's lock file %s (the ledger directory "
                              "must be writable by you; TANDEM_LEDGER_DIR chooses another)",
                              ledger->lock_path),
               -1;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & mode) != mode)
        (void)fchmod(fd, (st.st_mode & 0777) | mode); /* widen only; best effort */
    return fd;
}

static tdm_status ledger_lock(tdm_ledger *ledger, tdm_error *err)
{
    int fd = open_lock_file(ledger, err);
    if (fd < 0)
        return err->status;
    /* Bounded wait: non-blocking attempts with a backoff from 0.1 ms to 5 ms. */
    tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_LOCK_ACQ);
    int64_t deadline = tdm_now_mono_ns() + ledger->lock_timeout_ms * 1000000LL;
    int64_t backoff_us = 100;
    for (;;) {
        if (tdm_fault("ledger.lock")) {
            close(fd);
            tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "error")));
            return tdm_fail(err, TDM_ERR_IO, "cannot lock %s: injected fault", ledger->lock_path);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int saved = errno;
            close(fd);
            tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "error")));
            return tdm_fail_errno(err, TDM_ERR_IO, saved, "cannot lock %s", ledger->lock_path);
        }
        if (tdm_now_mono_ns() > deadline) {
            close(fd);
            tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "timeout")));
            return tdm_fail(err, TDM_ERR_BUSY,
                            "could not lock the GPU ledger %s within %lld ms; another process holds "
                            "it (a hung tandem?). See `tandem gpu status`",
                            ledger->lock_path, (long long)ledger->lock_timeout_ms);
        }
        struct timespec ts = {0, backoff_us * 1000};
        nanosleep(&ts, NULL);
        if (backoff_us < 5000)
            backoff_us *= 2;
    }
    ledger->lock_fd = fd;
    tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "locked")));
    return TDM_OK;
}

static void ledger_unlock(tdm_ledger *ledger)
{
    if (ledger->lock_fd >= 0) {
        tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_LOCK_REL);
        flock(ledger->lock_fd, LOCK_UN);
        close(ledger->lock_fd);
        ledger->lock_fd = -1;
        tdm_obs_end(&phase, 0, NULL);
    }
}

/* Reads the data file into state. Missing: empty state. Unreadable or unparsable: moved aside with
 * a warning, empty state, *moved_aside = true. */
static tdm_status ledger_read_file(tdm_ledger *ledger, tdm_ledger_state *state,
                                   bool *moved_aside, tdm_error *err);

static tdm_status ledger_read(tdm_ledger *ledger, tdm_ledger_state *state, bool *moved_aside,
                              tdm_error *err)
{
    tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_LEDGER_RD);
    tdm_status st = ledger_read_file(ledger, state, moved_aside, err);
    tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", st != TDM_OK ? "error"
                                                               : *moved_aside ? "moved_aside"
                                                                              : "ok"),
                                       TDM_TRACE_INT("reservations",
                                                     (int64_t)state->n_reservations),
                                       TDM_TRACE_INT("queued", (int64_t)state->n_queue)));
    return st;
}

static tdm_status ledger_read_file(tdm_ledger *ledger, tdm_ledger_state *state,
                                   bool *moved_aside, tdm_error *err)
{
    *moved_aside = false;
    tdm_ledger_state_init(state);
    char *text = NULL;
    size_t len = 0;
    tdm_error rerr = {0};
    tdm_status st = tdm_fault("ledger.read")
                        ? tdm_fail(&rerr, TDM_ERR_IO, "cannot read %s: injected fault",
                                   ledger->data_path)
                        : tdm_read_file(ledger->data_path, &text, &len, &rerr);
    if (st == TDM_ERR_NOT_FOUND)
        return TDM_OK;
    if (st == TDM_OK) {
        st = tdm_ledger_state_from_json(text, len, state, &rerr);
        free(text);
        if (st == TDM_OK)
            return TDM_OK;
        tdm_ledger_state_free(state);
        tdm_ledger_state_init(state);
    }
    char stamp[32], aside[4300];
    tdm_format_rfc3339(time(NULL), stamp, sizeof stamp);
    snprintf(aside, sizeof aside, "%s.corrupt-%s-%ld", ledger->data_path, stamp, (long)getpid());
    if (rename(ledger->data_path, aside) != 0)
        return tdm_fail_errno(err, TDM_ERR_CORRUPT, errno,
                              "the GPU ledger %s is unusable (%s) and could not be moved aside",
                              ledger->data_path, rerr.message);
    tdm_warn("the GPU ledger was unusable (%s); it was moved aside to %s and a fresh ledger was "
             "started. Running jobs re-register their reservations; until they have, admission "
             "also counts the memory the GPUs report in use",
             rerr.message, aside);
    state->recovering_until = time(NULL) + (time_t)tdm_ledger_recovery_sec();
    *moved_aside = true;
    return TDM_OK;
}

static tdm_status ledger_write(tdm_ledger *ledger, const tdm_ledger_state *state, tdm_error *err)
{
    tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_LEDGER_WR);
    char *json = tdm_ledger_state_to_json(state);
    if (!json) {
        tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "error")));
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory serialising the GPU ledger");
    }
    tdm_status st =
        tdm_atomic_write(ledger->data_path, json, strlen(json), ledger_file_mode(ledger), err);
    free(json);
    tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", st == TDM_OK ? "ok" : "error")));
    if (st != TDM_OK)
        tdm_error_prefix(err, "cannot update the GPU ledger (is %s writable?)", ledger->dir);
    return st;
}

/* Removes ".gpu-ledger.json.tmp-PID" files left by writers killed between creating and renaming
 * them (kill -9, power loss): those whose PID is dead, or names a process started after the file
 * was last written (a recycled PID). Runs under the lock, where no live writer has a temp file
 * open, so a live PID's file is only kept out of caution. Returns how many were removed. */
static size_t remove_stale_temps(const tdm_ledger *ledger)
{
    static const char prefix[] = ".gpu-ledger.json.tmp-";
    DIR *d = opendir(ledger->dir);
    if (!d)
        return 0;
    size_t removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0)
            continue;
        const char *digits = e->d_name + sizeof prefix - 1;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (end == digits || *end || errno || pid <= 0 || pid > INT32_MAX)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode))
            continue;
        if (tdm_proc_running_since((pid_t)pid, st.st_mtime))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

tdm_status tdm_ledger_transact(tdm_ledger *ledger, tdm_ledger_decide_fn decide, void *user,
                               tdm_error *err)
{
    if (ledger_lock(ledger, err) != TDM_OK)
        return err->status;
    size_t stale_temps = remove_stale_temps(ledger);
    tdm_ledger_state state;
    bool moved_aside;
    tdm_status st = ledger_read(ledger, &state, &moved_aside, err);
    if (st == TDM_OK) {
        bool changed = moved_aside;
        tdm_trace_span cleanup = tdm_trace_span_begin("LedgerCleanup", "gpu");
        size_t pruned = tdm_ledger_state_prune(&state, time(NULL), tdm_host_name());
        tdm_trace_span_end(&cleanup,
                           TDM_TRACE_ARGS(TDM_TRACE_INT("pruned", (int64_t)pruned),
                                          TDM_TRACE_INT("stale_temps", (int64_t)stale_temps)));
        if (pruned > 0)
            changed = true;
        if (decide)
            st = decide(&state, &changed, user, err);
        if (st == TDM_OK && changed)
            st = ledger_write(ledger, &state, err);
    }
    tdm_ledger_state_free(&state);
    ledger_unlock(ledger);
    return st;
}

tdm_status tdm_ledger_snapshot(tdm_ledger *ledger, tdm_ledger_state *out, tdm_error *err)
{
    if (ledger_lock(ledger, err) != TDM_OK)
        return err->status;
    bool moved_aside;
    tdm_status st = ledger_read(ledger, out, &moved_aside, err);
    if (st == TDM_OK)
        tdm_ledger_state_prune(out, time(NULL), tdm_host_name());
    /* The fresh ledger carries the recovery mark to the next admission, and its appearance is
     * what wakes waiters; the holders were woken by the move itself. */
    if (st == TDM_OK && moved_aside)
        st = ledger_write(ledger, out, err);
    ledger_unlock(ledger);
    return st;
}

/* ---- state ---- */

void tdm_ledger_state_init(tdm_ledger_state *s)
{
    memset(s, 0, sizeof *s);
    s->next_ticket = 1;
}

void tdm_ledger_state_free(tdm_ledger_state *s)
{
    free(s->reservations);
    free(s->queue);
    memset(s, 0, sizeof *s);
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = ncap;
    return true;
}

tdm_status tdm_ledger_state_add_reservation(tdm_ledger_state *s, const tdm_reservation *r,
                                            tdm_error *err)
{
    if (!grow((void **)&s->reservations, &s->cap_reservations, s->n_reservations + 1, sizeof *r))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    s->reservations[s->n_reservations++] = *r;
    return TDM_OK;
}

tdm_status tdm_ledger_state_add_ticket(tdm_ledger_state *s, const tdm_ticket *t, tdm_error *err)
{
    if (!grow((void **)&s->queue, &s->cap_queue, s->n_queue + 1, sizeof *t))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    size_t i = s->n_queue; /* insertion keeps the queue sorted by ticket */
    while (i > 0 && s->queue[i - 1].ticket > t->ticket) {
        s->queue[i] = s->queue[i - 1];
        i--;
    }
    s->queue[i] = *t;
    s->n_queue++;
    if (t->ticket >= s->next_ticket)
        s->next_ticket = t->ticket + 1;
    return TDM_OK;
}

bool tdm_ledger_state_settling(const tdm_ledger_state *s, time_t now)
{
    if (s->recovering_until <= now)
        return false;
    time_t moved_aside_at = s->recovering_until - (time_t)tdm_ledger_recovery_sec();
    return now < moved_aside_at + TDM_LEDGER_REREGISTER_GRACE_SEC;
}

tdm_status tdm_ledger_state_take_ticket(tdm_ledger_state *s, int64_t *ticket, tdm_error *err)
{
    if (s->next_ticket >= TDM_LEDGER_TICKET_LIMIT) {
        if (s->n_queue > 0)
            return tdm_fail(err, TDM_ERR_CORRUPT,
                            "the GPU ledger's ticket numbers are exhausted (next_ticket %lld, "
                            "limit 2^53) while %zu job(s) wait; they restart at 1 once the queue "
                            "is empty",
                            (long long)s->next_ticket, s->n_queue);
        s->next_ticket = 1;
    }
    *ticket = s->next_ticket++;
    return TDM_OK;
}

tdm_reservation *tdm_ledger_state_find_reservation(tdm_ledger_state *s, const char *id)
{
    for (size_t i = 0; i < s->n_reservations; i++)
        if (!strcmp(s->reservations[i].id, id))
            return &s->reservations[i];
    return NULL;
}

tdm_ticket *tdm_ledger_state_find_ticket(tdm_ledger_state *s, int64_t ticket)
{
    for (size_t i = 0; i < s->n_queue; i++)
        if (s->queue[i].ticket == ticket)
            return &s->queue[i];
    return NULL;
}

bool tdm_ledger_state_remove_reservation(tdm_ledger_state *s, const char *id)
{
    tdm_reservation *r = tdm_ledger_state_find_reservation(s, id);
    if (!r)
        return false;
    size_t i = (size_t)(r - s->reservations);
    memmove(r, r + 1, (s->n_reservations - i - 1) * sizeof *r);
    s->n_reservations--;
    return true;
}

bool tdm_ledger_state_remove_ticket(tdm_ledger_state *s, int64_t ticket)
{
    tdm_ticket *t = tdm_ledger_state_find_ticket(s, ticket);
    if (!t)
        return false;
    size_t i = (size_t)(t - s->queue);
    memmove(t, t + 1, (s->n_queue - i - 1) * sizeof *t);
    s->n_queue--;
    return true;
}

static bool any_holder_alive(const tdm_holder *h, int n)
{
    for (int i = 0; i < n; i++)
        if (tdm_holder_alive(&h[i]))
            return true;
    return false;
}

/* Stale: lease expired, or (on this host, where PIDs mean something) no holder alive. */
static bool entry_stale(const char *host, const tdm_holder *h, int n, time_t lease_expires,
                        time_t now, const char *this_host)
{
    if (lease_expires <= now)
        return true;
    return !strcmp(host, this_host) && !any_holder_alive(h, n);
}

/* Bounds a lease read from the file (ledger.h): this host's is cut to max_lease; another host's
 * beyond max_lease + the clock skew becomes expired (now), since nothing of ours can renew or
 * release it. */
static void bound_lease(const char *host, time_t *lease_expires, time_t now, time_t max_lease,
                        const char *this_host)
{
    if (*lease_expires <= max_lease)
        return;
    if (!strcmp(host, this_host))
        *lease_expires = max_lease;
    else if (*lease_expires > max_lease + TDM_LEDGER_CLOCK_SKEW_SEC)
        *lease_expires = now;
}

size_t tdm_ledger_state_prune(tdm_ledger_state *s, time_t now, const char *this_host)
{
    size_t removed = 0, w = 0;
    time_t max_lease = now + (time_t)tdm_ledger_lease_sec();
    time_t max_recovery = now + (time_t)tdm_ledger_recovery_sec();
    if (s->recovering_until <= now)
        s->recovering_until = 0;
    else if (s->recovering_until > max_recovery)
        s->recovering_until = max_recovery;
    for (size_t i = 0; i < s->n_reservations; i++) {
        tdm_reservation *r = &s->reservations[i];
        bound_lease(r->host, &r->lease_expires, now, max_lease, this_host);
        if (entry_stale(r->host, r->holders, r->n_holders, r->lease_expires, now, this_host))
            removed++;
        else
            s->reservations[w++] = *r;
    }
    s->n_reservations = w;
    w = 0;
    for (size_t i = 0; i < s->n_queue; i++) {
        tdm_ticket *t = &s->queue[i];
        bound_lease(t->host, &t->lease_expires, now, max_lease, this_host);
        if (entry_stale(t->host, t->holders, t->n_holders, t->lease_expires, now, this_host))
            removed++;
        else
            s->queue[w++] = *t;
    }
    s->n_queue = w;
    return removed;
}

/* ---- JSON ---- */

static json_t *holders_to_json(const tdm_holder *h, int n)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:i,s:I}", "pid", (int)h[i].pid, "start_time",
                                             (json_int_t)h[i].start_time));
    return arr;
}

static json_t *time_json(time_t t)
{
    char buf[32];
    tdm_format_rfc3339(t, buf, sizeof buf);
    return json_string(buf);
}

char *tdm_ledger_state_to_json(const tdm_ledger_state *s)
{
    json_t *root = json_object();
    json_t *res = json_array(), *queue = json_array();
    json_object_set_new(root, "version", json_integer(LEDGER_VERSION));
    json_object_set_new(root, "next_ticket", json_integer(s->next_ticket));
    if (s->recovering_until > 0)
        json_object_set_new(root, "recovering_until", time_json(s->recovering_until));
    for (size_t i = 0; i < s->n_reservations; i++) {
        const tdm_reservation *r = &s->reservations[i];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(r->id));
        json_object_set_new(o, "holders", holders_to_json(r->holders, r->n_holders));
        json_object_set_new(o, "user", json_string(r->user));
        json_object_set_new(o, "host", json_string(r->host));
        json_object_set_new(o, "gpu_uuid", json_string(r->gpu_uuid));
        json_object_set_new(o, "budget_mb", json_integer(r->budget_mb));
        json_object_set_new(o, "actual_mb", r->actual_mb >= 0 ? json_integer(r->actual_mb)
                                                              : json_null());
        json_object_set_new(o, "task", json_string(r->task));
        json_object_set_new(o, "started", time_json(r->started));
        json_object_set_new(o, "lease_expires", time_json(r->lease_expires));
        json_array_append_new(res, o);
    }
    for (size_t i = 0; i < s->n_queue; i++) {
        const tdm_ticket *t = &s->queue[i];
        json_t *o = json_object();
        json_object_set_new(o, "ticket", json_integer(t->ticket));
        json_object_set_new(o, "holders", holders_to_json(t->holders, t->n_holders));
        json_object_set_new(o, "user", json_string(t->user));
        json_object_set_new(o, "host", json_string(t->host));
        json_object_set_new(o, "gpu_uuid", t->gpu_uuid[0] ? json_string(t->gpu_uuid) : json_null());
        json_object_set_new(o, "budget_mb", json_integer(t->budget_mb));
        json_object_set_new(o, "task", json_string(t->task));
        json_object_set_new(o, "enqueued", time_json(t->enqueued));
        json_object_set_new(o, "lease_expires", time_json(t->lease_expires));
        json_array_append_new(queue, o);
    }
    json_object_set_new(root, "reservations", res);
    json_object_set_new(root, "queue", queue);
    char *out = tdm_json_dumps_line(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return out;
}

/* Field readers: each failure names the entry and field, for the corrupt-ledger warning. */
static tdm_status get_string(json_t *o, const char *key, char *dst, size_t size, bool nullable,
                             const char *what, size_t idx, tdm_error *err)
{
    *dst = 0; /* set on every path: -O3 cannot tell that tdm_fail never returns TDM_OK */
    json_t *v = json_object_get(o, key);
    if (nullable && (v == NULL || json_is_null(v))) {
        dst[0] = '\0';
        return TDM_OK;
    }
    if (!json_is_string(v))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"%s\" must be a string", what, idx, key);
    if (json_string_length(v) >= size)
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"%s\" is too long", what, idx, key);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return TDM_OK;
}

static tdm_status get_int(json_t *o, const char *key, int64_t *dst, bool nullable, int64_t min,
                          const char *what, size_t idx, tdm_error *err)
{
    *dst = 0; /* set on every path: -O3 cannot tell that tdm_fail never returns TDM_OK */
    json_t *v = json_object_get(o, key);
    if (nullable && v != NULL && json_is_null(v)) {
        *dst = -1;
        return TDM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"%s\" must be an integer >= %lld", what,
                        idx, key, (long long)min);
    *dst = json_integer_value(v);
    return TDM_OK;
}

/* An integer in [min, max]: beyond max the ledger is corrupt (a ticket number past 2^53). */
static tdm_status get_int_below(json_t *o, const char *key, int64_t *dst, int64_t min, int64_t max,
                                const char *what, size_t idx, tdm_error *err)
{
    if (get_int(o, key, dst, false, min, what, idx, err) != TDM_OK)
        return err->status;
    if (*dst > max)
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"%s\" %lld is above the limit %lld", what,
                        idx, key, (long long)*dst, (long long)max);
    return TDM_OK;
}

/* A MiB value, clamped to TDM_LEDGER_MAX_MB: a huge budget still blocks its whole GPU (the guard
 * counts it as the GPU's total) but can no longer overflow a sum. -1 (null) stays. */
static tdm_status get_mb(json_t *o, const char *key, int64_t *dst, bool nullable, int64_t min,
                         const char *what, size_t idx, tdm_error *err)
{
    if (get_int(o, key, dst, nullable, min, what, idx, err) != TDM_OK)
        return err->status;
    if (*dst > TDM_LEDGER_MAX_MB)
        *dst = TDM_LEDGER_MAX_MB;
    return TDM_OK;
}

static tdm_status get_time(json_t *o, const char *key, time_t *dst, const char *what, size_t idx,
                           tdm_error *err)
{
    char buf[64];
    if (get_string(o, key, buf, sizeof buf, false, what, idx, err) != TDM_OK)
        return err->status;
    if (!tdm_parse_rfc3339(buf, dst))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"%s\" is not an RFC 3339 UTC time", what,
                        idx, key);
    return TDM_OK;
}

static tdm_status get_holders(json_t *o, tdm_holder *h, int *n, const char *what, size_t idx,
                              tdm_error *err)
{
    json_t *arr = json_object_get(o, "holders");
    if (!json_is_array(arr) || json_array_size(arr) == 0 ||
        json_array_size(arr) > TDM_MAX_HOLDERS)
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: \"holders\" must be a list of 1 to %d",
                        what, idx, TDM_MAX_HOLDERS);
    *n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        int64_t pid, start;
        if (get_int(e, "pid", &pid, false, 1, what, idx, err) != TDM_OK ||
            get_int(e, "start_time", &start, false, 0, what, idx, err) != TDM_OK)
            return err->status;
        if (pid > INT32_MAX)
            return tdm_fail(err, TDM_ERR_CORRUPT, "%s %zu: pid out of range", what, idx);
        h[(*n)++] = (tdm_holder){.pid = (int32_t)pid, .start_time = (uint64_t)start};
    }
    return TDM_OK;
}

static tdm_status parse_root(json_t *root, tdm_ledger_state *s, tdm_error *err)
{
    if (!json_is_object(root))
        return tdm_fail(err, TDM_ERR_CORRUPT, "the top level is not an object");
    int64_t version;
    if (get_int(root, "version", &version, false, 0, "ledger", 0, err) != TDM_OK)
        return err->status;
    if (version != LEDGER_VERSION)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "ledger version %lld is not %d (written by another tandem version?)",
                        (long long)version, LEDGER_VERSION);
    if (get_int_below(root, "next_ticket", &s->next_ticket, 1, TDM_LEDGER_TICKET_LIMIT, "ledger", 0,
                      err) != TDM_OK)
        return err->status;
    if (json_object_get(root, "recovering_until") &&
        get_time(root, "recovering_until", &s->recovering_until, "ledger", 0, err) != TDM_OK)
        return err->status;
    json_t *res = json_object_get(root, "reservations");
    json_t *queue = json_object_get(root, "queue");
    if (!json_is_array(res) || !json_is_array(queue))
        return tdm_fail(err, TDM_ERR_CORRUPT, "\"reservations\" and \"queue\" must be lists");
    size_t i;
    json_t *o;
    json_array_foreach(res, i, o)
    {
        tdm_reservation r = {0};
        const char *w = "reservation";
        if (!json_is_object(o))
            return tdm_fail(err, TDM_ERR_CORRUPT, "reservation %zu is not an object", i);
        if (get_string(o, "id", r.id, sizeof r.id, false, w, i, err) ||
            get_holders(o, r.holders, &r.n_holders, w, i, err) ||
            get_string(o, "user", r.user, sizeof r.user, false, w, i, err) ||
            get_string(o, "host", r.host, sizeof r.host, false, w, i, err) ||
            get_string(o, "gpu_uuid", r.gpu_uuid, sizeof r.gpu_uuid, false, w, i, err) ||
            get_mb(o, "budget_mb", &r.budget_mb, false, 1, w, i, err) ||
            get_mb(o, "actual_mb", &r.actual_mb, true, 0, w, i, err) ||
            get_string(o, "task", r.task, sizeof r.task, false, w, i, err) ||
            get_time(o, "started", &r.started, w, i, err) ||
            get_time(o, "lease_expires", &r.lease_expires, w, i, err))
            return err->status;
        if (tdm_ledger_state_add_reservation(s, &r, err) != TDM_OK)
            return err->status;
    }
    json_array_foreach(queue, i, o)
    {
        tdm_ticket t = {0};
        const char *w = "queue entry";
        if (!json_is_object(o))
            return tdm_fail(err, TDM_ERR_CORRUPT, "queue entry %zu is not an object", i);
        if (get_int_below(o, "ticket", &t.ticket, 1, TDM_LEDGER_TICKET_LIMIT - 1, w, i, err) ||
            get_holders(o, t.holders, &t.n_holders, w, i, err) ||
            get_string(o, "user", t.user, sizeof t.user, false, w, i, err) ||
            get_string(o, "host", t.host, sizeof t.host, false, w, i, err) ||
            get_string(o, "gpu_uuid", t.gpu_uuid, sizeof t.gpu_uuid, true, w, i, err) ||
            get_mb(o, "budget_mb", &t.budget_mb, false, 1, w, i, err) ||
            get_string(o, "task", t.task, sizeof t.task, false, w, i, err) ||
            get_time(o, "enqueued", &t.enqueued, w, i, err) ||
            get_time(o, "lease_expires", &t.lease_expires, w, i, err))
            return err->status;
        if (t.ticket >= s->next_ticket)
            return tdm_fail(err, TDM_ERR_CORRUPT, "queue entry %zu: ticket %lld >= next_ticket", i,
                            (long long)t.ticket);
        if (tdm_ledger_state_add_ticket(s, &t, err) != TDM_OK)
            return err->status;
    }
    return TDM_OK;
}

tdm_status tdm_ledger_state_from_json(const char *text, size_t len, tdm_ledger_state *s,
                                      tdm_error *err)
{
    tdm_ledger_state_init(s);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tdm_fail(err, TDM_ERR_CORRUPT, "line %d, column %d: %s", jerr.line, jerr.column,
                        jerr.text);
    tdm_status st = parse_root(root, s, err);
    json_decref(root);
    if (st != TDM_OK) {
        tdm_ledger_state_free(s);
        tdm_ledger_state_init(s);
    }
    return st;
}
