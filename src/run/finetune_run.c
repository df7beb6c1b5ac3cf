/* finetune_run.c — the flow of one finetune run (finetune_run.h). */
#include "run/finetune_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/op_profile.h"
#include "run/cotrain_run.h"
#include "run/output_claim.h"
#include "train/adapters_config.h"
#include "train/memory_plan.h"
#include "util/path_identity.h"

/* Keeps s (malloc'd, may be NULL) in o, to be freed with the list; returns it, or NULL (s freed)
 * when out of memory. */
static const char *keep_owned(tdm_run_adapters *o, char *s)
{
    if (s && o->n_owned == o->cap_owned) {
        size_t cap = o->cap_owned ? 2 * o->cap_owned : 16;
        char **v = realloc(o->owned, cap * sizeof *v);
        if (!v) {
            free(s);
            return NULL;
        }
        o->owned = v;
        o->cap_owned = cap;
    }
    if (s) o->owned[o->n_owned++] = s;
    return s;
}

/* path as written when absolute, else base_dir/path; the copy is kept in o. NULL when out of
 * memory. */
static const char *owned_path(tdm_run_adapters *o, const char *base_dir, const char *path)
{
    char *out;
    if (path[0] == '/' || !base_dir[0] || !strcmp(base_dir, "."))
        out = strdup(path);
    else if (asprintf(&out, "%s/%s", base_dir, path) < 0)
        out = NULL;
    return keep_owned(o, out);
}

/* Every adapter of an adapters.toml: the table's keys over the run's defaults. Relative paths
 * are relative to the file's own directory (as `tandem submit` resolves them). */
static tdm_status adapters_from_config(const tdm_adapters_config *acfg, const char *config_file,
                                       const tdm_trainer_adapter *defaults,
                                       tdm_trainer_adapter *ads, tdm_run_adapters *owned,
                                       tdm_error *err)
{
    char config_dir[4096];
    snprintf(config_dir, sizeof config_dir, "%s", config_file);
    char *slash = strrchr(config_dir, '/');
    if (slash)
        *(slash == config_dir ? slash + 1 : slash) = '\0';
    else
        config_dir[0] = '\0';
    for (size_t a = 0; a < acfg->n_adapters; a++) {
        const tdm_adapter_spec *s = &acfg->adapters[a];
        tdm_trainer_adapter *t = &ads[a];
        *t = *defaults;
        t->data = owned_path(owned, config_dir, s->data);
        char *origin; /* "adapters.toml:LINE" of its data key, for an error reading the file */
        if (asprintf(&origin, "%s:%u", acfg->file, s->key_line[TDM_ADAPTER_KEY_DATA]) < 0)
            origin = NULL;
        t->data_origin = keep_owned(owned, origin);
        t->output = owned_path(owned, config_dir, s->output);
        t->label = s->label;
        if (s->init_adapter) t->init_adapter = owned_path(owned, config_dir, s->init_adapter);
        if (!t->data || !t->data_origin || !t->output || (s->init_adapter && !t->init_adapter))
            return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        if (s->has_rank) t->rank = s->rank;
        if (s->has_alpha) t->alpha = s->alpha;
        if (s->has_targets) t->targets = s->targets;
        if (s->has_learning_rate) t->lr = s->learning_rate;
        if (s->has_epochs) t->epochs = s->epochs;
        if (s->has_batch_size) t->batch_size = s->batch_size;
        if (s->has_max_seq_len) t->max_seq_len = s->max_seq_len;
        if (s->has_weight) t->weight = s->weight;
        if (s->has_lora_dropout) t->lora_dropout = s->lora_dropout;
        if (s->has_seed) t->seed = s->seed;
        if (s->has_grad_accum) t->grad_accum = s->grad_accum;
        if (s->has_lr_schedule) t->lr_kind = s->lr_schedule;
        if (s->has_warmup_steps) t->warmup_steps = s->warmup_steps;
        if (s->has_weight_decay) t->weight_decay = s->weight_decay;
        if (s->has_max_grad_norm) t->max_grad_norm = s->max_grad_norm;
        if (s->has_val_split) t->val_split = s->val_split;
        if (s->has_eval_every) t->eval_every = s->eval_every;
        if (s->has_save_every) t->save_every = s->save_every;
        if (s->has_save_total_limit) t->save_total_limit = s->save_total_limit;
        if (s->has_log_every) t->log_every = s->log_every;
        if (s->has_task) t->task = s->task;
        if (s->has_chat_template)
            t->chat_template = s->chat_template, t->chat_template_given = true;
        if (s->has_train_on_prompt) t->train_on_prompt = s->train_on_prompt;
        if (s->has_skip_bad_lines) t->skip_bad_lines = s->skip_bad_lines;
        if (s->has_no_shuffle) t->shuffle = !s->no_shuffle;
        if (t->max_seq_len < 2)
            return tdm_fail(err, TDM_ERR_INVALID, "%s:%u: max_seq_len must be >= 2", acfg->file,
                            s->key_line[TDM_ADAPTER_KEY_MAX_SEQ_LEN]);
    }
    return TDM_OK;
}

