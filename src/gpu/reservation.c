/* reservation.c — acquire/renew/release over the ledger, and the FIFO wait loop. */
#include "gpu/reservation.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "gpu/guard.h"
#include "gpu/inventory.h"
#include "gpu/wait_queue.h"
#include "obs/obs.h"
#include "util/timeutil.h"

tdm_acquire_opts tdm_acquire_defaults(void)
{
    tdm_acquire_opts o = {0};
    o.task = "job";
    o.wait = true;
    o.timeout_sec = 3600;
    o.report_interval_sec = 30;
    return o;
}

static int64_t env_ms(const char *name, int64_t dflt)
{
    const char *s = getenv(name);
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (!*end && v > 0)
            return v;
    }
    return dflt;
}

/* start + sec seconds in nanoseconds, saturated at INT64_MAX: `--timeout 1e10` is 1e19 ns, beyond
 * int64, and an unchecked conversion would wrap to a deadline in the past (an instant timeout). */
static int64_t deadline_after(int64_t start_ns, double sec)
{
    if (!(sec > 0))
        return start_ns;
    double ns = sec * 1e9;
    if (ns >= (double)(INT64_MAX - start_ns))
        return INT64_MAX;
    return start_ns + (int64_t)ns;
}

/* Context of one acquire transaction. */
typedef struct acquire_ctx {
    const tdm_acquire_opts *opts;
    const tdm_inventory *inv;
    const char *pinned_uuid; /* NULL = any GPU */
    tdm_lease *lease;
    int64_t ticket;          /* 0 = none yet */
    enum { OUTCOME_NONE, OUTCOME_ADMITTED, OUTCOME_QUEUED, OUTCOME_BUSY } outcome;
    tdm_wait_report report;  /* figures for the best candidate GPU */
} acquire_ctx;

static void fill_holder_info(const tdm_acquire_opts *o, tdm_holder *h, int *n)
{
    h[0] = tdm_holder_of(getpid());
    *n = 1;
    if (o->extra_holder > 0)
        h[(*n)++] = tdm_holder_of(o->extra_holder);
}

/* Figures for status lines and messages: the candidate GPU with the shortest line (then the most
 * memory available). */
static void describe_best(acquire_ctx *c, const tdm_ledger_state *s)
{
    int best_pos = -1;
    int64_t best_avail = -1;
    for (size_t i = 0; i < c->inv->n_gpus; i++) {
        const tdm_gpu *g = &c->inv->gpus[i];
        if (c->pinned_uuid && strcmp(c->pinned_uuid, g->uuid) != 0)
            continue;
        if (!tdm_guard_could_ever_fit(g, c->opts->budget_mb))
            continue;
        int pos = tdm_queue_ahead(s, c->ticket ? c->ticket : INT64_MAX, g) + 1;
        tdm_guard_view v;
        tdm_guard_view_of(g, s, &v);
        if (best_pos < 0 || pos < best_pos || (pos == best_pos && v.available_mb > best_avail)) {
            best_pos = pos;
            best_avail = v.available_mb;
            snprintf(c->report.gpu_uuid, sizeof c->report.gpu_uuid, "%s", g->uuid);
        }
    }
    c->report.position = best_pos;
    c->report.available_mb = best_avail;
    c->report.needed_mb = c->opts->budget_mb;
}

