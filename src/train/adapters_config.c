/* adapters_config.c — adapters.toml to tdm_adapter_spec (see adapters_config.h and
 * docs/adapters-toml.md). The TOML syntax is util/toml's job; this file checks meaning. */
#include "train/adapters_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/lr_schedule.h"
#include "train/trainer.h"
#include "util/atomic_file.h"
#include "util/suggest.h"
#include "util/path_identity.h"
#include "util/toml.h"

/* ------------------------------------------------------------------------------------------ */
/* Targets                                                                                     */

/* Adds one target name to *mask; message without location on failure. */
static tdm_status add_target(const char *name, size_t len, uint32_t *mask, tdm_error *err)
{
    tdm_lora_target t;
    if (!tdm_lora_target_parse_n(name, len, &t)) {
        char *copy = strndup(name, len);
        if (!copy)
            return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        const char *hint = tdm_suggest(copy, tdm_lora_target_names, TDM_LORA_N_TARGETS);
        tdm_fail(err, TDM_ERR_INVALID,
                 "unknown target '%.64s'%s%s%s (known: q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj)",
                 copy, hint ? "; did you mean '" : "", hint ? hint : "", hint ? "'?" : "");
        free(copy);
        return TDM_ERR_INVALID;
    }
    if (*mask & TDM_LORA_BIT(t))
        return tdm_fail(err, TDM_ERR_INVALID, "target '%s' is listed twice", tdm_lora_target_name(t));
    *mask |= TDM_LORA_BIT(t);
    return TDM_OK;
}

tdm_status tdm_adapter_targets_parse(const char *list, uint32_t *mask, tdm_error *err)
{
    uint32_t m = 0;
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b) {
            if (!comma && m == 0 && p == list)
                break; /* the whole list is empty: reported below */
            return tdm_fail(err, TDM_ERR_INVALID,
                            "empty name in the target list '%.64s' (write names separated by "
                            "single commas, e.g. q_proj,v_proj)",
                            list);
        }
        tdm_status st = add_target(a, (size_t)(b - a), &m, err);
        if (st != TDM_OK)
            return st;
        if (!comma)
            break;
        p = comma + 1;
    }
    if (m == 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "the target list is empty (name at least one of q_proj, k_proj, v_proj, "
                        "o_proj, gate_proj, up_proj, down_proj)");
    *mask = m;
    return TDM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* One key                                                                                     */

/* Re-raises a location-free message at v: "FILE:LINE:COL: what: message". */
static tdm_status locate(tdm_error *err, const tdm_toml_value *v, const char *what)
{
    if (!err)
        return TDM_ERR_INVALID;
    char msg[sizeof err->message];
    memcpy(msg, err->message, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    return tdm_toml_fail_at(err, err->status, v, "%s: %s", what, msg);
}

static tdm_status check_path(const tdm_toml_value *v, const char *what, const char **out,
                             tdm_error *err)
{
    tdm_status st = tdm_toml_as_string(v, what, out, err);
    if (st != TDM_OK)
        return st;
    if (!**out)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must not be empty", what);
    for (const unsigned char *c = (const unsigned char *)*out; *c; c++)
        if (*c < 0x20 || *c == 0x7F)
            return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                    "%s contains a control character (U+%04X); paths may not",
                                    what, *c);
    return TDM_OK;
}

static tdm_status check_label(const tdm_toml_value *v, const char **out, tdm_error *err)
{
    tdm_status st = tdm_toml_as_string(v, "label", out, err);
    if (st != TDM_OK)
        return st;
    size_t n = strlen(*out);
    bool ok = n >= 1 && n <= TDM_ADAPTER_LABEL_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char c = (*out)[i];
        ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    if (!ok)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                "label must be 1 to %d characters of A-Z a-z 0-9 . _ - (it "
                                "names the adapter in logs and file names)",
                                TDM_ADAPTER_LABEL_MAX);
    return TDM_OK;
}

