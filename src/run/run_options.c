/* run_options.c — the option table of `tandem finetune` and `tandem eval` (run_options.h), and
 * what is generated from it: parsing, usage, defaults, the list the docs test reads. */
#include "run/run_options.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/reservation.h"
#include "train/lr_schedule.h"
#include "util/suggest.h"

/* ---- values that need more than a range check --------------------------------------------- */

static tdm_status parse_method(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "qlora") && strcmp(arg, "lora"))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not qlora or lora", arg);
    *(bool *)dst = !strcmp(arg, "qlora");
    return TDM_OK;
}

static tdm_status parse_schedule(const char *arg, void *dst, tdm_error *err)
{
    if (!tdm_train_schedule_parse(arg, (tdm_train_schedule *)dst))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "'%s' is not synchronized, round-robin or priority-val-loss", arg);
    return TDM_OK;
}

static tdm_status parse_device(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda"))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not auto, cpu or cuda", arg);
    *(const char **)dst = arg;
    return TDM_OK;
}

static tdm_status parse_vram(const char *arg, void *dst, tdm_error *err)
{
    return tdm_vram_gib_parse(arg, true, (double *)dst, err);
}

static tdm_status parse_recompute(const char *arg, void *dst, tdm_error *err)
{
    if (!tdm_recompute_parse(arg, (tdm_recompute *)dst))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not layer, mlp or attn", arg);
    return TDM_OK;
}

/* --base-compute bf16|fp8, stored as base_fp8 */
static tdm_status parse_base_compute(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "bf16") && strcmp(arg, "fp8"))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not bf16 or fp8", arg);
    *(bool *)dst = !strcmp(arg, "fp8");
    return TDM_OK;
}

/* --join auto|require, stored as join_require */
static tdm_status parse_join(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "auto") && strcmp(arg, "require"))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not auto or require", arg);
    *(bool *)dst = !strcmp(arg, "require");
    return TDM_OK;
}

/* dst: the whole tdm_device_request (the share, and that one was given). */
static tdm_status parse_gpu_share(const char *arg, void *dst, tdm_error *err)
{
    tdm_device_request *d = dst;
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || !*arg || *end || v < 1 || v > 100)
        return tdm_fail(err, TDM_ERR_INVALID, "needs a percentage 1..100");
    d->mps.gpu_share_pct = (int)v;
    d->gpu_share_given = true;
    return TDM_OK;
}

/* dst: the whole tdm_run_opts; --adapter is repeatable. */
static tdm_status add_adapter_arg(const char *arg, void *dst, tdm_error *err)
{
    tdm_run_opts *o = dst;
    const char **v = realloc(o->adapter_args, (o->n_adapter_args + 1) * sizeof *v);
    if (!v) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    v[o->n_adapter_args++] = arg;
    o->adapter_args = v;
    return TDM_OK;
}

/* ---- the table ------------------------------------------------------------------------------ */

#define F TDM_CMD_FINETUNE
#define E TDM_CMD_EVAL
#define DST(field) offsetof(tdm_run_opts, field), sizeof(((tdm_run_opts *)0)->field)
#define BIG 1099511627776.0 /* 2^40: "no upper bound" for step counts */
#define V(...)                                                                                     \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }
/* A per-adapter setting: kind, range, default and help are its row of train/adapter_options.c. */
#define ADAPTER_ROW(flag, metavar, commands, field, key, submit)                                   \
    {                                                                                              \
        flag, metavar, commands, DST(field), {0}, &tdm_adapter_options[key], submit                \
    }

/* Rows in the order of --help. Columns: flag, metavar, commands, destination, V(kind, min, max,
 * min_open, max_open, bool_value, parse, default, accepts, help), adapter row, submit. A
 * per-adapter setting is ADAPTER_ROW(flag, metavar, commands, destination, its adapters.toml
 * key, submit): the rest of its row is in train/adapter_options.c. */
