/* cotrain_run.c — co-training in a finetune run: election, the joiner's attached loop, the
 * host's step-boundary service (cotrain_run.h). */
#include "run/cotrain_run.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cotrain/base_identity.h"
#include "cotrain/client.h"
#include "cotrain/host.h"
#include "cotrain/status.h"
#include "cotrain/trainer_bridge.h"
#include "gpu/proc_identity.h"
#include "train/memory_plan.h"
#include "util/timeutil.h"

/* What to do when --join require finds no host (both places it can tell). */
#define JOIN_REQUIRE_ADVICE                                                                        \
    "start the finetune to join first, or leave out --join require (by default this run trains "  \
    "alone and later finetunes of the base join it)"

#define JOIN_ATTEMPTS 3    /* elections before giving up (a host may end while we join it) */
#define TAKEOVERS_MAX 8    /* host deaths survived by one joiner (each one resumes its adapters) */
#define CLIENT_POLL_MS 200 /* how often the joiner checks its stop flag */
#define EXIT_WAIT_MS 2000  /* after EOF: how long the host's process may take to be gone */

/* One joiner's adapters in the host's trainer. */
typedef struct joined_group {
    uint64_t conn;
    tdm_cotrain_msg join; /* owns the strings the trainer's adapters borrow */
    int first, n;         /* trainer indices first..first+n-1 */
    int ended;            /* adapters finished or detached */
    bool closed;          /* its connection is gone or closed */
    int32_t pid;          /* the joiner's (SO_PEERCRED) */
} joined_group;

/* A join accepted (its data read) that waits for the host's reservation to grow. */
typedef struct waiting_join {
    uint64_t conn;
    tdm_cotrain_msg join; /* owns the strings the prepared adapters borrow */
    tdm_cotrain_peer peer;
    tdm_trainer_join *tj;
    int64_t ticket;   /* its growth's ticket in the ledger queue, 0 when none */
    int64_t told_mb;  /* the need and queue position of the last `waiting` sent (-1: none) */
    int told_position;
} waiting_join;

/* What the host shows of one adapter of its trainer: in its own output and in the status it
 * publishes for `gpu status` (cotrain/status.h). Indexed by trainer index. */
typedef struct adapter_view {
    bool used;                 /* false: an index of a join that failed */
    const char *data, *output; /* borrowed: the run's adapters, or the join message */
    char label[128];           /* the trainer's label; joined ones: " (pid P, user)" added */
    int32_t joiner_pid;        /* 0: the host's own */
    const char *joiner_user;   /* borrowed from the join */
    double weight;
    int epochs;
    int64_t step, total;
    double epoch, loss, tokens_per_sec;
    int64_t window_seqs; /* sequences in the fused passes since the last publication */
} adapter_view;

struct tdm_cotrain_serving {
    tdm_cotrain_host *host; /* NULL: not serving (a GPU run before device open, or it failed) */
    /* a GPU run elects after device open (tdm_cotrain_serve_open), on the GPU it reserved */
    bool elect_at_open;
    int takeover_n; /* > 0: this run's adapters, orphaned by a dead host, resume here */
    char dir[4096];
    tdm_base_identity base; /* model, method; device and dtype set at open */
    const char *model_dir;
    tdm_cotrain_advert found; /* serve_open found a host there: join it */
    /* memory admission (GPU): the reservation grows and shrinks with the adapters */
    tdm_device *dev;
    bool planned;
    int64_t plan_mb;     /* the plan of the unfinished adapters (reservation MiB) */
    uint64_t scratch_hw; /* the largest backend scratch planned (the scratch never shrinks) */
    int n_active;        /* unfinished adapters at the last boundary */
    int64_t grow_checked_ns; /* monotonic time of the last grow_to_faster check, 0: none */
    waiting_join *w;
    int n_wait, cap_wait;
    bool (*stop_requested)(void *user);
    void *stop_requested_user;
    tdm_trainer_progress_fn progress; /* the host's own output */
    void *progress_user;
    void (*note)(const char *line, void *user);
    void *note_user;
    tdm_cotrain_run_opts mine; /* the host's options, to compare a join's run-wide ones with */
    int n_own;
    joined_group *g;
    int n_groups, cap_groups;
    tdm_trainer *trainer; /* known from the first boundary */
    adapter_view *views;  /* (n_views) */
    int n_views;
    bool dirty;           /* an adapter joined, ended or left: publish at the next boundary */
    int64_t published_ns; /* monotonic time of the last publication, 0: none */
    bool publish_failed;  /* said once */
    tdm_trainer_pass_fn inner_pass; /* the caller's on_pass, chained */
    void *inner_pass_user;
    tdm_train_schedule schedule;
};