/* --adapter DATA.jsonl:OUT_DIR, split at the first ':' in place. */
static tdm_status adapters_from_flags(tdm_run_opts *o, tdm_trainer_adapter *ads, tdm_error *err)
{
    for (size_t a = 0; a < o->n_adapter_args; a++) {
        char *arg = (char *)o->adapter_args[a];
        char *colon = strchr(arg, ':');
        if (!colon || colon == arg || !colon[1])
            return tdm_fail(err, TDM_ERR_INVALID,
                            "finetune: --adapter '%s': expected DATA.jsonl:OUT_DIR", arg);
        *colon = 0;
        ads[a] = o->adapter;
        ads[a].data = arg;
        ads[a].output = colon + 1;
    }
    /* Two OUT_DIRs that are one directory ("out/a", "./out/a/", "x/../out/a", a symbolic link)
     * would train both adapters into it and lose one; adapters.toml is checked by its loader. */
    char ka[TDM_PATH_IDENTITY_MAX], kb[TDM_PATH_IDENTITY_MAX];
    for (size_t a = 0; a < o->n_adapter_args; a++) {
        if (tdm_path_identity(NULL, ads[a].output, ka, sizeof ka, err) != TDM_OK) {
            tdm_error_prefix(err, "finetune: --adapter #%zu", a + 1);
            return TDM_ERR_INVALID;
        }
        for (size_t b = 0; b < a; b++)
            if (tdm_path_identity(NULL, ads[b].output, kb, sizeof kb, err) == TDM_OK &&
                !strcmp(ka, kb))
                return tdm_fail(err, TDM_ERR_INVALID,
                                "finetune: --adapter #%zu (%s:%s) and --adapter #%zu (%s:%s) write "
                                "the same OUT_DIR; give each adapter its own",
                                b + 1, ads[b].data, ads[b].output, a + 1, ads[a].data,
                                ads[a].output);
    }
    return TDM_OK;
}

/* --vram auto on a GPU: the first plan of the run that fits the budget it can get
 * (tdm_device_budget_query; train/memory_plan.h for the order), applied to the trainer and said
 * in one line when it is not the plan as asked. When none fits that budget the smallest is
 * taken and waits for the memory held outside the ledger; when the smallest exceeds every GPU's
 * reservable capacity the run fails at once (TDM_ERR_NEVER_FITS, exit 1) naming the budget it
 * would need. Under tandem gpu run the budget is its reservation, which the user chose: when
 * nothing fits it the smallest plan is trained with a warning (gpu run reports the overrun), as
 * the plan as asked was before plans were fitted. */