static const tdm_run_option table[] = {
    /* what to train */
    {"adapter", "DATA.jsonl:OUT_DIR", F, 0, sizeof(tdm_run_opts),
     V(TDM_OPT_LIST, 0, 0, 0, 0, 0, add_adapter_arg, "", "DATA.jsonl:OUT_DIR",
       "one adapter: its data and output (repeatable)"),
     NULL, false},
    {"adapters-config", "FILE.toml", F, DST(adapters_config),
     V(TDM_OPT_PATH, 0, 0, 0, 0, 0, NULL, "", "a file",
       "the adapters as [[adapter]] tables (docs/adapters-toml.md)"),
     NULL, false},
    ADAPTER_ROW(NULL, NULL, F, adapter.data, TDM_ADAPTER_KEY_DATA, false),
    ADAPTER_ROW(NULL, NULL, F, adapter.output, TDM_ADAPTER_KEY_OUTPUT, false),
    ADAPTER_ROW(NULL, NULL, F, adapter.label, TDM_ADAPTER_KEY_LABEL, false),
    /* eval's inputs */
    {"data", "FILE", E, DST(eval_data),
     V(TDM_OPT_PATH, 0, 0, 0, 0, 0, NULL, "", "a file", "the JSONL data to measure (required)"),
     NULL, false},
    {"adapter", "DIR", E, DST(eval_adapter),
     V(TDM_OPT_PATH, 0, 0, 0, 0, 0, NULL, "", "a directory",
       "a PEFT LoRA adapter directory (default: the bare base model)"),
     NULL, false},
    /* the base model */
    {"method", "qlora|lora", F | E, DST(trainer.nf4),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_method, "qlora", "qlora or lora",
       "qlora: NF4 base; lora: the base in its own precision"),
     NULL, true},
    {"no-double-quant", NULL, F | E, DST(trainer.double_quant),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, false, NULL, "", "",
       "qlora: fp32 absmax per block instead of 8-bit double quantization"),
     NULL, true},
    {"base-compute", "bf16|fp8", F, DST(trainer.base_fp8),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_base_compute, "bf16", "bf16 or fp8",
       "qlora on a CUDA GPU of compute capability 8.9+: the frozen projections' GEMMs in FP8"),
     NULL, true},
    ADAPTER_ROW("task", "instruct", F, adapter, TDM_ADAPTER_KEY_TASK, true),
    /* the adapter */
    ADAPTER_ROW("rank", "N", F, adapter.rank, TDM_ADAPTER_KEY_RANK, true),
    ADAPTER_ROW("alpha", "N", F, adapter.alpha, TDM_ADAPTER_KEY_ALPHA, true),
    {"rslora", NULL, F, DST(adapter.use_rslora),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "", "scale alpha / sqrt(r) (rsLoRA)"), NULL, true},
    ADAPTER_ROW("targets", "LIST", F, adapter.targets, TDM_ADAPTER_KEY_TARGETS, true),
    ADAPTER_ROW("init-adapter", "DIR", F, adapter.init_adapter, TDM_ADAPTER_KEY_INIT_ADAPTER,
                false),
    ADAPTER_ROW("lora-dropout", "P", F, adapter.lora_dropout, TDM_ADAPTER_KEY_LORA_DROPOUT, true),
    ADAPTER_ROW(NULL, NULL, F, adapter.weight, TDM_ADAPTER_KEY_WEIGHT, false),
    /* optimisation */
    ADAPTER_ROW("lr", "X", F, adapter.lr, TDM_ADAPTER_KEY_LEARNING_RATE, true),
    ADAPTER_ROW("weight-decay", "X", F, adapter.weight_decay, TDM_ADAPTER_KEY_WEIGHT_DECAY, true),
    ADAPTER_ROW("max-grad-norm", "X", F, adapter.max_grad_norm, TDM_ADAPTER_KEY_MAX_GRAD_NORM,
                true),
    ADAPTER_ROW("lr-schedule", "cosine|linear|constant", F, adapter, TDM_ADAPTER_KEY_LR_SCHEDULE,
                true),
    ADAPTER_ROW("warmup-steps", "N", F, adapter.warmup_steps, TDM_ADAPTER_KEY_WARMUP_STEPS, true),
    ADAPTER_ROW("epochs", "N", F, adapter.epochs, TDM_ADAPTER_KEY_EPOCHS, true),
    ADAPTER_ROW("batch-size", "N", F, adapter.batch_size, TDM_ADAPTER_KEY_BATCH_SIZE, true),
    {"batch-size", "N", E, DST(eval_batch_size),
     V(TDM_OPT_INT, 1, TDM_ADAPTER_BATCH_SIZE_MAX, 0, 0, 0, NULL, "8", "an integer 1..65536",
       "sequences per forward pass"),
     NULL, false},
    ADAPTER_ROW("grad-accum", "N", F, adapter.grad_accum, TDM_ADAPTER_KEY_GRAD_ACCUM, true),
    ADAPTER_ROW("max-seq-len", "N", F | E, adapter.max_seq_len, TDM_ADAPTER_KEY_MAX_SEQ_LEN, true),
    {"grad-checkpoint", NULL, F, DST(trainer.grad_checkpoint),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "keep fewer activations; recompute the rest in backward"),
     NULL, true},
    {"recompute", "layer|mlp|attn", F, DST(trainer.recompute),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_recompute, "layer", "layer, mlp or attn",
       "what --grad-checkpoint recomputes: the layer, norms and gate/up, or norms and q/k/v"),
     NULL, true},
    {"offload-activations", NULL, F, DST(trainer.offload_activations),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "keep each layer's input in page-locked host memory between forward and backward, "
       "copied beside the compute (long context)"),
     NULL, true},
    /* data */
    ADAPTER_ROW("seed", "S", F, adapter.seed, TDM_ADAPTER_KEY_SEED, true),
    ADAPTER_ROW("no-shuffle", NULL, F, adapter.shuffle, TDM_ADAPTER_KEY_NO_SHUFFLE, true),
    ADAPTER_ROW("val-split", "F", F, adapter.val_split, TDM_ADAPTER_KEY_VAL_SPLIT, true),
    ADAPTER_ROW("chat-template", "chatml|llama3|none", F | E, adapter,
                TDM_ADAPTER_KEY_CHAT_TEMPLATE, true),
    ADAPTER_ROW("train-on-prompt", NULL, F, adapter.train_on_prompt,
                TDM_ADAPTER_KEY_TRAIN_ON_PROMPT, true),
    ADAPTER_ROW("skip-bad-lines", NULL, F, adapter.skip_bad_lines, TDM_ADAPTER_KEY_SKIP_BAD_LINES,
                true),
    /* steps */
    ADAPTER_ROW("eval-every", "N", F, adapter.eval_every, TDM_ADAPTER_KEY_EVAL_EVERY, true),
    ADAPTER_ROW("save-every", "N", F, adapter.save_every, TDM_ADAPTER_KEY_SAVE_EVERY, true),
    ADAPTER_ROW("save-total-limit", "N", F, adapter.save_total_limit,
                TDM_ADAPTER_KEY_SAVE_TOTAL_LIMIT, true),
    ADAPTER_ROW("log-every", "N", F, adapter.log_every, TDM_ADAPTER_KEY_LOG_EVERY, true),
    {"schedule", "synchronized|round-robin|priority-val-loss", F, DST(trainer.schedule),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_schedule, "synchronized",
       "synchronized, round-robin or priority-val-loss", "how adapters share the fused passes"),
     NULL, true},
    {"resume", NULL, F, DST(trainer.resume),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "continue from the latest checkpoint every adapter has"),
     NULL, true},
    /* the device */
    {"device", "auto|cpu|cuda", F | E, DST(device.device),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_device, "auto", "auto, cpu or cuda",
       "auto: CUDA when there is a GPU, else the CPU"),
     NULL, false},
    {"threads", "N", F | E, DST(device.threads),
     V(TDM_OPT_INT, 0, 4096, 0, 0, 0, NULL, "0", "an integer 0..4096",
       "CPU backend: OpenMP threads (0: the CPUs this process may use)"),
     NULL, true},
    {"vram", "GB|auto", F | E, DST(device.vram_gib),
     V(TDM_OPT_SIZE, 0, TDM_VRAM_MAX_GIB, true, 0, 0, parse_vram, "auto", "a positive number of GiB or 'auto'",
       "GPU memory to reserve in the ledger"),
     NULL, true},
    {"no-wait-gpu", NULL, F | E, DST(device.no_wait),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "fail at once when the GPU memory is not free"),
     NULL, true},
    {"wait-gpu", NULL, F | E, DST(device.no_wait),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, false, NULL, "", "",
       "wait for GPU memory (the default; undoes an earlier --no-wait-gpu)"),
     NULL, true},
    {"timeout", "SEC", F | E, DST(device.timeout_sec),
     V(TDM_OPT_FLOAT, 0, INFINITY, 0, 0, 0, NULL, "3600", "seconds >= 0",
       "give up waiting for GPU memory after SEC (exit 75)"),
     NULL, true},
    {"experimental-mps", NULL, F, DST(device.mps.enabled),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "run as a CUDA MPS client (as tandem gpu run)"),
     NULL, true},
    {"gpu-share", "PCT", F, DST(device),
     V(TDM_OPT_INT, 0, 0, 0, 0, 0, parse_gpu_share, "100", "a percentage 1..100",
       "with --experimental-mps: the share of the GPU's threads"),
     NULL, true},
    /* co-training (docs/co-training.md) */
    {"join", "auto|require", F, DST(join_require),
     V(TDM_OPT_ENUM, 0, 0, 0, 0, 0, parse_join, "auto", "auto or require",
       "join a running finetune with the same base on the same device (require: or fail)"),
     NULL, false},
    {"no-join", NULL, F, DST(no_join),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "train in a process of its own: never join another finetune, nor host one"),
     NULL, false},
    /* several GPUs (docs/finetune.md, "Several GPUs") */
    {"gpus", "all|N|UUID,UUID", F, DST(gpus),
     V(TDM_OPT_LABEL, 0, 0, 0, 0, 0, NULL, "", "all, a count or a list of GPUs",
       "spread the adapters over these GPUs: one process per GPU"),
     NULL, false},
    {"profile-ops", NULL, F, DST(profile_ops),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "print the time of every backend op at the end"),
     NULL, true},
    /* output */
    {"json", NULL, E, DST(json),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "",
       "print {\"loss\", \"tokens\", \"perplexity\"} as JSON"),
     NULL, false},
    /* hidden: no help line, not in the docs */
    {"list-options", NULL, F | E, DST(list_options),
     V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "", NULL), NULL, false},
    {"adapter-subset", "I,J", F, DST(adapter_subset),
     V(TDM_OPT_LABEL, 0, 0, 0, 0, 0, NULL, "", "a list of adapter indices", NULL), NULL, false},
    {"help", NULL, F | E, DST(help), V(TDM_OPT_BOOL, 0, 0, 0, 0, true, NULL, "", "", NULL), NULL,
     false},
};