static void note(void (*fn)(const char *, void *), void *user, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(void (*fn)(const char *, void *), void *user, const char *fmt, ...)
{
    if (!fn) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(line, user);
}

/* ----------------------------------------------------------------------- joiner ---- */

static void stem_of(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
}

/* Whether the host's process still exists (not a zombie, pid not recycled). After EOF, waits
 * up to EXIT_WAIT_MS for it to go: the kernel closes a killed process's sockets a moment before
 * the process is reaped. */
static bool host_alive(const tdm_cotrain_advert *host, bool wait_exit)
{
    tdm_holder h = {.pid = host->pid, .start_time = host->start_time};
    int64_t until = tdm_now_mono_ns() + (wait_exit ? EXIT_WAIT_MS : 0) * 1000000LL;
    for (;;) {
        if (!tdm_holder_alive(&h)) return false;
        if (tdm_now_mono_ns() >= until) return true;
        usleep(10000);
    }
}

/* The attached joiner: sends the join, shows its adapters' progress, forwards a stop request as
 * a detach, returns their outcome. *retry: the host ended before admitting us (elect again).
 * *orphaned: the host's process died after admitting us (the caller takes over: elect again
 * and resume the adapters from their latest checkpoints). A host that goes silent but whose
 * process still exists (stopped, frozen) is waited for: taking its adapters over while it may
 * continue would have two processes write one OUT_DIR. */
static tdm_status join_host(tdm_run_opts *o, const tdm_trainer_adapter *ads, int n,
                            const tdm_finetune_hooks *hooks, const tdm_cotrain_advert *host,
                            const tdm_base_identity *base, bool *retry, bool *orphaned,
                            char **bad_lines, tdm_error *err)
{
    *retry = false;
    *orphaned = false;
    tdm_cotrain_msg join = {0};
    tdm_status st = tdm_cotrain_join_from_trainer(&o->trainer, ads, n, base->id, &join, err);
    if (st != TDM_OK) return st;
    join.u.join.opts.no_wait = o->device.no_wait;
    tdm_cotrain_client c;
    if ((st = tdm_cotrain_client_connect(&c, host->socket_path, err)) != TDM_OK) {
        tdm_cotrain_msg_free(&join);
        *retry = true;
        return st;
    }
    st = tdm_cotrain_client_send(&c, &join, err);
    tdm_cotrain_msg_free(&join);
    char(*labels)[128] = calloc((size_t)n, sizeof *labels);
    bool *ended = calloc((size_t)n, sizeof *ended);
    if (!labels || !ended) {
        free(labels);
        free(ended);
        tdm_cotrain_client_close(&c);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (int a = 0; a < n; a++) {
        if (ads[a].label)
            snprintf(labels[a], sizeof labels[a], "%s", ads[a].label);
        else
            stem_of(ads[a].data, labels[a], sizeof labels[a]);
    }
    bool admitted = false, detach_sent = false, said_silent = false;
    int64_t waiting_since = 0; /* while the host waits for GPU memory: --timeout applies */
    int n_ended = 0, n_detached = 0, n_failed = 0;
    char failure[1024] = "";
    tdm_error io = {0};
    if (st != TDM_OK) io = *err; /* the host may have answered why before closing: read it */
    while (n_ended < n) {
        if (admitted && !detach_sent && o->trainer.stop_requested &&
            o->trainer.stop_requested(o->trainer.stop_requested_user)) {
            tdm_cotrain_msg d = {.type = TDM_COTRAIN_DETACH};
            tdm_error e = {0};
            (void)tdm_cotrain_client_send(&c, &d, &e);
            detach_sent = true;
        }
        tdm_cotrain_msg m = {0};
        if (!admitted && waiting_since && o->device.timeout_sec > 0 &&
            (double)(tdm_now_mono_ns() - waiting_since) / 1e9 >= o->device.timeout_sec) {
            st = tdm_fail(err, TDM_ERR_TIMEOUT,
                          "timed out after %.15g s waiting for the finetune of pid %d to make "
                          "room for these adapters on %s (see `tandem gpu status`, or raise "
                          "--timeout)",
                          o->device.timeout_sec, (int)host->pid, base->device);
            goto out; /* closing the connection withdraws the join and its ticket */
        }
        tdm_status r = tdm_cotrain_client_next(&c, CLIENT_POLL_MS, &m, &io);
        if (r == TDM_ERR_TIMEOUT) continue;
        /* before admission too: giving up on a stopped host would make this run a second host
         * of the device (or fail after JOIN_ATTEMPTS elections that all find it again) */
        if (r != TDM_OK && c.host_gone && !c.eof && host_alive(host, false)) {
            if (!said_silent)
                note(o->device.note, o->device.note_user,
                     "the finetune of pid %d has sent nothing for %d ms but its process still "
                     "exists (stopped or frozen?): waiting for it",
                     (int)host->pid, TDM_COTRAIN_HOST_SILENCE_MS);
            said_silent = true;
            tdm_cotrain_client_keep_waiting(&c);
            continue;
        }
        if (r != TDM_OK) {
            if (!admitted) {
                *retry = true;
                st = tdm_fail(err, TDM_ERR_IO,
                              "the finetune of pid %d ended before taking the "
                              "adapters (%s)",
                              (int)host->pid, io.message);
            } else {
                bool alive = c.host_gone && host_alive(host, c.eof);
                *orphaned = c.host_gone && !alive && !detach_sent;
                st = tdm_fail(err, TDM_ERR_IO,
                              "the finetune of pid %d that trained these adapters %s (%s); "
                              "their latest checkpoints are in their OUT_DIRs: run the same "
                              "command with --resume",
                              (int)host->pid, alive ? "closed the connection" : "died", io.message);
            }
            goto out;
        }
        switch (m.type) {
        case TDM_COTRAIN_ADMITTED: {
            admitted = true;
            note(o->device.note, o->device.note_user,
                 "joined the finetune of pid %d (same base model on %s): %d adapter(s) train in "
                 "its fused pass; Ctrl-C hands them back with a checkpoint",
                 (int)m.u.admitted.host_pid, base->device, n);
            if (hooks && hooks->started) {
                tdm_run_adapter_info *info = calloc((size_t)n, sizeof *info);
                for (int a = 0; info && a < n; a++)
                    info[a] = (tdm_run_adapter_info){.data = ads[a].data,
                                                     .output = ads[a].output,
                                                     .n_train = -1,
                                                     .n_val = -1,
                                                     .total_steps = -1};
                if (info) hooks->started(info, n, hooks->user);
                free(info);
            }
            break;
        }
        case TDM_COTRAIN_REJECTED:
            if (m.u.rejected.status == TDM_ERR_PARSE && bad_lines) {
                *bad_lines = m.u.rejected.message;
                m.u.rejected.message = NULL;
                st = tdm_fail(err, TDM_ERR_PARSE, "bad lines in the training data");
            } else {
                tdm_status s = m.u.rejected.status;
                if (s == TDM_OK) s = TDM_ERR_INVALID;
                st = tdm_fail(err, s, "the finetune of pid %d refused the adapters: %s",
                              (int)host->pid,
                              m.u.rejected.message ? m.u.rejected.message : "no reason given");
            }
            tdm_cotrain_msg_free(&m);
            goto out;
        case TDM_COTRAIN_WAITING:
            if (!waiting_since) waiting_since = tdm_now_mono_ns();
            note(o->device.note, o->device.note_user, "waiting: %s",
                 m.u.waiting.message ? m.u.waiting.message : m.u.waiting.reason);
            break;
        case TDM_COTRAIN_PROGRESS:
            if (m.u.progress.adapter >= 0 && m.u.progress.adapter < n && o->trainer.progress) {
                tdm_trainer_progress p;
                tdm_cotrain_progress_to_trainer(&m.u.progress, labels[m.u.progress.adapter], &p);
                o->trainer.progress(&p, o->trainer.progress_user);
            }
            break;
        case TDM_COTRAIN_DONE: {
            int a = m.u.done.adapter;
            if (a < 0 || a >= n || ended[a]) break;
            ended[a] = true;
            n_ended++;
            if (m.u.done.outcome == TDM_COTRAIN_DETACHED) n_detached++;
            if (m.u.done.outcome == TDM_COTRAIN_FAILED) {
                n_failed++;
                snprintf(failure, sizeof failure, "%s: %s", ads[a].output,
                         m.u.done.message ? m.u.done.message : "failed");
            }
            break;
        }
        default:
            break;
        }
        tdm_cotrain_msg_free(&m);
    }
    if (n_failed > 0)
        st = tdm_fail(err, TDM_ERR_IO, "%d adapter(s) failed in the finetune of pid %d; %s",
                      n_failed, (int)host->pid, failure);
    else if (n_detached > 0)
        st = tdm_fail(err, TDM_ERR_STOPPED,
                      "handed back by the finetune of pid %d; checkpoints of %d adapter(s) "
                      "written",
                      (int)host->pid, n_detached);
    else
        st = TDM_OK;
out:
    free(labels);
    free(ended);
    tdm_cotrain_client_close(&c);
    return st;
}

/* A serving of o's run, its adapter ads[0]'s options kept to compare a join's run-wide ones
 * with. */
static tdm_status serving_new(const tdm_run_opts *o, const tdm_trainer_adapter *ads,
                              tdm_cotrain_serving **out, tdm_error *err)
{
    *out = NULL;
    tdm_cotrain_serving *s = calloc(1, sizeof *s);
    if (!s) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = tdm_cotrain_run_opts_from_trainer(&o->trainer, &ads[0], &s->mine, err);
    if (st != TDM_OK) {
        free(s);
        return st;
    }
    s->note = o->device.note;
    s->note_user = o->device.note_user;
    s->model_dir = o->trainer.model_dir;
    *out = s;
    return TDM_OK;
}

/* The host a joiner trained in died: nobody trains these adapters any more. The caller elects
 * again: the first orphan hosts, the others join it; every one resumes from its checkpoints. */
static void note_orphaned(tdm_run_opts *o, const tdm_cotrain_advert *host, int n, tdm_error *err)
{
    note(o->device.note, o->device.note_user,
         "the finetune of pid %d died; its %d adapter(s) of this command resume from their "
         "latest checkpoints",
         (int)host->pid, n);
    *err = (tdm_error){0};
    o->trainer.resume = true;
}

static void note_taking_over(const tdm_cotrain_serving *s, const char *device, int n)
{
    note(s->note, s->note_user,
         "taking over: no other finetune of this base model runs on %s; this process trains its "
         "%d adapter(s) from their latest checkpoints and hosts the others",
         device, n);
}

/* A GPU run: the hosts on each GPU it could get, in the order it would get them (device open's
 * candidates, nothing reserved); the first found is joined. None: *srv elects after device open
 * (tdm_cotrain_serve_open), on the GPU the ledger gave. */
static tdm_status find_on_gpus(tdm_run_opts *o, const tdm_trainer_adapter *ads, int n,
                               const tdm_finetune_hooks *hooks, const tdm_device_candidates *cand,
                               tdm_base_identity *base, const char *dir, tdm_cotrain_serving **srv,
                               bool *joined, char **bad_lines, tdm_error *err)
{
    tdm_status st = TDM_OK;
    int attempt = 0, takeovers = o->cotrain_takeovers;
    while (attempt < JOIN_ATTEMPTS) {
        tdm_cotrain_advert found;
        bool have = false;
        for (size_t i = 0; i < cand->n && !have; i++) {
            snprintf(base->device, sizeof base->device, "%s", cand->uuid[i]);
            tdm_base_identity_seal(base);
            tdm_error e = {0};
            have = tdm_cotrain_find_host(dir, base, &found, NULL, &e) == TDM_OK;
        }
        if (!have) break;
        bool retry = false, orphaned = false;
        st = join_host(o, ads, n, hooks, &found, base, &retry, &orphaned, bad_lines, err);
        if (orphaned && takeovers < TAKEOVERS_MAX) {
            note_orphaned(o, &found, n, err);
            o->cotrain_takeovers = ++takeovers;
            attempt = 0;
            continue; /* another orphan may host already: join it; none: elect after open */
        }
        if (!retry) {
            *joined = true;
            return st;
        }
        attempt++;
    }
    if (o->join_require && takeovers == 0)
        return tdm_fail(err, TDM_ERR_NOT_FOUND,
                        "--join require: no finetune of this base model runs on %s%s; %s",
                        cand->uuid[0], cand->n > 1 ? " or the other GPUs this run could use" : "",
                        JOIN_REQUIRE_ADVICE);
    tdm_cotrain_serving *s = NULL;
    TDM_TRY(serving_new(o, ads, &s, err));
    s->elect_at_open = true;
    s->takeover_n = takeovers > 0 ? n : 0;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    s->base = *base;
    *srv = s;
    return TDM_OK;
}

tdm_status tdm_cotrain_run_start(tdm_run_opts *o, const tdm_trainer_adapter *ads, int n,
                                 const tdm_finetune_hooks *hooks, tdm_cotrain_serving **srv,
                                 bool *joined, char **bad_lines, tdm_error *err)
{
    *srv = NULL;
    *joined = false;
    if (o->no_join) return TDM_OK;
    /* The devices this run could get, without reserving. An error here (a bad
     * TANDEM_FAKE_GPUS) is device open's to report, with the exit code of a run without
     * co-training. */
    tdm_device_candidates cand;
    tdm_status st = tdm_device_candidates_list(&o->device, &cand, err);
    if (st != TDM_OK) {
        if (o->join_require) return st;
        *err = (tdm_error){0};
        return TDM_OK;
    }
    if (!cand.cpu && !cand.n) { /* --device cuda without a usable GPU: device open says why */
        if (o->join_require)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED, "--join require: no usable GPU");
        return TDM_OK;
    }
    /* A model directory that cannot be identified (no config.json, a FIFO, a corrupt header)
     * cannot be trained either: without --join require the run goes on alone, and loading it
     * reports the problem with the message and exit code of a run without co-training. */
    tdm_base_identity base;
    char dir[4096];
    const char *device = cand.cpu ? "cpu" : cand.uuid[0];
    st = tdm_base_identity_compute(o->trainer.model_dir, o->trainer.nf4, o->trainer.double_quant,
                                   cand.compute_dtype, device, &base, err);
    if (st == TDM_OK) st = tdm_cotrain_dir(NULL, dir, sizeof dir, err);
    if (st != TDM_OK) {
        tdm_device_candidates_free(&cand);
        if (o->join_require) {
            tdm_error_prefix(err, "--join require");
            return st;
        }
        *err = (tdm_error){0};
        return TDM_OK;
    }
    if (!cand.cpu) {
        st = find_on_gpus(o, ads, n, hooks, &cand, &base, dir, srv, joined, bad_lines, err);
        tdm_device_candidates_free(&cand);
        return st;
    }
    tdm_device_candidates_free(&cand);
    /* the CPU: nothing to reserve, so the election happens now, before any data is read */
    int attempt = 0, takeovers = o->cotrain_takeovers;
    while (attempt < JOIN_ATTEMPTS) {
        tdm_cotrain_host *h = NULL;
        tdm_cotrain_advert found;
        const char *why = NULL;
        if ((st = tdm_cotrain_elect(dir, &base, o->trainer.model_dir, &h, &found, &why, err)) !=
            TDM_OK)
            return st;
        if (h) {
            if (o->join_require && takeovers == 0) {
                tdm_cotrain_host_stop(h);
                return tdm_fail(err, TDM_ERR_NOT_FOUND,
                                "--join require: no finetune of this base model runs on %s%s%s%s; "
                                "%s",
                                device, why && *why ? " (nearest differs in: " : "",
                                why && *why ? why : "", why && *why ? ")" : "",
                                JOIN_REQUIRE_ADVICE);
            }
            tdm_cotrain_serving *s = NULL;
            if ((st = serving_new(o, ads, &s, err)) != TDM_OK) {
                tdm_cotrain_host_stop(h);
                return st;
            }
            s->host = h;
            *srv = s;
            /* finetunes run here, but none of them can share its pass with this one */
            if (why && *why)
                note(s->note, s->note_user,
                     "not joining: the finetunes running on %s train another base (the nearest "
                     "differs in: %s); this one trains in its own process",
                     device, why);
            if (takeovers > 0) note_taking_over(s, device, n);
            return TDM_OK;
        }
        bool retry = false, orphaned = false;
        st = join_host(o, ads, n, hooks, &found, &base, &retry, &orphaned, bad_lines, err);
        if (orphaned && takeovers < TAKEOVERS_MAX) {
            note_orphaned(o, &found, n, err);
            o->cotrain_takeovers = ++takeovers;
            attempt = 0;
            continue;
        }
        if (!retry) {
            *joined = true;
            return st;
        }
        attempt++;
    }
    return st;
}

tdm_status tdm_cotrain_serve_open(tdm_cotrain_serving *s, tdm_device *dev, bool *join_instead,
                                  tdm_error *err)
{
    (void)err;
    *join_instead = false;
    if (!s) return TDM_OK;
    s->dev = dev;
    if (!s->elect_at_open) return TDM_OK;
    s->elect_at_open = false;
    snprintf(s->base.device, sizeof s->base.device, "%s", tdm_device_name(dev));
    snprintf(s->base.compute_dtype, sizeof s->base.compute_dtype, "%s",
             tdm_device_compute_dtype(dev));
    tdm_base_identity_seal(&s->base);
    tdm_cotrain_host *h = NULL;
    tdm_error e = {0};
    if (tdm_cotrain_elect(s->dir, &s->base, s->model_dir, &h, &s->found, NULL, &e) != TDM_OK) {
        note(s->note, s->note_user, "warning: co-training: %s; training on its own", e.message);
        return TDM_OK;
    }
    if (h) {
        s->host = h;
        if (s->takeover_n > 0) note_taking_over(s, s->base.device, s->takeover_n);
    } else {
        *join_instead = true; /* a host took this GPU while we reserved: give it back, join */
    }
    return TDM_OK;
}

tdm_status tdm_cotrain_serve_join(tdm_cotrain_serving *s, tdm_run_opts *o,
                                  const tdm_trainer_adapter *ads, int n,
                                  const tdm_finetune_hooks *hooks, bool *take_over,
                                  char **bad_lines, tdm_error *err)
{
    bool retry = false, orphaned = false;
    *take_over = false;
    tdm_status st =
        join_host(o, ads, n, hooks, &s->found, &s->base, &retry, &orphaned, bad_lines, err);
    if (orphaned && o->cotrain_takeovers < TAKEOVERS_MAX) {
        /* that host died after admitting us: this run gave its reservation back, so the caller
         * runs again from the election with --resume (reserving anew, in the ledger's order) */
        note_orphaned(o, &s->found, n, err);
        o->cotrain_takeovers++;
        *take_over = true;
        return TDM_OK;
    }
    if (retry && o->cotrain_rejoins < JOIN_ATTEMPTS) {
        /* it ended before admitting us (it just finished): elect again, as at the start */
        note(o->device.note, o->device.note_user, "%s on %s; electing again", err->message,
             s->base.device);
        *err = (tdm_error){0};
        o->cotrain_rejoins++;
        *take_over = true;
        return TDM_OK;
    }
    if (retry)
        tdm_error_prefix(err, "joining the finetune of pid %d on %s failed (run the command "
                              "again)",
                         (int)s->found.pid, s->base.device);
    return st;
}

/* ------------------------------------------------------------------------- host ---- */

static joined_group *group_of(tdm_cotrain_serving *s, int a)
{
    for (int i = 0; i < s->n_groups; i++)
        if (a >= s->g[i].first && a < s->g[i].first + s->g[i].n) return &s->g[i];
    return NULL;
}

static joined_group *group_by_conn(tdm_cotrain_serving *s, uint64_t conn)
{
    for (int i = 0; i < s->n_groups; i++)
        if (s->g[i].conn == conn) return &s->g[i];
    return NULL;
}

static void send_msg(tdm_cotrain_serving *s, joined_group *g, const tdm_cotrain_msg *m)
{
    if (g->closed) return;
    tdm_error e = {0};
    if (tdm_cotrain_host_send(s->host, g->conn, m, &e) == TDM_ERR_NOT_FOUND) g->closed = true;
}

static void send_done(tdm_cotrain_serving *s, joined_group *g, int a, tdm_cotrain_outcome out,
                      int64_t step, const char *message)
{
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_DONE};
    m.u.done.adapter = a - g->first;
    m.u.done.outcome = out;
    m.u.done.step = step;
    m.u.done.message = (char *)message;
    send_msg(s, g, &m);
    if (++g->ended == g->n && !g->closed) {
        tdm_cotrain_host_close(s->host, g->conn);
        g->closed = true;
    }
}

