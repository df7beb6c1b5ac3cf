/* trainer_bridge.c — trainer structs <-> co-training messages (contract in trainer_bridge.h). */
#include "cotrain/trainer_bridge.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/proc_identity.h"

tdm_status tdm_cotrain_run_opts_from_trainer(const tdm_trainer_opts *o,
                                             const tdm_trainer_adapter *a,
                                             tdm_cotrain_run_opts *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->task = strdup(a->task ? a->task : "instruct");
    if (!out->task) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    out->chat_template_given = a->chat_template_given;
    out->chat_template = a->chat_template;
    out->train_on_prompt = a->train_on_prompt;
    out->skip_bad_lines = a->skip_bad_lines;
    out->weight_decay = a->weight_decay;
    out->max_grad_norm = a->max_grad_norm;
    out->lr_kind = a->lr_kind;
    out->warmup_steps = a->warmup_steps;
    out->grad_accum = a->grad_accum;
    out->seed = a->seed;
    out->shuffle = a->shuffle;
    out->val_split = a->val_split;
    out->eval_every = a->eval_every;
    out->save_every = a->save_every;
    out->log_every = a->log_every;
    out->save_total_limit = a->save_total_limit;
    out->schedule = o->schedule;
    out->resume = o->resume;
    return TDM_OK;
}

/* The per-adapter training options of a join (strings borrowed from r) into a. */
static void adapter_opts_from_msg(const tdm_cotrain_run_opts *r, tdm_trainer_adapter *a)
{
    a->task = r->task;
    a->chat_template_given = r->chat_template_given;
    a->chat_template = r->chat_template;
    a->train_on_prompt = r->train_on_prompt;
    a->skip_bad_lines = r->skip_bad_lines;
    a->weight_decay = r->weight_decay;
    a->max_grad_norm = r->max_grad_norm;
    a->lr_kind = r->lr_kind;
    a->warmup_steps = r->warmup_steps;
    a->grad_accum = r->grad_accum;
    a->seed = r->seed;
    a->shuffle = r->shuffle;
    a->val_split = r->val_split;
    a->eval_every = r->eval_every;
    a->save_every = r->save_every;
    a->log_every = r->log_every;
    a->save_total_limit = r->save_total_limit;
}

void tdm_cotrain_run_opts_free(tdm_cotrain_run_opts *o)
{
    free(o->task);
    memset(o, 0, sizeof *o);
}

tdm_status tdm_cotrain_absolute_path(const char *path, char *buf, size_t size, tdm_error *err)
{
    char joined[2 * PATH_MAX];
    if (!path || !*path) return tdm_fail(err, TDM_ERR_INVALID, "empty path");
    if (path[0] == '/') {
        if (strlen(path) >= sizeof joined)
            return tdm_fail(err, TDM_ERR_INVALID, "path too long: %.200s", path);
        strcpy(joined, path);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot read the working directory");
        if ((size_t)snprintf(joined, sizeof joined, "%s/%s", cwd, path) >= sizeof joined)
            return tdm_fail(err, TDM_ERR_INVALID, "path too long: %.200s", path);
    }
    /* Lexical normalization, component by component, into buf. */
    size_t len = 0;
    const char *p = joined;
    while (*p) {
        while (*p == '/')
            p++;
        const char *e = p;
        while (*e && *e != '/')
            e++;
        size_t n = (size_t)(e - p);
        if (n == 0 || (n == 1 && p[0] == '.')) {
            /* skip */
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (len > 0 && buf[len - 1] != '/')
                len--;
            if (len > 0) len--; /* the slash before the removed component */
        } else {
            if (len + 1 + n + 1 > size)
                return tdm_fail(err, TDM_ERR_INVALID, "path too long: %.200s", path);
            buf[len++] = '/';
            memcpy(buf + len, p, n);
            len += n;
        }
        p = e;
    }
    if (len == 0) {
        if (size < 2) return tdm_fail(err, TDM_ERR_INVALID, "path buffer too small");
        buf[len++] = '/';
    }
    buf[len] = '\0';
    return TDM_OK;
}

static tdm_status abs_dup(const char *path, char **out, tdm_error *err)
{
    *out = NULL;
    if (!path) return TDM_OK;
    char buf[PATH_MAX];
    tdm_status st = tdm_cotrain_absolute_path(path, buf, sizeof buf, err);
    if (st != TDM_OK) return st;
    *out = strdup(buf);
    return *out ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
}