static tdm_status acquire_decide(tdm_ledger_state *s, bool *changed, void *user, tdm_error *err)
{
    acquire_ctx *c = user;
    time_t now = time(NULL);
    int64_t lease_sec = tdm_ledger_lease_sec();
    if (c->ticket && !tdm_ledger_state_find_ticket(s, c->ticket))
        c->ticket = 0; /* our ticket vanished (ledger moved aside): take a new one below */
    /* Just after the ledger was moved aside, live holders are still writing their reservations
     * back: admit nobody until they have had the time to. */
    int idx = tdm_ledger_state_settling(s, now)
                  ? -1
                  : tdm_queue_choose_gpu(c->inv, s, c->ticket ? c->ticket : INT64_MAX,
                                         c->pinned_uuid, c->opts->budget_mb);
    if (idx >= 0) {
        const tdm_gpu *g = &c->inv->gpus[idx];
        tdm_lease *l = c->lease;
        tdm_reservation r = {0};
        snprintf(r.id, sizeof r.id, "r-%.40s-%ld-%llx", tdm_host_name(), (long)getpid(),
                 (unsigned long long)tdm_now_real_ns());
        fill_holder_info(c->opts, r.holders, &r.n_holders);
        snprintf(r.user, sizeof r.user, "%s", tdm_user_name());
        snprintf(r.host, sizeof r.host, "%s", tdm_host_name());
        snprintf(r.gpu_uuid, sizeof r.gpu_uuid, "%s", g->uuid);
        r.budget_mb = c->opts->budget_mb;
        r.actual_mb = -1;
        snprintf(r.task, sizeof r.task, "%s", c->opts->task ? c->opts->task : "job");
        r.started = now;
        r.lease_expires = now + lease_sec;
        if (tdm_ledger_state_add_reservation(s, &r, err) != TDM_OK)
            return err->status;
        if (c->ticket)
            tdm_ledger_state_remove_ticket(s, c->ticket);
        c->ticket = 0;
        memcpy(l->id, r.id, sizeof l->id);
        memcpy(l->gpu_uuid, g->uuid, sizeof l->gpu_uuid);
        memcpy(l->gpu_name, g->name, sizeof l->gpu_name);
        l->gpu_index = g->index;
        l->budget_mb = r.budget_mb;
        l->actual_mb = -1;
        memcpy(l->task, r.task, sizeof l->task);
        memcpy(l->holders, r.holders, sizeof l->holders);
        l->n_holders = r.n_holders;
        l->started = now;
        l->renewed_mono_ns = tdm_now_mono_ns();
        l->held = true;
        *changed = true;
        c->outcome = OUTCOME_ADMITTED;
        return TDM_OK;
    }
    if (!c->opts->wait) {
        describe_best(c, s);
        c->outcome = OUTCOME_BUSY;
        return TDM_OK;
    }
    if (!c->ticket) {
        tdm_ticket t = {0};
        if (tdm_ledger_state_take_ticket(s, &t.ticket, err) != TDM_OK)
            return err->status;
        fill_holder_info(c->opts, t.holders, &t.n_holders);
        snprintf(t.user, sizeof t.user, "%s", tdm_user_name());
        snprintf(t.host, sizeof t.host, "%s", tdm_host_name());
        snprintf(t.gpu_uuid, sizeof t.gpu_uuid, "%s", c->pinned_uuid ? c->pinned_uuid : "");
        t.budget_mb = c->opts->budget_mb;
        snprintf(t.task, sizeof t.task, "%s", c->opts->task ? c->opts->task : "job");
        t.enqueued = now;
        t.lease_expires = now + lease_sec;
        if (tdm_ledger_state_add_ticket(s, &t, err) != TDM_OK)
            return err->status;
        c->ticket = t.ticket;
        *changed = true;
    } else {
        tdm_ticket *t = tdm_ledger_state_find_ticket(s, c->ticket);
        if (t->lease_expires - now < lease_sec / 2) { /* a waiter renews its ticket too */
            t->lease_expires = now + lease_sec;
            *changed = true;
        }
    }
    describe_best(c, s);
    c->outcome = OUTCOME_QUEUED;
    return TDM_OK;
}

static tdm_status drop_ticket_decide(tdm_ledger_state *s, bool *changed, void *user,
                                     tdm_error *err)
{
    (void)err;
    if (tdm_ledger_state_remove_ticket(s, *(int64_t *)user))
        *changed = true;
    return TDM_OK;
}

/* Removes our ticket after a timeout, a cancellation or an error, so no ghost waits on. */
static void drop_ticket(tdm_lease *lease, int64_t ticket)
{
    if (!ticket)
        return;
    tdm_error ignored = {0};
    tdm_ledger_transact(&lease->ledger, drop_ticket_decide, &ticket, &ignored);
}

/* Blocks until the ledger directory changes or timeout_ms passes. inotify_fd < 0: plain sleep. */
static void wait_for_change(int inotify_fd, int64_t timeout_ms)
{
    if (timeout_ms < 1)
        timeout_ms = 1;
    if (inotify_fd < 0) {
        tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_WAIT_POLL);
        tdm_sleep_ms(timeout_ms);
        tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "poll")));
        return;
    }
    tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_WAIT_POLL);
    struct pollfd pfd = {.fd = inotify_fd, .events = POLLIN};
    bool woke = poll(&pfd, 1, (int)timeout_ms) > 0;
    if (woke) {
        char buf[4096];
        while (read(inotify_fd, buf, sizeof buf) > 0) {
        }
    }
    tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", woke ? "ledger_changed" : "timeout")));
}