/* The view of trainer adapter a, growing the array as adapters join; NULL when out of memory. */
static adapter_view *view_at(tdm_cotrain_serving *s, int a)
{
    if (a < 0) return NULL;
    if (a >= s->n_views) {
        adapter_view *v = realloc(s->views, (size_t)(a + 1) * sizeof *v);
        if (!v) return NULL;
        memset(v + s->n_views, 0, (size_t)(a + 1 - s->n_views) * sizeof *v);
        s->views = v;
        s->n_views = a + 1;
    }
    return &s->views[a];
}

static void view_init(tdm_cotrain_serving *s, int a, const char *data, const char *output,
                      const char *label, double weight, int epochs, int32_t pid, const char *user)
{
    adapter_view *v = view_at(s, a);
    if (!v) return;
    *v = (adapter_view){.used = true,
                        .data = data,
                        .output = output,
                        .joiner_pid = pid,
                        .joiner_user = user,
                        .weight = weight,
                        .epochs = epochs,
                        .loss = NAN,
                        .tokens_per_sec = NAN};
    if (label)
        snprintf(v->label, sizeof v->label, "%s", label);
    else
        stem_of(data, v->label, sizeof v->label);
    s->dirty = true;
}

static void on_progress(const tdm_trainer_progress *p, void *user)
{
    tdm_cotrain_serving *s = user;
    adapter_view *v = p->adapter >= 0 && p->adapter < s->n_views && s->views[p->adapter].used
                          ? &s->views[p->adapter]
                          : NULL;
    if (v) {
        v->step = p->step;
        v->total = p->total_steps;
        v->epoch = p->epoch;
        v->epochs = p->epochs;
        if (p->event == TDM_TRAINER_EVENT_STEP) v->loss = p->loss;
        if (isfinite(p->tokens_per_sec)) v->tokens_per_sec = p->tokens_per_sec;
        if (p->label) snprintf(v->label, sizeof v->label, "%s", p->label);
        if (p->event == TDM_TRAINER_EVENT_DONE) s->dirty = true;
    }
    if (p->adapter < s->n_own) {
        if (s->progress) s->progress(p, s->progress_user);
        return;
    }
    joined_group *g = group_of(s, p->adapter);
    /* a joined adapter's resume point is not a protocol event: the host's "joined" line says it */
    if (!g || p->event == TDM_TRAINER_EVENT_RESUMED) return;
    tdm_cotrain_msg m;
    tdm_cotrain_progress_from_trainer(p, p->adapter - g->first, &m);
    send_msg(s, g, &m);
    if (s->progress && v) {
        /* the host's own output shows joined adapters too, named with their joiner */
        char label[256];
        snprintf(label, sizeof label, "%s (pid %d, %s)", v->label, (int)v->joiner_pid,
                 v->joiner_user ? v->joiner_user : "?");
        tdm_trainer_progress q = *p;
        q.label = label;
        s->progress(&q, s->progress_user);
    }
    if (p->event == TDM_TRAINER_EVENT_DONE)
        send_done(s, g, p->adapter, TDM_COTRAIN_FINISHED, p->step, NULL);
}

