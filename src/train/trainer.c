/* trainer.c — the multi-adapter loop (see trainer.h and docs/finetune.md). */
#include "train/trainer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_model.h"
#include "data/dataset.h"
#include "data/render.h"
#include "engine/model.h"
#include "model/base_identity.h"
#include "model/lora_targets.h"
#include "tokenizer/tokenizer.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"
#include "train/peft_io.h"
#include "train/run_records.h"
#include "train/tfevents.h"
#include "train/train_cursor.h"
#include "util/atomic_dir.h"
#include "util/fault.h"
#include "util/mkdir_p.h"
#include "util/rng.h"
#include "util/timeutil.h"

static const char *const schedule_names[] = {"synchronized", "round-robin", "priority-val-loss"};

const char *tdm_train_schedule_name(tdm_train_schedule s)
{
    return (unsigned)s < 3 ? schedule_names[s] : "?";
}

bool tdm_train_schedule_parse(const char *name, tdm_train_schedule *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, schedule_names[i])) {
            *out = (tdm_train_schedule)i;
            return true;
        }
    return false;
}

void tdm_trainer_opts_default(tdm_trainer_opts *o)
{
    memset(o, 0, sizeof *o);
    o->nf4 = true;
    o->double_quant = true;
    o->schedule = TDM_SCHEDULE_SYNCHRONIZED;
}

void tdm_trainer_adapter_default(tdm_trainer_adapter *a)
{
    a->task = "instruct";
    a->chat_template_given = false;
    a->chat_template = TDM_CHAT_NONE;
    a->train_on_prompt = false;
    a->skip_bad_lines = false;
    a->seed = 42;
    a->shuffle = true;
    a->val_split = 0.05;
    a->grad_accum = 1;
    a->weight_decay = 0;
    a->max_grad_norm = 1.0;
    a->lr_kind = TDM_LR_COSINE;
    a->warmup_steps = 0;
    a->eval_every = 0;
    a->save_every = 500;
    a->log_every = 10;
    a->save_total_limit = 0;
}

/* ------------------------------------------------------------------ state ---- */

typedef struct adapter_state {
    tdm_trainer_adapter cfg; /* strings borrowed from the caller */
    char task[128];
    tdm_dataset ds;
    tdm_lora_params host; /* layout + host copy of the parameters (init / checkpoints) */
    tdm_adamw_state opt;  /* host copy of the moments (checkpoints) */
    tdm_peft_meta meta;
    tdm_lora *dev;
    tdm_train_cursor *cur;
    tdm_lr_schedule sched;
    tdm_rng rng;
    tdm_trainer_state ts;
    int64_t micro_per_epoch, steps_per_epoch, total_steps;
    /* position (all of it in checkpoints) */
    int64_t step;
    bool done;
    double credit; /* synchronized, weight below the largest: sequences owed to it (< 1 between
                      passes); each pass adds weight / max weight * batch_size */
    bool log_due;  /* a --log-every point passed since its last log line */
    /* the optimizer batch in progress: drawn at once (idx, step_counted), processed in pieces
     * over one or more global steps, stepped when all batch_seqs are done; in progress exactly
     * while batch_cursor is set (in_batch()) */
    int batch_seqs, seqs_done;
    char *batch_cursor;  /* the data cursor before the batch was drawn (JSON), or NULL */
    float *d_grad_saved; /* (n_params) f32 device or NULL: the partial gradient at the start of
                            the global step, for the out-of-memory rollback */
    double last_val, last_train_loss, last_grad_norm, last_lr;
    int64_t eval_step; /* the adapter's step at its latest validation, -1 before the first: a
                          periodic evaluation skips an adapter whose weights did not change */
    int64_t tokens_seen, samples_seen;
    double epoch_loss_sum;
    int64_t epoch_tokens;
    double last_epoch_loss;
    double log_loss_sum;
    int64_t log_tokens;
    int64_t metrics_lines; /* lines in metrics.jsonl */
    /* this process's TensorBoard event file (train/tfevents.h), created at the adapter's first
     * log or evaluation; its SessionLog START is at tb_start, the first step it can log */
    tdm_tfevents tb;
    int64_t tb_start;
    /* wall clock (not state) */
    double train_ms, epoch_start_ms, last_epoch_ms;
    int64_t run_tokens;
    int64_t run_steps;
    /* scratch for one optimizer step */
    uint32_t *idx; /* (grad_accum * batch_size) sample indices of this batch */
    int64_t step_counted;
    int64_t step_tokens; /* every token of the batch's sequences (tokens/s counts these) */
    double step_loss_sum;
    /* joining a running trainer (tdm_trainer_add_adapters): the adapter's own global steps,
     * which decide its log/eval/save points and what its checkpoints record, count from the
     * trainer's global step global0, and its clock from t0_ms, so it runs as it would alone */
    int64_t global0;
    /* its own global step when it started in this trainer: 0, or the resume point of an adapter
     * added with resume (a stop or detach before it steps again has nothing new to save) */
    int64_t own_start;
    double t0_ms;
    int run_index; /* its index in its own command (metrics.jsonl, metadata.json) */
    bool detached; /* checkpointed and handed back (tdm_trainer_detach_adapter); also done */
    bool started_over; /* resume found no checkpoint of it: it started fresh (start_over) */
} adapter_state;

struct tdm_trainer {
    tdm_trainer_opts o;
    tdm_backend *be;
    tdm_model *model;
    const tdm_model_config *mcfg;
    tdm_model_config *mcfg_host; /* config.json, read by create */
    int n;
    adapter_state *ad;
    int64_t global_step;
    int rr_next;
    float *d_sumsq, *d_coef, *d_norm; /* (n) f32 device */
    double t0_ms;         /* monotonic ms when this process's run began (elapsed_ms is since) */
    bool warned_schedule; /* --resume under another --schedule: warned once */
    /* the memory plan (tdm_trainer_set_memory_plan): every adapter's pass takes at most
     * ceil(batch_size / split) sequences of its batch, in up to grad_accum x split passes per
     * global step; the optimizer batches are those of split 1 */
    int split;
    bool gc_asked;          /* --grad-checkpoint as the user gave it (the plans' "as asked") */
    tdm_recompute rc_asked; /* --recompute as the user gave it */
    char base_id[TDM_BASE_IDENTITY_LEN]; /* the base model's identity, for metadata.json */
};

/* Sequences adapter s puts in one pass at most: its micro-batch under the memory plan. */
static int micro_batch(const tdm_trainer *t, const adapter_state *s)
{
    int k = t->split > 1 ? t->split : 1;
    return (s->cfg.batch_size + k - 1) / k;
}

/* An optimizer batch is in progress (drawn, not yet stepped). */
static bool in_batch(const adapter_state *s)
{
    return s->batch_cursor != NULL;
}

static double now_ms(void)
{
    return (double)tdm_now_mono_ns() / 1e6;
}

/* The adapter's own global step: the trainer's, counted from when it joined. */
static int64_t own_global(const tdm_trainer *t, const adapter_state *s)
{
    return t->global_step - s->global0;
}

static void stem_of(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
}

void tdm_trainer_free(tdm_trainer *t)
{
    if (!t) return;
    for (int a = 0; a < t->n; a++) {
        adapter_state *s = &t->ad[a];
        tdm_dataset_free(&s->ds);
        tdm_lora_params_free(&s->host);
        tdm_adamw_state_free(&s->opt);
        tdm_lora_free(s->dev);
        tdm_train_cursor_free(s->cur);
        tdm_trainer_state_free(&s->ts);
        free(s->idx);
        free(s->batch_cursor);
        if (t->be) tdm_be_free(t->be, s->d_grad_saved);
    }
    free(t->ad);
    if (t->be) {
        tdm_be_free(t->be, t->d_sumsq);
        tdm_be_free(t->be, t->d_coef);
        tdm_be_free(t->be, t->d_norm);
    }
    tdm_model_free(t->model);
    free(t->mcfg_host);
    free(t);
}

void tdm_trainer_adapter_position(const tdm_trainer *t, int a, int64_t *step, bool *done)
{
    if (step) *step = t->ad[a].step;
    if (done) *done = t->ad[a].done;
}

int64_t tdm_trainer_global_step(const tdm_trainer *t)
{
    return t->global_step;
}

void tdm_trainer_adapter_info(const tdm_trainer *t, int a, int64_t *n_train, int64_t *n_val,
                              int64_t *total_steps)
{
    const adapter_state *s = &t->ad[a];
    if (n_train) *n_train = s->ds.n_train;
    if (n_val) *n_val = s->ds.n_val;
    if (total_steps) *total_steps = s->total_steps;
}

/* Every adapter's settings and training options (the run-wide ones need no check). */
static tdm_status check_adapters(const tdm_trainer_adapter *ads, int n, tdm_error *err)
{
    if (n < 1) return tdm_fail(err, TDM_ERR_INVALID, "no adapter to train");
    for (int a = 0; a < n; a++) {
        const tdm_trainer_adapter *c = &ads[a];
        if (!c->data || !c->output)
            return tdm_fail(err, TDM_ERR_INVALID, "adapter %d: data and output are required", a);
        if (c->grad_accum < 1 || c->grad_accum > 64)
            return tdm_fail(err, TDM_ERR_INVALID, "--grad-accum %d: must be 1..64", c->grad_accum);
        if (!(c->val_split >= 0 && c->val_split < 1))
            return tdm_fail(err, TDM_ERR_INVALID, "--val-split %g: must be in [0, 1)",
                            c->val_split);
        if (c->log_every < 1) return tdm_fail(err, TDM_ERR_INVALID, "--log-every must be >= 1");
        if (c->eval_every < 0 || c->save_every < 0 || c->warmup_steps < 0)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "negative --eval-every/--save-every/--warmup-steps");
        if (!(c->max_grad_norm >= 0) || !isfinite(c->max_grad_norm))
            return tdm_fail(err, TDM_ERR_INVALID, "--max-grad-norm must be >= 0");
        tdm_adamw_config ac = tdm_adamw_defaults();
        ac.weight_decay = c->weight_decay;
        TDM_TRY(tdm_adamw_config_check(&ac, err));
        if (c->batch_size < 1 || c->epochs < 1 || c->max_seq_len < 2 || !(c->weight > 0) ||
            !(c->lr > 0))
            return tdm_fail(err, TDM_ERR_INVALID,
                            "adapter %d (%s): batch size, epochs, max_seq_len (>= 2), weight and "
                            "learning rate must be positive",
                            a, c->data);
        if (!(c->lora_dropout >= 0 && c->lora_dropout < 1))
            return tdm_fail(err, TDM_ERR_INVALID, "adapter %d (%s): LoRA dropout %g not in [0, 1)",
                            a, c->data, c->lora_dropout);
        for (int b = 0; b < a; b++)
            if (!strcmp(ads[b].output, c->output))
                return tdm_fail(err, TDM_ERR_INVALID, "adapters %d and %d both write %s", b, a,
                                c->output);
    }
    return TDM_OK;
}