/* The inventory query as a profiled phase (VramQuery). */
static tdm_status query_vram(tdm_inventory *inv, tdm_error *err)
{
    tdm_obs_span phase = tdm_obs_begin(TDM_PHASE_VRAM_QRY);
    tdm_status st = tdm_inventory_query(inv, err);
    tdm_obs_end(&phase, TDM_TRACE_ARGS(TDM_TRACE_INT("gpus", st == TDM_OK ? (int64_t)inv->n_gpus
                                                                          : -1)));
    return st;
}

static tdm_status check_never_fits(const tdm_inventory *inv, const char *pinned, int64_t budget,
                                   tdm_error *err)
{
    for (size_t i = 0; i < inv->n_gpus; i++) {
        const tdm_gpu *g = &inv->gpus[i];
        if ((!pinned || !strcmp(pinned, g->uuid)) && tdm_guard_could_ever_fit(g, budget))
            return TDM_OK;
    }
    const tdm_gpu *g = inv->gpus; /* report against the largest candidate */
    for (size_t i = 0; i < inv->n_gpus; i++)
        if ((!pinned || !strcmp(pinned, inv->gpus[i].uuid)) &&
            (pinned || inv->gpus[i].total_mb > g->total_mb))
            g = &inv->gpus[i];
    double f = tdm_guard_reserve_factor(g->memory_type);
    return tdm_fail(err, TDM_ERR_NEVER_FITS,
                    "%lld MiB can never fit: the largest candidate GPU %s (%s) has %lld MiB, of "
                    "which tandem may reserve %.0f%% = %lld MiB. Ask for less (--vram), or raise "
                    "the reserve factor with TANDEM_RESERVE_FACTOR",
                    (long long)budget, g->uuid, g->name, (long long)g->total_mb, f * 100,
                    (long long)((double)g->total_mb * f));
}

static tdm_status acquire(tdm_lease *lease, const tdm_acquire_opts *opts, tdm_error *err);

tdm_status tdm_reservation_acquire(tdm_lease *lease, const tdm_acquire_opts *opts,
                                   tdm_error *err)
{
    tdm_trace_span span = tdm_trace_span_begin("LedgerReserve", "gpu");
    tdm_status st = acquire(lease, opts, err);
    tdm_trace_span_end(&span, TDM_TRACE_ARGS(TDM_TRACE_INT("budget_mb", opts->budget_mb),
                                             TDM_TRACE_STR("gpu", st == TDM_OK ? lease->gpu_uuid
                                                                               : ""),
                                             TDM_TRACE_STR("outcome", tdm_status_str(st))));
    return st;
}

