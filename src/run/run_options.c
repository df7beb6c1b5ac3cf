/* run_options.c — the option table of `tandem finetune` and `tandem eval` (run_options.h), and
 * what is generated from it: parsing, usage, defaults, the list the docs test reads. */
#include "run/run_options.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"
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

static tdm_status parse_task(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "instruct"))
        return tdm_fail(err, TDM_ERR_INVALID, "only 'instruct' is supported");
    *(const char **)dst = arg;
    return TDM_OK;
}

static tdm_status parse_targets(const char *arg, void *dst, tdm_error *err)
{
    return tdm_adapter_targets_parse(arg, (uint32_t *)dst, err);
}

static tdm_status parse_lr_schedule(const char *arg, void *dst, tdm_error *err)
{
    return tdm_lr_kind_parse(arg, (tdm_lr_kind *)dst, err);
}

static tdm_status parse_schedule(const char *arg, void *dst, tdm_error *err)
{
    if (!tdm_train_schedule_parse(arg, (tdm_train_schedule *)dst))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "'%s' is not synchronized, round-robin or priority-val-loss", arg);
    return TDM_OK;
}

/* dst: the whole tdm_trainer_adapter (the template and whether one was given). */
static tdm_status parse_chat_template(const char *arg, void *dst, tdm_error *err)
{
    tdm_trainer_adapter *t = dst;
    if (!*arg) { /* the default: detected from the tokenizer */
        t->chat_template_given = false;
        return TDM_OK;
    }
    tdm_status st = tdm_chat_template_parse(arg, &t->chat_template, err);
    if (st == TDM_OK) t->chat_template_given = true;
    return st;
}