#undef F
#undef E
#undef DST
#undef V
#undef ADAPTER_ROW
#undef BIG

enum { N_ROWS = sizeof table / sizeof *table };

const tdm_run_option *tdm_run_option_table(size_t *n)
{
    *n = N_ROWS;
    return table;
}

const tdm_option_value *tdm_run_option_value(const tdm_run_option *r)
{
    return r->adapter ? &r->adapter->value : &r->value;
}

int tdm_run_option_key(const tdm_run_option *r)
{
    return r->adapter ? (int)(r->adapter - tdm_adapter_options) : -1;
}

const tdm_run_option *tdm_run_option_find(const char *flag, unsigned command)
{
    for (size_t i = 0; i < N_ROWS; i++)
        if (table[i].flag && (table[i].commands & command) && !strcmp(table[i].flag, flag))
            return &table[i];
    return NULL;
}

/* ---- setting one value ---------------------------------------------------------------------- */

static bool in_range(const tdm_option_value *r, double v)
{
    if (r->min_open ? !(v > r->min) : !(v >= r->min)) return false;
    if (r->max_open ? !(v < r->max) : !(v <= r->max)) return false;
    return true;
}

static tdm_status store_int(void *dst, size_t size, long long v)
{
    if (size == sizeof(int))
        *(int *)dst = (int)v;
    else if (size == sizeof(int64_t))
        *(int64_t *)dst = v;
    else
        return TDM_ERR_INVALID;
    return TDM_OK;
}

