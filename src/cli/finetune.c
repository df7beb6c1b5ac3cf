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
#include "engine/op_profile.h"
#include "gpu/mps.h"
#include "gpu/inventory.h"
#include "gpu/reservation.h"
#include "train/adapters_config.h"
#include "train/trainer.h"
#include "util/timeutil.h"

/* The CUDA context of a process (driver state, the module images of tandem and cuBLASLt) as
 * NVML counts it, which --vram auto adds to the engine's own estimate. Measured with
 * scripts/device/vram-estimate.sh (docs/verification.md): on the H200, driver 580, the process
 * held 666-789 MiB more than the backend allocated (context + allocation granularity). */
#define TDM_CUDA_CONTEXT_MIB 680

static int64_t mib_up(uint64_t bytes)
{
    return (int64_t)((bytes + (1u << 20) - 1) >> 20);
}

/* The reservation --vram auto takes (MiB). */
static int64_t estimate_mb(const tdm_model_mem *e)
{
    return mib_up(e->weights + e->activations + e->adapters + e->backend_scratch) +
           TDM_CUDA_CONTEXT_MIB;
}

/* This process's memory on the GPU it uses, as NVML reports it (MiB), or -1 when no GPU lists
 * it (no NVML, a simulated inventory). The CUDA backend never shrinks during training, so at the
 * end of a run this is the run's peak. */
static int64_t process_gpu_mb(void)
{
    tdm_inventory inv;
    tdm_error e = {0};
    int64_t mb = -1;
    if (tdm_inventory_query(&inv, &e) != TDM_OK) return -1;
    for (size_t g = 0; g < inv.n_gpus && mb < 0; g++)
        mb = tdm_gpu_process_used_mb(&inv.gpus[g], (uint32_t)getpid());
    tdm_inventory_free(&inv);
    return mb;
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem finetune MODEL_DIR (--adapter DATA.jsonl:OUT_DIR ... | --adapters-config "
        "FILE.toml)\n"
        "         [--method qlora|lora] [--task instruct] [--rank N] [--alpha N] [--rslora]\n"
        "         [--targets LIST] [--lr X] [--weight-decay X] [--max-grad-norm X]\n"
        "         [--lr-schedule cosine|linear|constant] [--warmup-steps N] [--epochs N]\n"
        "         [--batch-size N] [--grad-accum N] [--max-seq-len N] [--seed S] [--no-shuffle]\n"
        "         [--val-split F] [--eval-every N] [--save-every N] [--log-every N]\n"
        "         [--schedule synchronized|round-robin|priority-val-loss]\n"
        "         [--chat-template chatml|llama3|none] [--train-on-prompt] [--skip-bad-lines]\n"
        "         [--no-double-quant] [--vram GB|auto] [--no-wait-gpu] [--timeout SEC]\n"
        "         [--device auto|cpu|cuda] [--experimental-mps --gpu-share PCT] [--resume]\n"
        "         [--grad-checkpoint] [--lora-dropout P] [--init-adapter DIR] [--profile-ops]\n\n"
        "Trains one LoRA adapter per --adapter (or [[adapter]] table) on the frozen base loaded\n"
        "once; each OUT_DIR receives a PEFT adapter, checkpoints, best/ and run records.\n"
        "Defaults: qlora, rank 16, alpha 32, targets q_proj,v_proj, lr 2e-4, cosine, 3 epochs,\n"
        "batch 4, max-seq-len 512, val-split 0.05, save-every 500, log-every 10, seed 42.\n"
        "docs/finetune.md describes every flag.\n");
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    return tdm_cli_parse_long(s, out) && *out >= lo && *out <= hi;
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

/* Strings this command allocates for the trainer's adapter list, freed together at the end. */
typedef struct owned_strings {
    char **v;
    size_t n, cap;
} owned_strings;

/* path as written when absolute, else base_dir/path; the copy is kept in o. NULL when out of
 * memory. */
static const char *owned_path(owned_strings *o, const char *base_dir, const char *path)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        char **v = realloc(o->v, cap * sizeof *v);
        if (!v) return NULL;
        o->v = v;
        o->cap = cap;
    }
    char *out;
    if (path[0] == '/' || !base_dir[0] || !strcmp(base_dir, "."))
        out = strdup(path);
    else if (asprintf(&out, "%s/%s", base_dir, path) < 0)
        out = NULL;
    if (out) o->v[o->n++] = out;
    return out;
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