static tdm_status check_targets(const tdm_toml_value *v, uint32_t *mask, tdm_error *err)
{
    if (tdm_toml_type_of(v) == TDM_TOML_STRING) {
        if (tdm_adapter_targets_parse(tdm_toml_string(v, NULL), mask, err) != TDM_OK)
            return locate(err, v, "targets");
        return TDM_OK;
    }
    if (tdm_toml_type_of(v) != TDM_TOML_ARRAY || tdm_toml_is_table_array(v))
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                "targets must be an array of names or a comma-separated string, "
                                "e.g. targets = [\"q_proj\", \"v_proj\"]");
    tdm_status st = tdm_toml_as_array_of(v, TDM_TOML_STRING, "targets", err);
    if (st != TDM_OK)
        return st;
    if (tdm_toml_len(v) == 0)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                "targets is empty (name at least one of q_proj, k_proj, v_proj, "
                                "o_proj, gate_proj, up_proj, down_proj)");
    uint32_t m = 0;
    for (size_t i = 0; i < tdm_toml_len(v); i++) {
        const tdm_toml_value *e = tdm_toml_at(v, i);
        size_t len;
        const char *name = tdm_toml_string(e, &len);
        if (add_target(name, len, &m, err) != TDM_OK)
            return locate(err, e, "targets");
    }
    *mask = m;
    return TDM_OK;
}

static tdm_status set_string(char **field, const char *value, tdm_error *err)
{
    char *copy = strdup(value);
    if (!copy)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    free(*field);
    *field = copy;
    return TDM_OK;
}

/* Checks a number against its row's range; the messages read "KEY must be ...". */
static tdm_status check_int(const tdm_adapter_option *o, const tdm_toml_value *v, int64_t *i,
                            tdm_error *err)
{
    tdm_status st = tdm_toml_as_int(v, o->key, i, err);
    if (st != TDM_OK || (*i >= o->value.min && *i <= o->value.max))
        return st;
    if (!isfinite(o->value.max) || o->value.max >= 1099511627776.0) /* "no upper bound" */
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be an integer >= %.0f (got %lld)",
                                o->key, o->value.min, (long long)*i);
    if (o->value.min == 1)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                "%s must be a positive integer no larger than %.0f (got %lld)",
                                o->key, o->value.max, (long long)*i);
    return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be an integer %.0f..%.0f (got %lld)",
                            o->key, o->value.min, o->value.max, (long long)*i);
}

static tdm_status check_number(const tdm_adapter_option *o, const tdm_toml_value *v, double *x,
                               tdm_error *err)
{
    const tdm_option_value *r = &o->value;
    tdm_status st = tdm_toml_as_number(v, o->key, x, err);
    if (st != TDM_OK)
        return st;
    bool low = r->min_open ? !(*x > r->min) : !(*x >= r->min);
    bool high = r->max_open ? !(*x < r->max) : !(*x <= r->max);
    if (!low && !high)
        return TDM_OK;
    if (r->min == 0 && !r->min_open && r->max == 1 && r->max_open)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be a probability in [0, 1) (got %g)",
                                o->key, *x);
    if (low)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be %s %g (got %g)", o->key,
                                r->min_open ? "greater than" : "at least", r->min, *x);
    return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be %s %g (got %g)%s%s", o->key,
                            r->max_open ? "less than" : "at most", r->max, *x,
                            o->range_hint ? "; " : "", o->range_hint ? o->range_hint : "");
}

/* Checks v as the value of key k (by the kind and range of its row in adapter_options.c) and
 * stores it in s (marking it set). */