static tdm_status fit_memory_plan(tdm_trainer *tr, const tdm_run_opts *o, tdm_error *err)
{
    if (o->device.vram_gib > 0) return TDM_OK; /* --vram GB: the plan as asked, in GB */
    tdm_device_budget b;
    TDM_TRY(tdm_device_budget_query(&o->device, &b, err));
    if (!b.gpu || b.budget_mb < 0) return TDM_OK;
    tdm_memory_fit fit;
    TDM_TRY(tdm_trainer_memory_fit(tr, TDM_BE_BF16, b.budget_mb, TDM_CUDA_CONTEXT_MIB, &fit, err));
    char chosen[256], smallest[256];
    tdm_memory_plan_describe(&fit.chosen, chosen, sizeof chosen);
    tdm_memory_plan_describe(&fit.smallest, smallest, sizeof smallest);
    if (!fit.fits && b.adopted) {
        if (o->device.note) {
            char line[1024];
            snprintf(line, sizeof line,
                     "warning: --vram auto: this run needs at least %lld MiB (its smallest plan: "
                     "%s), more than the %lld MiB of the reservation %s of tandem gpu run on %s; "
                     "training the smallest plan over it (ask gpu run for --vram %.1f or more)",
                     (long long)fit.smallest.mb, smallest, (long long)b.budget_mb,
                     getenv("TANDEM_RESERVATION_ID"), b.gpu_uuid,
                     ceil((double)fit.smallest.mb / 102.4) / 10.0);
            o->device.note(line, o->device.note_user);
        }
    } else if (fit.smallest.mb > b.capacity_mb) {
        return tdm_fail(err, TDM_ERR_NEVER_FITS,
                        "--vram auto: this run needs at least %lld MiB (its smallest plan: %s), "
                        "more than any GPU here may reserve: the largest, %s, has %lld MiB, of "
                        "which tandem may reserve %.0f%% = %lld MiB. Lower --max-seq-len, "
                        "--batch-size, --rank or the number of adapters, use a larger GPU, or "
                        "raise TANDEM_RESERVE_FACTOR",
                        (long long)fit.smallest.mb, smallest, b.capacity_gpu,
                        (long long)b.capacity_total_mb, b.reserve_factor * 100,
                        (long long)b.capacity_mb);
    }
    char where[400];
    snprintf(where, sizeof where, "%lld MiB this run can get on %s (%s)%s", (long long)b.budget_mb,
             b.gpu_uuid, b.gpu_name, b.adopted ? ", the reservation of tandem gpu run" : "");
    if (b.outside_mb > 0 && !b.adopted) {
        size_t l = strlen(where);
        snprintf(where + l, sizeof where - l, " with %lld MiB held outside the ledger",
                 (long long)b.outside_mb);
    }
    if (!fit.fits && !b.adopted) {
        if (o->device.note) {
            char line[1024];
            snprintf(line, sizeof line,
                     "--vram auto: no plan of this run fits the %s; its smallest, %s, needs %lld "
                     "MiB: it can start only when memory held outside the ledger is freed",
                     where, smallest, (long long)fit.smallest.mb);
            o->device.note(line, o->device.note_user);
        }
    } else if (fit.fits && fit.chosen.rung != TDM_PLAN_AS_ASKED && o->device.note) {
        char line[1024];
        snprintf(line, sizeof line,
                 "--vram auto: the plan as asked needs %lld MiB, more than the %s: using %s, "
                 "%lld MiB",
                 (long long)fit.asked.mb, where, chosen, (long long)fit.chosen.mb);
        o->device.note(line, o->device.note_user);
    }
    return tdm_trainer_set_memory_plan(tr, fit.chosen.grad_checkpoint, fit.chosen.recompute,
                                       fit.chosen.split, err);
}

/* On the CPU, before anything is loaded: the first plan of the run that fits the memory it may
 * use (tdm_device_cpu_memory_limit: the machine's or the cgroup's limit, not what is available
 * this moment, so the plan, and with it the result to float rounding, does not depend on what
 * other processes hold), in tdm_memory_plan_fit's order: the plan as asked, gradient
 * checkpointing, then micro-batches with accumulation. Applied to the trainer and said in one
 * line when it is not the plan as asked, then the need against what is available
 * (tdm_device_cpu_memory_note); when even the smallest exceeds the limit the run fails at once
 * (TDM_ERR_NEVER_FITS, exit 1) naming what it would need. An unknown limit: the plan as asked,
 * with a note. */