static void on_pass(const tdm_trainer_pass *tp, void *user)
{
    tdm_cotrain_serving *s = user;
    for (int a = 0; a < tp->n_adapters && a < s->n_views; a++)
        s->views[a].window_seqs += tp->seqs[a];
    if (s->inner_pass) s->inner_pass(tp, s->inner_pass_user);
}

/* Rewrites the advertisement with the live status (cotrain/status.h): at most once per
 * TDM_COTRAIN_STATUS_PERIOD_MS, and at the first boundary after an adapter joined or ended.
 * A failed write (a full disk) is said once and does not stop training. */
static void publish(tdm_cotrain_serving *s, tdm_trainer *t)
{
    int64_t now = tdm_now_mono_ns();
    if (!s->dirty && s->published_ns &&
        now - s->published_ns < (int64_t)TDM_COTRAIN_STATUS_PERIOD_MS * 1000000)
        return;
    int n = tdm_trainer_adapter_count(t);
    if (n > s->n_views) n = s->n_views;
    tdm_cotrain_status_adapter *ads = calloc((size_t)(n > 0 ? n : 1), sizeof *ads);
    if (!ads) return;
    int64_t window = 0;
    for (int a = 0; a < n; a++)
        if (s->views[a].used) window += s->views[a].window_seqs;
    int k = 0;
    for (int a = 0; a < n; a++) {
        adapter_view *v = &s->views[a];
        if (!v->used) continue;
        int64_t step = 0, total = 0;
        bool done = false;
        tdm_trainer_adapter_position(t, a, &step, &done);
        tdm_trainer_adapter_info(t, a, NULL, NULL, &total);
        tdm_cotrain_status_adapter *o = &ads[k++];
        o->index = a;
        o->label = v->label;
        o->data = (char *)v->data;
        o->output = (char *)v->output;
        o->joiner_pid = v->joiner_pid;
        snprintf(o->joiner_user, sizeof o->joiner_user, "%s",
                 v->joiner_user ? v->joiner_user : "?");
        o->state = !done                                ? TDM_COTRAIN_ADAPTER_TRAINING
                   : tdm_trainer_adapter_detached(t, a) ? TDM_COTRAIN_ADAPTER_DETACHED
                                                        : TDM_COTRAIN_ADAPTER_FINISHED;
        o->step = step;
        o->total_steps = total;
        o->epoch = v->epoch;
        o->epochs = v->epochs;
        o->loss = v->loss;
        o->tokens_per_sec = v->tokens_per_sec;
        o->weight = v->weight;
        o->share = window > 0 ? (double)v->window_seqs / (double)window : NAN;
    }
    tdm_cotrain_status st = {.updated_ms = tdm_now_real_ns() / 1000000,
                             .global_step = tdm_trainer_global_step(t),
                             .n_adapters = k,
                             .adapters = ads};
    snprintf(st.schedule, sizeof st.schedule, "%s", tdm_train_schedule_name(s->schedule));
    st.has_plan = true;
    st.grad_checkpoint = tdm_trainer_grad_checkpoint(t);
    if (st.grad_checkpoint)
        snprintf(st.recompute, sizeof st.recompute, "%s",
                 tdm_recompute_name(tdm_trainer_recompute(t)));
    st.split = tdm_trainer_split(t);
    json_t *j = tdm_cotrain_status_json(&st);
    free(ads); /* its strings are borrowed */
    tdm_error e = {0};
    tdm_status r =
        j ? tdm_cotrain_host_publish(s->host, j, &e) : tdm_fail(&e, TDM_ERR_NOMEM, "out of memory");
    json_decref(j);
    if (r != TDM_OK && !s->publish_failed) {
        note(s->note, s->note_user, "co-training: cannot publish the status for gpu status: %s",
             e.message);
        s->publish_failed = true;
    }
    for (int a = 0; a < n; a++)
        s->views[a].window_seqs = 0;
    s->dirty = false;
    s->published_ns = now;
}

static void reject(tdm_cotrain_serving *s, uint64_t conn, tdm_status status, const char *message)
{
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_REJECTED};
    m.u.rejected.status = status;
    m.u.rejected.message = (char *)message;
    tdm_error e = {0};
    (void)tdm_cotrain_host_send(s->host, conn, &m, &e);
    tdm_cotrain_host_close(s->host, conn);
}

/* ---- memory admission: the host's reservation follows the plan of its adapters ---- */

static bool on_gpu(const tdm_cotrain_serving *s)
{
    return s->dev && s->dev->gpu;
}

/* The activations the host's plans are made for (the CUDA backend's also on a simulated GPU,
 * whose reservation is the one a real GPU's plan would take). */
static tdm_be_dtype host_act(const tdm_cotrain_serving *s)
{
    return on_gpu(s) ? TDM_BE_BF16 : TDM_BE_F32;
}

/* What a plan of est (host_act's estimate) needs, MiB: its reservation as --vram auto takes it
 * on a GPU, its need on the CPU; the backend scratch counted at the largest size held so far
 * (the scratch never shrinks). */
static int64_t plan_mb(tdm_cotrain_serving *s, tdm_model_mem *est)
{
    if (est->backend_scratch < s->scratch_hw) est->backend_scratch = s->scratch_hw;
    return on_gpu(s) ? tdm_device_reservation_mb(est) : tdm_device_cpu_need_mb(est);
}