static tdm_status set_key(tdm_adapter_spec *s, tdm_adapter_key k, const tdm_toml_value *v,
                          tdm_error *err)
{
    const tdm_adapter_option *o = &tdm_adapter_options[k];
    const char *str = NULL;
    int64_t i = 0;
    double x = 0;
    bool b = false;
    tdm_trainer_adapter words = {0}; /* where the rows' word parsers put what they read */
    tdm_status st = TDM_OK;
    switch (o->value.kind) {
    case TDM_OPT_PATH: st = check_path(v, o->key, &str, err); break;
    case TDM_OPT_LABEL: st = check_label(v, &str, err); break;
    case TDM_OPT_INT: st = check_int(o, v, &i, err); break;
    case TDM_OPT_FLOAT: st = check_number(o, v, &x, err); break;
    case TDM_OPT_LIST: st = check_targets(v, &s->targets, err); break; /* targets: the only list */
    case TDM_OPT_ENUM: /* a word, checked by the row's parser, as its flag is */
        st = tdm_toml_as_string(v, o->key, &str, err);
        if (st == TDM_OK && (st = o->value.parse(str, &words, err)) != TDM_OK)
            st = locate(err, v, o->key);
        break;
    case TDM_OPT_BOOL:
        st = tdm_toml_as_bool(v, o->key, &b, err);
        break;
    case TDM_OPT_SIZE:
        st = tdm_fail(err, TDM_ERR_INVALID, "%s: no adapters.toml check", o->key);
    }
    if (st != TDM_OK)
        return st;
    switch (k) {
    case TDM_ADAPTER_KEY_DATA: st = set_string(&s->data, str, err); break;
    case TDM_ADAPTER_KEY_OUTPUT: st = set_string(&s->output, str, err); break;
    case TDM_ADAPTER_KEY_LABEL: st = set_string(&s->label, str, err); break;
    case TDM_ADAPTER_KEY_INIT_ADAPTER: st = set_string(&s->init_adapter, str, err); break;
    case TDM_ADAPTER_KEY_RANK: s->has_rank = true, s->rank = (int)i; break;
    case TDM_ADAPTER_KEY_ALPHA: s->has_alpha = true, s->alpha = x; break;
    case TDM_ADAPTER_KEY_TARGETS: s->has_targets = true; break;
    case TDM_ADAPTER_KEY_LEARNING_RATE: s->has_learning_rate = true, s->learning_rate = x; break;
    case TDM_ADAPTER_KEY_EPOCHS: s->has_epochs = true, s->epochs = (int)i; break;
    case TDM_ADAPTER_KEY_BATCH_SIZE: s->has_batch_size = true, s->batch_size = (int)i; break;
    case TDM_ADAPTER_KEY_MAX_SEQ_LEN: s->has_max_seq_len = true, s->max_seq_len = (int)i; break;
    case TDM_ADAPTER_KEY_WEIGHT: s->has_weight = true, s->weight = x; break;
    case TDM_ADAPTER_KEY_LORA_DROPOUT: s->has_lora_dropout = true, s->lora_dropout = x; break;
    case TDM_ADAPTER_KEY_SEED: s->has_seed = true, s->seed = (uint64_t)i; break;
    case TDM_ADAPTER_KEY_GRAD_ACCUM: s->has_grad_accum = true, s->grad_accum = (int)i; break;
    case TDM_ADAPTER_KEY_LR_SCHEDULE:
        s->has_lr_schedule = true, s->lr_schedule = words.lr_kind;
        break;
    case TDM_ADAPTER_KEY_WARMUP_STEPS: s->has_warmup_steps = true, s->warmup_steps = i; break;
    case TDM_ADAPTER_KEY_WEIGHT_DECAY: s->has_weight_decay = true, s->weight_decay = x; break;
    case TDM_ADAPTER_KEY_MAX_GRAD_NORM: s->has_max_grad_norm = true, s->max_grad_norm = x; break;
    case TDM_ADAPTER_KEY_VAL_SPLIT: s->has_val_split = true, s->val_split = x; break;
    case TDM_ADAPTER_KEY_EVAL_EVERY: s->has_eval_every = true, s->eval_every = i; break;
    case TDM_ADAPTER_KEY_SAVE_EVERY: s->has_save_every = true, s->save_every = i; break;
    case TDM_ADAPTER_KEY_SAVE_TOTAL_LIMIT:
        s->has_save_total_limit = true, s->save_total_limit = (int)i;
        break;
    case TDM_ADAPTER_KEY_LOG_EVERY: s->has_log_every = true, s->log_every = i; break;
    case TDM_ADAPTER_KEY_TASK:
        s->has_task = true, s->task = words.task;
        break;
    case TDM_ADAPTER_KEY_CHAT_TEMPLATE:
        s->has_chat_template = true, s->chat_template = words.chat_template;
        break;
    case TDM_ADAPTER_KEY_TRAIN_ON_PROMPT:
        s->has_train_on_prompt = true, s->train_on_prompt = b;
        break;
    case TDM_ADAPTER_KEY_SKIP_BAD_LINES:
        s->has_skip_bad_lines = true, s->skip_bad_lines = b;
        break;
    case TDM_ADAPTER_KEY_NO_SHUFFLE:
        s->has_no_shuffle = true, s->no_shuffle = b;
        break;
    case TDM_ADAPTER_KEY_COUNT: break;
    }
    if (st == TDM_OK)
        s->key_line[k] = tdm_toml_line(v);
    return st;
}