static tdm_status acquire(tdm_lease *lease, const tdm_acquire_opts *opts, tdm_error *err)
{
    memset(lease, 0, sizeof *lease);
    if (opts->budget_mb <= 0)
        return tdm_fail(err, TDM_ERR_INVALID, "the memory budget must be positive");
    if (tdm_ledger_open(&lease->ledger, opts->ledger_dir, err) != TDM_OK)
        return err->status;

    tdm_inventory inv;
    if (query_vram(&inv, err) != TDM_OK)
        return err->status;
    if (inv.n_gpus == 0) {
        tdm_status st = tdm_fail(err, TDM_ERR_NOT_FOUND, "no GPU found%s%s", inv.note[0] ? ": " : "",
                                 inv.note);
        tdm_inventory_free(&inv);
        return st;
    }
    char pinned[96] = "";
    if (opts->gpu && *opts->gpu) {
        const tdm_gpu *g = tdm_inventory_find(&inv, opts->gpu);
        if (!g) {
            tdm_inventory_free(&inv);
            return tdm_fail(err, TDM_ERR_NOT_FOUND,
                            "no GPU matches '%s' (give a UUID, a unique UUID prefix or an index "
                            "from `tandem gpu status`)",
                            opts->gpu);
        }
        snprintf(pinned, sizeof pinned, "%s", g->uuid);
    }
    const char *pin = pinned[0] ? pinned : NULL;
    if (check_never_fits(&inv, pin, opts->budget_mb, err) != TDM_OK) {
        tdm_inventory_free(&inv);
        return err->status;
    }

    /* TANDEM_NO_INOTIFY=1 leaves only the bounded poll (for benchmarks and odd file systems). */
    const char *no_inotify = getenv("TANDEM_NO_INOTIFY");
    int inotify_fd = no_inotify && !strcmp(no_inotify, "1")
                         ? -1
                         : inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    /* The data file only ever changes by rename (or is moved aside / deleted), so these events are
     * exactly "the ledger changed". IN_CLOSE_WRITE would also fire on every close of the lock file,
     * including our own, and turn the wait into a busy loop. */
    if (inotify_fd >= 0 &&
        inotify_add_watch(inotify_fd, lease->ledger.dir,
                          IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE) < 0) {
        close(inotify_fd);
        inotify_fd = -1; /* the bounded poll below still works, only slower */
    }
    int64_t poll_ms = env_ms("TANDEM_POLL_MS", 500);
    int64_t start = tdm_now_mono_ns();
    int64_t deadline = deadline_after(start, opts->timeout_sec);
    int64_t next_report = start;
    acquire_ctx c = {.opts = opts, .inv = &inv, .pinned_uuid = pin, .lease = lease};
    tdm_status st;
    for (;;) {
        st = tdm_ledger_transact(&lease->ledger, acquire_decide, &c, err);
        if (st != TDM_OK || c.outcome == OUTCOME_ADMITTED)
            break;
        if (c.outcome == OUTCOME_BUSY) {
            st = tdm_fail(err, TDM_ERR_BUSY,
                          "%lld MiB of GPU memory is not available now (best: %lld MiB on %s, "
                          "%d job(s) queued ahead) and --no-wait-gpu was given",
                          (long long)opts->budget_mb, (long long)c.report.available_mb,
                          c.report.gpu_uuid, c.report.position - 1);
            break;
        }
        int64_t now = tdm_now_mono_ns();
        c.report.elapsed_sec = (double)(now - start) / 1e9;
        if (opts->cancel && *opts->cancel) {
            st = tdm_fail(err, TDM_ERR_BUSY, "cancelled while waiting for GPU memory");
            break;
        }
        if (now >= deadline) {
            st =
                tdm_fail(err, TDM_ERR_TIMEOUT,
                         "timed out after %.15g s waiting for %lld MiB of GPU memory: the best GPU "
                         "(%s) has %lld MiB available to tandem and %d job(s) ahead in its queue. "
                         "See `tandem gpu status`, or raise --timeout",
                         opts->timeout_sec, (long long)opts->budget_mb, c.report.gpu_uuid,
                         (long long)c.report.available_mb, c.report.position - 1);
            break;
        }
        if (opts->report && now >= next_report) {
            opts->report(&c.report, opts->report_user);
            next_report = deadline_after(now, opts->report_interval_sec);
        }
        int64_t wait_ms = poll_ms;
        if ((deadline - now) / 1000000 + 1 < wait_ms)
            wait_ms = (deadline - now) / 1000000 + 1;
        wait_for_change(inotify_fd, wait_ms);
        /* Real free memory may have changed without a ledger change: query it again. */
        tdm_inventory_free(&inv);
        if (query_vram(&inv, err) != TDM_OK) {
            memset(&inv, 0, sizeof inv);
            st = err->status;
            break;
        }
    }
    if (st != TDM_OK)
        drop_ticket(lease, c.ticket);
    if (inotify_fd >= 0)
        close(inotify_fd);
    tdm_inventory_free(&inv);
    return st;
}

/* ---- operations on a held reservation ---- */

typedef struct update_ctx {
    tdm_lease *lease;
    enum { UPDATE_HOLDER, UPDATE_ACTUAL, UPDATE_RENEW, UPDATE_RELEASE } what;
    tdm_holder holder;
    int64_t actual_mb;
} update_ctx;