tdm_status tdm_cotrain_join_from_trainer(const tdm_trainer_opts *o,
                                         const tdm_trainer_adapter *adapters, int n,
                                         const char *identity, tdm_cotrain_msg *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || n > TDM_COTRAIN_MAX_ADAPTERS)
        return tdm_fail(err, TDM_ERR_INVALID, "a join carries 1 to %d adapters, not %d",
                        TDM_COTRAIN_MAX_ADAPTERS, n);
    out->type = TDM_COTRAIN_JOIN;
    tdm_cotrain_join *j = &out->u.join;
    j->pid = (int32_t)getpid();
    j->uid = (uint32_t)geteuid();
    j->user = strdup(tdm_user_name());
    j->identity = strdup(identity);
    j->adapters = calloc((size_t)n, sizeof *j->adapters);
    tdm_status st = TDM_OK;
    if (!j->user || !j->identity || !j->adapters) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    j->n_adapters = n;
    if ((st = tdm_cotrain_run_opts_from_trainer(o, &adapters[0], &j->opts, err)) != TDM_OK)
        goto out;
    /* the join's opts are its first adapter's; an adapter whose training options differ (its
     * adapters.toml row set some) carries its own */
    for (int i = 1; i < n && st == TDM_OK; i++) {
        tdm_cotrain_run_opts *own = calloc(1, sizeof *own);
        if (!own) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            break;
        }
        char diff[512];
        if ((st = tdm_cotrain_run_opts_from_trainer(o, &adapters[i], own, err)) == TDM_OK &&
            tdm_cotrain_run_opts_diff(&j->opts, own, diff, sizeof diff) > 0) {
            j->adapters[i].opts = own;
            continue;
        }
        tdm_cotrain_run_opts_free(own);
        free(own);
    }
    for (int i = 0; i < n && st == TDM_OK; i++) {
        const tdm_trainer_adapter *a = &adapters[i];
        tdm_cotrain_adapter *c = &j->adapters[i];
        st = abs_dup(a->data, &c->data, err);
        if (st == TDM_OK) st = abs_dup(a->output, &c->output, err);
        if (st == TDM_OK) st = abs_dup(a->init_adapter, &c->init_adapter, err);
        if (st == TDM_OK && a->label && !(c->label = strdup(a->label)))
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        c->rank = a->rank;
        c->alpha = a->alpha;
        c->use_rslora = a->use_rslora;
        c->targets = a->targets;
        c->lora_dropout = a->lora_dropout;
        c->lr = a->lr;
        c->epochs = a->epochs;
        c->batch_size = a->batch_size;
        c->max_seq_len = a->max_seq_len;
        c->weight = a->weight;
    }
out:
    if (st != TDM_OK) tdm_cotrain_msg_free(out);
    return st;
}

void tdm_cotrain_adapters_to_trainer(const tdm_cotrain_join *j, tdm_trainer_adapter *out)
{
    for (int i = 0; i < j->n_adapters; i++) {
        const tdm_cotrain_adapter *c = &j->adapters[i];
        out[i] = (tdm_trainer_adapter){.data = c->data,
                                       .output = c->output,
                                       .label = c->label,
                                       .init_adapter = c->init_adapter,
                                       .rank = c->rank,
                                       .alpha = c->alpha,
                                       .use_rslora = c->use_rslora,
                                       .targets = c->targets,
                                       .lora_dropout = c->lora_dropout,
                                       .lr = c->lr,
                                       .epochs = c->epochs,
                                       .batch_size = c->batch_size,
                                       .max_seq_len = c->max_seq_len,
                                       .weight = c->weight};
        adapter_opts_from_msg(c->opts ? c->opts : &j->opts, &out[i]);
    }
}

void tdm_cotrain_progress_from_trainer(const tdm_trainer_progress *p, int adapter,
                                       tdm_cotrain_msg *out)
{
    memset(out, 0, sizeof *out);
    out->type = TDM_COTRAIN_PROGRESS;
    out->u.progress = (tdm_cotrain_progress_msg){.adapter = adapter,
                                                 .event = p->event,
                                                 .global_step = p->global_step,
                                                 .step = p->step,
                                                 .total_steps = p->total_steps,
                                                 .epoch = p->epoch,
                                                 .epochs = p->epochs,
                                                 .loss = p->loss,
                                                 .learning_rate = p->learning_rate,
                                                 .grad_norm = p->grad_norm,
                                                 .val_loss = p->val_loss,
                                                 .tokens_per_sec = p->tokens_per_sec,
                                                 .eta_sec = p->eta_sec};
}

void tdm_cotrain_progress_to_trainer(const tdm_cotrain_progress_msg *m, const char *label,
                                     tdm_trainer_progress *out)
{
    *out = (tdm_trainer_progress){.event = m->event,
                                  .adapter = m->adapter,
                                  .label = label,
                                  .global_step = m->global_step,
                                  .step = m->step,
                                  .total_steps = m->total_steps,
                                  .epoch = m->epoch,
                                  .epochs = m->epochs,
                                  .loss = m->loss,
                                  .learning_rate = m->learning_rate,
                                  .grad_norm = m->grad_norm,
                                  .val_loss = m->val_loss,
                                  .tokens_per_sec = m->tokens_per_sec,
                                  .eta_sec = m->eta_sec};
}