/* Copies the defaults' set fields into the unset fields of s (defaults hold no strings). */
static void apply_defaults(tdm_adapter_spec *s, const tdm_adapter_spec *d)
{
#define INHERIT(field, key)                                                                        \
    if (d->has_##field && !s->has_##field) {                                                       \
        s->has_##field = true;                                                                     \
        s->field = d->field;                                                                       \
        s->key_line[key] = d->key_line[key];                                                       \
    }
    INHERIT(rank, TDM_ADAPTER_KEY_RANK)
    INHERIT(alpha, TDM_ADAPTER_KEY_ALPHA)
    INHERIT(targets, TDM_ADAPTER_KEY_TARGETS)
    INHERIT(learning_rate, TDM_ADAPTER_KEY_LEARNING_RATE)
    INHERIT(epochs, TDM_ADAPTER_KEY_EPOCHS)
    INHERIT(batch_size, TDM_ADAPTER_KEY_BATCH_SIZE)
    INHERIT(max_seq_len, TDM_ADAPTER_KEY_MAX_SEQ_LEN)
    INHERIT(weight, TDM_ADAPTER_KEY_WEIGHT)
    INHERIT(lora_dropout, TDM_ADAPTER_KEY_LORA_DROPOUT)
    INHERIT(seed, TDM_ADAPTER_KEY_SEED)
    INHERIT(grad_accum, TDM_ADAPTER_KEY_GRAD_ACCUM)
    INHERIT(lr_schedule, TDM_ADAPTER_KEY_LR_SCHEDULE)
    INHERIT(warmup_steps, TDM_ADAPTER_KEY_WARMUP_STEPS)
    INHERIT(weight_decay, TDM_ADAPTER_KEY_WEIGHT_DECAY)
    INHERIT(max_grad_norm, TDM_ADAPTER_KEY_MAX_GRAD_NORM)
    INHERIT(val_split, TDM_ADAPTER_KEY_VAL_SPLIT)
    INHERIT(eval_every, TDM_ADAPTER_KEY_EVAL_EVERY)
    INHERIT(save_every, TDM_ADAPTER_KEY_SAVE_EVERY)
    INHERIT(save_total_limit, TDM_ADAPTER_KEY_SAVE_TOTAL_LIMIT)
    INHERIT(log_every, TDM_ADAPTER_KEY_LOG_EVERY)
    INHERIT(task, TDM_ADAPTER_KEY_TASK)
    INHERIT(chat_template, TDM_ADAPTER_KEY_CHAT_TEMPLATE)
    INHERIT(train_on_prompt, TDM_ADAPTER_KEY_TRAIN_ON_PROMPT)
    INHERIT(skip_bad_lines, TDM_ADAPTER_KEY_SKIP_BAD_LINES)
    INHERIT(no_shuffle, TDM_ADAPTER_KEY_NO_SHUFFLE)
#undef INHERIT
}

static void spec_free(tdm_adapter_spec *s)
{
    free(s->data);
    free(s->output);
    free(s->label);
    free(s->init_adapter);
}

/* ------------------------------------------------------------------------------------------ */
/* Tables                                                                                      */

static const char *const table_names[] = {"adapter", "defaults"};

/* " (did you mean 'x'?)" or "". */
static void did_you_mean(const char *word, const char *const *cands, size_t n, const char *pre,
                         const char *post, char *buf, size_t size)
{
    const char *hint = tdm_suggest(word, cands, n);
    if (hint)
        snprintf(buf, size, "; did you mean %s%s%s?", pre, hint, post);
    else
        buf[0] = '\0';
}

/* "data, output, ..." into buf: the keys of the rows (only the defaultable ones if asked). */
static void key_list(bool defaultable_only, char *buf, size_t size)
{
    const char *names[TDM_ADAPTER_KEY_COUNT];
    size_t n = tdm_adapter_key_names(names, defaultable_only), at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? ", " : "", names[i]);
}