tdm_status tdm_run_option_set(tdm_run_opts *o, const tdm_run_option *r, const char *arg,
                              tdm_error *err)
{
    void *dst = (char *)o + r->offset;
    const char *name = r->flag ? r->flag : r->adapter->key;
    const tdm_option_value *val = tdm_run_option_value(r);
    if (val->parse) {
        tdm_error e = {0};
        tdm_status st = val->parse(arg, dst, &e);
        if (st == TDM_ERR_NOMEM) return tdm_fail(err, st, "out of memory");
        if (st != TDM_OK) {
            /* "needs ..." messages read as one sentence after the flag; others follow a colon */
            bool needs = !strncmp(e.message, "needs ", 6);
            return tdm_fail(err, TDM_ERR_INVALID, "--%s%s%s", name, needs ? " " : ": ", e.message);
        }
        return TDM_OK;
    }
    switch (val->kind) {
    case TDM_OPT_BOOL:
        *(bool *)dst = val->bool_value;
        return TDM_OK;
    case TDM_OPT_PATH:
    case TDM_OPT_LABEL:
        *(const char **)dst = *arg ? arg : NULL;
        return TDM_OK;
    case TDM_OPT_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(arg, &end, 10);
        if (errno || !*arg || *end || !in_range(val, (double)v) || store_int(dst, r->size, v))
            return tdm_fail(err, TDM_ERR_INVALID, "--%s needs %s, not '%s'", name, val->accepts,
                            arg);
        return TDM_OK;
    }
    case TDM_OPT_FLOAT: {
        char *end;
        errno = 0;
        double v = strtod(arg, &end);
        if (errno || !*arg || *end || !isfinite(v) || !in_range(val, v))
            return tdm_fail(err, TDM_ERR_INVALID, "--%s needs %s, not '%s'", name, val->accepts,
                            arg);
        *(double *)dst = v;
        return TDM_OK;
    }
    case TDM_OPT_ENUM:
    case TDM_OPT_LIST:
    case TDM_OPT_SIZE: /* --vram: parse_vram */
        break;
    }
    return tdm_fail(err, TDM_ERR_INVALID, "--%s: no parser", name);
}