static tdm_status update_decide(tdm_ledger_state *s, bool *changed, void *user, tdm_error *err)
{
    update_ctx *u = user;
    tdm_lease *l = u->lease;
    time_t now = time(NULL);
    if (u->what == UPDATE_RELEASE) {
        if (tdm_ledger_state_remove_reservation(s, l->id))
            *changed = true;
        return TDM_OK;
    }
    tdm_reservation *r = tdm_ledger_state_find_reservation(s, l->id);
    if (!r) {
        /* Vanished (the ledger was moved aside as corrupt): the memory is still ours, so the
         * reservation is written back as we know it. */
        tdm_reservation back = {0};
        memcpy(back.id, l->id, sizeof back.id);
        memcpy(back.holders, l->holders, sizeof back.holders);
        back.n_holders = l->n_holders;
        snprintf(back.user, sizeof back.user, "%s", tdm_user_name());
        snprintf(back.host, sizeof back.host, "%s", tdm_host_name());
        memcpy(back.gpu_uuid, l->gpu_uuid, sizeof back.gpu_uuid);
        back.budget_mb = l->budget_mb;
        back.actual_mb = l->actual_mb;
        memcpy(back.task, l->task, sizeof back.task);
        back.started = l->started;
        back.lease_expires = now + tdm_ledger_lease_sec();
        if (tdm_ledger_state_add_reservation(s, &back, err) != TDM_OK)
            return err->status;
        r = &s->reservations[s->n_reservations - 1];
        *changed = true;
    }
    switch (u->what) {
    case UPDATE_HOLDER:
        if (r->n_holders >= TDM_MAX_HOLDERS)
            return tdm_fail(err, TDM_ERR_INVALID, "a reservation has at most %d holders",
                            TDM_MAX_HOLDERS);
        r->holders[r->n_holders++] = u->holder;
        *changed = true;
        break;
    case UPDATE_ACTUAL:
        if (r->actual_mb != u->actual_mb) {
            r->actual_mb = u->actual_mb;
            *changed = true;
        }
        break;
    case UPDATE_RENEW:
        r->lease_expires = now + tdm_ledger_lease_sec();
        *changed = true;
        break;
    case UPDATE_RELEASE:
        break;
    }
    return TDM_OK;
}

static tdm_status update(tdm_lease *lease, update_ctx *u, tdm_error *err)
{
    if (!lease->held)
        return tdm_fail(err, TDM_ERR_INVALID, "the reservation is not held");
    u->lease = lease;
    return tdm_ledger_transact(&lease->ledger, update_decide, u, err);
}

tdm_status tdm_reservation_add_holder(tdm_lease *lease, pid_t pid, tdm_error *err)
{
    update_ctx u = {.what = UPDATE_HOLDER, .holder = tdm_holder_of(pid)};
    if (u.holder.start_time == 0)
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "process %ld does not exist", (long)pid);
    if (lease->n_holders >= TDM_MAX_HOLDERS)
        return tdm_fail(err, TDM_ERR_INVALID, "a reservation has at most %d holders",
                        TDM_MAX_HOLDERS);
    tdm_status st = update(lease, &u, err);
    if (st == TDM_OK)
        lease->holders[lease->n_holders++] = u.holder;
    return st;
}

tdm_status tdm_reservation_update_actual(tdm_lease *lease, int64_t actual_mb, tdm_error *err)
{
    update_ctx u = {.what = UPDATE_ACTUAL, .actual_mb = actual_mb};
    tdm_status st = update(lease, &u, err);
    if (st == TDM_OK)
        lease->actual_mb = actual_mb;
    return st;
}

tdm_status tdm_reservation_renew(tdm_lease *lease, tdm_error *err)
{
    update_ctx u = {.what = UPDATE_RENEW};
    tdm_status st = update(lease, &u, err);
    if (st == TDM_OK)
        lease->renewed_mono_ns = tdm_now_mono_ns();
    return st;
}

bool tdm_reservation_renew_due(const tdm_lease *lease)
{
    int64_t every_ms = env_ms("TANDEM_RENEW_SEC", 300) * 1000;
    return lease->held && tdm_now_mono_ns() - lease->renewed_mono_ns >= every_ms * 1000000LL;
}

int tdm_reservation_watch_open(const tdm_lease *lease)
{
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0)
        return -1;
    if (inotify_add_watch(fd, lease->ledger.dir, IN_MOVED_FROM | IN_DELETE) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

tdm_status tdm_reservation_watch_handle(tdm_lease *lease, int fd, bool *reregistered,
                                        tdm_error *err)
{
    *reregistered = false;
    /* The data file leaves its name only when it is moved aside or deleted: every normal write
     * renames a temp file over it, which reports the temp file's name. */
    const char *data_name = strrchr(lease->ledger.data_path, '/');
    data_name = data_name ? data_name + 1 : lease->ledger.data_path;
    bool gone = false;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            if (e->len > 0 && !strcmp(e->name, data_name))
                gone = true;
            p += sizeof *e + e->len;
        }
    }
    if (!gone || !lease->held)
        return TDM_OK;
    tdm_status st = tdm_reservation_renew(lease, err);
    if (st == TDM_OK)
        *reregistered = true;
    return st;
}