tdm_status tdm_trainer_create(tdm_trainer **out, const tdm_trainer_opts *opts,
                              const tdm_trainer_adapter *adapters, int n_adapters, char **report,
                              tdm_error *err)
{
    *out = NULL;
    if (report) *report = NULL;
    TDM_TRY(check_adapters(adapters, n_adapters, err));
    tdm_trainer *t = calloc(1, sizeof *t);
    if (!t) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    t->o = *opts;
    t->n = n_adapters;
    t->split = 1;
    t->gc_asked = opts->grad_checkpoint;
    t->rc_asked = opts->recompute;
    t->ad = calloc((size_t)n_adapters, sizeof *t->ad);
    if (!t->ad) {
        free(t);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (int a = 0; a < n_adapters; a++) {
        t->ad[a].cfg = adapters[a];
        t->ad[a].run_index = a;
    }
    t->mcfg_host = calloc(1, sizeof *t->mcfg_host);
    if (!t->mcfg_host) {
        free(t->ad);
        free(t);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }

    tdm_status st = TDM_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", opts->model_dir);
    if ((st = tdm_model_config_load(t->mcfg_host, path, err)) != TDM_OK) goto fail;
    const tdm_model_config cfg = *t->mcfg_host;
    if ((st = tdm_base_model_identity(opts->model_dir, t->base_id, err)) != TDM_OK) goto fail;

    /* 1. every data file, completely, before anything else, each rendered and split with its
     * adapter's options */
    tdm_dataset_opts dopt;
    tdm_dataset_opts_default(&dopt);
    /* ids below config.json's vocab_size; no tokenizer needed for pre-tokenized data; the
     * template the tokenizer implies, for the adapters that give none */
    tdm_data_model dm;
    if ((st = tdm_data_model_open(&dm, opts->model_dir, cfg.vocab_size, false, &dopt, err)) !=
        TDM_OK)
        goto fail;
    const tdm_chat_template detected = dopt.chat_template;
    char *bad = NULL;
    size_t bad_len = 0;
    tdm_status first_bad = TDM_OK;
    tdm_error first_err = {0};
    for (int a = 0; a < n_adapters; a++) {
        adapter_state *s = &t->ad[a];
        dopt.max_seq_len = s->cfg.max_seq_len;
        dopt.chat_template = s->cfg.chat_template_given ? s->cfg.chat_template : detected;
        dopt.train_on_prompt = s->cfg.train_on_prompt;
        dopt.val_split = s->cfg.val_split;
        dopt.seed = s->cfg.seed;
        dopt.skip_bad_lines = s->cfg.skip_bad_lines;
        if (s->cfg.max_seq_len > cfg.max_position_embeddings)
            tdm_warn("adapter %d (%s): max_seq_len %d is above %s/config.json's "
                     "max_position_embeddings %lld: positions beyond it were never trained and "
                     "may train poorly (lower --max-seq-len, or check the config)",
                     a, s->cfg.data, s->cfg.max_seq_len, opts->model_dir,
                     (long long)cfg.max_position_embeddings);
        tdm_data_report rep;
        tdm_error e = {0};
        tdm_status ds =
            tdm_dataset_load(&s->ds, s->cfg.data, tdm_data_model_tokenizer(&dm), &dopt, &rep, &e);
        if (ds == TDM_ERR_PARSE) {
            char *txt = tdm_data_report_bad_text(&rep, s->cfg.data);
            if (txt) {
                size_t l = strlen(txt);
                char *nb = realloc(bad, bad_len + l + 1);
                if (nb) {
                    memcpy(nb + bad_len, txt, l + 1);
                    bad = nb;
                    bad_len += l;
                }
                free(txt);
            }
            memset(&s->ds, 0, sizeof s->ds);
        } else if (ds == TDM_OK && s->ds.n_train == 0) {
            /* a runtime failure of this data (exit 1), not a usage error */
            ds = tdm_data_no_train_sample(&s->ds.report, s->cfg.data, &dopt, &e);
        }
        if (ds != TDM_OK && ds != TDM_ERR_PARSE && s->cfg.data_origin)
            tdm_error_prefix(&e, "%s", s->cfg.data_origin);
        if (ds != TDM_OK && first_bad == TDM_OK) {
            first_bad = ds;
            first_err = e;
        }
    }
    tdm_data_model_close(&dm);
    if (first_bad != TDM_OK) {
        if (report)
            *report = bad;
        else
            free(bad);
        *err = first_err;
        st = first_bad;
        goto fail;
    }
    free(bad);

    /* 2. adapter shapes (--init-adapter decides them), layouts, schedules */
    for (int a = 0; a < n_adapters; a++) {
        adapter_state *s = &t->ad[a];
        if (s->cfg.label)
            snprintf(s->task, sizeof s->task, "%s", s->cfg.label);
        else
            stem_of(s->cfg.data, s->task, sizeof s->task);
        snprintf(s->meta.base_model_name_or_path, sizeof s->meta.base_model_name_or_path, "%s",
                 opts->model_dir);
        if (s->cfg.init_adapter) {
            tdm_peft_meta im;
            if ((st = tdm_peft_load(s->cfg.init_adapter, &cfg, &s->host, &im, err)) != TDM_OK) {
                tdm_error_prefix(err, "--init-adapter %s", s->cfg.init_adapter);
                goto fail;
            }
            s->cfg.rank = s->host.rank;
            s->cfg.alpha = s->host.alpha;
            s->cfg.targets = s->host.targets;
            s->cfg.use_rslora = s->host.use_rslora;
            s->cfg.lora_dropout = im.lora_dropout;
        } else if ((st = tdm_lora_params_init(&s->host, &cfg, s->cfg.rank, s->cfg.alpha,
                                              s->cfg.use_rslora, s->cfg.targets, err)) != TDM_OK) {
            tdm_error_prefix(err, "adapter %s", s->task);
            goto fail;
        }
        s->meta.lora_dropout = s->cfg.lora_dropout; /* adapter_config.json records it */
        if ((st = tdm_adamw_state_init(&s->opt, s->host.n_params, err)) != TDM_OK) goto fail;
        int64_t n = s->ds.n_train, bs = s->cfg.batch_size;
        s->micro_per_epoch = (n + bs - 1) / bs;
        int64_t ga = s->cfg.grad_accum;
        s->steps_per_epoch = (s->micro_per_epoch + ga - 1) / ga;
        s->total_steps = s->steps_per_epoch * s->cfg.epochs;
        s->sched.kind = s->cfg.lr_kind;
        s->sched.peak_lr = s->cfg.lr;
        s->sched.warmup_steps = s->cfg.warmup_steps;
        s->sched.total_steps = s->total_steps;
        if ((st = tdm_lr_schedule_check(&s->sched, err)) != TDM_OK) goto fail;
        s->idx = malloc((size_t)ga * (size_t)bs * sizeof *s->idx);
        if (!s->idx) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = tdm_train_cursor_create(&s->cur, s->ds.n_train, s->cfg.seed, s->cfg.shuffle,
                                          err)) != TDM_OK)
            goto fail;
        if ((st = tdm_trainer_state_init(&s->ts, err)) != TDM_OK) goto fail;
    }

    *out = t;
    return TDM_OK;
fail:
    tdm_trainer_free(t);
    return st;
}

/* Under synchronized an adapter weighted below the largest spreads each optimizer batch over
 * several global steps (its gradient is partial between them); the others never do. */
static bool spreads_batches(const tdm_trainer *t, int a)
{
    if (t->o.schedule != TDM_SCHEDULE_SYNCHRONIZED) return false;
    for (int b = 0; b < t->n; b++)
        if (t->ad[b].cfg.weight > t->ad[a].cfg.weight) return true;
    return false;
}

static tdm_status memory_plan(const tdm_trainer *t, tdm_model_mem_plan *out, tdm_error *err);

/* The adapter's device state (parameters, gradients, moments) on the loaded model. */
static tdm_status attach_adapter(tdm_trainer *t, adapter_state *s, tdm_error *err)
{
    TDM_TRY(tdm_lora_create(&s->dev, t->model, s->host.rank, (float)s->host.scale, s->host.targets,
                            err));
    s->dev->dropout = (float)s->cfg.lora_dropout;
    if (s->dev->n_params != s->host.n_params)
        return tdm_fail(err, TDM_ERR_INVALID, "adapter layouts disagree (%lld vs %lld params)",
                        (long long)s->dev->n_params, (long long)s->host.n_params);
    for (size_t k = 0; k < s->host.n_modules; k++) {
        const tdm_lora_module *md = &s->host.modules[k];
        int64_t i = (int64_t)md->layer * TDM_LORA_N_TARGETS + md->target;
        if (s->dev->a_off[i] != md->a_offset || s->dev->b_off[i] != md->b_offset)
            return tdm_fail(err, TDM_ERR_INVALID, "adapter layouts disagree at module %zu", k);
    }
    return TDM_OK;
}

/* The clipping scratch, one float per adapter: d_sumsq, d_coef, d_norm. */
static tdm_status alloc_clip_scratch(tdm_trainer *t, int n, tdm_error *err)
{
    float *sumsq = NULL, *coef = NULL, *norm = NULL;
    tdm_status st = tdm_be_alloc(t->be, TDM_BE_F32, n, (void **)&sumsq, err);
    if (st == TDM_OK) st = tdm_be_alloc(t->be, TDM_BE_F32, n, (void **)&coef, err);
    if (st == TDM_OK) st = tdm_be_alloc(t->be, TDM_BE_F32, n, (void **)&norm, err);
    if (st != TDM_OK) {
        tdm_be_free(t->be, sumsq);
        tdm_be_free(t->be, coef);
        tdm_be_free(t->be, norm);
        return st;
    }
    tdm_be_free(t->be, t->d_sumsq);
    tdm_be_free(t->be, t->d_coef);
    tdm_be_free(t->be, t->d_norm);
    t->d_sumsq = sumsq;
    t->d_coef = coef;
    t->d_norm = norm;
    return TDM_OK;
}

const struct tdm_model *tdm_trainer_model(const tdm_trainer *t)
{
    return t->model;
}

/* The model options of the trainer's run-wide settings (double quantization only with NF4). */
static tdm_model_opts model_opts(const tdm_trainer *t)
{
    return (tdm_model_opts){.nf4 = t->o.nf4,
                            .double_quant = t->o.nf4 && t->o.double_quant,
                            .grad_checkpoint = t->o.grad_checkpoint,
                            .recompute = t->o.recompute,
                            .offload_activations = t->o.offload_activations,
                            .base_fp8 = t->o.nf4 && t->o.base_fp8};
}

tdm_status tdm_trainer_attach(tdm_trainer *t, tdm_backend *be, tdm_error *err)
{
    if (t->model) return tdm_fail(err, TDM_ERR_INVALID, "trainer: model already loaded");
    /* 3. the frozen base, once; the adapters on the device */
    tdm_status st = TDM_OK;
    t->be = be;
    tdm_model_opts mo = model_opts(t);
    if ((st = tdm_model_load(&t->model, be, t->o.model_dir, &mo, err)) != TDM_OK) return st;
    t->mcfg = tdm_model_get_config(t->model);
    for (int a = 0; a < t->n; a++)
        TDM_TRY(attach_adapter(t, &t->ad[a], err));
    /* the out-of-memory rollback restores the partial gradient of an adapter that spreads its
     * batch over global steps from a copy */
    for (int a = 0; a < t->n; a++)
        if (spreads_batches(t, a) &&
            (st = tdm_be_alloc(be, TDM_BE_F32, t->ad[a].host.n_params,
                               (void **)&t->ad[a].d_grad_saved, err)) != TDM_OK)
            return st;
    TDM_TRY(alloc_clip_scratch(t, t->n, err));
    /* 4. the activations and backend scratch of the largest step, now: the run holds from its
     * start what the ledger reserved for it, and a plan that does not fit fails before step 1 */
    tdm_model_mem_plan plan;
    if ((st = memory_plan(t, &plan, err)) != TDM_OK) return st;
    if ((st = tdm_model_reserve(t->model, &plan, err)) != TDM_OK) {
        tdm_error_prefix(err,
                         "the largest step (%lld rows) does not fit (lower --batch-size or "
                         "--max-seq-len, or free memory)",
                         (long long)plan.rows);
        return st;
    }
    return TDM_OK;
}

/* ------------------------------------------------------- host <-> device ---- */

static tdm_status upload_state(tdm_trainer *t, adapter_state *s, bool with_opt, tdm_error *err)
{
    size_t bytes = (size_t)s->host.n_params * sizeof(float);
    TDM_TRY(tdm_be_upload(t->be, s->dev->params, s->host.params, bytes, err));
    if (with_opt) {
        TDM_TRY(tdm_be_upload(t->be, s->dev->adam_m, s->opt.m, bytes, err));
        TDM_TRY(tdm_be_upload(t->be, s->dev->adam_v, s->opt.v, bytes, err));
    }
    return TDM_OK;
}

static tdm_status download_state(tdm_trainer *t, adapter_state *s, bool with_opt, tdm_error *err)
{
    size_t bytes = (size_t)s->host.n_params * sizeof(float);
    TDM_TRY(tdm_be_download(t->be, s->host.params, s->dev->params, bytes, err));
    if (with_opt) {
        TDM_TRY(tdm_be_download(t->be, s->opt.m, s->dev->adam_m, bytes, err));
        TDM_TRY(tdm_be_download(t->be, s->opt.v, s->dev->adam_v, bytes, err));
        s->opt.step = s->step;
    }
    return TDM_OK;
}

/* ------------------------------------------------------------- batches ---- */

typedef struct fused {
    int32_t *tokens, *labels, *cu;
    tdm_batch_seg *segs;
    int64_t cap_rows, cap_seqs, cap_segs;
    int64_t m, n_seqs, n_segs;
} fused;

static tdm_status fused_reserve(fused *f, int64_t rows, int64_t seqs, int64_t segs, tdm_error *err)
{
    if (rows > f->cap_rows) {
        int32_t *a = realloc(f->tokens, (size_t)rows * sizeof *a);
        if (!a) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory (batch)");
        f->tokens = a;
        int32_t *b = realloc(f->labels, (size_t)rows * sizeof *b);
        if (!b) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory (batch)");
        f->labels = b;
        f->cap_rows = rows;
    }
    if (seqs + 1 > f->cap_seqs) {
        int32_t *c = realloc(f->cu, (size_t)(seqs + 1) * sizeof *c);
        if (!c) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory (batch)");
        f->cu = c;
        f->cap_seqs = seqs + 1;
    }
    if (segs > f->cap_segs) {
        tdm_batch_seg *g = realloc(f->segs, (size_t)segs * sizeof *g);
        if (!g) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory (batch)");
        f->segs = g;
        f->cap_segs = segs;
    }
    return TDM_OK;
}

static void fused_free(fused *f)
{
    free(f->tokens);
    free(f->labels);
    free(f->cu);
    free(f->segs);
}

static void fused_clear(fused *f)
{
    f->m = f->n_seqs = f->n_segs = 0;
    if (f->cu) f->cu[0] = 0;
}

