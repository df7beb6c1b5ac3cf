/* finetune.c — `tandem finetune`: several LoRA adapters trained at once on one frozen base
 * (docs/finetune.md). Reads and checks every data file before writing anything; on a GPU
 * device reserves memory through the ledger first (or adopts `tandem gpu run`'s reservation).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "run/finetune_run.h"
#include "train/trainer.h"
#include "util/timeutil.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem finetune MODEL_DIR (--adapter DATA.jsonl:OUT_DIR ... | "
                 "--adapters-config FILE.toml)\n");
    tdm_run_options_usage(out, TDM_CMD_FINETUNE);
    fprintf(out,
            "\nTrains one LoRA adapter per --adapter (or [[adapter]] table) on the frozen base "
            "loaded\nonce; each OUT_DIR receives a PEFT adapter, checkpoints, best/ and run "
            "records.\ndocs/finetune.md describes every flag; src/run/run_options.c defines "
            "them.\n");
}

/* --- progress --------------------------------------------------------------------------- */

typedef struct progress_ctx {
    bool tty;
    int n;
    bool drawn;
    char **lines;
    int64_t last_draw_ns;
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
    char eta[32];
    fmt_eta(p->eta_sec, eta, sizeof eta);
    if (c->tty) {
        int width = 24;
        int fill = p->total_steps > 0 ? (int)(width * p->step / p->total_steps) : width;
        char bar[32];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        char val[32] = "";
        if (!isnan(p->val_loss)) snprintf(val, sizeof val, " val %.4f", p->val_loss);
        snprintf(c->lines[p->adapter], 256,
                 "%-16.16s [%s] ep %.2f/%d step %lld/%lld loss %.4f%s %.0f tok/s ETA %s%s",
                 p->label, bar, p->epoch, p->epochs, (long long)p->step, (long long)p->total_steps,
                 p->loss, val, isfinite(p->tokens_per_sec) ? p->tokens_per_sec : 0.0, eta,
                 p->event == TDM_TRAINER_EVENT_DONE ? " done" : "");
        int64_t now = tdm_now_mono_ns();
        if (p->event == TDM_TRAINER_EVENT_STEP && now - c->last_draw_ns < 100000000) return;
        c->last_draw_ns = now;
        if (c->drawn) printf("\033[%dA", c->n);
        for (int i = 0; i < c->n; i++)
            printf("\r\033[K%s\n", c->lines[i]);
        c->drawn = true;
        fflush(stdout);
        return;
    }
    switch (p->event) {
    case TDM_TRAINER_EVENT_STEP:
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

/* --- main ----------------------------------------------------------------------------- */

static void print_note(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: %s\n", line);
}

/* The adapters about to train: one line each, and the progress lines they will use. */
static void on_started(const tdm_run_adapter_info *ads, int n, void *user)
{
    progress_ctx *pc = user;
    pc->n = n;
    pc->lines = calloc((size_t)n, sizeof *pc->lines);
    for (int a = 0; pc->lines && a < n; a++)
        if (!(pc->lines[a] = calloc(256, 1))) pc->tty = false;
    if (!pc->lines) pc->tty = false;
    for (int a = 0; a < n; a++)
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
    if (tdm_run_opts_parse(&ro, TDM_CMD_FINETUNE, argc, argv, &pos, &n_pos, &err) != TDM_OK) {
        free(ro.adapter_args);
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
    } else {
        progress_ctx pc = {.tty = isatty(STDOUT_FILENO)};
        ro.trainer.model_dir = pos[0];
        ro.trainer.progress = on_progress;
        ro.trainer.progress_user = &pc;
        ro.device.task = "finetune";
        ro.device.note = print_note;
        tdm_finetune_hooks hooks = {.started = on_started, .user = &pc, .profile_out = stderr};
        char *bad = NULL;
        if (tdm_run_finetune(&ro, &hooks, &bad, &err) != TDM_OK) {
            if (bad) {
                fputs(bad, stderr);
                code = tdm_cli_fail(TDM_EXIT_FAILURE,
                                    "bad lines in the training data; nothing was written (fix "
                                    "them, or --skip-bad-lines)");
            } else {
                code = tdm_cli_fail_err(&err);
            }
        }
        free(bad);
        for (int a = 0; pc.lines && a < pc.n; a++)
            free(pc.lines[a]);
        free(pc.lines);
    }
    free(pos);
    free(ro.adapter_args);
    return code;
}
