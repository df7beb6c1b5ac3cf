/* finetune.c — `tandem finetune`: several LoRA adapters trained at once on one frozen base
 * (docs/finetune.md). Reads and checks every data file before writing anything; on a GPU
 * device reserves memory through the ledger first (or adopts `tandem gpu run`'s reservation).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cluster/shell_quote.h"
#include "run/finetune_run.h"
#include "train/trainer.h"
#include "util/timeutil.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem finetune MODEL_DIR (--adapter DATA.jsonl:OUT_DIR ... | "
                 "--adapters-config FILE.toml)\n");
    tdm_run_options_usage(out, TDM_CMD_FINETUNE,
                          (const char *const[]){"adapter", "adapters-config", NULL});
    fprintf(out,
            "\nTrains one LoRA adapter per --adapter (or [[adapter]] table) on the frozen base "
            "loaded\nonce; each OUT_DIR receives a PEFT adapter, checkpoints, best/ and run "
            "records.\ndocs/finetune.md describes every flag; src/run/run_options.c defines "
            "them.\n");
}

/* --- graceful stop ---------------------------------------------------------------------
 * SIGINT (Ctrl-C), SIGTERM (a scheduler's notice before SIGKILL) and SIGUSR1 (Slurm's
 * --signal=USR1@N: the time limit is near) only set stop_signal; the trainer asks stop_requested
 * between two global steps, checkpoints every unfinished adapter and returns TDM_ERR_STOPPED.
 * A second SIGINT or SIGTERM stops at once (default action), unless it comes within
 * TDM_STOP_REPEAT_MS of the first: a terminal sends Ctrl-C to the whole process group, so under
 * `tandem gpu run` (which forwards it too) one key press arrives twice. */
#define TDM_STOP_REPEAT_MS 500
static volatile sig_atomic_t stop_signal; /* the signal deciding the exit code, 0 = none */
static volatile sig_atomic_t hard_armed;  /* an INT/TERM arrived: the next one is final */
static volatile int64_t hard_armed_at_ms; /* CLOCK_MONOTONIC ms of that INT/TERM (written
                                             before hard_armed, read only after it) */