/* "unknown key 'x'; did you mean 'y'? (WHICH: a, b, ...)" at e, suggesting among every key. */
static tdm_status unknown_key(const tdm_toml_value *table, const tdm_toml_entry *e,
                              const char *where, const char *which, bool defaultable_only,
                              tdm_error *err)
{
    const char *names[TDM_ADAPTER_KEY_COUNT];
    size_t n = tdm_adapter_key_names(names, false);
    char hint[256], known[512], negated[80];
    did_you_mean(e->key, names, n, "'", "'", hint, sizeof hint);
    snprintf(negated, sizeof negated, "no_%.64s", e->key); /* shuffle = false: no_shuffle = true */
    if (!hint[0] && tdm_adapter_key_find(negated) >= 0)
        snprintf(hint, sizeof hint, "; did you mean '%.67s'? (%.67s = true turns %.64s off)",
                 negated, negated, e->key);
    key_list(defaultable_only, known, sizeof known);
    return tdm_toml_fail_at_key(err, TDM_ERR_INVALID, table, e, "unknown key '%.64s'%s%s (%s: %s)",
                                e->key, where, hint, which, known);
}

/* A key of the top level or of [defaults] (defaults_line: where it was seen first, per key). */
static tdm_status default_key(tdm_adapter_spec *defaults, const tdm_toml_value *table,
                              const tdm_toml_entry *e, tdm_error *err)
{
    int k = tdm_adapter_key_find(e->key);
    if (k < 0)
        return unknown_key(table, e, "", "defaults may set", true, err);
    if (!tdm_adapter_options[k].defaultable)
        return tdm_toml_fail_at_key(err, TDM_ERR_INVALID, table, e,
                                    "%s cannot be a default: each adapter sets its own; move it "
                                    "into an [[adapter]] table",
                                    e->key);
    if (defaults->key_line[k])
        return tdm_toml_fail_at_key(err, TDM_ERR_INVALID, table, e,
                                    "default %s is already set at line %u (set defaults at the "
                                    "top or in [defaults], not both)",
                                    e->key, defaults->key_line[k]);
    return set_key(defaults, (tdm_adapter_key)k, e->value, err);
}

static tdm_status adapter_table(tdm_adapter_spec *s, const tdm_toml_value *t, size_t number,
                                tdm_error *err)
{
    s->line = tdm_toml_line(t);
    for (size_t i = 0; i < tdm_toml_len(t); i++) {
        const tdm_toml_entry *e = tdm_toml_entry_at(t, i);
        int k = tdm_adapter_key_find(e->key);
        if (k < 0) {
            char where[48];
            snprintf(where, sizeof where, " in [[adapter]] #%zu", number);
            return unknown_key(t, e, where, "known", false, err);
        }
        tdm_status st = set_key(s, (tdm_adapter_key)k, e->value, err);
        if (st != TDM_OK)
            return st;
    }
    static const tdm_adapter_key required[] = {TDM_ADAPTER_KEY_DATA, TDM_ADAPTER_KEY_OUTPUT};
    for (size_t r = 0; r < sizeof required / sizeof required[0]; r++)
        if (!s->key_line[required[r]])
            return tdm_fail(err, TDM_ERR_INVALID,
                            "%s:%u: [[adapter]] #%zu has no %s; add a line such as %s",
                            tdm_toml_file(t), s->line, number,
                            tdm_adapter_options[required[r]].key,
                            tdm_adapter_options[required[r]].example);
    return TDM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Cross-adapter checks                                                                        */

/* Lexical form of a directory path for comparison: no "." components, no doubled or trailing
 * slashes. "./out//a/" -> "out/a"; "/" stays "/"; "." -> ".". ".." is kept as is. */
static char *normalize_path(const char *path)
{
    size_t n = strlen(path);
    char *out = malloc(n + 2);
    if (!out)
        return NULL;
    size_t o = 0;
    bool absolute = path[0] == '/';
    if (absolute)
        out[o++] = '/';
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        const char *end = p;
        while (*end && *end != '/')
            end++;
        size_t len = (size_t)(end - p);
        if (len && !(len == 1 && p[0] == '.')) {
            if (o && out[o - 1] != '/')
                out[o++] = '/';
            memcpy(out + o, p, len);
            o += len;
        }
        p = end;
    }
    if (o == 0)
        out[o++] = '.';
    out[o] = '\0';
    return out;
}

typedef struct keyed {
    const char *key;
    size_t index;
} keyed;