/* Appends samples idx[0..k) of ds as one segment of slot `adapter`. */
static tdm_status fused_add(fused *f, const tdm_dataset *ds, const uint32_t *idx, int k,
                            int adapter, tdm_error *err)
{
    int64_t rows = 0;
    for (int i = 0; i < k; i++)
        rows += ds->samples[idx[i]].len;
    if (f->m + rows > INT32_MAX) return tdm_fail(err, TDM_ERR_INVALID, "batch too large");
    TDM_TRY(fused_reserve(f, f->m + rows, f->n_seqs + k, f->n_segs + 1, err));
    if (f->n_seqs == 0) f->cu[0] = 0;
    int64_t begin = f->m;
    for (int i = 0; i < k; i++) {
        const tdm_data_sample *sm = &ds->samples[idx[i]];
        memcpy(f->tokens + f->m, ds->ids + sm->offset, sm->len * sizeof(int32_t));
        memcpy(f->labels + f->m, ds->labels + sm->offset, sm->len * sizeof(int32_t));
        f->m += sm->len;
        f->cu[++f->n_seqs] = (int32_t)f->m;
    }
    f->segs[f->n_segs++] = (tdm_batch_seg){adapter, begin, f->m};
    return TDM_OK;
}

static tdm_batch fused_view(const fused *f)
{
    return (tdm_batch){.m = f->m,
                       .tokens = f->tokens,
                       .labels = f->labels,
                       .cu_seqlens = f->cu,
                       .n_seqs = f->n_seqs,
                       .segs = f->segs,
                       .n_segs = f->n_segs};
}

tdm_status tdm_trainer_evaluate(struct tdm_model *m, const tdm_lora_params *params,
                                const struct tdm_dataset *ds, const uint32_t *idx, uint32_t n,
                                int batch_size, double *loss_sum, int64_t *tokens, tdm_error *err)
{
    *loss_sum = 0;
    *tokens = 0;
    tdm_lora *dev = NULL;
    tdm_status st = TDM_OK;
    if (params) {
        TDM_TRY(tdm_lora_create(&dev, m, params->rank, (float)params->scale, params->targets, err));
        if (dev->n_params != params->n_params)
            st = tdm_fail(err, TDM_ERR_INVALID, "adapter layouts disagree");
        else
            st = tdm_be_upload(tdm_model_backend(m), dev->params, params->params,
                               (size_t)params->n_params * sizeof(float), err);
    }
    fused f = {0};
    for (uint32_t i = 0; st == TDM_OK && i < n; i += (uint32_t)batch_size) {
        int k = (int)(n - i < (uint32_t)batch_size ? n - i : (uint32_t)batch_size);
        fused_clear(&f);
        st = fused_add(&f, ds, idx + i, k, 0, err);
        if (st != TDM_OK) break;
        tdm_batch b = fused_view(&f);
        double ls = 0;
        int64_t tk = 0;
        tdm_lora *slot[1] = {dev};
        st = tdm_model_step(m, slot, 1, &b, false, NULL, &ls, &tk, err);
        *loss_sum += ls;
        *tokens += tk;
    }
    fused_free(&f);
    tdm_lora_free(dev);
    return st;
}

static tdm_status eval_adapter(tdm_trainer *t, adapter_state *s, double *val, tdm_error *err)
{
    *val = NAN;
    if (s->ds.n_val == 0) return TDM_OK;
    fused f = {0};
    double sum = 0;
    int64_t tok = 0;
    tdm_status st = TDM_OK;
    uint32_t mb = (uint32_t)micro_batch(t, s);
    for (uint32_t i = 0; i < s->ds.n_val; i += mb) {
        uint32_t left = s->ds.n_val - i;
        int k = (int)(left < mb ? left : mb);
        fused_clear(&f);
        if ((st = fused_add(&f, &s->ds, s->ds.val + i, k, 0, err)) != TDM_OK) break;
        tdm_batch b = fused_view(&f);
        double ls = 0;
        int64_t tk = 0;
        tdm_lora *slot[1] = {s->dev};
        if ((st = tdm_model_step(t->model, slot, 1, &b, false, NULL, &ls, &tk, err)) != TDM_OK)
            break;
        sum += ls;
        tok += tk;
    }
    fused_free(&f);
    if (st == TDM_OK && tok > 0) *val = sum / (double)tok;
    return st;
}

/* ----------------------------------------------------------- one step ---- */

/* Draws the samples of adapter s's next optimizer step: up to grad_accum micro-batches, none
 * crossing the epoch's end. */
static tdm_status plan_step(tdm_trainer *t, adapter_state *s, tdm_error *err)
{
    int64_t in_epoch = s->step % s->steps_per_epoch;
    (void)t;
    int64_t first_micro = in_epoch * s->cfg.grad_accum;
    int64_t micros = s->micro_per_epoch - first_micro;
    if (micros > s->cfg.grad_accum) micros = s->cfg.grad_accum;
    s->step_counted = 0;
    s->step_tokens = 0;
    s->step_loss_sum = 0;
    int64_t used = 0;
    for (int64_t j = 0; j < micros; j++) {
        uint64_t pos = tdm_train_cursor_position(s->cur);
        uint64_t left = s->ds.n_train - pos;
        int k = (int)(left < (uint64_t)s->cfg.batch_size ? left : (uint64_t)s->cfg.batch_size);
        for (int i = 0; i < k; i++) {
            TDM_TRY(tdm_train_cursor_next(s->cur, &s->idx[used], err));
            s->step_counted += s->ds.samples[s->idx[used]].counted;
            s->step_tokens += s->ds.samples[s->idx[used]].len;
            used++;
        }
    }
    s->batch_seqs = (int)used;
    return TDM_OK;
}

/* Starts adapter s's next optimizer batch: keeps the data cursor from before it (a checkpoint
 * taken while the batch is in progress saves that cursor and draws the batch again on resume),
 * draws the whole batch, so that its counted tokens N (the loss weight 1/N) are known before
 * the first piece, and zeroes the gradient. */
static tdm_status begin_batch(tdm_trainer *t, adapter_state *s, tdm_error *err)
{
    free(s->batch_cursor);
    s->batch_cursor = NULL;
    TDM_TRY(tdm_train_cursor_to_json(s->cur, &s->batch_cursor, err));
    TDM_TRY(plan_step(t, s, err));
    TDM_TRY(tdm_lora_zero_grad(s->dev, err));
    s->seqs_done = 0;
    return TDM_OK;
}

/* How many of its batch's remaining sequences adapter s puts in the next pass, at share ratio
 * (weight / max weight, 1 for the max-weight adapter and for the one-adapter schedules). At 1 it
 * is a whole micro-batch (batch_size, or ceil(batch_size / split) under a memory plan that
 * splits), so the batch completes within the global step exactly as a micro-batch loop would
 * run it. Below 1 the pass adds ratio * micro-batch to the adapter's credit
 * and takes its whole part; a piece never crosses the batch's end, and credit the end leaves
 * unused is dropped (the fraction carries over), so the credit stays below 1 between passes. */
static int piece_size(const tdm_trainer *t, adapter_state *s, double ratio)
{
    int left = s->batch_seqs - s->seqs_done;
    int micro = micro_batch(t, s);
    if (left <= 0) return 0;
    if (ratio >= 1) {
        s->credit = 0;
        return left < micro ? left : micro;
    }
    s->credit += ratio * micro;
    double whole = floor(s->credit + 1e-9); /* 0.3 * 10 is 2.9999999999999996 */
    s->credit -= whole;
    return whole < left ? (int)whole : left;
}

/* One global step of the adapters part[0..np), adapter part[p] at share ratio[p]: up to
 * grad_accum fused forward + backward passes, each with a piece of every adapter's batch (see
 * piece_size; an adapter without a batch in progress draws one first), then clipping and AdamW
 * for the adapters whose batch is complete, one launch each. stepped[p]: part[p] took an
 * optimizer step; worked[p]: it put sequences in a pass. The gradient of a batch is that of its
 * token losses divided by its counted tokens, however its sequences were split into pieces. */
static tdm_status train_step(tdm_trainer *t, const int *part, const double *ratio, int np, fused *f,
                             bool *stepped, bool *worked, tdm_error *err)
{
    int n = t->n;
    tdm_lora **slots = calloc((size_t)n, sizeof *slots);
    double *w = calloc((size_t)n, sizeof *w), *ls = calloc((size_t)n, sizeof *ls);
    int64_t *tk = calloc((size_t)n, sizeof *tk);
    int *pass_seqs = calloc((size_t)n, sizeof *pass_seqs);
    int64_t *pass_rows = calloc((size_t)n, sizeof *pass_rows);
    int *q = calloc((size_t)np, sizeof *q);
    tdm_be_vec *vecs = calloc((size_t)np, sizeof *vecs);
    float *maxn = calloc((size_t)np, sizeof *maxn);
    tdm_adamw_tensor *ten = calloc((size_t)np, sizeof *ten);
    float *norms = calloc((size_t)np, sizeof *norms);
    tdm_status st = TDM_OK;
    int passes = 1;
    if (!slots || !w || !ls || !tk || !pass_seqs || !pass_rows || !q || !vecs || !maxn || !ten ||
        !norms) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int p = 0; p < np; p++) {
        adapter_state *s = &t->ad[part[p]];
        slots[part[p]] = s->dev;
        stepped[p] = worked[p] = false;
        if (!in_batch(s) && (st = begin_batch(t, s, err)) != TDM_OK) goto done;
        /* Anomaly test: a device out-of-memory after the batch was drawn (docs/testing.md). */
        if (t->global_step >= 3 && tdm_fault("trainer.step_oom")) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "injected device out-of-memory (trainer.step_oom)");
            goto done;
        }
        w[part[p]] = s->step_counted > 0 ? 1.0 / (double)s->step_counted : 0.0;
        /* passes: enough for the full-share adapters' micro-batches; each stops at its own */
        if (ratio[p] >= 1 && s->cfg.grad_accum > passes) passes = s->cfg.grad_accum;
    }
    /* under a memory plan that splits (t->split), each micro-batch takes split passes */
    for (int j = 0, pass = 0; j < passes * t->split; j++) {
        fused_clear(f);
        memset(pass_seqs, 0, (size_t)n * sizeof *pass_seqs);
        memset(pass_rows, 0, (size_t)n * sizeof *pass_rows);
        for (int p = 0; p < np; p++) {
            adapter_state *s = &t->ad[part[p]];
            int k = piece_size(t, s, ratio[p]);
            if (k == 0) continue;
            int64_t begin = f->m;
            if ((st = fused_add(f, &s->ds, s->idx + s->seqs_done, k, part[p], err)) != TDM_OK)
                goto done;
            /* the dropout masks of this piece: from the adapter's own step and the sequences of
             * its batch done before it (restored on resume, independent of the other adapters) */
            s->dev->dropout_seed = tdm_lora_dropout_seed(s->cfg.seed, s->step, (int)s->seqs_done);
            s->seqs_done += k;
            pass_seqs[part[p]] = k;
            pass_rows[part[p]] = f->m - begin;
            worked[p] = true;
        }
        if (f->n_segs == 0) continue;
        tdm_batch b = fused_view(f);
        memset(ls, 0, (size_t)n * sizeof *ls);
        memset(tk, 0, (size_t)n * sizeof *tk);
        if ((st = tdm_model_step(t->model, slots, n, &b, true, w, ls, tk, err)) != TDM_OK)
            goto done;
        for (int p = 0; p < np; p++)
            t->ad[part[p]].step_loss_sum += ls[part[p]];
        /* Anomaly test: a device out-of-memory after a pass added to the gradients. */
        if (t->global_step >= 3 && tdm_fault("trainer.pass_oom")) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "injected device out-of-memory (trainer.pass_oom)");
            goto done;
        }
        if (t->o.on_pass) {
            tdm_trainer_pass tp = {.global_step = t->global_step,
                                   .pass = pass++,
                                   .n_adapters = n,
                                   .seqs = pass_seqs,
                                   .rows = pass_rows};
            t->o.on_pass(&tp, t->o.on_pass_user);
        }
    }
    /* clipping and AdamW, one launch each for the adapters whose batch is complete */
    int nq = 0;
    for (int p = 0; p < np; p++)
        if (t->ad[part[p]].seqs_done == t->ad[part[p]].batch_seqs) {
            stepped[p] = true;
            q[nq++] = part[p];
        }
    if (nq == 0) goto done;
    for (int i = 0; i < nq; i++) {
        adapter_state *s = &t->ad[q[i]];
        vecs[i] = (tdm_be_vec){s->dev->grads, s->dev->n_params, i};
        maxn[i] = (float)s->cfg.max_grad_norm;
    }
    if ((st = tdm_be_sumsq(t->be, vecs, nq, nq, t->d_sumsq, err)) != TDM_OK) goto done;
    if ((st = tdm_be_clip_coef(t->be, t->d_sumsq, maxn, nq, t->d_coef, t->d_norm, err)) != TDM_OK)
        goto done;
    for (int i = 0; i < nq; i++) {
        adapter_state *s = &t->ad[q[i]];
        double lr = tdm_lr_at(&s->sched, s->step);
        s->last_lr = lr;
        ten[i] = (tdm_adamw_tensor){.p = s->dev->params,
                                    .g = s->dev->grads,
                                    .m = s->dev->adam_m,
                                    .v = s->dev->adam_v,
                                    .n = s->dev->n_params,
                                    .grad_scale = s->cfg.max_grad_norm > 0 ? t->d_coef + i : NULL,
                                    .lr = lr, /* doubles, as torch computes its constants */
                                    .beta1 = 0.9,
                                    .beta2 = 0.999,
                                    .eps = 1e-8,
                                    .weight_decay = s->cfg.weight_decay,
                                    .step = s->step + 1};
    }
    if ((st = tdm_be_adamw(t->be, ten, nq, err)) != TDM_OK) goto done;
    if ((st = tdm_be_download(t->be, norms, t->d_norm, (size_t)nq * sizeof(float), err)) != TDM_OK)
        goto done;
    for (int i = 0; i < nq; i++) {
        adapter_state *s = &t->ad[q[i]];
        s->step++;
        free(s->batch_cursor);
        s->batch_cursor = NULL;
        s->last_grad_norm = norms[i];
        s->last_train_loss = s->step_counted > 0 ? s->step_loss_sum / (double)s->step_counted : NAN;
        s->tokens_seen += s->step_counted;
        s->run_tokens += s->step_tokens; /* tokens/s: all tokens trained, not only loss ones */
        s->run_steps++;
        s->samples_seen += s->batch_seqs;
        s->epoch_loss_sum += s->step_loss_sum;
        s->epoch_tokens += s->step_counted;
        s->log_loss_sum += s->step_loss_sum;
        s->log_tokens += s->step_counted;
    }