static tdm_status fit_cpu_memory_plan(tdm_trainer *tr, const tdm_run_opts *o, tdm_error *err)
{
    tdm_cpu_memory m;
    tdm_error why = {0};
    bool known = tdm_device_cpu_memory_limit(&m, &why) == TDM_OK;
    tdm_memory_fit fit;
    TDM_TRY(tdm_trainer_memory_fit(tr, TDM_BE_F32, known ? m.limit_mb : INT64_MAX / 4,
                                   TDM_CPU_PROCESS_MIB, &fit, err));
    char chosen[256], smallest[256];
    tdm_memory_plan_describe(&fit.chosen, chosen, sizeof chosen);
    tdm_memory_plan_describe(&fit.smallest, smallest, sizeof smallest);
    if (!fit.fits)
        return tdm_fail(err, TDM_ERR_NEVER_FITS,
                        "--device cpu: this run needs at least %lld MiB (its smallest plan: %s; "
                        "as asked %lld MiB), more than %s. Use --method qlora, a lower "
                        "--max-seq-len or --batch-size, fewer adapters, or a larger machine",
                        (long long)fit.smallest.mb, smallest, (long long)fit.asked.mb, m.where);
    if (fit.chosen.rung != TDM_PLAN_AS_ASKED && o->device.note) {
        char line[1024];
        snprintf(line, sizeof line,
                 "cpu memory: the plan as asked needs %lld MiB, more than %s: using %s, %lld MiB",
                 (long long)fit.asked.mb, m.where, chosen, (long long)fit.chosen.mb);
        o->device.note(line, o->device.note_user);
    }
    tdm_device_cpu_memory_note(&o->device, known ? &m : NULL, why.message, &fit.chosen.est);
    return tdm_trainer_set_memory_plan(tr, fit.chosen.grad_checkpoint, fit.chosen.recompute,
                                       fit.chosen.split, err);
}

/* One line on the base's load: at 7B it is the wait before anyone's first step (a joiner's too). */
static void note_load_times(const tdm_trainer *tr, const tdm_run_opts *o)
{
    if (!o->device.note) return;
    const tdm_model_load_times *lt = tdm_model_get_load_times(tdm_trainer_model(tr));
    char line[256];
    snprintf(line, sizeof line,
             "base loaded in %.1f s (read %.1f s, quantize %.1f s, upload %.1f s)", lt->total_s,
             lt->read_s, lt->quantize_s, lt->upload_s);
    o->device.note(line, o->device.note_user);
}

/* Device open, attach, train, record the memory. Frees tr (before the backend it lives on);
 * ends the co-training service srv (NULL: none) while the trainer still exists. */