/* The host's part of a fit request (train/memory_plan.h): its device's activations and fixed
 * cost (the CUDA context, or the CPU process's), and the scratch it already holds. */
static void host_fit(const tdm_cotrain_serving *s, tdm_memory_fit_request *fit)
{
    fit->act = host_act(s);
    fit->context_mb = on_gpu(s) ? TDM_CUDA_CONTEXT_MIB : TDM_CPU_PROCESS_MIB;
    fit->scratch_floor = s->scratch_hw;
}

/* The memory a CPU host may use (tdm_device_cpu_memory_limit) into *m; false when unknown (then
 * m->where says so). */
static bool cpu_memory(tdm_cpu_memory *m)
{
    tdm_error why = {0};
    if (tdm_device_cpu_memory_limit(m, &why) == TDM_OK) return true;
    snprintf(m->where, sizeof m->where, "the machine's memory (unknown: %.300s)", why.message);
    return false;
}

static int active_adapters(const tdm_trainer *t)
{
    int k = 0;
    for (int a = 0; a < tdm_trainer_adapter_count(t); a++) {
        bool done = false;
        tdm_trainer_adapter_position(t, a, NULL, &done);
        k += !done;
    }
    return k;
}

/* The first boundary: the plan of the host's own adapters, which its reservation holds. */
static void plan_start(tdm_cotrain_serving *s, tdm_trainer *t)
{
    if (s->planned) return;
    s->planned = true;
    s->n_active = active_adapters(t);
    tdm_model_mem est;
    tdm_error e = {0};
    if (tdm_trainer_join_estimate(t, NULL, host_act(s), &est, &e) != TDM_OK) return;
    s->scratch_hw = est.backend_scratch;
    s->plan_mb = plan_mb(s, &est);
    s->grow_checked_ns = tdm_now_mono_ns(); /* the plan was just fitted to what is free */
}

/* Switches the trainer to lr's faster plan; false (said as a warning, the plan in use stays)
 * when it cannot. was / now (256 bytes each) receive both plans' phrases for the caller's line. */
static bool switch_plan(tdm_cotrain_serving *s, tdm_trainer *t, const tdm_leave_replan *lr,
                        char *was, char *now)
{
    tdm_error e = {0};
    if (tdm_trainer_set_memory_plan(t, lr->plan.grad_checkpoint, lr->plan.recompute,
                                    lr->plan.split, &e) != TDM_OK) {
        note(s->note, s->note_user, "warning: co-training: keeping the plan in use: %s",
             e.message);
        return false;
    }
    if (lr->plan.est.backend_scratch > s->scratch_hw) s->scratch_hw = lr->plan.est.backend_scratch;
    tdm_memory_plan_describe(&lr->current, was, 256);
    tdm_memory_plan_describe(&lr->plan, now, 256);
    return true;
}

/* After adapters left, on a GPU, nothing released yet: the plan of the adapters still training
 * goes back to the fastest one the reservation holds (tdm_trainer_leave_replan: checkpointing
 * off, a lighter --recompute rung, a lower split; never past the user's own flags), said in one
 * line. Not while joins wait for memory: the head one's admission plans everything with its
 * adapters, and what is released now is room for it. */
static void replan_after_leave(tdm_cotrain_serving *s, tdm_trainer *t, int active, int left)
{
    if (active < 1 || s->n_wait > 0) return;
    tdm_cpu_memory m;
    tdm_leave_replan_request rq = {0};
    if (on_gpu(s)) {
        rq.reservation_mb = s->dev->budget_mb;
        rq.plan_mb = s->plan_mb;
    } else if (cpu_memory(&m)) { /* no reservation: the fastest plan within the memory */
        rq.reservation_mb = rq.plan_mb = m.limit_mb;
    } else {
        return;
    }
    host_fit(s, &rq.fit);
    tdm_leave_replan lr;
    tdm_error e = {0};
    if (tdm_trainer_leave_replan(t, &rq, &lr, &e) != TDM_OK) {
        note(s->note, s->note_user, "warning: co-training: no faster plan computed: %s",
             e.message);
        return;
    }
    char was[256], now[256];
    if (!lr.faster || !switch_plan(s, t, &lr, was, now)) return;
    if (!on_gpu(s)) {
        note(s->note, s->note_user,
             "co-training: %d adapter(s) left, %d training: %s fits %s: using it, %lld MiB, "
             "instead of %s, %lld MiB",
             left, active, now, m.where, (long long)lr.plan.mb, was, (long long)lr.current.mb);
        return;
    }
    note(s->note, s->note_user,
         "co-training: %d adapter(s) left, %d training: %s fits the %lld MiB this finetune's "
         "reservation holds for its plan on %s: using it, %lld MiB, instead of %s, %lld MiB",
         left, active, now, (long long)lr.budget_mb, s->dev->lease.gpu_uuid,
         (long long)lr.plan.mb, was, (long long)lr.current.mb);
}

#define GROW_CHECK_MS 2000 /* how often a host on a slower plan looks for memory to go faster */

/* A host on a slower plan than its fastest (it started while memory was short, or re-planned
 * for joins that have left) grows its reservation to a faster plan when the GPU has room for it
 * now: at most every GROW_CHECK_MS, never while joins wait (their admission plans with the
 * memory), never past the user's own flags, and only through the ledger's non-blocking resize
 * (a waiter in its queue comes first: the growth is then not admissible). The plan is the first
 * of the plans that fit (tdm_trainer_leave_replan) for the budget the reservation could grow to;
 * the reservation grows to what that plan needs, not to all that is free. */
static void grow_to_faster(tdm_cotrain_serving *s, tdm_trainer *t)
{
    if (!on_gpu(s) || s->n_wait > 0 || !s->planned) return;
    int64_t now = tdm_now_mono_ns();
    if (s->grow_checked_ns && now - s->grow_checked_ns < (int64_t)GROW_CHECK_MS * 1000000) return;
    s->grow_checked_ns = now;
    bool gc0 = tdm_trainer_grad_checkpoint(t);
    if (active_adapters(t) < 1 || (!gc0 && tdm_trainer_split(t) == 1)) return; /* the fastest */
    int64_t growable = -1, capacity = -1, held = s->dev->budget_mb;
    tdm_error e = {0};
    if (tdm_device_growth_budget(s->dev, &growable, &capacity, &e) != TDM_OK || growable <= held)
        return;
    int64_t slack = held - s->plan_mb;
    tdm_leave_replan_request rq = {.reservation_mb = growable, .plan_mb = growable - slack};
    host_fit(s, &rq.fit);
    tdm_leave_replan lr;
    if (tdm_trainer_leave_replan(t, &rq, &lr, &e) != TDM_OK || !lr.faster ||
        lr.target_mb <= held)
        return;
    int64_t ticket = 0;
    bool granted = false;
    if (tdm_device_resize(s->dev, lr.target_mb, false, &ticket, &granted, NULL, &e) != TDM_OK ||
        !granted)
        return; /* taken meanwhile, or a waiter comes first: look again later */
    char was[256], now_plan[256];
    if (!switch_plan(s, t, &lr, was, now_plan)) {
        tdm_error ignored = {0};
        (void)tdm_device_resize(s->dev, held, false, &ticket, &granted, NULL, &ignored);
        return;
    }
    s->plan_mb = lr.target_mb - slack;
    s->dirty = true;
    tdm_device_record_actual(s->dev, false, NULL, NULL);
    note(s->note, s->note_user,
         "co-training: memory is free on %s: reservation grown by %lld MiB to %lld MiB for %s, "
         "%lld MiB, instead of %s, %lld MiB",
         s->dev->lease.gpu_uuid, (long long)(lr.target_mb - held), (long long)lr.target_mb,
         now_plan, (long long)lr.plan.mb, was, (long long)lr.current.mb);
}

/* Adapters left since the last boundary (finished, handed back): their device memory is freed
 * (tdm_trainer_shrink), the plan goes back to a faster one when the reservation holds it
 * (replan_after_leave), and the reservation shrinks by what the plan of the rest needs less. */