void tdm_run_opts_default(tdm_run_opts *o, unsigned command)
{
    memset(o, 0, sizeof *o);
    tdm_trainer_opts_default(&o->trainer); /* the fields no option sets */
    tdm_trainer_adapter_default(&o->adapter);
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        const tdm_option_value *v = tdm_run_option_value(r);
        if (!(r->commands & command) || v->kind == TDM_OPT_PATH || v->kind == TDM_OPT_LABEL)
            continue;
        if (v->kind == TDM_OPT_BOOL) { /* the flag sets bool_value; without it, the other */
            /* two flags of one field (--no-wait-gpu, --wait-gpu): the first row's default */
            bool first = true;
            for (size_t k = 0; k < i && first; k++)
                first = !(tdm_run_option_value(&table[k])->kind == TDM_OPT_BOOL &&
                          table[k].offset == r->offset && (table[k].commands & command));
            if (first) *(bool *)((char *)o + r->offset) = !v->bool_value;
            continue;
        }
        if (!*v->default_text) continue; /* --chat-template: detected (trainer's default) */
        tdm_error e = {0};
        tdm_run_option_set(o, r, v->default_text, &e); /* the table's defaults are valid */
    }
    o->help = o->list_options = false;
    o->device.gpu_share_given = false; /* the default share is not one the user gave */
}