/* ---- resizing a held reservation ---- */

typedef struct resize_ctx {
    tdm_lease *lease;
    const tdm_inventory *inv;
    int64_t budget_mb;
    bool wait;
    int64_t ticket;
    bool granted, busy;
    tdm_wait_report report;
} resize_ctx;

static tdm_status resize_decide(tdm_ledger_state *s, bool *changed, void *user, tdm_error *err)
{
    resize_ctx *c = user;
    tdm_lease *l = c->lease;
    time_t now = time(NULL);
    int64_t lease_sec = tdm_ledger_lease_sec();
    update_ctx u = {.lease = l, .what = UPDATE_ACTUAL, .actual_mb = l->actual_mb};
    TDM_TRY(update_decide(s, changed, &u, err)); /* written back when it vanished */
    tdm_reservation *r = tdm_ledger_state_find_reservation(s, l->id);
    if (c->ticket && !tdm_ledger_state_find_ticket(s, c->ticket)) c->ticket = 0;
    if (c->budget_mb <= r->budget_mb) {
        if (c->budget_mb != r->budget_mb) *changed = true;
        r->budget_mb = c->budget_mb;
        c->granted = true;
    } else {
        int64_t grow = c->budget_mb - r->budget_mb;
        int idx = tdm_ledger_state_settling(s, now)
                      ? -1
                      : tdm_queue_choose_gpu(c->inv, s, c->ticket ? c->ticket : INT64_MAX,
                                             l->gpu_uuid, grow);
        if (idx >= 0) {
            r->budget_mb = c->budget_mb;
            c->granted = true;
            *changed = true;
        } else if (!c->wait) {
            c->busy = true;
        } else if (!c->ticket) {
            tdm_ticket t = {0};
            TDM_TRY(tdm_ledger_state_take_ticket(s, &t.ticket, err));
            t.holders[0] = tdm_holder_of(getpid());
            t.n_holders = 1;
            snprintf(t.user, sizeof t.user, "%s", tdm_user_name());
            snprintf(t.host, sizeof t.host, "%s", tdm_host_name());
            snprintf(t.gpu_uuid, sizeof t.gpu_uuid, "%s", l->gpu_uuid);
            t.budget_mb = grow;
            snprintf(t.task, sizeof t.task, "%.100s (growth)", l->task);
            t.enqueued = now;
            t.lease_expires = now + lease_sec;
            TDM_TRY(tdm_ledger_state_add_ticket(s, &t, err));
            c->ticket = t.ticket;
            *changed = true;
        } else {
            tdm_ticket *t = tdm_ledger_state_find_ticket(s, c->ticket);
            if (t->budget_mb != grow || t->lease_expires - now < lease_sec / 2) {
                t->budget_mb = grow; /* the reservation shrank meanwhile: a smaller growth */
                t->lease_expires = now + lease_sec;
                *changed = true;
            }
        }
        if (!c->granted) {
            c->report.needed_mb = grow;
            snprintf(c->report.gpu_uuid, sizeof c->report.gpu_uuid, "%s", l->gpu_uuid);
            c->report.position = -1;
            c->report.available_mb = -1;
            for (size_t i = 0; i < c->inv->n_gpus; i++) {
                const tdm_gpu *g = &c->inv->gpus[i];
                if (strcmp(g->uuid, l->gpu_uuid)) continue;
                tdm_guard_view v;
                tdm_guard_view_of(g, s, &v);
                c->report.position =
                    tdm_queue_ahead(s, c->ticket ? c->ticket : INT64_MAX, g) + 1;
                c->report.available_mb = v.available_mb;
            }
        }
    }
    if (c->granted && c->ticket) {
        tdm_ledger_state_remove_ticket(s, c->ticket);
        c->ticket = 0;
        *changed = true;
    }
    return TDM_OK;
}