static int keyed_cmp(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Finds the earliest adapter (in file order) whose key equals an earlier adapter's. keys_of[i]
 * may be NULL (skipped). Sorting keeps this O(n log n) for any number of adapters. Returns
 * false on allocation failure; *dup_later is SIZE_MAX when all keys are distinct. */
static bool first_duplicate(const char *const *keys_of, size_t n, size_t *dup_first,
                            size_t *dup_later)
{
    *dup_later = SIZE_MAX;
    keyed *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return false;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (keys_of[i])
            v[m++] = (keyed){keys_of[i], i};
    qsort(v, m, sizeof *v, keyed_cmp);
    for (size_t i = 0; i + 1 < m;) {
        size_t j = i + 1; /* v[i] is the first of its group; v[j] the second */
        if (!strcmp(v[i].key, v[j].key) && v[j].index < *dup_later) {
            *dup_first = v[i].index;
            *dup_later = v[j].index;
        }
        while (j < m && !strcmp(v[i].key, v[j].key))
            j++;
        i = j;
    }
    free(v);
    return true;
}

static tdm_status cross_checks(const tdm_adapters_config *cfg, tdm_error *err)
{
    size_t n = cfg->n_adapters;
    char **norm = calloc(n ? n : 1, sizeof *norm);
    const char **labels = calloc(n ? n : 1, sizeof *labels);
    tdm_status st = TDM_OK;
    if (!norm || !labels) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        labels[i] = cfg->adapters[i].label;
        if (!(norm[i] = normalize_path(cfg->adapters[i].output))) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    size_t a, b;
    if (!first_duplicate((const char *const *)norm, n, &a, &b)) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (b != SIZE_MAX) {
        const tdm_adapter_spec *x = &cfg->adapters[a], *y = &cfg->adapters[b];
        st = tdm_fail(err, TDM_ERR_INVALID,
                      "%s:%u: [[adapter]] #%zu writes to output '%s', the same directory as "
                      "[[adapter]] #%zu (line %u); give each adapter its own output",
                      cfg->file, y->key_line[TDM_ADAPTER_KEY_OUTPUT], b + 1, y->output, a + 1,
                      x->key_line[TDM_ADAPTER_KEY_OUTPUT]);
        goto done;
    }
    if (!first_duplicate(labels, n, &a, &b)) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (b != SIZE_MAX) {
        const tdm_adapter_spec *x = &cfg->adapters[a], *y = &cfg->adapters[b];
        st = tdm_fail(err, TDM_ERR_INVALID,
                      "%s:%u: [[adapter]] #%zu has label '%s', already used by [[adapter]] #%zu "
                      "(line %u); labels must be unique",
                      cfg->file, y->key_line[TDM_ADAPTER_KEY_LABEL], b + 1, y->label, a + 1,
                      x->key_line[TDM_ADAPTER_KEY_LABEL]);
    }
done:
    if (norm)
        for (size_t i = 0; i < n; i++)
            free(norm[i]);
    free(norm);
    free(labels);
    return st;
}

/* ------------------------------------------------------------------------------------------ */

static tdm_status from_doc(const tdm_toml_doc *doc, tdm_adapters_config *cfg, tdm_error *err)
{
    const tdm_toml_value *root = tdm_toml_root(doc);
    const char *file = tdm_toml_filename(doc);
    tdm_adapter_spec defaults = {0};
    const tdm_toml_value *list = NULL;
    tdm_status st;

    for (size_t i = 0; i < tdm_toml_len(root); i++) {
        const tdm_toml_entry *e = tdm_toml_entry_at(root, i);
        const tdm_toml_value *v = e->value;
        if (!strcmp(e->key, "adapter")) {
            if ((st = tdm_toml_get_table_array(root, "adapter", &list, err)) != TDM_OK)
                return st;
        } else if (!strcmp(e->key, "defaults") && tdm_toml_type_of(v) == TDM_TOML_TABLE) {
            for (size_t j = 0; j < tdm_toml_len(v); j++)
                if ((st = default_key(&defaults, v, tdm_toml_entry_at(v, j), err)) != TDM_OK)
                    return st;
        } else if (!strcmp(e->key, "defaults")) {
            return tdm_toml_fail_at_key(err, TDM_ERR_INVALID, root, e,
                                        "defaults must be a single [defaults] table");
        } else if (tdm_toml_type_of(v) == TDM_TOML_TABLE || tdm_toml_is_table_array(v)) {
            const char *t = tdm_suggest(e->key, table_names, 2);
            char hint[64] = "";
            if (t)
                snprintf(hint, sizeof hint, "; did you mean %s?",
                         !strcmp(t, "adapter") ? "[[adapter]]" : "[defaults]");
            return tdm_toml_fail_at_key(err, TDM_ERR_INVALID, root, e,
                                        "unknown table '%.64s'%s (adapters.toml has [[adapter]] "
                                        "tables and an optional [defaults] table)",
                                        e->key, hint);
        } else {
            if ((st = default_key(&defaults, root, e, err)) != TDM_OK)
                return st;
        }
    }
    if (!list)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: no [[adapter]] tables; add one per adapter to train, e.g.\n"
                        "  [[adapter]]\n  data = \"data/train.jsonl\"\n  output = \"out/a\"\n"
                        "(see docs/adapters-toml.md)",
                        file);
    size_t n = tdm_toml_len(list);
    cfg->adapters = calloc(n, sizeof *cfg->adapters);
    if (!cfg->adapters)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    cfg->n_adapters = n;
    for (size_t i = 0; i < n; i++) {
        if ((st = adapter_table(&cfg->adapters[i], tdm_toml_at(list, i), i + 1, err)) != TDM_OK)
            return st;
        apply_defaults(&cfg->adapters[i], &defaults);
    }
    return cross_checks(cfg, err);
}