static void shrink_after_leave(tdm_cotrain_serving *s, tdm_trainer *t)
{
    int active = active_adapters(t);
    if (active >= s->n_active) {
        s->n_active = active;
        return;
    }
    int left = s->n_active - active;
    s->n_active = active;
    tdm_error e = {0};
    tdm_model_mem est;
    tdm_status st = tdm_trainer_shrink(t, &e);
    if (st == TDM_OK) replan_after_leave(s, t, active, left);
    if (st != TDM_OK || tdm_trainer_join_estimate(t, NULL, host_act(s), &est, &e) != TDM_OK) {
        note(s->note, s->note_user, "warning: memory of the adapters that left not released: %s",
             e.message);
        return;
    }
    int64_t now_mb = plan_mb(s, &est);
    if (!on_gpu(s) || now_mb >= s->plan_mb) {
        s->plan_mb = now_mb < s->plan_mb ? now_mb : s->plan_mb;
        return;
    }
    int64_t target = s->dev->budget_mb - (s->plan_mb - now_mb);
    int64_t ticket = 0;
    bool granted = false;
    if (target < 1) target = 1;
    int64_t before = s->dev->budget_mb;
    if (tdm_device_resize(s->dev, target, false, &ticket, &granted, NULL, &e) != TDM_OK ||
        !granted) {
        note(s->note, s->note_user, "warning: the reservation did not shrink: %s", e.message);
        return;
    }
    s->plan_mb = now_mb;
    tdm_device_record_actual(s->dev, false, NULL, NULL);
    note(s->note, s->note_user,
         "co-training: %lld MiB released, reservation now %lld MiB (%d adapter(s) training)",
         (long long)(before - target), (long long)target, active);
}

static void waiter_free(tdm_cotrain_serving *s, int i)
{
    waiting_join *w = &s->w[i];
    if (w->ticket && s->dev) tdm_device_resize_cancel(s->dev, &w->ticket);
    tdm_trainer_join_free(w->tj);
    tdm_cotrain_msg_free(&w->join);
    memmove(&s->w[i], &s->w[i + 1], (size_t)(s->n_wait - i - 1) * sizeof *s->w);
    s->n_wait--;
}

static void tell_waiting(tdm_cotrain_serving *s, waiting_join *w, int64_t need_mb, int position,
                         const char *message)
{
    if (w->told_mb == need_mb && w->told_position == position) return;
    w->told_mb = need_mb;
    w->told_position = position;
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_WAITING};
    m.u.waiting.reason = "gpu-memory";
    m.u.waiting.need_mb = (uint64_t)(need_mb > 0 ? need_mb : 0);
    m.u.waiting.message = (char *)message;
    tdm_error e = {0};
    (void)tdm_cotrain_host_send(s->host, w->conn, &m, &e);
}

/* Moves the head waiter's prepared adapters into the trainer (its memory is reserved); false
 * when that failed (the joiner was told). */
static bool admit(tdm_cotrain_serving *s, tdm_trainer *t, waiting_join *w, int64_t with_mb,
                  uint64_t scratch)
{
    if (s->n_groups == s->cap_groups) {
        int cap = s->cap_groups ? 2 * s->cap_groups : 4;
        joined_group *g = realloc(s->g, (size_t)cap * sizeof *g);
        if (!g) {
            reject(s, w->conn, TDM_ERR_NOMEM, "the host is out of memory");
            return false;
        }
        s->g = g;
        s->cap_groups = cap;
    }
    joined_group *g = &s->g[s->n_groups];
    memset(g, 0, sizeof *g);
    g->conn = w->conn;
    g->join = w->join; /* the trainer borrows its strings */
    memset(&w->join, 0, sizeof w->join);
    tdm_cotrain_join *j = &g->join.u.join;
    g->n = j->n_adapters;
    tdm_error e = {0};
    tdm_status st = tdm_trainer_join_commit(t, w->tj, &g->first, &e);
    w->tj = NULL;
    if (st != TDM_OK) {
        note(s->note, s->note_user, "refused %d adapter(s) of pid %d (%s): %s", g->n,
             (int)w->peer.pid, j->user ? j->user : "?", e.message);
        reject(s, w->conn, st, e.message);
        tdm_cotrain_msg_free(&g->join);
        return false;
    }
    s->n_groups++;
    g->pid = w->peer.pid;
    for (int a = 0; a < g->n; a++)
        view_init(s, g->first + a, j->adapters[a].data, j->adapters[a].output, j->adapters[a].label,
                  j->adapters[a].weight, j->adapters[a].epochs, g->pid, j->user ? j->user : "?");
    s->n_active = active_adapters(t);
    if (with_mb > 0) {
        s->plan_mb = with_mb;
        if (scratch > s->scratch_hw) s->scratch_hw = scratch;
    }
    if (on_gpu(s)) tdm_device_record_actual(s->dev, false, NULL, NULL);
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_ADMITTED};
    m.u.admitted.host_pid = (int32_t)getpid();
    m.u.admitted.n_adapters = g->n;
    send_msg(s, g, &m);
    for (int a = 0; a < g->n; a++) {
        int64_t step = 0;
        bool done = false;
        tdm_trainer_adapter_position(t, g->first + a, &step, &done);
        char from[64] = "";
        if (j->opts.resume && step > 0)
            snprintf(from, sizeof from, ", resumed at step %lld%s", (long long)step,
                     done ? " (already finished)" : "");
        note(s->note, s->note_user, "joined: adapter %d: %s -> %s, from pid %d (%s)%s",
             g->first + a, j->adapters[a].data, j->adapters[a].output, (int)w->peer.pid,
             j->user ? j->user : "?", from);
    }
    /* resumed from a final checkpoint: nothing left to train */
    for (int a = g->first; a < g->first + g->n; a++) {
        int64_t step = 0;
        bool done = false;
        tdm_trainer_adapter_position(t, a, &step, &done);
        if (done) send_done(s, g, a, TDM_COTRAIN_FINISHED, step, NULL);
    }
    return true;
}

/* The head waiter's admission on a GPU (tdm_trainer_join_admit): the plan of the unfinished
 * adapters with its adapters that fits what the reservation can grow to, or the smallest. */
static tdm_status plan_join(tdm_cotrain_serving *s, tdm_trainer *t, waiting_join *w,
                            tdm_join_admission *adm, int64_t *growable_mb, tdm_error *e)
{
    tdm_join_admit_request rq = {.reservation_mb = s->dev->budget_mb, .plan_mb = s->plan_mb};
    host_fit(s, &rq.fit);
    TDM_TRY(tdm_device_growth_budget(s->dev, &rq.growable_mb, &rq.capacity_mb, e));
    *growable_mb = rq.growable_mb;
    TDM_TRY(tdm_trainer_join_admit(t, w->tj, &rq, adm, e));
    if (adm->kind != TDM_JOIN_NEVER_FITS) return TDM_OK;
    char smallest[256];
    tdm_memory_plan_describe(&adm->plan, smallest, sizeof smallest);
    return tdm_fail(e, TDM_ERR_NEVER_FITS,
                    "with these adapters the finetune of pid %d needs at least %lld MiB on %s "
                    "(its smallest plan: %s), more than tandem may reserve there (%lld MiB); "
                    "lower --max-seq-len, --batch-size or --rank, or run with --no-join",
                    (int)getpid(), (long long)adm->need_mb, s->dev->lease.gpu_uuid, smallest,
                    (long long)rq.capacity_mb);
}

/* The head waiter's admission on the CPU (tdm_trainer_join_admit; no ledger to grow): the plan
 * of the unfinished adapters with its adapters that fits the memory the host may use
 * (tdm_device_cpu_memory_limit, where says what binds), applied at this boundary like a GPU
 * host's; refused when even the smallest exceeds it. Growth past what is available this moment
 * is admitted with a warning (the CPU has no queue to wait in, and page cache is reclaimed). An
 * unknown limit: the plan as asked, with a note. */