done:
    free(slots);
    free(w);
    free(ls);
    free(tk);
    free(pass_seqs);
    free(pass_rows);
    free(q);
    free(vecs);
    free(maxn);
    free(ten);
    free(norms);
    return st;
}

/* ------------------------------------------------------------ records ---- */

static double adapter_epoch(const adapter_state *s)
{
    return (double)s->step / (double)s->steps_per_epoch;
}

static void report(tdm_trainer *t, int a, tdm_trainer_event ev, double loss)
{
    if (!t->o.progress) return;
    adapter_state *s = &t->ad[a];
    tdm_trainer_progress p = {.event = ev,
                              .adapter = a,
                              .label = s->task,
                              .global_step = own_global(t, s),
                              .step = s->step,
                              .total_steps = s->total_steps,
                              .epoch = adapter_epoch(s),
                              .epochs = s->cfg.epochs,
                              .loss = loss,
                              .learning_rate = s->last_lr,
                              .grad_norm = s->last_grad_norm,
                              .val_loss = s->last_val,
                              .tokens_per_sec = NAN,
                              .eta_sec = NAN,
                              .done = s->done};
    double el = now_ms() - s->t0_ms;
    int64_t g = own_global(t, s);
    if (el > 0 && s->run_tokens > 0) p.tokens_per_sec = (double)s->run_tokens / (el / 1000.0);
    if (s->run_steps > 0 && g > 0) {
        double ms_per_global = el / (double)g;
        double global_per_step = (double)g / (double)s->run_steps;
        p.eta_sec = (double)(s->total_steps - s->step) * global_per_step * ms_per_global / 1000.0;
    }
    t->o.progress(&p, t->o.progress_user);
}

static tdm_status write_metadata(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->cfg.output, TDM_METADATA_FILE);
    double secs = s->train_ms / 1000.0;
    tdm_run_metadata md = {.task = s->task,
                           .label = s->cfg.label,
                           .adapter_index = s->run_index,
                           .epoch = adapter_epoch(s),
                           .train_loss =
                               isnan(s->last_epoch_loss) ? s->last_train_loss : s->last_epoch_loss,
                           .val_loss = s->last_val,
                           .learning_rate = s->last_lr,
                           .epoch_time_ms = s->last_epoch_ms,
                           .samples_per_sec = secs > 0 ? (double)s->samples_seen / secs : 0,
                           .lora_rank = s->host.rank,
                           .lora_alpha = s->host.alpha,
                           .data_hash = s->ds.report.data_hash,
                           .base_model_identity = t->base_id,
                           .method = t->o.nf4 ? "qlora" : "lora",
                           .double_quant = t->o.double_quant};
    return tdm_run_metadata_save(&md, path, err);
}

/* Appends one event of adapter s at its step to its TensorBoard file, creating the file at the
 * first call of this process (the same values as its metrics.jsonl line). */
static tdm_status tb_write(adapter_state *s, const tdm_tfevents_value *v, int n, tdm_error *err)
{
    if (!s->tb.path[0]) TDM_TRY(tdm_tfevents_open(&s->tb, s->cfg.output, s->tb_start, err));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return tdm_tfevents_write(&s->tb, s->step, (double)ts.tv_sec + ts.tv_nsec / 1e9, v, n, err);
}

static tdm_status log_point(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    if (s->log_tokens == 0) return TDM_OK;
    double loss = s->log_loss_sum / (double)s->log_tokens;
    s->ts.global_step = s->step;
    s->ts.epoch = adapter_epoch(s);
    tdm_trainer_state_log_train(&s->ts, loss, s->last_lr, s->last_grad_norm);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->cfg.output, TDM_METRICS_FILE);
    double el = now_ms() - s->t0_ms;
    tdm_metrics_line ml = {.step = s->step,
                           .epoch = adapter_epoch(s),
                           .loss = loss,
                           .learning_rate = s->last_lr,
                           .grad_norm = s->last_grad_norm,
                           .tokens = s->log_tokens,
                           .tokens_per_sec = el > 0 ? (double)s->run_tokens / (el / 1000) : NAN,
                           .elapsed_ms = el,
                           .val_loss = NAN,
                           .adapter_index = s->run_index,
                           .label = s->cfg.label};
    TDM_TRY(tdm_metrics_append(path, &ml, err));
    s->metrics_lines++;
    tdm_tfevents_value tv[] = {{"train/loss", ml.loss},
                               {"train/learning_rate", ml.learning_rate},
                               {"train/grad_norm", ml.grad_norm},
                               {"train/tokens_per_sec", ml.tokens_per_sec},
                               {"train/tokens_seen", (double)s->tokens_seen},
                               {"train/epoch", ml.epoch}};
    TDM_TRY(tb_write(s, tv, (int)(sizeof tv / sizeof tv[0]), err));
    s->log_loss_sum = 0;
    s->log_tokens = 0;
    report(t, a, TDM_TRAINER_EVENT_LOG, loss);
    return TDM_OK;
}

static tdm_status eval_point(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    if (s->ds.n_val == 0) return TDM_OK;
    double t0 = now_ms();
    double v;
    TDM_TRY(eval_adapter(t, s, &v, err));
    double secs = (now_ms() - t0) / 1000.0;
    s->last_val = v;
    s->eval_step = s->step;
    char best[4096];
    snprintf(best, sizeof best, "%s/%s", s->cfg.output, TDM_BEST_DIR);
    s->ts.global_step = s->step;
    s->ts.epoch = adapter_epoch(s);
    int64_t nb = (s->ds.n_val + s->cfg.batch_size - 1) / s->cfg.batch_size;
    bool is_best =
        tdm_trainer_state_log_eval(&s->ts, v, secs, secs > 0 ? (double)s->ds.n_val / secs : 0,
                                   secs > 0 ? (double)nb / secs : 0, best);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->cfg.output, TDM_METRICS_FILE);
    tdm_metrics_line ml = {.step = s->step,
                           .epoch = adapter_epoch(s),
                           .loss = NAN,
                           .learning_rate = NAN,
                           .grad_norm = NAN,
                           .tokens = 0,
                           .tokens_per_sec = NAN,
                           .elapsed_ms = now_ms() - s->t0_ms,
                           .val_loss = v,
                           .adapter_index = s->run_index,
                           .label = s->cfg.label};
    TDM_TRY(tdm_metrics_append(path, &ml, err));
    s->metrics_lines++;
    tdm_tfevents_value tv[] = {{"eval/loss", v}};
    TDM_TRY(tb_write(s, tv, 1, err));
    if (is_best) {
        TDM_TRY(download_state(t, s, false, err));
        TDM_TRY(tdm_checkpoint_save_best(s->cfg.output, &s->host, &s->meta, s->step, "eval_loss", v,
                                         err));
    }
    report(t, a, TDM_TRAINER_EVENT_EVAL, v);
    return TDM_OK;
}

/* Writes adapter a's checkpoint at its current step. An adapter in the middle of an optimizer
 * batch (synchronized, weight below the largest: the batch spans global steps) saves where that
 * batch began, the data cursor from before it was drawn, with "piece" = the sequences of it done
 * and their loss sum, and its partial gradient (grad_accum.safetensors); resume draws the batch
 * again and continues with the next piece. (Deferring the checkpoint to the adapter's next
 * optimizer step instead would leave no global step that every adapter saved, and the
 * out-of-memory checkpoint cannot wait.) */
/* What adapter s trains on in this run, as its checkpoints record it. */
static tdm_checkpoint_trained_on trained_on(const tdm_trainer *t, const adapter_state *s)
{
    tdm_checkpoint_trained_on o = {
        .known = true, .nf4 = t->o.nf4, .double_quant = t->o.nf4 && t->o.double_quant};
    snprintf(o.data_file, sizeof o.data_file, "%s", s->cfg.data);
    snprintf(o.data_hash, sizeof o.data_hash, "%s", s->ds.report.data_hash);
    return o;
}

/* How the base is held, as the flags that choose it ("--method qlora --no-double-quant"). */
static const char *base_flags(bool nf4, bool double_quant)
{
    return !nf4           ? "--method lora"
           : double_quant ? "--method qlora"
                          : "--method qlora --no-double-quant";
}

static tdm_status save_checkpoint(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    TDM_TRY(download_state(t, s, true, err));
    /* the data cursor: from before the batch in progress, else the current one */
    char *now = NULL;
    if (!in_batch(s)) TDM_TRY(tdm_train_cursor_to_json(s->cur, &now, err));
    json_t *cursor = json_loads(now ? now : s->batch_cursor, 0, NULL);
    free(now);
    bool piece = in_batch(s) && s->seqs_done > 0;
    float *grad = NULL;
    if (piece) {
        size_t bytes = (size_t)s->host.n_params * sizeof(float);
        grad = malloc(bytes);
        tdm_status gs = grad ? tdm_be_download(t->be, grad, s->dev->grads, bytes, err)
                             : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        if (gs != TDM_OK) {
            free(grad);
            json_decref(cursor);
            return gs;
        }
    }
    tdm_trainer_ckpt tc = {.global_step = own_global(t, s),
                           .rr_next = t->rr_next,
                           .done = s->done,
                           .credit = s->credit,
                           .last_val = s->last_val,
                           .last_train_loss = s->last_train_loss,
                           .last_grad_norm = s->last_grad_norm,
                           .last_lr = s->last_lr,
                           .tokens_seen = s->tokens_seen,
                           .samples_seen = s->samples_seen,
                           .epoch_loss_sum = s->epoch_loss_sum,
                           .epoch_tokens = s->epoch_tokens,
                           .last_epoch_loss = s->last_epoch_loss,
                           .log_loss_sum = s->log_loss_sum,
                           .log_tokens = s->log_tokens,
                           .log_due = s->log_due,
                           .metrics_lines = s->metrics_lines,
                           .eval_step = s->eval_step,
                           .in_piece = piece,
                           .piece_seqs_done = piece ? s->seqs_done : 0,
                           .piece_loss_sum = piece ? s->step_loss_sum : 0};
    snprintf(tc.train_schedule, sizeof tc.train_schedule, "%s",
             tdm_train_schedule_name(t->o.schedule));
    json_t *tsj = tdm_trainer_state_to_json(&s->ts);
    tdm_status st = TDM_OK;
    if (!cursor || !tsj)
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    else {
        tdm_checkpoint_info info = {.step = s->step,
                                    .epoch = adapter_epoch(s),
                                    .schedule = s->sched,
                                    .rng = s->rng,
                                    .data_cursor = cursor,
                                    .trainer = tc,
                                    .trained_on = trained_on(t, s),
                                    .grad_accum = grad};
        st = tdm_checkpoint_save(s->cfg.output, &s->host, &s->meta, &s->opt, &info, tsj, NULL, 0,
                                 err);
        /* --save-total-limit: the new checkpoint is the latest, so it is always kept */
        if (st == TDM_OK && s->cfg.save_total_limit > 0)
            st = tdm_checkpoint_prune(s->cfg.output, s->cfg.save_total_limit, err);
    }
    json_decref(cursor);
    json_decref(tsj);
    free(grad);
    return st;
}

/* The global step and "done" flag recorded in a checkpoint directory's tandem_state.json. */
static bool read_ckpt_global(const char *dir, int64_t *g, bool *done)
{
    tdm_checkpoint_info info;
    tdm_error e = {0};
    if (tdm_checkpoint_load_state(dir, &info, &e) != TDM_OK) return false;
    *g = info.trainer.global_step;
    *done = info.trainer.done;
    tdm_checkpoint_info_free(&info);
    return true;
}

/* A checkpoint (its adapter l, meta and info) must be one that adapter s of this run
 * can go on from: another rank, targets, LoRA dropout, base, data or learning-rate schedule
 * would silently train a different adapter than the one the checkpoint's run was heading for
 * (docs/finetune.md, "Resume"). TDM_ERR_INVALID says what differs and what to do. A checkpoint
 * that does not record its data and base (an older tandem's) is not checked for them. */