static tdm_status train(tdm_trainer *tr, const tdm_trainer_adapter *ads, int n, tdm_run_opts *o,
                        const tdm_finetune_hooks *hooks, tdm_cotrain_serving *srv,
                        bool *take_over, char **bad_lines, tdm_error *err)
{
    *take_over = false;
    tdm_device dev;
    tdm_model_mem est;
    tdm_status st = TDM_OK;
    bool cpu = o->device.device && !strcmp(o->device.device, "cpu");
    if ((!cpu && (st = fit_memory_plan(tr, o, err)) != TDM_OK) ||
        (!cpu && (st = tdm_trainer_memory_estimate(tr, &est, err)) != TDM_OK) ||
        (st = tdm_device_open(&dev, &o->device, cpu ? NULL : &est, err)) != TDM_OK) {
        tdm_cotrain_serve_end(srv, st, err);
        tdm_trainer_free(tr);
        return st;
    }
    /* a CPU run fits its plan to the machine's memory before it loads anything (the GPU's is
     * the ledger's) */
    if (!dev.gpu && (st = fit_cpu_memory_plan(tr, o, err)) != TDM_OK) goto out;
    /* a GPU run hosts on the GPU it reserved, or joins the host that took it meanwhile */
    bool join_instead = false;
    if ((st = tdm_cotrain_serve_open(srv, &dev, &join_instead, err)) != TDM_OK) goto out;
    if (join_instead) {
        tdm_trainer_free(tr);
        tdm_device_close(&dev);
        st = tdm_cotrain_serve_join(srv, o, ads, n, hooks, take_over, bad_lines, err);
        tdm_cotrain_serve_end(srv, st, err);
        return st;
    }
    if (o->profile_ops && (st = tdm_be_profile_enable(dev.be, true, err)) != TDM_OK) goto out;
    if ((st = tdm_trainer_attach(tr, dev.be, err)) != TDM_OK) goto out;
    tdm_device_record_actual(&dev, false, NULL, NULL);
    note_load_times(tr, o);
    tdm_run_adapter_info *info = calloc((size_t)n, sizeof *info);
    if (!info) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int a = 0; a < n; a++) {
        info[a].data = ads[a].data;
        info[a].output = ads[a].output;
        tdm_trainer_adapter_info(tr, a, &info[a].n_train, &info[a].n_val, &info[a].total_steps);
    }
    if (hooks && hooks->started) hooks->started(info, n, hooks->user);
    free(info);
    st = tdm_trainer_run(tr, err);
    tdm_cotrain_serve_end(srv, st, err); /* joiners told, host stopped */
    srv = NULL;
    if (dev.gpu) {
        /* The figures that calibrate --vram auto: what was reserved against the peak. */
        int64_t proc_mb, peak_mb;
        tdm_device_record_actual(&dev, true, &proc_mb, &peak_mb);
        if (peak_mb >= 0 && o->device.note) {
            char line[256];
            snprintf(line, sizeof line,
                     "device memory: reserved %lld MiB, peak %lld MiB (backend), process %lld MiB "
                     "(NVML)",
                     (long long)dev.budget_mb, (long long)peak_mb, (long long)proc_mb);
            o->device.note(line, o->device.note_user);
        }
    } else if (st == TDM_OK) {
        tdm_device_cpu_memory_end_note(&o->device, dev.be); /* beside the start's plan */
    }
    /* The table covers loading too (uploads), then every training and evaluation step. */
    if (o->profile_ops && hooks && hooks->profile_out)
        tdm_be_profile_report(dev.be, hooks->profile_out);
out:
    tdm_cotrain_serve_end(srv, st, err);
    tdm_trainer_free(tr);
    tdm_device_close(&dev);
    return st;
}

tdm_status tdm_run_adapters_load(tdm_run_opts *o, tdm_run_adapters *l, tdm_error *err)
{
    memset(l, 0, sizeof *l);
    if (!o->n_adapter_args && !o->adapters_config)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: no adapter given: give --adapter DATA.jsonl:OUT_DIR (one or "
                        "more) or --adapters-config FILE");
    if (o->n_adapter_args && o->adapters_config)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: give --adapter DATA.jsonl:OUT_DIR (one or more) or "
                        "--adapters-config FILE, not both");
    tdm_status st;
    l->n = (int)o->n_adapter_args;
    if (o->adapters_config) {
        if ((st = tdm_adapters_config_load(o->adapters_config, &l->acfg, err)) != TDM_OK) {
            /* a mistake in the file is a usage error (exit 2); a file that cannot be read (a
             * FIFO, a directory, no permission) is a runtime one (exit 1) */
            if (err->status != TDM_ERR_IO) err->status = TDM_ERR_INVALID;
            return err->status;
        }
        l->n = (int)l->acfg.n_adapters;
    }
    l->ads = calloc((size_t)l->n + 1, sizeof *l->ads);
    if (!l->ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    return o->adapters_config
               ? adapters_from_config(&l->acfg, o->adapters_config, &o->adapter, l->ads, l, err)
               : adapters_from_flags(o, l->ads, err);
}

void tdm_run_adapters_free(tdm_run_adapters *l)
{
    free(l->ads);
    for (size_t i = 0; i < l->n_owned; i++)
        free(l->owned[i]);
    free(l->owned);
    tdm_adapters_config_free(&l->acfg);
    memset(l, 0, sizeof *l);
}