tdm_status tdm_adapters_config_parse(const char *text, size_t len, const char *filename,
                                     tdm_adapters_config *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    tdm_toml_doc *doc = NULL;
    tdm_status st = tdm_toml_parse(text, len, filename, &doc, err);
    if (st != TDM_OK)
        return st;
    out->file = strdup(tdm_toml_filename(doc));
    if (!out->file)
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    else
        st = from_doc(doc, out, err);
    tdm_toml_free(doc);
    if (st != TDM_OK)
        tdm_adapters_config_free(out);
    return st;
}

/* The lexical check of cross_checks misses outputs that differ only through "..", symbolic
 * links or bind mounts ("out/a" and "out/../out/a"): compare where they lead on the file
 * system, relative paths taken from the file's own directory as `tandem finetune` does. */
static tdm_status same_output_checks(const tdm_adapters_config *cfg, const char *path,
                                     tdm_error *err)
{
    size_t n = cfg->n_adapters;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        dir[0] = '\0';
    char **out_keys = calloc(n ? n : 1, sizeof *out_keys);
    tdm_status st = out_keys ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == TDM_OK && i < n; i++) {
        if (!(out_keys[i] = malloc(TDM_PATH_IDENTITY_MAX)))
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        else if ((st = tdm_path_identity(dir, cfg->adapters[i].output, out_keys[i],
                                         TDM_PATH_IDENTITY_MAX, err)) != TDM_OK)
            tdm_error_prefix(err, "%s:%u", cfg->file,
                             cfg->adapters[i].key_line[TDM_ADAPTER_KEY_OUTPUT]);
    }
    size_t a, b;
    if (st == TDM_OK && !first_duplicate((const char *const *)out_keys, n, &a, &b))
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    if (st == TDM_OK && b != SIZE_MAX) {
        const tdm_adapter_spec *x = &cfg->adapters[a], *y = &cfg->adapters[b];
        st = tdm_fail(err, TDM_ERR_INVALID,
                      "%s:%u: [[adapter]] #%zu writes to output '%s', the same directory as "
                      "[[adapter]] #%zu (line %u, output '%s'); give each adapter its own output",
                      cfg->file, y->key_line[TDM_ADAPTER_KEY_OUTPUT], b + 1, y->output, a + 1,
                      x->key_line[TDM_ADAPTER_KEY_OUTPUT], x->output);
    }
    for (size_t i = 0; out_keys && i < n; i++)
        free(out_keys[i]);
    free(out_keys);
    return st;
}

tdm_status tdm_adapters_config_load(const char *path, tdm_adapters_config *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st != TDM_OK)
        return st;
    st = tdm_adapters_config_parse(text, len, path, out, err);
    free(text);
    if (st == TDM_OK && (st = same_output_checks(out, path, err)) != TDM_OK)
        tdm_adapters_config_free(out);
    return st;
}

void tdm_adapters_config_free(tdm_adapters_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->n_adapters; i++)
        spec_free(&cfg->adapters[i]);
    free(cfg->adapters);
    free(cfg->file);
    memset(cfg, 0, sizeof *cfg);
}