static tdm_status refuse_other_run(const tdm_trainer *t, const adapter_state *s,
                                   const tdm_lora_params *l, const tdm_peft_meta *meta,
                                   const tdm_checkpoint_info *info, tdm_error *err)
{
    if (l->rank != s->host.rank || l->targets != s->host.targets ||
        l->n_params != s->host.n_params) {
        char had[64], has[64];
        tdm_lora_targets_format(l->targets, had, sizeof had);
        tdm_lora_targets_format(s->host.targets, has, sizeof has);
        return tdm_fail(err, TDM_ERR_INVALID,
                        "trained with --rank %d --targets %s; this run has --rank %d --targets %s "
                        "(resume with the same --rank and --targets, or train into a new OUT_DIR)",
                        l->rank, had, s->host.rank, has);
    }
    if (meta->lora_dropout != s->cfg.lora_dropout)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "trained with LoRA dropout %g, this run has %g (resume with the same "
                        "--lora-dropout, or train into a new OUT_DIR)",
                        meta->lora_dropout, s->cfg.lora_dropout);
    const tdm_checkpoint_trained_on *was = &info->trained_on;
    tdm_checkpoint_trained_on now = trained_on(t, s);
    if (was->known && (was->nf4 != now.nf4 || was->double_quant != now.double_quant))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "trained with %s; this run has %s (resume with %s, or train into a new "
                        "OUT_DIR)",
                        base_flags(was->nf4, was->double_quant),
                        base_flags(now.nf4, now.double_quant),
                        base_flags(was->nf4, was->double_quant));
    if (was->known && strcmp(was->data_hash, now.data_hash) != 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "trained on %s (%s); this run's data %s is %s (resume with the same data, "
                        "or train into a new OUT_DIR)",
                        was->data_file, was->data_hash, now.data_file, now.data_hash);
    const tdm_lr_schedule *had = &info->schedule, *has = &s->sched;
    if (had->kind != has->kind || had->peak_lr != has->peak_lr ||
        had->warmup_steps != has->warmup_steps || had->total_steps != has->total_steps)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "trained with --lr %g, --lr-schedule %s, --warmup-steps %lld over %lld "
                        "steps; this run has --lr %g, %s, %lld over %lld steps (resume with the "
                        "same --lr, --lr-schedule, --warmup-steps, --epochs, --batch-size and "
                        "data, or train into a new OUT_DIR)",
                        had->peak_lr, tdm_lr_kind_name(had->kind), (long long)had->warmup_steps,
                        (long long)had->total_steps, has->peak_lr, tdm_lr_kind_name(has->kind),
                        (long long)has->warmup_steps, (long long)has->total_steps);
    return TDM_OK;
}

static tdm_status load_checkpoint(tdm_trainer *t, int a, const char *dir, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    tdm_lora_params l = {0};
    tdm_adamw_state opt = {0};
    tdm_checkpoint_info info = {0};
    tdm_peft_meta meta;
    TDM_TRY(tdm_checkpoint_load(dir, t->mcfg, &l, &meta, &opt, &info, err));
    tdm_status st = refuse_other_run(t, s, &l, &meta, &info, err);
    char *cj = NULL;
    if (st == TDM_OK) st = tdm_lora_params_copy(&s->host, &l, err);
    if (st == TDM_OK) {
        memcpy(s->opt.m, opt.m, (size_t)opt.n * sizeof(float));
        memcpy(s->opt.v, opt.v, (size_t)opt.n * sizeof(float));
        s->opt.step = opt.step;
        s->step = info.step;
        s->rng = info.rng;
        cj = json_dumps(info.data_cursor, JSON_COMPACT);
        if (!cj) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    if (st == TDM_OK) st = tdm_train_cursor_from_json(s->cur, cj, err);
    if (st == TDM_OK) {
        const tdm_trainer_ckpt *tc = &info.trainer;
        if (tc->global_step >= t->global_step) {
            t->global_step = tc->global_step;
            t->rr_next = (int)tc->rr_next;
        }
        s->done = tc->done;
        s->credit = isnan(tc->credit) ? 0 : tc->credit;
        s->last_val = tc->last_val;
        s->last_train_loss = tc->last_train_loss;
        s->last_grad_norm = tc->last_grad_norm;
        s->last_lr = tc->last_lr;
        s->tokens_seen = tc->tokens_seen;
        s->samples_seen = tc->samples_seen;
        s->epoch_loss_sum = tc->epoch_loss_sum;
        s->epoch_tokens = tc->epoch_tokens;
        s->last_epoch_loss = tc->last_epoch_loss;
        s->log_loss_sum = tc->log_loss_sum;
        s->log_tokens = tc->log_tokens;
        s->log_due = tc->log_due;
        s->eval_step = tc->eval_step;
        tdm_train_schedule was;
        if (tdm_train_schedule_parse(tc->train_schedule, &was) && was != t->o.schedule &&
            !t->warned_schedule) {
            t->warned_schedule = true;
            tdm_warn("%s was trained under --schedule %s and resumes under %s: the adapters "
                     "will not be those of an uninterrupted run",
                     dir, tc->train_schedule, tdm_train_schedule_name(t->o.schedule));
        }
        st = upload_state(t, s, true, err);
    }
    if (st == TDM_OK && info.trainer.in_piece) { /* in an optimizer batch: draw it again */
        free(s->batch_cursor);
        s->batch_cursor = cj; /* the cursor before the batch: in progress from here */
        cj = NULL;
        st = plan_step(t, s, err);
        int64_t done_seqs = info.trainer.piece_seqs_done;
        if (st == TDM_OK && (!info.grad_accum || done_seqs < 1 || done_seqs >= s->batch_seqs))
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: an optimizer batch in progress (%lld of %d sequences done) without "
                          "its partial gradient, or out of range",
                          dir, (long long)done_seqs, s->batch_seqs);
        if (st == TDM_OK)
            st = tdm_be_upload(t->be, s->dev->grads, info.grad_accum,
                               (size_t)s->host.n_params * sizeof(float), err);
        if (st == TDM_OK) {
            s->seqs_done = (int)done_seqs;
            s->step_loss_sum = info.trainer.piece_loss_sum;
        }
    }
    if (st == TDM_OK) {
        char tsp[4200];
        snprintf(tsp, sizeof tsp, "%s/%s", dir, TDM_CHECKPOINT_TRAINER_STATE_FILE);
        tdm_trainer_state_free(&s->ts);
        st = tdm_trainer_state_load(&s->ts, tsp, err);
    }
    if (st == TDM_OK) {
        char mp[4096];
        snprintf(mp, sizeof mp, "%s/%s", s->cfg.output, TDM_METRICS_FILE);
        /* the lines written up to the checkpoint */
        st = tdm_metrics_truncate_lines(mp, s->step, info.trainer.metrics_lines, &s->metrics_lines,
                                        err);
        /* a new event file; its START drops what older ones logged after this step */
        s->tb.path[0] = '\0';
        s->tb_start = s->step + 1;
    }
    free(cj);
    tdm_lora_params_free(&l);
    tdm_adamw_state_free(&opt);
    tdm_checkpoint_info_free(&info);
    return st;
}

/* Finds the resume point: the highest global step G such that every adapter has a checkpoint
 * taken at G, or a final ("done") one taken at or before G. *found false: start fresh. An
 * adapter whose OUT_DIR holds no checkpoint at all (it had saved none yet when its run was
 * killed, or it is new in the command) does not count: it starts over from step 0 (dirs[a] is
 * "") while the others resume, in their frame of global steps, so a later --resume finds a
 * common step again. */
static tdm_status find_resume(tdm_trainer *t, char (*dirs)[4096], bool *found, tdm_error *err)
{
    *found = false;
    int n = t->n;
    int64_t **gs = calloc((size_t)n, sizeof *gs);
    bool **dn = calloc((size_t)n, sizeof *dn);
    int64_t **steps = calloc((size_t)n, sizeof *steps);
    size_t *cnt = calloc((size_t)n, sizeof *cnt);
    tdm_status st = TDM_OK;
    bool any = false;
    if (!gs || !dn || !steps || !cnt) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int a = 0; a < n && st == TDM_OK; a++) {
        st = tdm_checkpoint_list(t->ad[a].cfg.output, &steps[a], &cnt[a], err);
        if (st == TDM_ERR_NOT_FOUND || st == TDM_ERR_IO) {
            st = TDM_OK;
            cnt[a] = 0;
        }
        if (cnt[a] == 0) continue;
        gs[a] = calloc(cnt[a], sizeof **gs);
        dn[a] = calloc(cnt[a], sizeof **dn);
        if (!gs[a] || !dn[a]) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        for (size_t i = 0; st == TDM_OK && i < cnt[a]; i++) {
            char d[4096];
            snprintf(d, sizeof d, "%.4000s/" TDM_CHECKPOINT_PREFIX "%lld", t->ad[a].cfg.output,
                     (long long)steps[a][i]);
            gs[a][i] = -1;
            if (!tdm_checkpoint_usable(d)) continue;
            if (!read_ckpt_global(d, &gs[a][i], &dn[a][i]))
                gs[a][i] = -1;
            else
                any = true;
        }
    }
    if (st != TDM_OK || !any) goto done;
    int64_t best_g = -1;
    for (int c = 0; c < n; c++)
        for (size_t i = 0; i < cnt[c]; i++) {
            int64_t G = gs[c][i];
            if (G <= best_g) continue;
            bool ok = true;
            for (int a = 0; a < n && ok; a++) {
                if (cnt[a] == 0) continue; /* starts over */
                bool has = false;
                for (size_t k = 0; k < cnt[a] && !has; k++)
                    has = gs[a][k] == G || (dn[a][k] && gs[a][k] >= 0 && gs[a][k] <= G);
                ok = has;
            }
            if (ok) best_g = G;
        }
    if (best_g < 0) {
        st = tdm_fail(err, TDM_ERR_INVALID,
                      "--resume: the OUT_DIRs hold checkpoints, but no global step that every "
                      "adapter saved; remove the checkpoints to start over");
        goto done;
    }
    for (int a = 0; a < n; a++) {
        dirs[a][0] = '\0';
        if (cnt[a] == 0) continue;
        int64_t pick = -1, pg = -1;
        for (size_t k = 0; k < cnt[a]; k++)
            if (gs[a][k] == best_g || (dn[a][k] && gs[a][k] >= 0 && gs[a][k] <= best_g))
                if (gs[a][k] >= pg) {
                    pg = gs[a][k];
                    pick = steps[a][k];
                }
        snprintf(dirs[a], 4096, "%.4000s/" TDM_CHECKPOINT_PREFIX "%lld", t->ad[a].cfg.output,
                 (long long)pick);
    }
    *found = true;
done:
    for (int a = 0; a < n && gs; a++)
        free(gs[a]);
    for (int a = 0; a < n && dn; a++)
        free(dn[a]);
    for (int a = 0; a < n && steps; a++)
        free(steps[a]);
    free(gs);
    free(dn);
    free(steps);
    free(cnt);
    return st;
}

static tdm_status finish_adapter(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    s->done = true;
    TDM_TRY(eval_point(t, a, err));
    TDM_TRY(download_state(t, s, false, err));
    TDM_TRY(tdm_peft_write_files(s->cfg.output, &s->host, &s->meta, err));
    s->ts.global_step = s->step;
    s->ts.epoch = adapter_epoch(s);
    double secs = s->train_ms / 1000.0;
    tdm_trainer_state_log_end(&s->ts, s->last_epoch_loss, secs,
                              secs > 0 ? (double)s->samples_seen / secs : 0,
                              secs > 0 ? (double)s->run_steps / secs : 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->cfg.output, TDM_TRAINER_STATE_FILE);
    TDM_TRY(tdm_trainer_state_save(&s->ts, path, err));
    TDM_TRY(write_metadata(t, a, err));
    TDM_TRY(save_checkpoint(t, a, err)); /* the final position, for --resume of the others */
    report(t, a, TDM_TRAINER_EVENT_DONE, s->last_epoch_loss);
    return TDM_OK;
}

static int pick_priority(tdm_trainer *t)
{
    int best = -1;
    double bv = -INFINITY;
    for (int a = 0; a < t->n; a++) {
        adapter_state *s = &t->ad[a];
        if (s->done) continue;
        double v = s->ds.n_val > 0 ? s->last_val : s->last_train_loss;
        if (isnan(v)) v = INFINITY;
        if (best < 0 || v > bv) {
            best = a;
            bv = v;
        }
    }
    return best;
}

static int cmp_len_desc(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a < b) - (a > b);
}

/* Adapter s's batch_size longest sample lengths (every sample counts: the shuffle may put the
 * longest together, and validation batches are as large), longest first, into a malloc'd array
 * of *n; NULL when out of memory (then the plan takes the worst case, max_seq_len each). */
static int32_t *longest_samples(const adapter_state *s, int *n_out)
{
    *n_out = 0;
    uint32_t n = s->ds.n_samples;
    int32_t *len = malloc((size_t)(n ? n : 1) * sizeof *len);
    if (!len) return NULL;
    for (uint32_t i = 0; i < n; i++)
        len[i] = s->ds.samples[i].len;
    qsort(len, n, sizeof *len, cmp_len_desc);
    *n_out = n < (uint32_t)s->cfg.batch_size ? (int)n : s->cfg.batch_size;
    return len;
}