static tdm_status parse_device(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda"))
        return tdm_fail(err, TDM_ERR_INVALID, "'%s' is not auto, cpu or cuda", arg);
    *(const char **)dst = arg;
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

static tdm_status parse_seed(const char *arg, void *dst, tdm_error *err)
{
    char *end;
    errno = 0;
    unsigned long long s = strtoull(arg, &end, 10);
    if (errno || !*arg || *end || *arg == '-')
        return tdm_fail(err, TDM_ERR_INVALID, "needs a non-negative integer, not '%s'", arg);
    *(uint64_t *)dst = s;
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
#define NOKEY -1
#define BIG 1099511627776.0 /* 2^40: "no upper bound" for step counts */

/* Rows in the order of --help. Columns: flag, metavar, kind, commands, destination, min, max,
 * min_open, max_open, bool_value, parse, default, accepts, help, adapters.toml key, submit. */
static const tdm_run_option table[] = {
    /* what to train */
    {"adapter", "DATA.jsonl:OUT_DIR", TDM_OPT_LIST, F, 0, sizeof(tdm_run_opts), 0, 0, 0, 0, 0,
     add_adapter_arg, "", "DATA.jsonl:OUT_DIR", "one adapter: its data and output (repeatable)",
     NOKEY, false},
    {"adapters-config", "FILE.toml", TDM_OPT_PATH, F, DST(adapters_config), 0, 0, 0, 0, 0, NULL, "",
     "a file", "the adapters as [[adapter]] tables (docs/adapters-toml.md)", NOKEY, false},
    {NULL, NULL, TDM_OPT_PATH, F, DST(adapter.data), 0, 0, 0, 0, 0, NULL, "", "a path",
     "training data (JSONL)", TDM_ADAPTER_KEY_DATA, false},
    {NULL, NULL, TDM_OPT_PATH, F, DST(adapter.output), 0, 0, 0, 0, 0, NULL, "", "a path",
     "output directory", TDM_ADAPTER_KEY_OUTPUT, false},
    {NULL, NULL, TDM_OPT_PATH, F, DST(adapter.label), 0, 0, 0, 0, 0, NULL, "", "a label",
     "name in logs and status", TDM_ADAPTER_KEY_LABEL, false},
    /* eval's inputs */
    {"data", "FILE", TDM_OPT_PATH, E, DST(eval_data), 0, 0, 0, 0, 0, NULL, "", "a file",
     "the JSONL data to measure (required)", NOKEY, false},
    {"adapter", "DIR", TDM_OPT_PATH, E, DST(eval_adapter), 0, 0, 0, 0, 0, NULL, "", "a directory",
     "a PEFT LoRA adapter directory (default: the bare base model)", NOKEY, false},
    /* the base model */
    {"method", "qlora|lora", TDM_OPT_ENUM, F | E, DST(trainer.nf4), 0, 0, 0, 0, 0, parse_method,
     "qlora", "qlora or lora", "qlora: NF4 base; lora: the base in its own precision", NOKEY, true},
    {"no-double-quant", NULL, TDM_OPT_BOOL, F | E, DST(trainer.double_quant), 0, 0, 0, 0, false,
     NULL, "", "", "qlora: fp32 absmax per block instead of 8-bit double quantization", NOKEY,
     true},
    {"task", "instruct", TDM_OPT_ENUM, F, DST(adapter.task), 0, 0, 0, 0, 0, parse_task, "instruct",
     "instruct", "the only task today", NOKEY, true},
    /* the adapter */
    {"rank", "N", TDM_OPT_INT, F, DST(adapter.rank), 1, TDM_ADAPTER_RANK_MAX, 0, 0, 0, NULL, "16",
     "an integer 1..4096", "LoRA rank r", TDM_ADAPTER_KEY_RANK, true},
    {"alpha", "N", TDM_OPT_FLOAT, F, DST(adapter.alpha), 0, INFINITY, true, 0, 0, NULL, "32",
     "a positive number", "LoRA scale numerator (scale = alpha / r)", TDM_ADAPTER_KEY_ALPHA, true},
    {"rslora", NULL, TDM_OPT_BOOL, F, DST(adapter.use_rslora), 0, 0, 0, 0, true, NULL, "", "",
     "scale alpha / sqrt(r) (rsLoRA)", NOKEY, true},
    {"targets", "LIST", TDM_OPT_LIST, F, DST(adapter.targets), 0, 0, 0, 0, 0, parse_targets,
     "q_proj,v_proj", "a list", "projections to adapt: q,k,v,o,gate,up,down _proj",
     TDM_ADAPTER_KEY_TARGETS, true},
    {"init-adapter", "DIR", TDM_OPT_PATH, F, DST(adapter.init_adapter), 0, 0, 0, 0, 0, NULL, "",
     "a directory", "start from a PEFT adapter (its rank, alpha, targets apply)",
     TDM_ADAPTER_KEY_INIT_ADAPTER, false},
    {"lora-dropout", "P", TDM_OPT_FLOAT, F, DST(adapter.lora_dropout), 0, 1, 0, true, 0, NULL, "0",
     "a probability in [0, 1)", "LoRA dropout on each targeted module's input (training only)",
     TDM_ADAPTER_KEY_LORA_DROPOUT, true},
    {NULL, NULL, TDM_OPT_FLOAT, F, DST(adapter.weight), 0, INFINITY, true, 0, 0, NULL, "1",
     "a positive number", "share of each fused pass (synchronized schedule)",
     TDM_ADAPTER_KEY_WEIGHT, false},
    /* optimisation */
    {"lr", "X", TDM_OPT_FLOAT, F, DST(adapter.lr), 0, 1, true, 0, 0, NULL, "2e-4",
     "a number in (0, 1]", "peak learning rate (AdamW)", TDM_ADAPTER_KEY_LEARNING_RATE, true},
    {"weight-decay", "X", TDM_OPT_FLOAT, F, DST(adapter.weight_decay), 0, INFINITY, 0, 0, 0, NULL,
     "0", "a number >= 0", "decoupled weight decay", NOKEY, true},
    {"max-grad-norm", "X", TDM_OPT_FLOAT, F, DST(adapter.max_grad_norm), 0, INFINITY, 0, 0, 0, NULL,
     "1", "a number >= 0 (0 = off)", "per-adapter gradient clipping; 0 = off", NOKEY, true},
    {"lr-schedule", "cosine|linear|constant", TDM_OPT_ENUM, F, DST(adapter.lr_kind), 0, 0, 0, 0, 0,
     parse_lr_schedule, "cosine", "cosine, linear or constant", "learning-rate schedule", NOKEY,
     true},
    {"warmup-steps", "N", TDM_OPT_INT, F, DST(adapter.warmup_steps), 0, BIG, 0, 0, 0, NULL, "0",
     "an integer >= 0", "linear warmup over the adapter's first N steps", NOKEY, true},
    {"epochs", "N", TDM_OPT_INT, F, DST(adapter.epochs), 1, TDM_ADAPTER_EPOCHS_MAX, 0, 0, 0, NULL,
     "3", "an integer 1..100000", "passes over the adapter's training split",
     TDM_ADAPTER_KEY_EPOCHS, true},
    {"batch-size", "N", TDM_OPT_INT, F, DST(adapter.batch_size), 1, TDM_ADAPTER_BATCH_SIZE_MAX, 0,
     0, 0, NULL, "4", "an integer 1..65536", "sequences per adapter per micro-batch",
     TDM_ADAPTER_KEY_BATCH_SIZE, true},
    {"batch-size", "N", TDM_OPT_INT, E, DST(eval_batch_size), 1, TDM_ADAPTER_BATCH_SIZE_MAX, 0, 0,
     0, NULL, "8", "an integer 1..65536", "sequences per forward pass", NOKEY, false},
    {"grad-accum", "N", TDM_OPT_INT, F, DST(adapter.grad_accum), 1, 64, 0, 0, 0, NULL, "1",
     "an integer 1..64", "micro-batches per optimizer step", NOKEY, true},
    {"max-seq-len", "N", TDM_OPT_INT, F | E, DST(adapter.max_seq_len), 2,
     TDM_ADAPTER_MAX_SEQ_LEN_MAX, 0, 0, 0, NULL, "512", "an integer 2..1048576",
     "longer samples keep their first N tokens", TDM_ADAPTER_KEY_MAX_SEQ_LEN, true},
    {"grad-checkpoint", NULL, TDM_OPT_BOOL, F, DST(trainer.grad_checkpoint), 0, 0, 0, 0, true, NULL,
     "", "", "keep only each layer's input; recompute in backward", NOKEY, true},
    /* data */
    {"seed", "S", TDM_OPT_INT, F, DST(adapter.seed), 0, 0, 0, 0, 0, parse_seed, "42",
     "a non-negative integer", "LoRA init, shuffling and the train/validation split", NOKEY, true},
    {"no-shuffle", NULL, TDM_OPT_BOOL, F, DST(adapter.shuffle), 0, 0, 0, 0, false, NULL, "", "",
     "file order every epoch", NOKEY, true},
    {"val-split", "F", TDM_OPT_FLOAT, F, DST(adapter.val_split), 0, 1, 0, true, 0, NULL, "0.05",
     "a fraction in [0, 1)", "fraction held out for validation", NOKEY, true},
    {"chat-template", "chatml|llama3|none", TDM_OPT_ENUM, F | E, DST(adapter), 0, 0, 0, 0, 0,
     parse_chat_template, "", "chatml, llama3 or none", "chat template (default: detected)", NOKEY,
     true},
    {"train-on-prompt", NULL, TDM_OPT_BOOL, F, DST(adapter.train_on_prompt), 0, 0, 0, 0, true, NULL,
     "", "", "count the prompt's tokens in the loss too", NOKEY, true},
    {"skip-bad-lines", NULL, TDM_OPT_BOOL, F, DST(adapter.skip_bad_lines), 0, 0, 0, 0, true, NULL,
     "", "", "train on the good lines of a file with bad ones", NOKEY, true},
    /* steps */
    {"eval-every", "N", TDM_OPT_INT, F, DST(adapter.eval_every), 0, BIG, 0, 0, 0, NULL, "0",
     "an integer >= 0", "validate every N global steps (0: at the end)", NOKEY, true},
    {"save-every", "N", TDM_OPT_INT, F, DST(adapter.save_every), 0, BIG, 0, 0, 0, NULL, "500",
     "an integer >= 0", "checkpoint every N global steps (0: at the end)", NOKEY, true},
    {"save-total-limit", "N", TDM_OPT_INT, F, DST(trainer.save_total_limit), 0, 1000000, 0, 0, 0,
     NULL, "0", "an integer >= 0", "keep each adapter's last N checkpoints, plus best/ (0: all)",
     NOKEY, true},
    {"log-every", "N", TDM_OPT_INT, F, DST(adapter.log_every), 1, BIG, 0, 0, 0, NULL, "10",
     "an integer >= 1", "one log line per adapter per N global steps", NOKEY, true},
    {"schedule", "synchronized|round-robin|priority-val-loss", TDM_OPT_ENUM, F,
     DST(trainer.schedule), 0, 0, 0, 0, 0, parse_schedule, "synchronized",
     "synchronized, round-robin or priority-val-loss", "how adapters share the fused passes", NOKEY,
     true},
    {"resume", NULL, TDM_OPT_BOOL, F, DST(trainer.resume), 0, 0, 0, 0, true, NULL, "", "",
     "continue from the latest checkpoint every adapter has", NOKEY, true},
    /* the device */
    {"device", "auto|cpu|cuda", TDM_OPT_ENUM, F | E, DST(device.device), 0, 0, 0, 0, 0,
     parse_device, "auto", "auto, cpu or cuda", "auto: CUDA when there is a GPU, else the CPU",
     NOKEY, false},
    {"vram", "GB|auto", TDM_OPT_SIZE, F | E, DST(device.vram_gib), 0, 1e6, true, 0, 0, NULL, "auto",
     "a positive number of GiB or 'auto'", "GPU memory to reserve in the ledger", NOKEY, true},
    {"no-wait-gpu", NULL, TDM_OPT_BOOL, F | E, DST(device.no_wait), 0, 0, 0, 0, true, NULL, "", "",
     "fail at once when the GPU memory is not free", NOKEY, true},
    {"wait-gpu", NULL, TDM_OPT_BOOL, F | E, DST(device.no_wait), 0, 0, 0, 0, false, NULL, "", "",
     "wait for GPU memory (the default; undoes an earlier --no-wait-gpu)", NOKEY, true},
    {"timeout", "SEC", TDM_OPT_FLOAT, F | E, DST(device.timeout_sec), 0, INFINITY, 0, 0, 0, NULL,
     "3600", "seconds >= 0", "give up waiting for GPU memory after SEC (exit 75)", NOKEY, true},
    {"experimental-mps", NULL, TDM_OPT_BOOL, F, DST(device.mps.enabled), 0, 0, 0, 0, true, NULL, "",
     "", "run as a CUDA MPS client (as tandem gpu run)", NOKEY, true},
    {"gpu-share", "PCT", TDM_OPT_INT, F, DST(device), 0, 0, 0, 0, 0, parse_gpu_share, "100",
     "a percentage 1..100", "with --experimental-mps: the share of the GPU's threads", NOKEY, true},
    /* co-training (docs/co-training.md) */
    {"join", "auto|require", TDM_OPT_ENUM, F, DST(join_require), 0, 0, 0, 0, 0, parse_join, "auto",
     "auto or require",
     "join a running finetune with the same base on the same device (require: or fail)", NOKEY,
     false},
    {"no-join", NULL, TDM_OPT_BOOL, F, DST(no_join), 0, 0, 0, 0, true, NULL, "", "",
     "train in a process of its own: never join another finetune, nor host one", NOKEY, false},
    {"profile-ops", NULL, TDM_OPT_BOOL, F, DST(profile_ops), 0, 0, 0, 0, true, NULL, "", "",
     "print the time of every backend op at the end", NOKEY, true},
    /* output */
    {"json", NULL, TDM_OPT_BOOL, E, DST(json), 0, 0, 0, 0, true, NULL, "", "",
     "print {\"loss\", \"tokens\", \"perplexity\"} as JSON", NOKEY, false},
    /* hidden: no help line, not in the docs */
    {"list-options", NULL, TDM_OPT_BOOL, F | E, DST(list_options), 0, 0, 0, 0, true, NULL, "", "",
     NULL, NOKEY, false},
    {"help", NULL, TDM_OPT_BOOL, F | E, DST(help), 0, 0, 0, 0, true, NULL, "", "", NULL, NOKEY,
     false},
};

#undef F
#undef E
#undef DST
#undef NOKEY
#undef BIG

enum { N_ROWS = sizeof table / sizeof *table };

const tdm_run_option *tdm_run_option_table(size_t *n)
{
    *n = N_ROWS;
    return table;
}

const tdm_run_option *tdm_run_option_find(const char *flag, unsigned command)
{
    for (size_t i = 0; i < N_ROWS; i++)
        if (table[i].flag && (table[i].commands & command) && !strcmp(table[i].flag, flag))
            return &table[i];
    return NULL;
}

/* ---- setting one value ---------------------------------------------------------------------- */

static bool in_range(const tdm_run_option *r, double v)
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
    const char *name = r->flag ? r->flag : tdm_adapter_key_name((tdm_adapter_key)r->toml_key);
    if (r->parse) {
        tdm_error e = {0};
        tdm_status st = r->parse(arg, dst, &e);
        if (st == TDM_ERR_NOMEM) return tdm_fail(err, st, "out of memory");
        if (st != TDM_OK) {
            /* "needs ..." messages read as one sentence after the flag; others follow a colon */
            bool needs = !strncmp(e.message, "needs ", 6);
            return tdm_fail(err, TDM_ERR_INVALID, "--%s%s%s", name, needs ? " " : ": ", e.message);
        }
        return TDM_OK;
    }
    switch (r->kind) {
    case TDM_OPT_BOOL:
        *(bool *)dst = r->bool_value;
        return TDM_OK;
    case TDM_OPT_PATH:
        *(const char **)dst = *arg ? arg : NULL;
        return TDM_OK;
    case TDM_OPT_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(arg, &end, 10);
        if (errno || !*arg || *end || !in_range(r, (double)v) || store_int(dst, r->size, v))
            return tdm_fail(err, TDM_ERR_INVALID, "--%s needs %s, not '%s'", name, r->accepts, arg);
        return TDM_OK;
    }
    case TDM_OPT_SIZE:
        if (!strcmp(arg, "auto")) {
            *(double *)dst = 0;
            return TDM_OK;
        }
        __attribute__((fallthrough)); /* GiB as a number */
    case TDM_OPT_FLOAT: {
        char *end;
        errno = 0;
        double v = strtod(arg, &end);
        if (errno || !*arg || *end || !isfinite(v) || !in_range(r, v))
            return tdm_fail(err, TDM_ERR_INVALID, "--%s needs %s, not '%s'", name, r->accepts, arg);
        *(double *)dst = v;
        return TDM_OK;
    }
    case TDM_OPT_ENUM:
    case TDM_OPT_LIST:
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
        if (!(r->commands & command) || r->kind == TDM_OPT_PATH) continue;
        if (r->kind == TDM_OPT_BOOL) { /* the flag sets bool_value; without it, the other */
            /* two flags of one field (--no-wait-gpu, --wait-gpu): the first row's default */
            bool first = true;
            for (size_t k = 0; k < i && first; k++)
                first = !(table[k].kind == TDM_OPT_BOOL && table[k].offset == r->offset &&
                          (table[k].commands & command));
            if (first) *(bool *)((char *)o + r->offset) = !r->bool_value;
            continue;
        }
        if (!*r->default_text && r->parse != parse_chat_template) continue;
        tdm_error e = {0};
        tdm_run_option_set(o, r, r->default_text, &e); /* the table's defaults are valid */
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
            if (rows[i]->help) names[k++] = rows[i]->flag;
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

void tdm_run_options_usage(FILE *out, unsigned command)
{
    int col = 9;
    fputs("        ", out);
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        if (!r->flag || !r->help || !(r->commands & command)) continue;
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
        if (!r->flag || !r->help || !(r->commands & command)) continue;
        char def[48] = "";
        if (*r->default_text) snprintf(def, sizeof def, " (default %s)", r->default_text);
        fprintf(out, "  --%-18s %s%s\n", r->flag, r->help, def);
    }
}

void tdm_run_options_list(FILE *out, unsigned command)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        const tdm_run_option *r = &table[i];
        if (!(r->commands & command) || (r->flag && !r->help)) continue;
        const char *key =
            r->toml_key >= 0 ? tdm_adapter_key_name((tdm_adapter_key)r->toml_key) : "-";
        fprintf(out, "%s\t%s\t%s\n", r->flag ? r->flag : "-", key,
                r->submit_passes ? "submit" : "-");
    }
}