/* ---- the command line ------------------------------------------------------------------------ */

tdm_status tdm_run_opts_parse(tdm_run_opts *o, unsigned command, int argc, char **argv,
                              char ***positional, int *n_positional, tdm_error *err)
{
    struct option longopts[N_ROWS + 1];
    const tdm_run_option *rows[N_ROWS];
    size_t n = 0;
    for (size_t i = 0; i < N_ROWS; i++) {
        if (!table[i].flag || !(table[i].commands & command)) continue;
        rows[n] = &table[i];
        longopts[n] = (struct option){
            table[i].flag, table[i].metavar ? required_argument : no_argument, NULL, 1000 + (int)n};
        n++;
    }
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    if (!pos) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int npos = 0;
    optind = 1;
    opterr = 0;
    int ch;
    /* "-" first in optstring: positional arguments come back as 1, in order */
    while ((ch = getopt_long(argc, argv, "-h", longopts, NULL)) != -1) {
        if (ch == 1) {
            pos[npos++] = optarg;
            continue;
        }
        if (ch == 'h') {
            o->help = true;
            continue;
        }
        if (ch >= 1000 && ch < 1000 + (int)n) {
            tdm_status st = tdm_run_option_set(o, rows[ch - 1000], optarg, err);
            if (st != TDM_OK) {
                free(pos);
                return st;
            }
            continue;
        }
        /* unknown, or a value missing: suggest the closest flag */
        const char *bad = argv[optind - 1];
        char word[64] = "";
        if (!strncmp(bad, "--", 2))
            snprintf(word, sizeof word, "%.*s", (int)strcspn(bad + 2, "="), bad + 2);
        const char *names[N_ROWS];
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (tdm_run_option_value(rows[i])->help) names[k++] = rows[i]->flag;
        const char *hint = *word ? tdm_suggest(word, names, k) : NULL;
        free(pos);
        if (ch == ':' || (optopt >= 1000 && optopt < 1000 + (int)n))
            return tdm_fail(err, TDM_ERR_INVALID, "option '%s' needs a value", bad);
        return tdm_fail(err, TDM_ERR_INVALID, "unknown or incomplete option '%s'%s%s%s", bad,
                        hint ? "; did you mean '--" : "", hint ? hint : "", hint ? "'?" : "");
    }
    while (optind < argc)
        pos[npos++] = argv[optind++];
    *positional = pos;
    *n_positional = npos;
    return TDM_OK;
}

static bool is_named(const char *flag, const char *const *named)
{
    for (; named && *named; named++)
        if (!strcmp(flag, *named)) return true;
    return false;
}

void tdm_run_options_usage(FILE *out, unsigned command, const char *const *named)
{
    int col = 9;
    fputs("        ", out);
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        if (!r->flag || !tdm_run_option_value(r)->help || !(r->commands & command) ||
            is_named(r->flag, named))
            continue;
        char item[128];
        snprintf(item, sizeof item, " [--%s%s%s]", r->flag, r->metavar ? " " : "",
                 r->metavar ? r->metavar : "");
        int len = (int)strlen(item);
        if (col + len > 96) {
            fputs("\n        ", out);
            col = 9;
        }
        fputs(item, out);
        col += len;
    }
    fputs("\n\n", out);
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        const tdm_option_value *v = tdm_run_option_value(r);
        if (!r->flag || !v->help || !(r->commands & command)) continue;
        char def[48] = "";
        if (*v->default_text) snprintf(def, sizeof def, " (default %s)", v->default_text);
        fprintf(out, "  --%-18s %s%s\n", r->flag, v->help, def);
    }
}

void tdm_run_options_list(FILE *out, unsigned command)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        if (!(r->commands & command) || (r->flag && !tdm_run_option_value(r)->help)) continue;
        const char *key = r->adapter ? r->adapter->key : "-";
        fprintf(out, "%s\t%s\t%s\n", r->flag ? r->flag : "-", key,
                r->submit_passes ? "submit" : "-");
    }
}