/* Each adapter of t as the memory plan sees it, its passes measured on its data, at split (the
 * split of the trainer it trains in: a joiner's is the host's), into ads (room for t->n);
 * active_only: the unfinished ones only. Returns how many were written (free with
 * free_plan_adapters). */
static int plan_adapters(const tdm_trainer *t, int split, bool active_only, tdm_plan_adapter *ads)
{
    int k = 0, div = split > 1 ? split : 1;
    for (int a = 0; a < t->n; a++) {
        const adapter_state *s = &t->ad[a];
        if (active_only && s->done) continue;
        ads[k] = (tdm_plan_adapter){.rank = s->host.rank,
                                    .targets = s->host.targets,
                                    .batch_size = s->cfg.batch_size,
                                    .max_seq_len = s->cfg.max_seq_len,
                                    .weight = s->cfg.weight,
                                    .micro_batch = (s->cfg.batch_size + div - 1) / div};
        ads[k].longest = longest_samples(s, &ads[k].n_longest);
        k++;
    }
    return k;
}

static void free_plan_adapters(tdm_plan_adapter *ads, int n)
{
    for (int a = 0; ads && a < n; a++)
        free((void *)ads[a].longest);
    free(ads);
}

/* The largest step of the unfinished adapters (what tdm_model_reserve holds; before a run that
 * is every adapter, the step --vram auto reserves for). */