static int64_t mono_ms(void)
{
    struct timespec ts; /* clock_gettime is async-signal-safe */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_stop_signal(int sig)
{
    int saved = errno;
    if (sig == SIGUSR1) {
        if (!stop_signal) stop_signal = sig;
    } else if (!hard_armed) {
        hard_armed_at_ms = mono_ms();
        hard_armed = 1;
        stop_signal = sig; /* INT/TERM outrank an earlier USR1 for the exit code */
    } else if (mono_ms() - hard_armed_at_ms >= TDM_STOP_REPEAT_MS) {
        signal(sig, SIG_DFL); /* blocked while we run: delivered, fatally, on return */
        raise(sig);
    }
    errno = saved;
}

static bool stop_requested(void *user)
{
    (void)user;
    return stop_signal != 0;
}

/* What a SIGUSR1 before the first step prints: made before the handler is installed (a
 * handler may only write(2) a ready buffer). */
static char *early_usr1_text;
static size_t early_usr1_len;

/* SIGUSR1 before training starts (queued for GPU memory, loading the base, waiting to join):
 * nothing to save, so the process ends at once, as INT/TERM do then, but with status 0: Slurm's
 * --signal=USR1@N asks for a checkpoint before the time limit, and the batch script requeues a
 * job whose finetune answered that with 0 (a death by the signal, 138, would end the job for
 * good instead). The queue ticket is cleaned up as a dead PID's. */
static void on_early_usr1(int sig)
{
    (void)sig;
    if (early_usr1_text) {
        ssize_t w = write(STDERR_FILENO, early_usr1_text, early_usr1_len);
        (void)w;
    }
    _exit(TDM_EXIT_OK);
}

/* The signal plan of one run, by phase (docs/finetune.md, "Stopping"):
 *   TDM_STOP_EARLY     before training: INT/TERM end the process (default action), USR1 ends it
 *                      with status 0 (on_early_usr1);
 *   TDM_STOP_GRACEFUL  from the end of the wait for GPU memory and the load to the end of
 *                      training: all three only set stop_signal (on_stop_signal);
 *   TDM_STOP_DONE      after training: INT/TERM default again; USR1 ignored, the work it asks
 *                      to save is saved already. */
typedef enum { TDM_STOP_EARLY, TDM_STOP_GRACEFUL, TDM_STOP_DONE } stop_phase;

static void stop_handlers(stop_phase phase)
{
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = phase == TDM_STOP_GRACEFUL ? on_stop_signal : SIG_DFL;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = phase == TDM_STOP_GRACEFUL ? on_stop_signal
                    : phase == TDM_STOP_EARLY  ? on_early_usr1
                                               : SIG_IGN;
    sigaction(SIGUSR1, &sa, NULL);
}

/* early_usr1_text for this command line (a --gpus child: its parent tells the command). */
static void early_usr1_prepare(const char *cmdline, bool child)
{
    const char *head = "\ntandem: SIGUSR1: stopped before the first step of this run (nothing "
                       "new to save)\n";
    char *t = NULL;
    int n = child ? asprintf(&t, "%s", head)
                  : asprintf(&t, "%standem: to continue, run:\n  %s%s\n", head, cmdline,
                             tdm_cli_resume_suffix(cmdline));
    if (n < 0) return; /* out of memory: the stop stays silent, its status is still 0 */
    early_usr1_text = t;
    early_usr1_len = (size_t)n;
}

/* The command line as typed, shell-quoted where needed, for the "resume with" hint (getopt
 * permutes argv and --adapter parsing cuts its argument, so this is taken first). */
/* The command that started this run, for the "to continue, run:" hints: the program as started
 * (tdm_cli_program), "finetune", then argv[1..argc), each a shell word (tdm_shell_word). */
static char *command_line(int argc, char **argv)
{
    char *out = tdm_shell_word(tdm_cli_program);
    if (!out) return NULL;
    size_t n = strlen(out);
    for (int i = 0; i < argc; i++) {
        char *w = i == 0 ? strdup("finetune") : tdm_shell_word(argv[i]);
        char *grown = w ? realloc(out, n + 1 + strlen(w) + 1) : NULL;
        if (!grown) {
            free(w);
            free(out);
            return NULL;
        }
        out = grown;
        out[n++] = ' ';
        memcpy(out + n, w, strlen(w) + 1);
        n += strlen(w);
        free(w);
    }
    return out;
}

/* --- progress --------------------------------------------------------------------------- */

typedef struct progress_ctx {
    bool tty;
    int n;
    int n_drawn; /* lines drawn last time (a host's joined adapters add lines) */
    int n_lines; /* lines[]: one per adapter shown, the host's joined ones included */
    char **lines;
    int64_t last_draw_ns;
    /* for the stop report: each adapter's OUT_DIR, steps taken and total, finished; --resume:
     * adapters loaded from a checkpoint, finished ones */
    char **outputs; /* copies: an adapters.toml run's strings are freed before the report */
    int64_t *step, *total;
    bool *done;
    int resumed, resumed_done;
} progress_ctx;

static void fmt_eta(double s, char *buf, size_t cap)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, cap, "--");
    else if (s < 60)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, cap, "%.0fm%02.0fs", floor(s / 60), fmod(s, 60));
    else
        snprintf(buf, cap, "%.0fh%02.0fm", floor(s / 3600), fmod(s / 60, 60));
}