static tdm_status plan_join_cpu(tdm_cotrain_serving *s, tdm_trainer *t, waiting_join *w,
                                tdm_join_admission *adm, char *where, size_t cap, tdm_error *e)
{
    tdm_cpu_memory m;
    bool known = cpu_memory(&m);
    snprintf(where, cap, "%s", m.where);
    if (!known)
        note(s->note, s->note_user, "note: %s; the adapters of pid %d are admitted unchecked",
             m.where, (int)w->peer.pid);
    int64_t limit = known ? m.limit_mb : -1; /* -1: no limit (tdm_memory_plan_admit) */
    tdm_join_admit_request rq = {
        .reservation_mb = limit, .plan_mb = limit, .growable_mb = limit, .capacity_mb = limit};
    host_fit(s, &rq.fit);
    TDM_TRY(tdm_trainer_join_admit(t, w->tj, &rq, adm, e));
    char smallest[256];
    tdm_memory_plan_describe(&adm->plan, smallest, sizeof smallest);
    if (adm->kind == TDM_JOIN_NEVER_FITS)
        return tdm_fail(e, TDM_ERR_NEVER_FITS,
                        "with the adapters of pid %d, the finetune of pid %d needs at least %lld "
                        "MiB (its smallest plan: %s), more than %s; lower --max-seq-len, "
                        "--batch-size or --rank, use --method qlora, or run with --no-join",
                        (int)w->peer.pid, (int)getpid(), (long long)adm->need_mb, smallest,
                        m.where);
    if (known && adm->plan.mb - s->plan_mb > m.avail_mb)
        note(s->note, s->note_user,
             "warning: co-training: the adapters of pid %d take this finetune's need from %lld to "
             "%lld MiB, more than the %lld MiB available now: it may swap or be killed for memory",
             (int)w->peer.pid, (long long)s->plan_mb, (long long)adm->plan.mb,
             (long long)m.avail_mb);
    return TDM_OK;
}

/* Says the plan an admission changed to (one line), when it is not the one in use; what bounded
 * it: the reservation's growth on a GPU, cpu_where on the CPU. */
static void note_plan(tdm_cotrain_serving *s, const waiting_join *w, const tdm_join_admission *adm,
                      int64_t growable_mb, const char *cpu_where)
{
    char what[256], limit[512];
    tdm_memory_plan_describe(&adm->plan, what, sizeof what);
    if (on_gpu(s))
        snprintf(limit, sizeof limit, "the %lld MiB this finetune's reservation can grow to on %s",
                 (long long)growable_mb, s->dev->lease.gpu_uuid);
    else
        snprintf(limit, sizeof limit, "%s", cpu_where);
    if (adm->plan.rung != TDM_PLAN_AS_ASKED)
        note(s->note, s->note_user,
             "co-training: with %d adapter(s) of pid %d the plan as asked needs %lld MiB, more "
             "than %s: using %s, %lld MiB",
             w->join.u.join.n_adapters, (int)w->peer.pid, (long long)adm->fit.asked.mb, limit,
             what, (long long)adm->plan.mb);
    else
        note(s->note, s->note_user,
             "co-training: with %d adapter(s) of pid %d the plan as asked fits: using it, %lld MiB",
             w->join.u.join.n_adapters, (int)w->peer.pid, (long long)adm->plan.mb);
}

/* Admits waiting joins in arrival order while the reservation can grow for the head one. Each
 * admission re-plans (memory_plan.h, tdm_memory_plan_admit): the plan of the unfinished adapters
 * with the joiner's that fits what the reservation can grow to now on a GPU (the memory the
 * process may use on the CPU: plan_join_cpu), applied at this step boundary
 * (tdm_trainer_set_memory_plan: checkpointing and the split), after the ledger granted the
 * growth and before the joiner's adapters are allocated; a plan that needs less than the
 * reservation holds shrinks it after the commit. */
static void admit_waiting(tdm_cotrain_serving *s, tdm_trainer *t)
{
    while (s->n_wait > 0) {
        waiting_join *w = &s->w[0];
        int64_t with_mb = 0, target = 0, growable = -1;
        uint64_t scratch = 0;
        bool granted = true, replan = false;
        char cpu_where[400] = "";
        bool gc0 = tdm_trainer_grad_checkpoint(t);
        tdm_recompute rc0 = tdm_trainer_recompute(t);
        int split0 = tdm_trainer_split(t);
        int64_t before = on_gpu(s) ? s->dev->budget_mb : 0;
        tdm_join_admission adm = {0};
        tdm_wait_report rep = {0};
        tdm_error e = {0};
        tdm_status st = TDM_OK;
        st = on_gpu(s) ? plan_join(s, t, w, &adm, &growable, &e)
                       : plan_join_cpu(s, t, w, &adm, cpu_where, sizeof cpu_where, &e);
        if (st == TDM_OK) {
            scratch = adm.plan.est.backend_scratch;
            with_mb = adm.plan.mb;
            replan = adm.plan.grad_checkpoint != gc0 || adm.plan.split != split0 ||
                     (gc0 && adm.plan.recompute != rc0);
        }
        if (st == TDM_OK && on_gpu(s)) {
            target = adm.target_mb;
            if (target > before)
                st = tdm_device_resize(s->dev, target, !w->join.u.join.opts.no_wait, &w->ticket,
                                       &granted, &rep, &e);
        }
        if (st == TDM_OK && granted && replan) {
            st = tdm_trainer_set_memory_plan(t, adm.plan.grad_checkpoint, adm.plan.recompute,
                                             adm.plan.split, &e);
            if (st == TDM_OK) note_plan(s, w, &adm, growable, cpu_where);
        }
        if (st != TDM_OK) {
            note(s->note, s->note_user, "refused %d adapter(s) of pid %d (%s): %s",
                 w->join.u.join.n_adapters, (int)w->peer.pid,
                 w->join.u.join.user ? w->join.u.join.user : "?", e.message);
            reject(s, w->conn, st, e.message);
            if (on_gpu(s) && s->dev->budget_mb > before) { /* grown for nothing */
                int64_t ticket = 0;
                bool ok = false;
                tdm_error ignored = {0};
                (void)tdm_device_resize(s->dev, before, false, &ticket, &ok, NULL, &ignored);
            }
            waiter_free(s, 0);
            continue;
        }
        if (!granted) {
            char line[1024], plan[300] = "";
            if (adm.plan.rung != TDM_PLAN_AS_ASKED) {
                char what[256];
                tdm_memory_plan_describe(&adm.plan, what, sizeof what);
                snprintf(plan, sizeof plan, ", with %s", what);
            }
            snprintf(line, sizeof line,
                     "the finetune of pid %d needs %lld MiB more on %s for these adapters (its "
                     "reservation %lld -> %lld MiB%s): %lld MiB admissible now, position %d in the "
                     "GPU's queue; they join when it fits (Ctrl-C withdraws them)",
                     (int)getpid(), (long long)rep.needed_mb, s->dev->lease.gpu_uuid,
                     (long long)s->dev->budget_mb, (long long)target, plan,
                     (long long)rep.available_mb, rep.position);
            tell_waiting(s, w, rep.needed_mb, rep.position, line);
            for (int i = 1; i < s->n_wait; i++) {
                if (!s->w[i].join.u.join.opts.no_wait) {
                    tell_waiting(s, &s->w[i], 0, -i,
                                 "another join to this finetune waits for GPU memory first; "
                                 "these adapters join after it");
                    continue;
                }
                reject(s, s->w[i].conn, TDM_ERR_BUSY,
                       "another join to this finetune waits for GPU memory ahead of these "
                       "adapters and --no-wait-gpu was given");
                waiter_free(s, i--);
            }
            return;
        }
        if (on_gpu(s) && target > before)
            note(s->note, s->note_user,
                 "co-training: reservation grown by %lld MiB to %lld MiB for %d adapter(s) of "
                 "pid %d",
                 (long long)(target - before), (long long)target, w->join.u.join.n_adapters,
                 (int)w->peer.pid);
        int n_join = w->join.u.join.n_adapters;
        int32_t pid = w->peer.pid;
        bool ok = admit(s, t, w, with_mb, scratch);
        waiter_free(s, 0);
        if (!ok) {
            /* back to the plan and the reservation before this join */
            tdm_error ignored = {0};
            if (replan) (void)tdm_trainer_set_memory_plan(t, gc0, rc0, split0, &ignored);
            if (on_gpu(s) && s->dev->budget_mb > before) {
                int64_t ticket = 0;
                bool shrunk = false;
                (void)tdm_device_resize(s->dev, before, false, &ticket, &shrunk, NULL, &ignored);
            }
            continue;
        }
        if (on_gpu(s) && target < before) {
            /* the re-planned step needs less than the reservation held: give the rest back */
            int64_t ticket = 0;
            bool shrunk = false;
            if (tdm_device_resize(s->dev, target, false, &ticket, &shrunk, NULL, &e) == TDM_OK &&
                shrunk)
                note(s->note, s->note_user,
                     "co-training: reservation now %lld MiB (%lld MiB released) with %d "
                     "adapter(s) of pid %d",
                     (long long)target, (long long)(before - target), n_join, (int)pid);
            else
                note(s->note, s->note_user, "warning: the reservation did not shrink: %s",
                     e.message);
            tdm_device_record_actual(s->dev, false, NULL, NULL);
        }
    }
}