static tdm_status memory_plan(const tdm_trainer *t, tdm_model_mem_plan *out, tdm_error *err)
{
    tdm_plan_adapter *ads = calloc((size_t)t->n + 1, sizeof *ads);
    if (!ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int n = plan_adapters(t, t->split, true, ads);
    tdm_memory_plan_build(t->mcfg_host, ads, n, t->o.schedule == TDM_SCHEDULE_SYNCHRONIZED, out);
    free_plan_adapters(ads, n);
    return TDM_OK;
}

/* The memory estimate of t's adapters (active_only: its unfinished ones) together with extra's
 * (NULL: none; they train at t's split), for the backend of activation dtype act. */
static tdm_status estimate_act(const tdm_trainer *t, bool active_only, const tdm_trainer *extra,
                               tdm_be_dtype act, tdm_model_mem *out, tdm_error *err)
{
    int cap = t->n + (extra ? extra->n : 0);
    tdm_plan_adapter *ads = calloc((size_t)cap + 1, sizeof *ads);
    if (!ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int n = plan_adapters(t, t->split, active_only, ads);
    if (extra) n += plan_adapters(extra, t->split, false, ads + n);
    tdm_model_opts mo = model_opts(t);
    tdm_status st = tdm_run_memory_estimate(t->mcfg_host, &mo, act, ads, n,
                                            t->o.schedule == TDM_SCHEDULE_SYNCHRONIZED, out, err);
    free_plan_adapters(ads, n);
    return st;
}

tdm_status tdm_trainer_memory_estimate(const tdm_trainer *t, tdm_model_mem *out, tdm_error *err)
{
    return estimate_act(t, false, NULL, TDM_BE_BF16, out, err);
}

tdm_status tdm_trainer_cpu_memory_estimate(const tdm_trainer *t, tdm_model_mem *out,
                                           tdm_error *err)
{
    return estimate_act(t, false, NULL, TDM_BE_F32, out, err);
}

/* The most micro-batches any adapter accumulates per step (grad_accum is per adapter). */
static int max_grad_accum(const tdm_trainer *t)
{
    int g = 1;
    for (int a = 0; a < t->n; a++)
        if (t->ad[a].cfg.grad_accum > g) g = t->ad[a].cfg.grad_accum;
    return g;
}

/* The fit request of t's adapters (active_only: the unfinished ones) and extra's (may be NULL),
 * --grad-checkpoint as the user gave it; its adapters are malloc'd into *ads (*n of them: free
 * with free_plan_adapters). */
static tdm_status fit_request(const tdm_trainer *t, bool active_only, const tdm_trainer *extra,
                              tdm_be_dtype act, tdm_memory_fit_request *req, tdm_plan_adapter **ads,
                              int *n, tdm_error *err)
{
    int cap = t->n + (extra ? extra->n : 0);
    *ads = calloc((size_t)cap + 1, sizeof **ads);
    if (!*ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    *n = plan_adapters(t, t->split, active_only, *ads);
    if (extra) *n += plan_adapters(extra, t->split, false, *ads + *n);
    int accum = max_grad_accum(t);
    if (extra && max_grad_accum(extra) > accum) accum = max_grad_accum(extra);
    tdm_model_opts mo = model_opts(t);
    mo.grad_checkpoint = t->gc_asked;
    mo.recompute = t->rc_asked;
    *req = (tdm_memory_fit_request){.config = t->mcfg_host,
                                    .opts = mo,
                                    .act = act,
                                    .adapters = *ads,
                                    .n_adapters = *n,
                                    .synchronized = t->o.schedule == TDM_SCHEDULE_SYNCHRONIZED,
                                    .grad_accum = accum};
    return TDM_OK;
}

tdm_status tdm_trainer_memory_fit(const tdm_trainer *t, tdm_be_dtype act, int64_t budget_mb,
                                  int64_t context_mb, tdm_memory_fit *out, tdm_error *err)
{
    tdm_memory_fit_request req;
    tdm_plan_adapter *ads = NULL;
    int n = 0;
    TDM_TRY(fit_request(t, false, NULL, act, &req, &ads, &n, err));
    req.context_mb = context_mb;
    req.budget_mb = budget_mb;
    tdm_status st = tdm_memory_plan_fit(&req, out, err);
    free_plan_adapters(ads, n);
    return st;
}

tdm_status tdm_trainer_memory_fit_subset(const tdm_trainer *t, const int *subset, int n_subset,
                                         int64_t budget_mb, int64_t context_mb, tdm_memory_fit *out,
                                         tdm_error *err)
{
    tdm_plan_adapter *all = calloc((size_t)t->n + 1, sizeof *all);
    tdm_plan_adapter *ads = calloc((size_t)n_subset + 1, sizeof *ads);
    if (!all || !ads) {
        free(all);
        free(ads);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    int n = plan_adapters(t, t->split, false, all);
    int g = 1, k = 0;
    for (int i = 0; i < n_subset; i++) {
        if (subset[i] < 0 || subset[i] >= n) continue;
        ads[k++] = all[subset[i]];
        if (t->ad[subset[i]].cfg.grad_accum > g) g = t->ad[subset[i]].cfg.grad_accum;
    }
    tdm_memory_fit_request req = {.config = t->mcfg_host,
                                  .opts = model_opts(t),
                                  .act = TDM_BE_BF16,
                                  .adapters = ads,
                                  .n_adapters = k,
                                  .synchronized = t->o.schedule == TDM_SCHEDULE_SYNCHRONIZED,
                                  .grad_accum = g,
                                  .context_mb = context_mb,
                                  .budget_mb = budget_mb};
    tdm_status st = k ? tdm_memory_plan_fit(&req, out, err)
                      : tdm_fail(err, TDM_ERR_INVALID, "memory fit: no adapter in the subset");
    free(ads);
    free_plan_adapters(all, n);
    return st;
}

double tdm_trainer_adapter_work(const tdm_trainer *t, int a)
{
    const adapter_state *s = &t->ad[a];
    double tokens = 0;
    for (uint32_t i = 0; i < s->ds.n_train; i++)
        tokens += s->ds.samples[s->ds.train[i]].len;
    return tokens * s->cfg.epochs;
}

tdm_status tdm_trainer_set_memory_plan(tdm_trainer *t, bool grad_checkpoint,
                                       tdm_recompute recompute, int split, tdm_error *err)
{
    if (split < 1 || split > 65536)
        return tdm_fail(err, TDM_ERR_INVALID, "memory plan: split %d not in 1..65536", split);
    bool old_gc = t->o.grad_checkpoint;
    tdm_recompute old_rc = t->o.recompute;
    int old_split = t->split;
    t->o.grad_checkpoint = grad_checkpoint;
    t->o.recompute = recompute;
    t->split = split;
    if (!t->model || (old_gc == grad_checkpoint && old_split == split &&
                      (!grad_checkpoint || old_rc == recompute)))
        return TDM_OK;
    /* between two steps of an attached trainer: the model switches checkpointing (its workspace
     * holds nothing across steps) and the workspace follows the unfinished adapters' step,
     * given back when smaller (tdm_model_fit), allocated now when larger (tdm_model_reserve) */
    tdm_model_set_grad_checkpoint(t->model, grad_checkpoint, recompute);
    tdm_model_mem_plan plan;
    tdm_status st = memory_plan(t, &plan, err);
    if (st == TDM_OK) st = tdm_model_fit(t->model, &plan, err);
    if (st == TDM_OK) st = tdm_model_reserve(t->model, &plan, err);
    if (st != TDM_OK) { /* the plan before: it fitted a moment ago */
        t->o.grad_checkpoint = old_gc;
        t->o.recompute = old_rc;
        t->split = old_split;
        tdm_model_set_grad_checkpoint(t->model, old_gc, old_rc);
        tdm_error ignored = {0};
        if (memory_plan(t, &plan, &ignored) == TDM_OK)
            (void)tdm_model_reserve(t->model, &plan, &ignored);
    }
    return st;
}

bool tdm_trainer_grad_checkpoint(const tdm_trainer *t)
{
    return t->o.grad_checkpoint;
}

tdm_recompute tdm_trainer_recompute(const tdm_trainer *t)
{
    return t->o.recompute;
}

int tdm_trainer_split(const tdm_trainer *t)
{
    return t->split;
}

/* Adapter a's trainer_state.json and checkpoint at its current position (the periodic save,
 * the out-of-memory save and the stop save write the same thing). */
static tdm_status save_adapter(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->cfg.output, TDM_TRAINER_STATE_FILE);
    s->ts.global_step = s->step;
    s->ts.epoch = adapter_epoch(s);
    TDM_TRY(tdm_trainer_state_save(&s->ts, path, err));
    return save_checkpoint(t, a, err);
}

/* Where the loop stood before a step: an out-of-memory inside the step rolls back to it, so the
 * checkpoints written for the failure resume exactly at that step. */
/* One adapter as it stood before the step. */
typedef struct adapter_snapshot {
    double credit;
    char *cursor;    /* tdm_train_cursor JSON, NULL when not taken (the adapter was done) */
    bool in_batch;   /* an optimizer batch in progress... */
    int seqs_done;   /* ...with this many of its sequences done... */
    double loss_sum; /* ...and their loss sum; the gradient is in the adapter's d_grad_saved */
} adapter_snapshot;

typedef struct step_snapshot {
    int64_t global_step;
    int rr_next;
    adapter_snapshot *ad; /* (n) */
} step_snapshot;

static void snapshot_free(step_snapshot *ss, int n)
{
    if (ss->ad)
        for (int a = 0; a < n; a++)
            free(ss->ad[a].cursor);
    free(ss->ad);
    memset(ss, 0, sizeof *ss);
}

static tdm_status snapshot_init(step_snapshot *ss, int n, tdm_error *err)
{
    memset(ss, 0, sizeof *ss);
    ss->ad = calloc((size_t)n, sizeof *ss->ad);
    return ss->ad ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
}

static tdm_status snapshot_take(tdm_trainer *t, step_snapshot *ss, tdm_error *err)
{
    ss->global_step = t->global_step;
    ss->rr_next = t->rr_next;
    for (int a = 0; a < t->n; a++) {
        adapter_state *s = &t->ad[a];
        adapter_snapshot *as = &ss->ad[a];
        as->credit = s->credit;
        as->in_batch = in_batch(s);
        as->seqs_done = s->seqs_done;
        as->loss_sum = s->step_loss_sum;
        free(as->cursor);
        as->cursor = NULL;
        if (s->done) continue;
        TDM_TRY(tdm_train_cursor_to_json(s->cur, &as->cursor, err));
        if (!as->in_batch || s->seqs_done == 0) continue;
        /* a partial gradient the step may spoil: keep a device copy (allocated by attach for
         * the adapters that can be here; a batch restored by --resume under another schedule
         * gets one now) */
        size_t bytes = (size_t)s->host.n_params * sizeof(float);
        if (!s->d_grad_saved)
            TDM_TRY(
                tdm_be_alloc(t->be, TDM_BE_F32, s->host.n_params, (void **)&s->d_grad_saved, err));
        TDM_TRY(tdm_be_copy(t->be, s->d_grad_saved, s->dev->grads, bytes, err));
    }
    return TDM_OK;
}

/* A step failed for lack of device memory (another program took it, or the estimate was short):
 * roll back to the snapshot and write a checkpoint of every unfinished adapter, so the run can
 * continue with --resume instead of being lost. Returns the failure, with what was saved. */
static tdm_status checkpoint_after_oom(tdm_trainer *t, const step_snapshot *ss, tdm_error *err)
{
    char cause[sizeof err->message];
    snprintf(cause, sizeof cause, "%s", err->message);
    tdm_error serr = {0};
    tdm_status st = TDM_OK;
    t->global_step = ss->global_step;
    t->rr_next = ss->rr_next;
    for (int a = 0; a < t->n && st == TDM_OK; a++) {
        adapter_state *s = &t->ad[a];
        const adapter_snapshot *as = &ss->ad[a];
        s->credit = as->credit;
        if (s->done) continue;
        if (as->cursor) st = tdm_train_cursor_from_json(s->cur, as->cursor, &serr);
        if (st != TDM_OK) break;
        if (!as->in_batch) { /* a batch drawn by the failed step is drawn again */
            free(s->batch_cursor);
            s->batch_cursor = NULL;
        } else {
            s->seqs_done = as->seqs_done;
            s->step_loss_sum = as->loss_sum;
            if (s->seqs_done > 0)
                st = tdm_be_copy(t->be, s->dev->grads, s->d_grad_saved,
                                 (size_t)s->host.n_params * sizeof(float), &serr);
            if (st != TDM_OK) break;
        }
        st = save_adapter(t, a, &serr);
    }
    if (st != TDM_OK)
        return tdm_fail(err, TDM_ERR_NOMEM,
                        "out of device memory at global step %lld (%s), and the checkpoint that "
                        "should have saved the run failed too: %s",
                        (long long)(t->global_step + 1), cause, serr.message);
    return tdm_fail(err, TDM_ERR_NOMEM,
                    "out of device memory at global step %lld (%s). A checkpoint of every "
                    "unfinished adapter was written at its current step: free GPU memory (see "
                    "`tandem gpu status`) or lower --batch-size/--max-seq-len, then run the same "
                    "command with --resume",
                    (long long)(t->global_step + 1), cause);
}

/* The caller asked to stop (a signal) between two global steps: checkpoint every unfinished
 * adapter where it stands, exactly what a periodic save at this global step writes, so that
 * --resume continues as if nothing had happened. Nothing is written when no step was taken
 * since start_global (the run's start or its resume point: the checkpoints there already hold
 * this position, or there is nothing to save). */
static tdm_status checkpoint_on_stop(tdm_trainer *t, int64_t start_global, tdm_error *err)
{
    int saved = 0;
    for (int a = 0; a < t->n && t->global_step > start_global; a++) {
        /* an adapter that joined at this very boundary has nothing to save either */
        if (t->ad[a].done || own_global(t, &t->ad[a]) == t->ad[a].own_start) continue;
        tdm_status st = save_adapter(t, a, err);
        if (st != TDM_OK) {
            tdm_error_prefix(err, "stopping at global step %lld: the checkpoint failed",
                             (long long)t->global_step);
            return st;
        }
        saved++;
    }
    if (t->global_step == start_global)
        return tdm_fail(err, TDM_ERR_STOPPED,
                        "stopped before the first step of this run (nothing new to save)");
    return tdm_fail(err, TDM_ERR_STOPPED,
                    "stopped after global step %lld; checkpoints of %d unfinished adapter(s) "
                    "written",
                    (long long)t->global_step, saved);
}

static bool any_unfinished(const tdm_trainer *t)
{
    for (int a = 0; a < t->n; a++)
        if (!t->ad[a].done) return true;
    return false;
}

/* Adapter s's checkpoint interval in its own global steps (0: only at its end), capped by
 * opts.max_checkpoint_interval (MPS). */
static int64_t save_interval(const tdm_trainer *t, const adapter_state *s)
{
    int64_t every = s->cfg.save_every, cap = t->o.max_checkpoint_interval;
    return cap > 0 && (every == 0 || every > cap) ? cap : every;
}

/* Adapter a's OUT_DIR exists and holds no half-written checkpoint; its position is step 0. */
static tdm_status prepare_adapter(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    TDM_TRY(tdm_mkdir_p(s->cfg.output, 0777, err));
    TDM_TRY(tdm_atomic_dir_remove_stale(s->cfg.output, NULL, err));
    s->last_val = s->last_train_loss = s->last_grad_norm = NAN;
    s->last_epoch_loss = NAN;
    s->last_lr = tdm_lr_at(&s->sched, 0);
    s->eval_step = -1;
    return TDM_OK;
}

/* A fresh run refuses an OUT_DIR with checkpoints of an earlier one. */
static tdm_status refuse_old_checkpoints(const tdm_trainer *t, int a, tdm_error *err)
{
    int64_t *steps = NULL;
    size_t cnt = 0;
    if (tdm_checkpoint_list(t->ad[a].cfg.output, &steps, &cnt, err) == TDM_OK) free(steps);
    if (cnt > 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s already holds checkpoints of an earlier run: pass --resume "
                        "to continue it, or remove them to start over",
                        t->ad[a].cfg.output);
    return TDM_OK;
}

/* Adapter a starts from scratch: PEFT initialisation from the run's seed, empty records.
 * Refused when OUT_DIR holds the final adapter of an earlier run whose checkpoints are gone
 * (deleted to free space; with them --resume would continue it): training would replace it. */
static tdm_status start_fresh(tdm_trainer *t, int a, tdm_error *err)
{
    adapter_state *s = &t->ad[a];
    char final[4096];
    struct stat sb;
    snprintf(final, sizeof final, "%s/%s", s->cfg.output, TDM_PEFT_WEIGHTS_FILE);
    if (stat(final, &sb) == 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s holds the adapter of an earlier run (%s) and no checkpoint to resume "
                        "from: training from step 0 would replace it; train into a new OUT_DIR, "
                        "or move that adapter away",
                        s->cfg.output, TDM_PEFT_WEIGHTS_FILE);
    tdm_rng_seed(&s->rng, s->cfg.seed);
    if (!s->cfg.init_adapter) tdm_lora_params_init_peft(&s->host, &s->rng);
    TDM_TRY(upload_state(t, s, false, err));
    char mp[4096];
    snprintf(mp, sizeof mp, "%s/%s", s->cfg.output, TDM_METRICS_FILE);
    TDM_TRY(tdm_metrics_truncate_after(mp, -1, NULL, err));
    TDM_TRY(tdm_tfevents_remove(s->cfg.output, err));
    s->tb.path[0] = '\0';
    s->tb_start = s->step + 1;
    s->ts.num_train_epochs = s->cfg.epochs;
    s->ts.max_steps = s->total_steps;
    s->ts.logging_steps = s->cfg.log_every;
    s->ts.eval_steps = s->cfg.eval_every;
    s->ts.save_steps = s->cfg.save_every;
    s->ts.train_batch_size = s->cfg.batch_size;
    return TDM_OK;
}

/* --resume of an adapter without any checkpoint (find_resume): it starts fresh, said once, in
 * the frame of global steps of the adapters that resume. */
static tdm_status start_over(tdm_trainer *t, int a, tdm_error *err)
{
    tdm_warn("%s holds no checkpoint yet: this adapter starts over from step 0 while the "
             "others resume",
             t->ad[a].cfg.output);
    t->ad[a].started_over = true;
    return start_fresh(t, a, err);
}

/* The loop's per-adapter scratch, sized for t->n adapters (adapters may join at a step
 * boundary). */
typedef struct loop_scratch {
    int cap;
    int *part;
    double *ratio;
    bool *stepped, *worked;
} loop_scratch;

static void loop_scratch_free(loop_scratch *ls)
{
    free(ls->part);
    free(ls->ratio);
    free(ls->stepped);
    free(ls->worked);
    memset(ls, 0, sizeof *ls);
}

static tdm_status loop_scratch_fit(loop_scratch *ls, int n, tdm_error *err)
{
    if (n <= ls->cap) return TDM_OK;
    loop_scratch_free(ls);
    ls->part = malloc((size_t)n * sizeof *ls->part);
    ls->ratio = malloc((size_t)n * sizeof *ls->ratio);
    ls->stepped = malloc((size_t)n * sizeof *ls->stepped);
    ls->worked = malloc((size_t)n * sizeof *ls->worked);
    if (!ls->part || !ls->ratio || !ls->stepped || !ls->worked) {
        loop_scratch_free(ls);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    ls->cap = n;
    return TDM_OK;
}

/* A RESUMED event: adapter a starts from checkpoint dir (--resume, or added with resume). */
static void report_resumed(tdm_trainer *t, int a, const char *dir)
{
    if (!t->o.progress) return;
    adapter_state *s = &t->ad[a];
    tdm_trainer_progress p = {.event = TDM_TRAINER_EVENT_RESUMED,
                              .adapter = a,
                              .label = s->task,
                              .global_step = t->global_step,
                              .step = s->step,
                              .total_steps = s->total_steps,
                              .epoch = adapter_epoch(s),
                              .epochs = s->cfg.epochs,
                              .loss = s->last_train_loss,
                              .learning_rate = s->last_lr,
                              .grad_norm = s->last_grad_norm,
                              .val_loss = s->last_val,
                              .tokens_per_sec = NAN,
                              .eta_sec = NAN,
                              .checkpoint = dir,
                              .done = s->done};
    t->o.progress(&p, t->o.progress_user);
}

tdm_status tdm_trainer_run(tdm_trainer *t, tdm_error *err)
{
    int n = t->n;
    if (!t->model) return tdm_fail(err, TDM_ERR_INVALID, "trainer: tdm_trainer_attach first");
    for (int a = 0; a < n; a++)
        TDM_TRY(prepare_adapter(t, a, err));
    bool resumed = false;
    if (t->o.resume) {
        char(*dirs)[4096] = calloc((size_t)n, sizeof *dirs);
        if (!dirs) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        t->global_step = -1;
        tdm_status st = find_resume(t, dirs, &resumed, err);
        for (int a = 0; st == TDM_OK && resumed && a < n; a++) {
            if (!dirs[a][0]) continue;
            st = load_checkpoint(t, a, dirs[a], err);
            if (st != TDM_OK) tdm_error_prefix(err, "--resume %s", dirs[a]);
        }
        for (int a = 0; st == TDM_OK && resumed && a < n; a++)
            st = dirs[a][0] ? (report_resumed(t, a, dirs[a]), TDM_OK) : start_over(t, a, err);
        free(dirs);
        TDM_TRY(st);
    } else {
        for (int a = 0; a < n; a++)
            TDM_TRY(refuse_old_checkpoints(t, a, err));
    }
    if (!resumed) {
        t->global_step = 0;
        for (int a = 0; a < n; a++)
            TDM_TRY(start_fresh(t, a, err));
    }
    /* elapsed_ms counts from here: the first measurement below is part of the run */
    t->t0_ms = now_ms();
    for (int a = 0; a < n; a++)
        t->ad[a].t0_ms = t->t0_ms;
    int64_t start_global = t->global_step;
    /* priority-val-loss needs a first measurement of everyone (a resumed one has it from its
     * checkpoint) */
    if (t->o.schedule == TDM_SCHEDULE_PRIORITY_VAL_LOSS)
        for (int a = 0; a < n; a++)
            if (!resumed || t->ad[a].started_over) TDM_TRY(eval_point(t, a, err));

    for (int a = 0; a < n; a++)
        t->ad[a].epoch_start_ms = t->t0_ms;
    loop_scratch ls = {0};
    step_snapshot snap;
    tdm_status st = snapshot_init(&snap, n, err);
    if (st == TDM_OK) st = loop_scratch_fit(&ls, n, err);
    if (st != TDM_OK) {
        loop_scratch_free(&ls);
        snapshot_free(&snap, n);
        return st;
    }
    fused f = {0};
    for (;;) {
        int np = 0;
        /* between two global steps: the caller adds and detaches adapters here */
        if (t->o.at_step_boundary &&
            (st = t->o.at_step_boundary(t, t->o.at_step_boundary_user, err)) != TDM_OK)
            break;
        if (t->n != n) {
            snapshot_free(&snap, n);
            n = t->n;
            if ((st = snapshot_init(&snap, n, err)) != TDM_OK) break;
            if ((st = loop_scratch_fit(&ls, n, err)) != TDM_OK) break;
        }
        int *part = ls.part;
        double *ratio = ls.ratio;
        bool *stepped = ls.stepped, *worked = ls.worked;
        /* between two global steps, the only place a stop request is honoured */
        if (t->o.stop_requested && any_unfinished(t) &&
            t->o.stop_requested(t->o.stop_requested_user)) {
            st = checkpoint_on_stop(t, start_global, err);
            break;
        }
        if ((st = snapshot_take(t, &snap, err)) != TDM_OK) break;
        if (t->o.schedule == TDM_SCHEDULE_SYNCHRONIZED) {
            /* every active adapter, each with its share of the pass: weight / the largest
             * weight among the active ones */
            double wmax = 0;
            for (int a = 0; a < n; a++)
                if (!t->ad[a].done) wmax = fmax(wmax, t->ad[a].cfg.weight);
            for (int a = 0; a < n; a++)
                if (!t->ad[a].done) {
                    ratio[np] = t->ad[a].cfg.weight / wmax;
                    part[np++] = a;
                }
            if (np == 0) break;
        } else if (t->o.schedule == TDM_SCHEDULE_ROUND_ROBIN) {
            for (int k = 0; k < n; k++) {
                int a = (t->rr_next + k) % n;
                if (!t->ad[a].done) {
                    ratio[np] = 1;
                    part[np++] = a;
                    t->rr_next = (a + 1) % n;
                    break;
                }
            }
            if (np == 0) break;
        } else {
            int a = pick_priority(t);
            if (a < 0) break;
            ratio[np] = 1;
            part[np++] = a;
        }
        t->global_step++;
        double ts0 = now_ms();
        if ((st = train_step(t, part, ratio, np, &f, stepped, worked, err)) != TDM_OK) {
            if (st == TDM_ERR_NOMEM) st = checkpoint_after_oom(t, &snap, err);
            break;
        }
        double dt = now_ms() - ts0;
        for (int a = 0; a < n; a++)
            if (own_global(t, &t->ad[a]) % t->ad[a].cfg.log_every == 0)
                t->ad[a].log_due = !t->ad[a].done;
        for (int p = 0; p < np && st == TDM_OK; p++) {
            int a = part[p];
            adapter_state *s = &t->ad[a];
            if (worked[p]) s->train_ms += dt;
            if (!stepped[p]) continue;
            report(t, a, TDM_TRAINER_EVENT_STEP, s->last_train_loss);
            if (s->step % s->steps_per_epoch == 0) { /* an epoch ended */
                s->last_epoch_loss =
                    s->epoch_tokens > 0 ? s->epoch_loss_sum / (double)s->epoch_tokens : NAN;
                s->epoch_loss_sum = 0;
                s->epoch_tokens = 0;
                double now = now_ms();
                s->last_epoch_ms = now - s->epoch_start_ms;
                s->epoch_start_ms = now;
                st = write_metadata(t, a, err);
            }
        }
        for (int p = 0; p < np && st == TDM_OK; p++) {
            int a = part[p];
            adapter_state *s = &t->ad[a];
            if (!stepped[p]) continue;
            bool last = s->step >= s->total_steps;
            if (s->log_due || last) {
                s->log_due = false;
                st = log_point(t, a, err);
            }
            if (st == TDM_OK && last) st = finish_adapter(t, a, err);
        }
        if (st != TDM_OK) break;
        for (int a = 0; a < n && st == TDM_OK; a++) {
            adapter_state *s = &t->ad[a];
            int64_t g = own_global(t, s);
            /* an adapter that has not stepped since its latest validation (another adapter
             * trained, or its batch spans global steps) would only measure the same loss */
            if (s->done || s->step == s->eval_step) continue;
            if (s->cfg.eval_every > 0 && g % s->cfg.eval_every == 0) st = eval_point(t, a, err);
        }
        for (int a = 0; a < n && st == TDM_OK; a++) {
            adapter_state *s = &t->ad[a];
            int64_t every = save_interval(t, s);
            if (s->done || !(every > 0 && own_global(t, s) % every == 0)) continue;
            st = save_adapter(t, a, err);
        }
        if (st != TDM_OK) break;
    }
    fused_free(&f);
    loop_scratch_free(&ls);
    snapshot_free(&snap, n);
    if (st != TDM_OK && (err->sys_errno == ENOSPC || err->sys_errno == EDQUOT)) {
        size_t l = strlen(err->message);
        snprintf(err->message + l, sizeof err->message - l,
                 ". Free space on that file system, then run the same command with --resume: "
                 "checkpoints are written whole or not at all, so it continues from the last "
                 "complete one");
    }
    return st;
}

/* ------------------------------------------------------- join and leave ---- */

struct tdm_trainer_join {
    tdm_trainer *nt; /* the joining adapters, validated and with their data read; no device */
    bool resume;     /* commit continues each from its own latest checkpoint */
};

void tdm_trainer_join_free(tdm_trainer_join *j)
{
    if (!j) return;
    if (j->nt) j->nt->model = NULL; /* borrowed */
    tdm_trainer_free(j->nt);
    free(j);
}

tdm_status tdm_trainer_join_prepare(const tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                    int n_adapters, bool resume, tdm_trainer_join **out,
                                    char **report, tdm_error *err)
{
    *out = NULL;
    if (report) *report = NULL;
    /* Everything that can fail on the joiner's input happens in a trainer of its own, the way
     * create validates a command's adapters; the running ones are not touched. */
    tdm_trainer *nt = NULL;
    TDM_TRY(tdm_trainer_create(&nt, &t->o, adapters, n_adapters, report, err));
    tdm_status st = TDM_OK;
    for (int a = 0; a < nt->n && st == TDM_OK; a++) {
        for (int b = 0; b < t->n && st == TDM_OK; b++)
            if (!t->ad[b].done && strcmp(t->ad[b].cfg.output, nt->ad[a].cfg.output) == 0)
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "%s is the OUT_DIR of an adapter this trainer is training: give "
                              "each adapter its own",
                              nt->ad[a].cfg.output);
    }
    tdm_trainer_join *j = st == TDM_OK ? calloc(1, sizeof *j) : NULL;
    if (st == TDM_OK && !j) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    if (st != TDM_OK) {
        tdm_trainer_free(nt);
        return st;
    }
    j->nt = nt;
    j->resume = resume;
    *out = j;
    return TDM_OK;
}

tdm_status tdm_trainer_join_estimate(const tdm_trainer *t, const tdm_trainer_join *j,
                                     tdm_be_dtype act, tdm_model_mem *out, tdm_error *err)
{
    return estimate_act(t, true, j ? j->nt : NULL, act, out, err);
}

tdm_status tdm_trainer_join_admit(const tdm_trainer *t, const tdm_trainer_join *j,
                                  const tdm_join_admit_request *req, tdm_join_admission *out,
                                  tdm_error *err)
{
    tdm_join_admit_request r = *req;
    tdm_plan_adapter *ads = NULL;
    int n = 0;
    TDM_TRY(fit_request(t, true, j ? j->nt : NULL, req->fit.act, &r.fit, &ads, &n, err));
    r.fit.context_mb = req->fit.context_mb;
    r.fit.scratch_floor = req->fit.scratch_floor;
    tdm_status st = tdm_memory_plan_admit(&r, out, err);
    free_plan_adapters(ads, n);
    return st;
}

tdm_status tdm_trainer_leave_replan(const tdm_trainer *t, const tdm_leave_replan_request *req,
                                    tdm_leave_replan *out, tdm_error *err)
{
    tdm_leave_replan_request r = *req;
    tdm_plan_adapter *ads = NULL;
    int n = 0;
    TDM_TRY(fit_request(t, true, NULL, req->fit.act, &r.fit, &ads, &n, err));
    r.fit.context_mb = req->fit.context_mb;
    r.fit.scratch_floor = req->fit.scratch_floor;
    r.grad_checkpoint = t->o.grad_checkpoint;
    r.recompute = t->o.recompute;
    r.split = t->split;
    tdm_status st = n > 0 ? tdm_memory_plan_after_leave(&r, out, err)
                          : tdm_fail(err, TDM_ERR_INVALID, "memory plan: no adapter training");
    free_plan_adapters(ads, n);
    return st;
}

tdm_status tdm_trainer_join_commit(tdm_trainer *t, tdm_trainer_join *j, int *first,
                                   tdm_error *err)
{
    if (first) *first = t->n;
    if (!t->model) {
        tdm_trainer_join_free(j);
        return tdm_fail(err, TDM_ERR_INVALID, "trainer: tdm_trainer_attach first");
    }
    tdm_trainer *nt = j->nt;
    tdm_status st = TDM_OK;
    nt->be = t->be;
    nt->model = t->model;
    nt->mcfg = t->mcfg;
    for (int a = 0; a < nt->n && st == TDM_OK; a++)
        st = attach_adapter(nt, &nt->ad[a], err);
    for (int a = 0; a < nt->n && st == TDM_OK; a++)
        st = prepare_adapter(nt, a, err);
    /* with resume, the resume point of these adapters alone (as --resume of their own command
     * finds it): nt's global step becomes their own global step there */
    bool resumed = false;
    char(*dirs)[4096] = NULL;
    if (st == TDM_OK && j->resume) {
        if (!(dirs = calloc((size_t)nt->n, sizeof *dirs)))
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        nt->global_step = -1;
        if (st == TDM_OK) st = find_resume(nt, dirs, &resumed, err);
        for (int a = 0; st == TDM_OK && resumed && a < nt->n; a++) {
            if (!dirs[a][0]) continue;
            st = load_checkpoint(nt, a, dirs[a], err);
            if (st != TDM_OK) tdm_error_prefix(err, "--resume %s", dirs[a]);
        }
        for (int a = 0; st == TDM_OK && resumed && a < nt->n; a++)
            if (!dirs[a][0]) st = start_over(nt, a, err);
    } else {
        for (int a = 0; a < nt->n && st == TDM_OK; a++)
            st = refuse_old_checkpoints(nt, a, err);
    }
    if (st == TDM_OK && !resumed) {
        nt->global_step = 0;
        for (int a = 0; a < nt->n && st == TDM_OK; a++)
            st = start_fresh(nt, a, err);
    }
    adapter_state *grown = NULL;
    if (st == TDM_OK) {
        grown = realloc(t->ad, (size_t)(t->n + nt->n) * sizeof *grown);
        if (!grown)
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        else
            t->ad = grown;
    }
    if (st == TDM_OK) st = alloc_clip_scratch(t, t->n + nt->n, err);
    if (st != TDM_OK) {
        tdm_trainer_join_free(j);
        free(dirs);
        return st;
    }
    double now = now_ms();
    for (int a = 0; a < nt->n; a++) {
        adapter_state *s = &t->ad[t->n + a];
        *s = nt->ad[a];
        /* its own global step continues from its resume point (0 when fresh) */
        s->global0 = t->global_step - nt->global_step;
        s->own_start = nt->global_step;
        s->t0_ms = s->epoch_start_ms = now;
    }
    int old_n = t->n;
    t->n += nt->n;
    nt->n = 0;
    tdm_trainer_join_free(j);
    for (int a = old_n; resumed && a < t->n; a++)
        if (dirs[a - old_n][0]) report_resumed(t, a, dirs[a - old_n]);
    free(dirs);
    /* the fused step is larger now: hold its activations from here (as attach does) */
    tdm_model_mem_plan plan;
    st = memory_plan(t, &plan, err);
    if (st == TDM_OK) st = tdm_model_reserve(t->model, &plan, err);
    /* a resumed one has its measurement from its checkpoint, as --resume alone does */
    if (st == TDM_OK && t->o.schedule == TDM_SCHEDULE_PRIORITY_VAL_LOSS)
        for (int a = old_n; a < t->n && st == TDM_OK; a++)
            if (!resumed || t->ad[a].started_over) st = eval_point(t, a, err);
    if (st != TDM_OK) {
        /* they are in the array already: hand them back, untrained, so the running ones go on */
        for (int a = old_n; a < t->n; a++) {
            t->ad[a].done = t->ad[a].detached = true;
            tdm_lora_free(t->ad[a].dev);
            t->ad[a].dev = NULL;
        }
        return st;
    }
    return TDM_OK;
}

/* Adds adapters (fresh, or with resume from their own latest common checkpoint): prepare and
 * commit at once. */
static tdm_status add_adapters(tdm_trainer *t, const tdm_trainer_adapter *adapters, int n_adapters,
                               bool resume, int *first, char **report, tdm_error *err)
{
    if (first) *first = t->n;
    if (report) *report = NULL;
    if (!t->model) return tdm_fail(err, TDM_ERR_INVALID, "trainer: tdm_trainer_attach first");
    tdm_trainer_join *j = NULL;
    TDM_TRY(tdm_trainer_join_prepare(t, adapters, n_adapters, resume, &j, report, err));
    return tdm_trainer_join_commit(t, j, first, err);
}

tdm_status tdm_trainer_add_adapters(tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                    int n_adapters, int *first, char **report, tdm_error *err)
{
    return add_adapters(t, adapters, n_adapters, false, first, report, err);
}

tdm_status tdm_trainer_add_adapters_resume(tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                           int n_adapters, int *first, char **report,
                                           tdm_error *err)
{
    return add_adapters(t, adapters, n_adapters, true, first, report, err);
}

tdm_status tdm_trainer_shrink(tdm_trainer *t, tdm_error *err)
{
    if (!t->model) return TDM_OK;
    for (int a = 0; a < t->n; a++) {
        adapter_state *s = &t->ad[a];
        if (!s->done) continue;
        tdm_be_free(t->be, s->d_grad_saved);
        s->d_grad_saved = NULL;
        tdm_lora_free(s->dev);
        s->dev = NULL;
    }
    tdm_model_mem_plan plan;
    TDM_TRY(memory_plan(t, &plan, err));
    return tdm_model_fit(t->model, &plan, err);
}

tdm_status tdm_trainer_detach_adapter(tdm_trainer *t, int a, tdm_error *err)
{
    if (a < 0 || a >= t->n) return tdm_fail(err, TDM_ERR_INVALID, "trainer: no adapter %d", a);
    adapter_state *s = &t->ad[a];
    if (s->detached || s->done) return TDM_OK;
    /* a checkpoint at its position, unless it has not stepped since it joined or resumed (then
     * there is nothing new: --resume starts where its checkpoints already are) */
    if (own_global(t, s) > s->own_start) TDM_TRY(save_adapter(t, a, err));
    s->done = s->detached = true;
    tdm_be_free(t->be, s->d_grad_saved);
    s->d_grad_saved = NULL;
    tdm_lora_free(s->dev);
    s->dev = NULL;
    return TDM_OK;
}

bool tdm_trainer_adapter_detached(const tdm_trainer *t, int a)
{
    return t->ad[a].detached;
}

int tdm_trainer_adapter_count(const tdm_trainer *t)
{
    return t->n;
}