static void on_progress(const tdm_trainer_progress *p, void *user)
{
    progress_ctx *c = user;
    if (c->step && p->adapter < c->n) {
        c->step[p->adapter] = p->step;
        c->total[p->adapter] = p->total_steps;
        c->done[p->adapter] = p->done || p->event == TDM_TRAINER_EVENT_DONE;
    }
    if (p->event == TDM_TRAINER_EVENT_RESUMED) { /* before any progress is drawn */
        c->resumed++;
        if (p->done) {
            c->resumed_done++;
            printf("[%s] already finished (%lld steps): %s\n", p->label, (long long)p->step,
                   p->checkpoint);
        } else {
            printf("[%s] resuming from %s (step %lld/%lld, epoch %.2f/%d)\n", p->label,
                   p->checkpoint, (long long)p->step, (long long)p->total_steps, p->epoch,
                   p->epochs);
        }
        fflush(stdout);
        return;
    }
    char eta[32];
    fmt_eta(p->eta_sec, eta, sizeof eta);
    if (c->tty && p->adapter >= c->n_lines && p->adapter < 4096) {
        /* a joined adapter in a co-training host (docs/co-training.md): one more line */
        char **l = realloc(c->lines, (size_t)(p->adapter + 1) * sizeof *l);
        if (l) {
            c->lines = l;
            for (; c->n_lines <= p->adapter; c->n_lines++)
                if (!(c->lines[c->n_lines] = calloc(256, 1))) break;
        }
    }
    if (c->tty && p->adapter >= 0 && p->adapter < c->n_lines) {
        int width = 24;
        int fill = p->total_steps > 0 ? (int)(width * p->step / p->total_steps) : width;
        char bar[32];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        char val[32] = "";
        if (!isnan(p->val_loss)) snprintf(val, sizeof val, " val %.4f", p->val_loss);
        snprintf(c->lines[p->adapter], 256,
                 "%-16.40s [%s] ep %.2f/%d step %lld/%lld loss %.4f%s %.0f tok/s ETA %s%s",
                 p->label, bar, p->epoch, p->epochs, (long long)p->step, (long long)p->total_steps,
                 p->loss, val, isfinite(p->tokens_per_sec) ? p->tokens_per_sec : 0.0, eta,
                 p->event == TDM_TRAINER_EVENT_DONE ? " done" : "");
        int64_t now = tdm_now_mono_ns();
        if (p->event == TDM_TRAINER_EVENT_STEP && now - c->last_draw_ns < 100000000) return;
        c->last_draw_ns = now;
        if (c->n_drawn) printf("\033[%dA", c->n_drawn);
        for (int i = 0; i < c->n_lines; i++)
            printf("\r\033[K%s\n", c->lines[i]);
        c->n_drawn = c->n_lines;
        fflush(stdout);
        return;
    }
    switch (p->event) {
    case TDM_TRAINER_EVENT_STEP:
    case TDM_TRAINER_EVENT_RESUMED:
        return;
    case TDM_TRAINER_EVENT_LOG:
        printf("[%s] epoch %.2f/%d step %lld/%lld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s "
               "ETA %s\n",
               p->label, p->epoch, p->epochs, (long long)p->step, (long long)p->total_steps,
               p->loss, p->learning_rate, p->grad_norm,
               isfinite(p->tokens_per_sec) ? p->tokens_per_sec : 0.0, eta);
        break;
    case TDM_TRAINER_EVENT_EVAL:
        printf("[%s] step %lld val_loss %.4f\n", p->label, (long long)p->step, p->val_loss);
        break;
    case TDM_TRAINER_EVENT_DONE:
        printf("[%s] done: %lld steps, %.2f epochs\n", p->label, (long long)p->step, p->epoch);
        break;
    }
    fflush(stdout);
}

/* Tells what a graceful stop saved and how to go on; returns the exit code: 130 (SIGINT) and
 * 143 (SIGTERM), as a shell reports a process those signals ended, so scripts and schedulers
 * see an interrupted run; 0 for SIGUSR1, the checkpoint Slurm's --signal=USR1@N asks for before
 * the time limit (the job step ends normally, and its script can requeue). No signal here: a
 * joined run whose host stopped and handed its adapters back (docs/co-training.md, "Host stops
 * otherwise"): unfinished work, so 130, as its own Ctrl-C would give. */