/* A join request: checked and its data read now (errors go back at once, FILE:LINE), then it
 * waits for memory in arrival order (admit_waiting). */
static void take_join(tdm_cotrain_serving *s, tdm_trainer *t, tdm_cotrain_request *rq)
{
    tdm_cotrain_join *j = &rq->msg.u.join;
    char diff[512];
    if (tdm_cotrain_run_wide_diff(&s->mine, &j->opts, diff, sizeof diff) > 0) {
        char why[1024];
        snprintf(why, sizeof why,
                 "run-wide options differ from this finetune's (%s): one fused trainer runs "
                 "one schedule; run with the same values, or --no-join",
                 diff);
        reject(s, rq->conn, TDM_ERR_INVALID, why);
        return;
    }
    if (s->n_wait == s->cap_wait) {
        int cap = s->cap_wait ? 2 * s->cap_wait : 4;
        waiting_join *w = realloc(s->w, (size_t)cap * sizeof *w);
        if (!w) {
            reject(s, rq->conn, TDM_ERR_NOMEM, "the host is out of memory");
            return;
        }
        s->w = w;
        s->cap_wait = cap;
    }
    waiting_join *w = &s->w[s->n_wait];
    memset(w, 0, sizeof *w);
    w->conn = rq->conn;
    w->peer = rq->peer;
    w->join = rq->msg; /* the prepared adapters borrow its strings */
    w->told_mb = -1;
    memset(&rq->msg, 0, sizeof rq->msg);
    j = &w->join.u.join;
    tdm_trainer_adapter *ads = calloc((size_t)j->n_adapters, sizeof *ads);
    if (!ads) {
        reject(s, w->conn, TDM_ERR_NOMEM, "the host is out of memory");
        tdm_cotrain_msg_free(&w->join);
        return;
    }
    tdm_cotrain_adapters_to_trainer(j, ads);
    char *report = NULL;
    tdm_error e = {0};
    tdm_status st =
        tdm_trainer_join_prepare(t, ads, j->n_adapters, j->opts.resume, &w->tj, &report, &e);
    free(ads);
    if (st != TDM_OK) {
        note(s->note, s->note_user, "refused %d adapter(s) of pid %d (%s): %s", j->n_adapters,
             (int)rq->peer.pid, j->user ? j->user : "?", report ? "bad lines" : e.message);
        reject(s, w->conn, st, report ? report : e.message);
        free(report);
        tdm_cotrain_msg_free(&w->join);
        return;
    }
    s->n_wait++;
}

static int waiter_by_conn(const tdm_cotrain_serving *s, uint64_t conn)
{
    for (int i = 0; i < s->n_wait; i++)
        if (s->w[i].conn == conn) return i;
    return -1;
}

/* Checkpoints and removes a joiner's unfinished adapters (detach, or its connection ended). */
static void hand_back(tdm_cotrain_serving *s, tdm_trainer *t, joined_group *g, bool tell)
{
    for (int a = g->first; a < g->first + g->n; a++) {
        int64_t step = 0;
        bool done = false;
        tdm_trainer_adapter_position(t, a, &step, &done);
        if (done) continue;
        tdm_error e = {0};
        tdm_status st = tdm_trainer_detach_adapter(t, a, &e);
        tdm_trainer_adapter_position(t, a, &step, NULL);
        if (tell)
            send_done(s, g, a, st == TDM_OK ? TDM_COTRAIN_DETACHED : TDM_COTRAIN_FAILED, step,
                      st == TDM_OK ? NULL : e.message);
        note(s->note, s->note_user, "adapter %d handed back at step %lld%s%s", a, (long long)step,
             st == TDM_OK ? "" : ": ", st == TDM_OK ? "" : e.message);
        s->dirty = true;
    }
}

/* The host's work at a step boundary: requests, the memory of adapters that left, admissions. */
static void serve_once(tdm_cotrain_serving *s, tdm_trainer *t)
{
    tdm_cotrain_host_set_step(s->host, tdm_trainer_global_step(t));
    tdm_cotrain_request rq;
    while (tdm_cotrain_host_take(s->host, &rq)) {
        joined_group *g = group_by_conn(s, rq.conn);
        int wi = waiter_by_conn(s, rq.conn);
        switch (rq.kind) {
        case TDM_COTRAIN_REQ_JOIN:
            if (!g && wi < 0) take_join(s, t, &rq);
            break;
        case TDM_COTRAIN_REQ_DETACH:
            if (g) hand_back(s, t, g, true);
            if (wi >= 0) { /* withdrawn before admission: nothing trained, nothing to save */
                tdm_cotrain_host_close(s->host, rq.conn);
                waiter_free(s, wi);
            }
            break;
        case TDM_COTRAIN_REQ_GONE:
            if (g) {
                g->closed = true;
                hand_back(s, t, g, false);
            }
            if (wi >= 0) waiter_free(s, wi);
            break;
        case TDM_COTRAIN_REQ_REFUSED:
            note(s->note, s->note_user, "co-training: %s", rq.reason);
            break;
        }
        tdm_cotrain_request_free(&rq);
    }
    shrink_after_leave(s, t);
    admit_waiting(s, t);
}

#define IDLE_POLL_MS 100 /* a host with nothing to train and joins waiting for memory */

static tdm_status at_boundary(tdm_trainer *t, void *user, tdm_error *err)
{
    (void)err;
    tdm_cotrain_serving *s = user;
    s->trainer = t;
    if (!s->host) return TDM_OK;
    plan_start(s, t);
    serve_once(s, t);
    grow_to_faster(s, t);
    /* every adapter done while joins wait for memory: the loaded base waits with them (the run
     * would end otherwise), until they are admitted, withdrawn, or this run is stopped */
    while (s->n_wait > 0 && active_adapters(t) == 0 &&
           !(s->stop_requested && s->stop_requested(s->stop_requested_user))) {
        tdm_sleep_ms(IDLE_POLL_MS);
        serve_once(s, t);
        publish(s, t);
    }
    publish(s, t);
    return TDM_OK;
}

void tdm_cotrain_serve_hook(tdm_cotrain_serving *srv, tdm_trainer_opts *opts,
                            const tdm_trainer_adapter *own, int n_own)
{
    srv->n_own = n_own;
    srv->progress = opts->progress;
    srv->progress_user = opts->progress_user;
    srv->inner_pass = opts->on_pass;
    srv->inner_pass_user = opts->on_pass_user;
    srv->schedule = opts->schedule;
    for (int a = 0; a < n_own; a++)
        view_init(srv, a, own[a].data, own[a].output, own[a].label, own[a].weight, own[a].epochs, 0,
                  NULL);
    opts->progress = on_progress;
    opts->progress_user = srv;
    opts->on_pass = on_pass;
    opts->on_pass_user = srv;
    opts->at_step_boundary = at_boundary;
    opts->at_step_boundary_user = srv;
    srv->stop_requested = opts->stop_requested;
    srv->stop_requested_user = opts->stop_requested_user;
}

void tdm_cotrain_serve_end(tdm_cotrain_serving *srv, tdm_status run_status, const tdm_error *err)
{
    if (!srv) return;
    for (int i = 0; i < srv->n_groups; i++) {
        joined_group *g = &srv->g[i];
        for (int a = g->first; a < g->first + g->n && !g->closed; a++) {
            int64_t step = 0;
            bool done = false;
            if (srv->trainer) tdm_trainer_adapter_position(srv->trainer, a, &step, &done);
            if (done) continue; /* finished or handed back: already told */
            if (run_status == TDM_ERR_STOPPED)
                send_done(srv, g, a, TDM_COTRAIN_DETACHED, step,
                          "the host finetune was stopped; its checkpoint is written");
            else
                send_done(srv, g, a, TDM_COTRAIN_FAILED, step,
                          err && err->message[0] ? err->message : "the host finetune ended");
        }
    }
    /* joins still waiting for memory: closed unanswered, so each joiner elects again (and may
     * become the host itself once this run's reservation is gone) */
    while (srv->n_wait > 0) {
        if (srv->host) tdm_cotrain_host_close(srv->host, srv->w[0].conn);
        waiter_free(srv, 0);
    }
    free(srv->w);
    tdm_cotrain_host_stop(srv->host);
    for (int i = 0; i < srv->n_groups; i++)
        tdm_cotrain_msg_free(&srv->g[i].join);
    free(srv->g);
    free(srv->views);
    tdm_cotrain_run_opts_free(&srv->mine);
    free(srv);
}