tdm_status tdm_reservation_resize(tdm_lease *lease, int64_t budget_mb, bool wait, int64_t *ticket,
                                  bool *granted, tdm_wait_report *report, tdm_error *err)
{
    *granted = false;
    if (!lease->held) return tdm_fail(err, TDM_ERR_INVALID, "the reservation is not held");
    if (budget_mb <= 0) return tdm_fail(err, TDM_ERR_INVALID, "the memory budget must be positive");
    tdm_inventory inv;
    if (query_vram(&inv, err) != TDM_OK) return err->status;
    tdm_status st = TDM_OK;
    if (budget_mb > lease->budget_mb) st = check_never_fits(&inv, lease->gpu_uuid, budget_mb, err);
    resize_ctx c = {.lease = lease, .inv = &inv, .budget_mb = budget_mb, .wait = wait,
                    .ticket = *ticket};
    if (st == TDM_OK) st = tdm_ledger_transact(&lease->ledger, resize_decide, &c, err);
    tdm_inventory_free(&inv);
    if (st == TDM_OK && c.busy)
        st = tdm_fail(err, TDM_ERR_BUSY,
                      "%lld MiB more GPU memory is not available now on %s (%lld MiB admissible, "
                      "%d job(s) queued ahead) and --no-wait-gpu was given",
                      (long long)c.report.needed_mb, lease->gpu_uuid,
                      (long long)c.report.available_mb, c.report.position - 1);
    if (st != TDM_OK) {
        drop_ticket(lease, c.ticket ? c.ticket : *ticket);
        *ticket = 0;
        return st;
    }
    *ticket = c.ticket;
    if (c.granted) {
        lease->budget_mb = budget_mb;
        *granted = true;
    } else if (report) {
        *report = c.report;
    }
    return TDM_OK;
}

void tdm_reservation_resize_cancel(tdm_lease *lease, int64_t *ticket)
{
    drop_ticket(lease, *ticket);
    *ticket = 0;
}

static void forget_at_exit(tdm_lease *lease);

tdm_status tdm_reservation_release(tdm_lease *lease, tdm_error *err)
{
    /* The exit handler must never touch a lease whose owner released it (and may have let it go
     * out of scope); a failed release is pruned later through its dead holders. */
    forget_at_exit(lease);
    if (!lease->held)
        return TDM_OK;
    tdm_trace_span span = tdm_trace_span_begin("LedgerRelease", "gpu");
    update_ctx u = {.what = UPDATE_RELEASE};
    tdm_status st = update(lease, &u, err);
    tdm_trace_span_end(&span, TDM_TRACE_ARGS(TDM_TRACE_INT("budget_mb", lease->budget_mb),
                                             TDM_TRACE_STR("gpu", lease->gpu_uuid),
                                             TDM_TRACE_STR("outcome", tdm_status_str(st))));
    if (st == TDM_OK)
        lease->held = false;
    return st;
}

static tdm_lease *exit_leases[8];

static void forget_at_exit(tdm_lease *lease)
{
    for (int i = 0; i < 8; i++)
        if (exit_leases[i] == lease)
            exit_leases[i] = NULL;
}

static void release_all_at_exit(void)
{
    for (int i = 0; i < 8; i++) {
        tdm_lease *l = exit_leases[i];
        exit_leases[i] = NULL;
        if (l && l->held) {
            tdm_error ignored = {0};
            tdm_reservation_release(l, &ignored);
        }
    }
}

void tdm_reservation_release_at_exit(tdm_lease *lease)
{
    static bool registered;
    if (!registered) {
        atexit(release_all_at_exit);
        registered = true;
    }
    for (int i = 0; i < 8; i++) {
        if (exit_leases[i] == lease)
            return;
        if (!exit_leases[i]) {
            exit_leases[i] = lease;
            return;
        }
    }
}

tdm_status tdm_vram_gib_parse(const char *s, bool allow_auto, double *gib, tdm_error *err)
{
    if (allow_auto && !strcmp(s, "auto")) {
        *gib = 0;
        return TDM_OK;
    }
    bool decimal = *s && !s[strspn(s, "0123456789.eE+-")]; /* strtod reads "0x10" as 16 */
    char *end = NULL;
    double v = decimal ? strtod(s, &end) : NAN;
    if (!decimal || *end || !(v > 0))
        return tdm_fail(err, TDM_ERR_INVALID, "needs a positive number of GiB%s, not '%s'",
                        allow_auto ? " or 'auto'" : "", s);
    if (v > TDM_VRAM_MAX_GIB)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "'%s' GiB is too large: at most %.0f GiB (more than any GPU has)", s,
                        TDM_VRAM_MAX_GIB);
    *gib = v;
    return TDM_OK;
}