static int report_stop(const progress_ctx *pc, const char *cmdline, bool child,
                       const tdm_error *err)
{
    int sig = stop_signal;
    if (sig == 0)
        fprintf(stderr, "\ntandem: the finetune this one joined stopped: %s\n", err->message);
    else
        fprintf(stderr, "\ntandem: %s: %s\n",
                sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1", err->message);
    for (int a = 0; pc->step && a < pc->n; a++) {
        if (pc->done[a])
            fprintf(stderr, "  %s: finished\n", pc->outputs[a] ? pc->outputs[a] : "?");
        else
            fprintf(stderr, "  %s: step %lld of %lld saved\n",
                    pc->outputs[a] ? pc->outputs[a] : "?", (long long)pc->step[a],
                    (long long)pc->total[a]);
    }
    if (!child) /* a --gpus child: its parent tells the command of the whole run */
        fprintf(stderr, "tandem: to continue exactly where it stopped, run:\n  %s%s\n", cmdline,
                tdm_cli_resume_suffix(cmdline));
    return sig == SIGINT || sig == 0 ? 130 : sig == SIGTERM ? 143 : TDM_EXIT_OK;
}

/* --- main ----------------------------------------------------------------------------- */

static void print_note(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: %s\n", line);
}

static void progress_ctx_free(progress_ctx *pc)
{
    for (int a = 0; pc->lines && a < (pc->n_lines > pc->n ? pc->n_lines : pc->n); a++)
        free(pc->lines[a]);
    free(pc->lines);
    for (int a = 0; pc->outputs && a < pc->n; a++)
        free(pc->outputs[a]);
    free(pc->outputs);
    free(pc->step);
    free(pc->total);
    free(pc->done);
    pc->lines = NULL;
    pc->outputs = NULL;
    pc->step = pc->total = NULL;
    pc->done = NULL;
    pc->n_lines = 0;
}

/* The adapters about to train: one line each, and the progress lines they will use. Called
 * again when a joiner's host died and the adapters start over elsewhere (docs/co-training.md,
 * host failure). */
static void on_started(const tdm_run_adapter_info *ads, int n, void *user)
{
    progress_ctx *pc = user;
    progress_ctx_free(pc);
    pc->n_drawn = 0;
    pc->n = n;
    pc->outputs = calloc((size_t)n, sizeof *pc->outputs);
    pc->step = calloc((size_t)n, sizeof *pc->step);
    pc->total = calloc((size_t)n, sizeof *pc->total);
    pc->done = calloc((size_t)n, sizeof *pc->done);
    if (!pc->outputs || !pc->step || !pc->total || !pc->done) { /* no per-adapter stop report */
        free(pc->step);
        pc->step = NULL;
    }
    for (int a = 0; pc->step && a < n; a++) {
        pc->outputs[a] = strdup(ads[a].output ? ads[a].output : "?");
        pc->total[a] = ads[a].total_steps;
    }
    /* the device is open and the model loaded: from here a stop signal is honoured with a
     * checkpoint (before, while waiting for GPU memory or loading, it ends the process); armed
     * before the "adapter N:" lines, so a signal sent after them is always graceful */
    stop_handlers(TDM_STOP_GRACEFUL);
    pc->lines = calloc((size_t)n, sizeof *pc->lines);
    for (int a = 0; pc->lines && a < n; a++)
        if (!(pc->lines[a] = calloc(256, 1))) pc->tty = false;
    if (!pc->lines) pc->tty = false;
    pc->n_lines = pc->tty ? n : 0;
    for (int a = 0; a < n; a++)
        if (ads[a].total_steps < 0) /* joined: the host read the data (docs/co-training.md) */
            printf("adapter %d: %s -> %s: training in the joined finetune\n", a, ads[a].data,
                   ads[a].output);
        else
            printf("adapter %d: %s -> %s: %lld train / %lld validation samples, %lld steps\n", a,
                   ads[a].data, ads[a].output, (long long)ads[a].n_train, (long long)ads[a].n_val,
                   (long long)ads[a].total_steps);
    fflush(stdout);
}

int tdm_cmd_finetune(int argc, char **argv)
{
    tdm_run_opts ro;
    tdm_run_opts_default(&ro, TDM_CMD_FINETUNE);
    tdm_error err = {0};
    char **pos = NULL;
    int n_pos = 0;
    char *cmdline = command_line(argc, argv); /* before parsing cuts --adapter arguments */
    /* --gpus: the arguments as given, for the children (getopt permutes argv) */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!cmdline || !args) {
        free(cmdline);
        free(args);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
    }
    for (int i = 0; i < argc; i++)
        if (!(args[i] = strdup(argv[i]))) {
            for (int k = 0; k < i; k++)
                free(args[k]);
            free(args);
            free(cmdline);
            return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        }
    if (tdm_run_opts_parse(&ro, TDM_CMD_FINETUNE, argc, argv, &pos, &n_pos, &err) != TDM_OK) {
        free(ro.adapter_args);
        free(cmdline);
        for (int i = 0; i < argc; i++)
            free(args[i]);
        free(args);
        if (strstr(err.message, "unknown or incomplete option")) usage(stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "finetune: %s", err.message);
    }
    int code = TDM_EXIT_OK;
    if (ro.help || ro.list_options) {
        if (ro.list_options)
            tdm_run_options_list(stdout, TDM_CMD_FINETUNE);
        else
            usage(stdout);
    } else if (n_pos != 1) {
        code =
            tdm_cli_fail(TDM_EXIT_USAGE,
                         "finetune: expected exactly one MODEL_DIR (see tandem finetune --help)");
    } else if (ro.gpus && !ro.adapter_subset) {
        ro.trainer.model_dir = pos[0];
        code = tdm_cmd_finetune_gpus(&ro, argc, args, cmdline);
    } else {
        if (ro.adapter_subset) {
            /* a --gpus child: when its parent dies (killed, its terminal gone), SIGTERM stops
             * it gracefully, with a checkpoint, rather than leave it training unsupervised */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            signal(SIGPIPE, SIG_IGN); /* its output pipe gone with the parent: not fatal */
            const char *parent = getenv("TANDEM_GPUS_PARENT");
            if (parent && atol(parent) != (long)getppid()) raise(SIGTERM); /* died already */
        }
        progress_ctx pc = {.tty = isatty(STDOUT_FILENO)};
        ro.trainer.model_dir = pos[0];
        ro.trainer.progress = on_progress;
        ro.trainer.progress_user = &pc;
        ro.trainer.stop_requested = stop_requested;
        ro.device.task = "finetune";
        ro.device.note = print_note;
        tdm_finetune_hooks hooks = {.started = on_started, .user = &pc, .profile_out = stderr};
        char *bad = NULL;
        stop_signal = 0;
        hard_armed = 0;
        early_usr1_prepare(cmdline, ro.adapter_subset != NULL);
        stop_handlers(TDM_STOP_EARLY);
        tdm_status st = tdm_run_finetune(&ro, &hooks, &bad, &err);
        stop_handlers(TDM_STOP_DONE);
        free(early_usr1_text);
        early_usr1_text = NULL;
        if (st == TDM_ERR_STOPPED) {
            code = report_stop(&pc, cmdline, ro.adapter_subset != NULL, &err);
        } else if (st == TDM_OK && ro.trainer.resume && pc.resumed > 0 && pc.resumed_done == pc.n) {
            printf("nothing to do: every adapter had already finished; the final adapters are in "
                   "their OUT_DIRs\n");
        } else if (st == TDM_OK && pc.step) {
            /* the way to the curves (docs/report.md) */
            printf("report: tandem report");
            for (int a = 0; a < pc.n; a++) {
                char *w = tdm_shell_word(pc.outputs[a]);
                printf(" %s", w ? w : pc.outputs[a]);
                free(w);
            }
            printf("\n");
        } else if (st != TDM_OK) {
            if (bad) {
                fputs(bad, stderr);
                code = tdm_cli_fail(
                    TDM_EXIT_FAILURE,
                    "bad lines in the training data; nothing was written (fix them, or pass "
                    "--skip-bad-lines; in adapters.toml: skip_bad_lines = true)");
            } else if (st == TDM_ERR_BUSY) {
                /* --no-wait-gpu: the memory is not free now (alone, or for a join): try later */
                code = tdm_cli_fail(TDM_EXIT_TIMEOUT, "%s", err.message);
            } else {
                code = tdm_cli_fail_err(&err);
            }
        }
        free(bad);
        progress_ctx_free(&pc);
    }
    free(cmdline);
    for (int i = 0; i < argc; i++)
        free(args[i]);
    free(args);
    free(pos);
    free(ro.adapter_args);
    return code;
}