enum {
    O_ADAPTER = 1000,
    O_CONFIG,
    O_METHOD,
    O_TASK,
    O_RANK,
    O_ALPHA,
    O_RSLORA,
    O_TARGETS,
    O_LR,
    O_WD,
    O_MGN,
    O_LRS,
    O_WARMUP,
    O_EPOCHS,
    O_BATCH,
    O_ACCUM,
    O_SEQ,
    O_SEED,
    O_NOSHUF,
    O_VAL,
    O_EVAL,
    O_SAVE,
    O_LOG,
    O_SCHED,
    O_TMPL,
    O_TOP,
    O_SKIP,
    O_NODQ,
    O_VRAM,
    O_NOWAIT,
    O_TIMEOUT,
    O_DEVICE,
    O_MPS,
    O_SHARE,
    O_RESUME,
    O_GCKPT,
    O_DROPOUT,
    O_INIT,
    O_PROFOPS,
    O_HELP
};

int tdm_cmd_finetune(int argc, char **argv)
{
    static const struct option longopts[] = {{"adapter", required_argument, NULL, O_ADAPTER},
                                             {"adapters-config", required_argument, NULL, O_CONFIG},
                                             {"method", required_argument, NULL, O_METHOD},
                                             {"task", required_argument, NULL, O_TASK},
                                             {"rank", required_argument, NULL, O_RANK},
                                             {"alpha", required_argument, NULL, O_ALPHA},
                                             {"rslora", no_argument, NULL, O_RSLORA},
                                             {"targets", required_argument, NULL, O_TARGETS},
                                             {"lr", required_argument, NULL, O_LR},
                                             {"weight-decay", required_argument, NULL, O_WD},
                                             {"max-grad-norm", required_argument, NULL, O_MGN},
                                             {"lr-schedule", required_argument, NULL, O_LRS},
                                             {"warmup-steps", required_argument, NULL, O_WARMUP},
                                             {"epochs", required_argument, NULL, O_EPOCHS},
                                             {"batch-size", required_argument, NULL, O_BATCH},
                                             {"grad-accum", required_argument, NULL, O_ACCUM},
                                             {"max-seq-len", required_argument, NULL, O_SEQ},
                                             {"seed", required_argument, NULL, O_SEED},
                                             {"no-shuffle", no_argument, NULL, O_NOSHUF},
                                             {"val-split", required_argument, NULL, O_VAL},
                                             {"eval-every", required_argument, NULL, O_EVAL},
                                             {"save-every", required_argument, NULL, O_SAVE},
                                             {"log-every", required_argument, NULL, O_LOG},
                                             {"schedule", required_argument, NULL, O_SCHED},
                                             {"chat-template", required_argument, NULL, O_TMPL},
                                             {"train-on-prompt", no_argument, NULL, O_TOP},
                                             {"skip-bad-lines", no_argument, NULL, O_SKIP},
                                             {"no-double-quant", no_argument, NULL, O_NODQ},
                                             {"vram", required_argument, NULL, O_VRAM},
                                             {"no-wait-gpu", no_argument, NULL, O_NOWAIT},
                                             {"timeout", required_argument, NULL, O_TIMEOUT},
                                             {"device", required_argument, NULL, O_DEVICE},
                                             {"experimental-mps", no_argument, NULL, O_MPS},
                                             {"gpu-share", required_argument, NULL, O_SHARE},
                                             {"resume", no_argument, NULL, O_RESUME},
                                             {"grad-checkpoint", no_argument, NULL, O_GCKPT},
                                             {"lora-dropout", required_argument, NULL, O_DROPOUT},
                                             {"init-adapter", required_argument, NULL, O_INIT},
                                             {"profile-ops", no_argument, NULL, O_PROFOPS},
                                             {"help", no_argument, NULL, O_HELP},
                                             {NULL, 0, NULL, 0}};

    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    long rank = 16, epochs = 3, batch = 4, seqlen = 512;
    double alpha = 32, lr = 2e-4, dropout = 0;
    bool rslora = false;
    uint32_t targets = TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ;
    const char *init_adapter = NULL;
    const char *config_file = NULL, *device = "auto", *vram = "auto";
    char **adapter_args = calloc((size_t)argc + 1, sizeof *adapter_args);
    int n_adapter_args = 0;
    bool no_wait = false, have_share = false, profile_ops = false;
    double timeout = 3600;
    tdm_mps_opts mps = {.enabled = false, .gpu_share_pct = 100};
    tdm_error err = {0};
    long v;
    double d;
    int code = TDM_EXIT_OK;
    progress_ctx pc = {0};
    if (!adapter_args) return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
#define USAGE(...)                                                                                 \
    do {                                                                                           \
        free(adapter_args);                                                                        \
        return tdm_cli_fail(TDM_EXIT_USAGE, "finetune: " __VA_ARGS__);                             \
    } while (0)

    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case O_ADAPTER:
            adapter_args[n_adapter_args++] = optarg;
            break;
        case O_CONFIG:
            config_file = optarg;
            break;
        case O_METHOD:
            if (!strcmp(optarg, "qlora"))
                o.nf4 = true;
            else if (!strcmp(optarg, "lora"))
                o.nf4 = false;
            else
                USAGE("--method: '%s' is not qlora or lora", optarg);
            break;
        case O_TASK:
            if (strcmp(optarg, "instruct")) USAGE("--task: only 'instruct' is supported");
            o.task = optarg;
            break;
        case O_RANK:
            if (!parse_int(optarg, 1, TDM_ADAPTER_RANK_MAX, &rank))
                USAGE("--rank needs an integer 1..%d, not '%s'", TDM_ADAPTER_RANK_MAX, optarg);
            break;
        case O_ALPHA:
            if (!tdm_cli_parse_double(optarg, &alpha) || !(alpha > 0))
                USAGE("--alpha needs a positive number, not '%s'", optarg);
            break;
        case O_RSLORA:
            rslora = true;
            break;
        case O_TARGETS:
            if (tdm_adapter_targets_parse(optarg, &targets, &err) != TDM_OK)
                USAGE("--targets: %s", err.message);
            break;
        case O_LR:
            if (!tdm_cli_parse_double(optarg, &lr) || !(lr > 0) || lr > 1)
                USAGE("--lr needs a number in (0, 1], not '%s'", optarg);
            break;
        case O_WD:
            if (!tdm_cli_parse_double(optarg, &o.weight_decay) || !(o.weight_decay >= 0))
                USAGE("--weight-decay needs a number >= 0, not '%s'", optarg);
            break;
        case O_MGN:
            if (!tdm_cli_parse_double(optarg, &o.max_grad_norm) || !(o.max_grad_norm >= 0))
                USAGE("--max-grad-norm needs a number >= 0 (0 = off), not '%s'", optarg);
            break;
        case O_LRS:
            if (tdm_lr_kind_parse(optarg, &o.lr_kind, &err) != TDM_OK)
                USAGE("--lr-schedule: %s", err.message);
            break;
        case O_WARMUP:
            if (!parse_int(optarg, 0, 1L << 40, &v)) USAGE("--warmup-steps needs an integer >= 0");
            o.warmup_steps = v;
            break;
        case O_EPOCHS:
            if (!parse_int(optarg, 1, TDM_ADAPTER_EPOCHS_MAX, &epochs))
                USAGE("--epochs needs an integer 1..%d, not '%s'", TDM_ADAPTER_EPOCHS_MAX, optarg);
            break;
        case O_BATCH:
            if (!parse_int(optarg, 1, TDM_ADAPTER_BATCH_SIZE_MAX, &batch))
                USAGE("--batch-size needs an integer 1..%d, not '%s'", TDM_ADAPTER_BATCH_SIZE_MAX,
                      optarg);
            break;
        case O_ACCUM:
            if (!parse_int(optarg, 1, 64, &v)) USAGE("--grad-accum needs an integer 1..64");
            o.grad_accum = (int)v;
            break;
        case O_SEQ:
            if (!parse_int(optarg, 2, TDM_ADAPTER_MAX_SEQ_LEN_MAX, &seqlen))
                USAGE("--max-seq-len needs an integer 2..%d, not '%s'", TDM_ADAPTER_MAX_SEQ_LEN_MAX,
                      optarg);
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || !*optarg || *end || *optarg == '-')
                USAGE("--seed needs a non-negative integer, not '%s'", optarg);
            o.seed = s;
            break;
        }
        case O_NOSHUF:
            o.shuffle = false;
            break;
        case O_VAL:
            if (!tdm_cli_parse_double(optarg, &o.val_split) || !(o.val_split >= 0) ||
                o.val_split >= 1)
                USAGE("--val-split needs a fraction in [0, 1), not '%s'", optarg);
            break;
        case O_EVAL:
            if (!parse_int(optarg, 0, 1L << 40, &v)) USAGE("--eval-every needs an integer >= 0");
            o.eval_every = v;
            break;
        case O_SAVE:
            if (!parse_int(optarg, 0, 1L << 40, &v)) USAGE("--save-every needs an integer >= 0");
            o.save_every = v;
            break;
        case O_LOG:
            if (!parse_int(optarg, 1, 1L << 40, &v)) USAGE("--log-every needs an integer >= 1");
            o.log_every = v;
            break;
        case O_SCHED:
            if (!tdm_train_schedule_parse(optarg, &o.schedule))
                USAGE("--schedule: '%s' is not synchronized, round-robin or priority-val-loss",
                      optarg);
            break;
        case O_TMPL:
            if (tdm_chat_template_parse(optarg, &o.chat_template, &err) != TDM_OK)
                USAGE("--chat-template: %s", err.message);
            o.chat_template_given = true;
            break;
        case O_TOP:
            o.train_on_prompt = true;
            break;
        case O_SKIP:
            o.skip_bad_lines = true;
            break;
        case O_NODQ:
            o.double_quant = false;
            break;
        case O_VRAM:
            if (strcmp(optarg, "auto") &&
                (!tdm_cli_parse_double(optarg, &d) || !(d > 0) || d > 1e6))
                USAGE("--vram needs a positive number of GiB or 'auto', not '%s'", optarg);
            vram = optarg;
            break;
        case O_NOWAIT:
            no_wait = true;
            break;
        case O_TIMEOUT:
            if (!tdm_cli_parse_double(optarg, &timeout) || !(timeout >= 0))
                USAGE("--timeout needs seconds >= 0, not '%s'", optarg);
            break;
        case O_DEVICE:
            if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                USAGE("--device: '%s' is not auto, cpu or cuda", optarg);
            device = optarg;
            break;
        case O_MPS:
            mps.enabled = true;
            break;
        case O_SHARE:
            if (!parse_int(optarg, 1, 100, &v)) USAGE("--gpu-share needs a percentage 1..100");
            mps.gpu_share_pct = (int)v;
            have_share = true;
            break;
        case O_RESUME:
            o.resume = true;
            break;
        case O_GCKPT:
            o.grad_checkpoint = true;
            break;
        case O_DROPOUT:
            if (!tdm_cli_parse_double(optarg, &dropout) || !(dropout >= 0) || dropout >= 1)
                USAGE("--lora-dropout needs a probability in [0, 1), not '%s'", optarg);
            break;
        case O_INIT:
            init_adapter = optarg;
            break;
        case O_PROFOPS:
            profile_ops = true;
            break;
        case O_HELP:
        case 'h':
            free(adapter_args);
            usage(stdout);
            return TDM_EXIT_OK;
        default:
            free(adapter_args);
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "finetune: unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (optind != argc - 1) USAGE("expected exactly one MODEL_DIR (see tandem finetune --help)");
    o.model_dir = argv[optind];
    if (!n_adapter_args == !config_file)
        USAGE("give --adapter DATA.jsonl:OUT_DIR (one or more) or --adapters-config FILE, not "
              "both");
    if (have_share && !mps.enabled) USAGE("--gpu-share only applies with --experimental-mps");

    /* the adapter list */
    tdm_adapters_config acfg = {0};
    owned_strings owned = {0};
    char config_dir[4096] = "";
    if (config_file) {
        snprintf(config_dir, sizeof config_dir, "%s", config_file);
        char *slash = strrchr(config_dir, '/');
        if (slash)
            *(slash == config_dir ? slash + 1 : slash) = '\0';
        else
            config_dir[0] = '\0';
    }
    int n = 0;
    tdm_trainer_adapter *ads = NULL;
    if (config_file) {
        if (tdm_adapters_config_load(config_file, &acfg, &err) != TDM_OK) {
            free(adapter_args);
            return tdm_cli_fail(TDM_EXIT_USAGE, "%s", err.message);
        }
        n = (int)acfg.n_adapters;
    } else {
        n = n_adapter_args;
    }
    ads = calloc((size_t)n, sizeof *ads);
    if (!ads) {
        tdm_adapters_config_free(&acfg);
        free(adapter_args);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
    }
    for (int a = 0; a < n; a++) {
        tdm_trainer_adapter *t = &ads[a];
        *t = (tdm_trainer_adapter){.rank = (int)rank,
                                   .alpha = alpha,
                                   .use_rslora = rslora,
                                   .targets = targets,
                                   .lora_dropout = dropout,
                                   .lr = lr,
                                   .epochs = (int)epochs,
                                   .batch_size = (int)batch,
                                   .max_seq_len = (int)seqlen,
                                   .weight = 1.0,
                                   .init_adapter = init_adapter};
        if (config_file) {
            const tdm_adapter_spec *s = &acfg.adapters[a];
            /* Relative paths in adapters.toml are relative to the file's own directory (as
             * `tandem submit` resolves them), not to the working directory. */
            t->data = owned_path(&owned, config_dir, s->data);
            t->output = owned_path(&owned, config_dir, s->output);
            t->label = s->label;
            if (s->init_adapter) t->init_adapter = owned_path(&owned, config_dir, s->init_adapter);
            if (!t->data || !t->output || (s->init_adapter && !t->init_adapter)) {
                code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
                goto out;
            }
            if (s->has_rank) t->rank = s->rank;
            if (s->has_alpha) t->alpha = s->alpha;
            if (s->has_targets) t->targets = s->targets;
            if (s->has_learning_rate) t->lr = s->learning_rate;
            if (s->has_epochs) t->epochs = s->epochs;
            if (s->has_batch_size) t->batch_size = s->batch_size;
            if (s->has_max_seq_len) t->max_seq_len = s->max_seq_len;
            if (s->has_weight) t->weight = s->weight;
            if (s->has_lora_dropout) t->lora_dropout = s->lora_dropout;
            if (t->max_seq_len < 2) {
                code = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%u: max_seq_len must be >= 2", acfg.file,
                                    s->key_line[TDM_ADAPTER_KEY_MAX_SEQ_LEN]);
                goto out;
            }
        } else {
            char *arg = adapter_args[a];
            char *colon = strchr(arg, ':');
            if (!colon || colon == arg || !colon[1]) {
                code = tdm_cli_fail(TDM_EXIT_USAGE,
                                    "finetune: --adapter '%s': expected DATA.jsonl:OUT_DIR", arg);
                goto out;
            }
            *colon = 0;
            t->data = arg;
            t->output = colon + 1;
            for (int b = 0; b < a; b++)
                if (!strcmp(ads[b].output, t->output)) {
                    code =
                        tdm_cli_fail(TDM_EXIT_USAGE,
                                     "finetune: two adapters write the same OUT_DIR %s", t->output);
                    goto out;
                }
        }
    }

    /* 1. data and shapes: nothing written yet */
    pc.tty = isatty(STDOUT_FILENO);
    pc.n = n;
    pc.lines = calloc((size_t)n, sizeof *pc.lines);
    for (int a = 0; pc.lines && a < n; a++)
        if (!(pc.lines[a] = calloc(256, 1))) pc.tty = false;
    if (!pc.lines) pc.tty = false;
    o.progress = on_progress;
    o.progress_user = &pc;
    tdm_trainer *tr = NULL;
    char *bad = NULL;
    if (tdm_trainer_create(&tr, &o, ads, n, &bad, &err) != TDM_OK) {
        if (bad) {
            fputs(bad, stderr);
            free(bad);
            code = tdm_cli_fail(TDM_EXIT_FAILURE,
                                "bad lines in the training data; nothing was written (fix them, "
                                "or --skip-bad-lines)");
        } else {
            code = tdm_cli_fail_err(&err);
        }
        goto out;
    }

    /* 2. the device */
    tdm_backend *be = NULL;
    bool gpu = false;
    int64_t gpu_budget_mb = 0; /* what was reserved (or adopted: unknown, 0) */
    tdm_lease lease;
    memset(&lease, 0, sizeof lease);
    if (strcmp(device, "cpu")) {
        const char *adopted = getenv("TANDEM_RESERVATION_ID");
        tdm_run_context rc = tdm_run_context_for(&mps);
        if (rc.max_checkpoint_interval_steps > 0)
            o.max_checkpoint_interval = rc.max_checkpoint_interval_steps;
        /* Reserve before anything touches the GPU: whether a GPU is there is asked of the
         * inventory (NVML, no CUDA context), never by creating the backend, whose context alone
         * takes hundreds of MiB that the ledger would not know about yet. */
        bool can_cuda = false;
        tdm_error perr = {0};
#ifdef TANDEM_HAVE_CUDA
        tdm_inventory inv;
        if (tdm_inventory_query(&inv, &perr) == TDM_OK) {
            can_cuda = inv.n_gpus > 0;
            if (!can_cuda)
                snprintf(perr.message, sizeof perr.message, "no GPU found%s%s",
                         inv.note[0] ? ": " : "", inv.note);
            tdm_inventory_free(&inv);
        }
#else
        snprintf(perr.message, sizeof perr.message, "this tandem was built without CUDA");
#endif
        if (!can_cuda) {
            if (!strcmp(device, "cuda")) {
                code = tdm_cli_fail(TDM_EXIT_FAILURE,
                                    "--device cuda: %s (this tandem has no usable CUDA backend; "
                                    "use --device cpu)",
                                    perr.message);
                goto out_tr;
            }
            fprintf(stderr, "tandem: note: no CUDA backend (%s); training on the CPU\n",
                    perr.message);
        } else {
            gpu = true;
            tdm_model_mem est;
            if (tdm_trainer_memory_estimate(tr, &est, &err) != TDM_OK) {
                code = tdm_cli_fail_err(&err);
                goto out_tr;
            }
            int64_t need_mb = estimate_mb(&est);
            if (strcmp(vram, "auto")) {
                need_mb = (int64_t)ceil(atof(vram) * 1024.0);
            } else {
                fprintf(stderr,
                        "tandem: --vram auto: %lld MiB = weights %lld + activations %lld + "
                        "adapters %lld + backend scratch %lld + CUDA context %d (MiB)\n",
                        (long long)need_mb, (long long)mib_up(est.weights),
                        (long long)mib_up(est.activations), (long long)mib_up(est.adapters),
                        (long long)mib_up(est.backend_scratch), TDM_CUDA_CONTEXT_MIB);
            }
            gpu_budget_mb = need_mb;
            if (adopted && *adopted) {
                fprintf(stderr, "tandem: using the reservation %s of tandem gpu run\n", adopted);
            } else {
                tdm_acquire_opts ao = tdm_acquire_defaults();
                ao.budget_mb = need_mb;
                ao.task = "finetune";
                ao.wait = !no_wait;
                ao.timeout_sec = timeout;
                if (tdm_reservation_acquire(&lease, &ao, &err) != TDM_OK) {
                    code = err.status == TDM_ERR_TIMEOUT
                               ? tdm_cli_fail(TDM_EXIT_TIMEOUT, "%s", err.message)
                               : tdm_cli_fail_err(&err);
                    goto out_tr;
                }
                tdm_reservation_release_at_exit(&lease);
                /* CUDA is not initialised yet in this process: this makes the reserved GPU the
                 * one the backend opens. */
                setenv("CUDA_VISIBLE_DEVICES", lease.gpu_uuid, 1);
                fprintf(stderr, "tandem: reserved %lld MiB on %s\n", (long long)lease.budget_mb,
                        lease.gpu_uuid);
                if (mps.enabled) {
                    char env[512];
                    int len =
                        tdm_mps_child_env(&mps, lease.gpu_uuid, lease.budget_mb, env, sizeof env);
                    for (int i = 0; len > 0 && i < len; i += (int)strlen(env + i) + 1)
                        putenv(strdup(env + i));
                }
            }
        }
    }
    tdm_backend_opts bo = {0};
    if ((tdm_backend_create(&be, gpu ? "cuda" : "cpu", &bo, &err)) != TDM_OK) {
        if (!gpu || strcmp(device, "auto") != 0) {
            code = tdm_cli_fail_err(&err);
            goto out_lease;
        }
        /* --device auto: a GPU is listed but CUDA cannot use it (an old driver, a simulated
         * inventory): give the reservation back and train on the CPU. */
        fprintf(stderr, "tandem: note: %s; training on the CPU\n", err.message);
        if (lease.held) tdm_reservation_release(&lease, &err);
        gpu = false;
        if ((tdm_backend_create(&be, "cpu", &bo, &err)) != TDM_OK) {
            code = tdm_cli_fail_err(&err);
            goto out_lease;
        }
    }
    if (profile_ops && tdm_be_profile_enable(be, true, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out_be;
    }
    if (tdm_trainer_attach(tr, be, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out_be;
    }
    if (gpu && lease.held) {
        tdm_be_mem_info mi;
        if (tdm_be_memory(be, &mi, &err) == TDM_OK) {
            int64_t proc_mb = process_gpu_mb();
            tdm_reservation_update_actual(
                &lease,
                proc_mb > 0 ? proc_mb : (int64_t)(mi.used_bytes >> 20) + TDM_CUDA_CONTEXT_MIB,
                &err);
        }
    }
    for (int a = 0; a < n; a++) {
        int64_t ntr, nv, steps;
        tdm_trainer_adapter_info(tr, a, &ntr, &nv, &steps);
        printf("adapter %d: %s -> %s: %lld train / %lld validation samples, %lld steps\n", a,
               ads[a].data, ads[a].output, (long long)ntr, (long long)nv, (long long)steps);
    }
    fflush(stdout);
    if (tdm_trainer_run(tr, &err) != TDM_OK) code = tdm_cli_fail_err(&err);
    if (gpu) {
        tdm_be_mem_info mi;
        tdm_error merr = {0};
        if (tdm_be_memory(be, &mi, &merr) == TDM_OK) {
            /* The figures that calibrate --vram auto: what was reserved against the peak. */
            int64_t proc_mb = process_gpu_mb();
            fprintf(stderr,
                    "tandem: device memory: reserved %lld MiB, peak %lld MiB (backend), process "
                    "%lld MiB (NVML)\n",
                    (long long)gpu_budget_mb, (long long)(mi.peak_bytes >> 20), (long long)proc_mb);
            if (lease.held)
                tdm_reservation_update_actual(
                    &lease,
                    proc_mb > 0 ? proc_mb : (int64_t)(mi.peak_bytes >> 20) + TDM_CUDA_CONTEXT_MIB,
                    &merr);
        }
    }
    /* The table covers loading too (uploads), then every training and evaluation step. */
    if (profile_ops) tdm_be_profile_report(be, stderr);
out_be:
    tdm_trainer_free(tr);
    tr = NULL;
    tdm_backend_free(be);
out_lease:
    if (lease.held) tdm_reservation_release(&lease, &err);
out_tr:
    tdm_trainer_free(tr);
out:
    free(ads);
    for (size_t i = 0; i < owned.n; i++)
        free(owned.v[i]);
    free(owned.v);
    tdm_adapters_config_free(&acfg);
    free(adapter_args);
    for (int a = 0; pc.lines && a < n; a++)
        free(pc.lines[a]);
    free(pc.lines);
    return code;
#undef USAGE
}