/* --adapter-subset I,J,...: keeps those adapters (0-based, each once, in the list's order). */
static tdm_status apply_subset(const char *list, tdm_run_adapters *l, tdm_error *err)
{
    tdm_trainer_adapter *keep = calloc((size_t)l->n + 1, sizeof *keep);
    bool *taken = calloc((size_t)l->n + 1, sizeof *taken);
    if (!keep || !taken) {
        free(keep);
        free(taken);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    int n = 0;
    const char *p = list;
    tdm_status st = TDM_OK;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 0 || v >= l->n || taken[v]) {
            st = tdm_fail(err, TDM_ERR_INVALID,
                          "--adapter-subset '%s': needs distinct adapter indices 0..%d", list,
                          l->n - 1);
            break;
        }
        taken[v] = true;
        keep[n++] = l->ads[v];
        p = *end ? end + 1 : end;
    }
    if (st == TDM_OK && !n)
        st = tdm_fail(err, TDM_ERR_INVALID, "--adapter-subset: no adapter given");
    if (st == TDM_OK) {
        memcpy(l->ads, keep, (size_t)n * sizeof *keep);
        l->n = n;
    }
    free(keep);
    free(taken);
    return st;
}

tdm_status tdm_run_finetune(tdm_run_opts *o, const tdm_finetune_hooks *hooks, char **bad_lines,
                            tdm_error *err)
{
    *bad_lines = NULL;
    if (o->device.gpu_share_given && !o->device.mps.enabled)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: --gpu-share only applies with --experimental-mps");
    if (o->no_join && o->join_require)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: --no-join and --join require contradict each other (--no-join "
                        "never joins, --join require fails without a finetune to join): keep one");
    if (o->trainer.base_fp8 && !o->trainer.nf4)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: --base-compute fp8 needs --method qlora (the FP8 weights are "
                        "made from the NF4 ones)");
    o->device.base_fp8 = o->trainer.base_fp8;
    tdm_run_adapters l;
    tdm_status st = tdm_run_adapters_load(o, &l, err);
    if (st == TDM_OK && o->adapter_subset) st = apply_subset(o->adapter_subset, &l, err);
    if (st != TDM_OK) goto out;
    tdm_trainer_adapter *ads = l.ads;
    int n = l.n;
    /* one run writes an OUT_DIR at a time (output_claim.h): before joining or loading */
    tdm_output_claims claims;
    if ((st = tdm_output_claims_take(&claims, ads, n, err)) != TDM_OK) goto out;
    tdm_run_context rc = tdm_run_context_for(&o->device.mps);
    if (strcmp(o->device.device, "cpu") && rc.max_checkpoint_interval_steps > 0)
        o->trainer.max_checkpoint_interval = rc.max_checkpoint_interval_steps;
    /* co-training: join a running finetune of this base (the run happens there), or serve as
     * the host others join; before any weights are loaded. A GPU run that gave its reservation
     * back to join a host found at device open goes round again when that host dies (--resume)
     * or ends before admitting it: elect anew, reserve anew (tdm_cotrain_serve_join). */
    const tdm_trainer_opts plain = o->trainer; /* before the host's service hooks its fields */
    for (;;) {
        tdm_cotrain_serving *srv = NULL;
        bool joined = false, take_over = false;
        st = tdm_cotrain_run_start(o, ads, n, hooks, &srv, &joined, bad_lines, err);
        if (st != TDM_OK || joined) break;
        if (srv) tdm_cotrain_serve_hook(srv, &o->trainer, ads, n);
        /* data and shapes: nothing written yet, no device touched */
        tdm_trainer *tr = NULL;
        if ((st = tdm_trainer_create(&tr, &o->trainer, ads, n, bad_lines, err)) != TDM_OK) {
            tdm_cotrain_serve_end(srv, st, err);
            break;
        }
        st = train(tr, ads, n, o, hooks, srv, &take_over, bad_lines, err);
        if (!take_over) break;
        bool resume = o->trainer.resume; /* set when the host died after admitting them */
        o->trainer = plain;
        o->trainer.resume = resume;
    }
    tdm_output_claims_release(&claims);
out:
    tdm_run_adapters_free(&l);
    return st;
}
