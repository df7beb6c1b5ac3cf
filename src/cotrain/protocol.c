/* protocol.c — encode and parse co-training messages (contract in protocol.h). */
#include "cotrain/protocol.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/adapters_config.h"

static const char *const TYPE_NAMES[TDM_COTRAIN_MSG_TYPE_COUNT] = {
    "join", "admitted", "rejected", "waiting", "progress", "detach", "done", "heartbeat",
};

const char *tdm_cotrain_msg_type_name(tdm_cotrain_msg_type t)
{
    return (unsigned)t < TDM_COTRAIN_MSG_TYPE_COUNT ? TYPE_NAMES[t] : "unknown";
}

static const struct {
    tdm_status status;
    const char *name;
} STATUS_NAMES[] = {
    {TDM_OK, "ok"},
    {TDM_ERR_INVALID, "invalid"},
    {TDM_ERR_IO, "io"},
    {TDM_ERR_PARSE, "parse"},
    {TDM_ERR_NOMEM, "nomem"},
    {TDM_ERR_NOT_FOUND, "not-found"},
    {TDM_ERR_UNSUPPORTED, "unsupported"},
    {TDM_ERR_TIMEOUT, "timeout"},
    {TDM_ERR_BUSY, "busy"},
    {TDM_ERR_NEVER_FITS, "never-fits"},
    {TDM_ERR_CORRUPT, "corrupt"},
    {TDM_ERR_DEVICE, "device"},
};
#define N_STATUS (sizeof STATUS_NAMES / sizeof STATUS_NAMES[0])

const char *tdm_cotrain_status_name(tdm_status s)
{
    for (size_t i = 0; i < N_STATUS; i++)
        if (STATUS_NAMES[i].status == s) return STATUS_NAMES[i].name;
    return "unknown";
}

static const char *const OUTCOME_NAMES[] = {"finished", "failed", "detached"};
#define N_OUTCOME (sizeof OUTCOME_NAMES / sizeof OUTCOME_NAMES[0])

const char *tdm_cotrain_outcome_name(tdm_cotrain_outcome o)
{
    return (unsigned)o < N_OUTCOME ? OUTCOME_NAMES[o] : "unknown";
}

static const char *const EVENT_NAMES[] = {"step", "log", "eval", "done"};
#define N_EVENT (sizeof EVENT_NAMES / sizeof EVENT_NAMES[0])

/* ---- Field readers: each fails with TDM_ERR_INVALID naming the message type and field. ---- */

typedef struct reader {
    const char *type; /* message type, for messages */
    tdm_error *err;
} reader;

static tdm_status bad(const reader *r, const char *field, const char *what)
{
    return tdm_fail(r->err, TDM_ERR_INVALID, "co-training %s message: field \"%s\" %s", r->type,
                    field, what);
}

static tdm_status get_int(const reader *r, json_t *obj, const char *field, int64_t lo, int64_t hi,
                          int64_t *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v) return bad(r, field, "is missing");
    if (!json_is_integer(v)) return bad(r, field, "must be an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        char what[128];
        snprintf(what, sizeof what, "is out of range (%" PRId64 "..%" PRId64 ")", lo, hi);
        return bad(r, field, what);
    }
    *out = x;
    return TDM_OK;
}

static tdm_status get_int32(const reader *r, json_t *obj, const char *field, int64_t lo, int64_t hi,
                            int *out)
{
    int64_t x;
    tdm_status st = get_int(r, obj, field, lo, hi, &x);
    if (st == TDM_OK) *out = (int)x;
    return st;
}

/* A finite number in [lo, hi] (hi_open: [lo, hi)); null_ok: null reads as NaN. */
static tdm_status get_num(const reader *r, json_t *obj, const char *field, double lo, double hi,
                          bool hi_open, bool null_ok, double *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v) return bad(r, field, "is missing");
    if (null_ok && json_is_null(v)) {
        *out = NAN;
        return TDM_OK;
    }
    if (!json_is_number(v)) return bad(r, field, "must be a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (hi_open && x >= hi))
        return bad(r, field, "is out of range");
    *out = x;
    return TDM_OK;
}

static tdm_status get_bool(const reader *r, json_t *obj, const char *field, bool *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v) return bad(r, field, "is missing");
    if (!json_is_boolean(v)) return bad(r, field, "must be true or false");
    *out = json_is_true(v);
    return TDM_OK;
}

/* A string of 1..max-1 bytes (jansson already refuses embedded NULs); optional: absent or null
 * gives NULL; absolute: must start with '/'. */
static tdm_status get_str(const reader *r, json_t *obj, const char *field, size_t max,
                          bool optional, bool absolute, char **out)
{
    *out = NULL;
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) return optional ? TDM_OK : bad(r, field, "is missing");
    if (!json_is_string(v)) return bad(r, field, "must be a string");
    size_t n = json_string_length(v);
    if (n == 0 || n >= max) return bad(r, field, n == 0 ? "is empty" : "is too long");
    const char *s = json_string_value(v);
    if (absolute && s[0] != '/') return bad(r, field, "must be an absolute path");
    *out = strdup(s);
    if (!*out) return tdm_fail(r->err, TDM_ERR_NOMEM, "out of memory");
    return TDM_OK;
}

/* One of names[0..n) -> its index. */
static tdm_status get_enum(const reader *r, json_t *obj, const char *field,
                           const char *const *names, size_t n, int *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v) return bad(r, field, "is missing");
    const char *s = json_string_value(v);
    if (s)
        for (size_t i = 0; i < n; i++)
            if (strcmp(s, names[i]) == 0) {
                *out = (int)i;
                return TDM_OK;
            }
    return bad(r, field, "is not one of the known names");
}

static bool label_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > TDM_ADAPTER_LABEL_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        tdm_status st_ = (expr);                                                                   \
        if (st_ != TDM_OK) return st_;                                                             \
    } while (0)

static tdm_status parse_train_opts(const reader *r, json_t *o, tdm_cotrain_run_opts *p);

static tdm_status parse_adapter(const reader *r, json_t *o, tdm_cotrain_adapter *a)
{
    if (!json_is_object(o)) return bad(r, "adapters", "must hold objects");
    TRY(get_str(r, o, "data", TDM_COTRAIN_PATH_MAX, false, true, &a->data));
    TRY(get_str(r, o, "output", TDM_COTRAIN_PATH_MAX, false, true, &a->output));
    TRY(get_str(r, o, "label", TDM_ADAPTER_LABEL_MAX + 1, true, false, &a->label));
    if (a->label && !label_ok(a->label))
        return bad(r, "label", "must be 1-64 of A-Z a-z 0-9 . _ -");
    TRY(get_str(r, o, "init_adapter", TDM_COTRAIN_PATH_MAX, true, true, &a->init_adapter));
    TRY(get_int32(r, o, "rank", 1, TDM_ADAPTER_RANK_MAX, &a->rank));
    TRY(get_num(r, o, "alpha", 0, INFINITY, false, false, &a->alpha));
    if (!(a->alpha > 0)) return bad(r, "alpha", "must be > 0");
    TRY(get_bool(r, o, "use_rslora", &a->use_rslora));
    json_t *t = json_object_get(o, "targets");
    if (!json_is_array(t) || json_array_size(t) == 0 ||
        json_array_size(t) > TDM_ADAPTER_TARGET_COUNT)
        return bad(r, "targets", "must be a non-empty array of projection names");
    a->targets = 0;
    for (size_t i = 0; i < json_array_size(t); i++) {
        const char *name = json_string_value(json_array_get(t, i));
        tdm_lora_target bit;
        if (!tdm_lora_target_parse(name, &bit) || (a->targets & TDM_LORA_BIT(bit)))
            return bad(r, "targets", "holds an unknown or repeated projection name");
        a->targets |= TDM_LORA_BIT(bit);
    }
    TRY(get_num(r, o, "lora_dropout", 0, 1, true, false, &a->lora_dropout));
    TRY(get_num(r, o, "lr", 0, 1, false, false, &a->lr));
    if (!(a->lr > 0)) return bad(r, "lr", "must be > 0");
    TRY(get_int32(r, o, "epochs", 1, TDM_ADAPTER_EPOCHS_MAX, &a->epochs));
    TRY(get_int32(r, o, "batch_size", 1, TDM_ADAPTER_BATCH_SIZE_MAX, &a->batch_size));
    TRY(get_int32(r, o, "max_seq_len", 1, TDM_ADAPTER_MAX_SEQ_LEN_MAX, &a->max_seq_len));
    TRY(get_num(r, o, "weight", 0, INFINITY, false, false, &a->weight));
    if (!(a->weight > 0)) return bad(r, "weight", "must be > 0");
    json_t *own = json_object_get(o, "opts");
    if (own && !json_is_null(own)) {
        if (!(a->opts = calloc(1, sizeof *a->opts)))
            return tdm_fail(r->err, TDM_ERR_NOMEM, "out of memory");
        TRY(parse_train_opts(r, own, a->opts));
    }
    return TDM_OK;
}

static const char *const CHAT_NAMES[] = {"none", "chatml", "llama3"};
static const char *const LR_NAMES[] = {"cosine", "linear", "constant"};
static const char *const SCHEDULE_NAMES[] = {"synchronized", "round-robin", "priority-val-loss"};

/* The training options of opts (the join's, or one adapter's own). */
static tdm_status parse_train_opts(const reader *r, json_t *o, tdm_cotrain_run_opts *p)
{
    if (!json_is_object(o)) return bad(r, "opts", "must be an object");
    int e = 0; /* set by get_enum on success; -O3 cannot see that */
    TRY(get_str(r, o, "task", 64, false, false, &p->task));
    TRY(get_bool(r, o, "chat_template_given", &p->chat_template_given));
    TRY(get_enum(r, o, "chat_template", CHAT_NAMES, 3, &e));
    p->chat_template = (tdm_chat_template)e;
    TRY(get_bool(r, o, "train_on_prompt", &p->train_on_prompt));
    TRY(get_bool(r, o, "skip_bad_lines", &p->skip_bad_lines));
    TRY(get_num(r, o, "weight_decay", 0, INFINITY, false, false, &p->weight_decay));
    TRY(get_num(r, o, "max_grad_norm", 0, INFINITY, false, false, &p->max_grad_norm));
    TRY(get_enum(r, o, "lr_kind", LR_NAMES, 3, &e));
    p->lr_kind = (tdm_lr_kind)e;
    TRY(get_int(r, o, "warmup_steps", 0, INT64_MAX, &p->warmup_steps));
    TRY(get_int32(r, o, "grad_accum", 1, 1 << 20, &p->grad_accum));
    /* The seed is a uint64: a decimal string, as JSON integers stop at int64. */
    json_t *seed = json_object_get(o, "seed");
    const char *s = json_string_value(seed);
    if (!s || !*s || strlen(s) > 20 || strspn(s, "0123456789") != strlen(s))
        return bad(r, "seed", "must be a string of decimal digits");
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || (s[0] == '0' && s[1]))
        return bad(r, "seed", "must be a decimal uint64 without leading zeros");
    p->seed = v;
    TRY(get_bool(r, o, "shuffle", &p->shuffle));
    TRY(get_num(r, o, "val_split", 0, 1, true, false, &p->val_split));
    TRY(get_int(r, o, "eval_every", 0, INT64_MAX, &p->eval_every));
    TRY(get_int(r, o, "save_every", 0, INT64_MAX, &p->save_every));
    TRY(get_int(r, o, "log_every", 1, INT64_MAX, &p->log_every));
    p->save_total_limit = 0; /* optional: absent in the messages of earlier builds */
    if (json_object_get(o, "save_total_limit"))
        TRY(get_int32(r, o, "save_total_limit", 0, 1000000, &p->save_total_limit));
    return TDM_OK;
}

static tdm_status parse_opts(const reader *r, json_t *o, tdm_cotrain_run_opts *p)
{
    TRY(parse_train_opts(r, o, p));
    int e = 0; /* set by get_enum on success; -O3 cannot see that */
    TRY(get_enum(r, o, "schedule", SCHEDULE_NAMES, 3, &e));
    p->schedule = (tdm_train_schedule)e;
    TRY(get_bool(r, o, "resume", &p->resume));
    TRY(get_bool(r, o, "no_wait", &p->no_wait));
    return TDM_OK;
}

static bool identity_ok(const char *s)
{
    if (strlen(s) != 7 + 64 || strncmp(s, "sha256:", 7) != 0) return false;
    return strspn(s + 7, "0123456789abcdef") == 64;
}

static tdm_status parse_body(const reader *r, json_t *o, tdm_cotrain_msg *m)
{
    int64_t x;
    int e = 0; /* set by get_enum on success; -O3 cannot see that */
    switch (m->type) {
    case TDM_COTRAIN_JOIN: {
        tdm_cotrain_join *j = &m->u.join;
        TRY(get_int(r, o, "pid", 1, INT32_MAX, &x));
        j->pid = (int32_t)x;
        TRY(get_int(r, o, "uid", 0, UINT32_MAX, &x));
        j->uid = (uint32_t)x;
        TRY(get_str(r, o, "user", 256, false, false, &j->user));
        TRY(get_str(r, o, "identity", 128, false, false, &j->identity));
        if (!identity_ok(j->identity))
            return bad(r, "identity", "must be \"sha256:\" and 64 lower-case hex digits");
        TRY(parse_opts(r, json_object_get(o, "opts"), &j->opts));
        json_t *arr = json_object_get(o, "adapters");
        if (!json_is_array(arr) || json_array_size(arr) < 1 ||
            json_array_size(arr) > TDM_COTRAIN_MAX_ADAPTERS)
            return bad(r, "adapters", "must be an array of 1 to 64 adapters");
        j->adapters = calloc(json_array_size(arr), sizeof *j->adapters);
        if (!j->adapters) return tdm_fail(r->err, TDM_ERR_NOMEM, "out of memory");
        j->n_adapters = (int)json_array_size(arr);
        for (int i = 0; i < j->n_adapters; i++)
            TRY(parse_adapter(r, json_array_get(arr, (size_t)i), &j->adapters[i]));
        for (int i = 0; i < j->n_adapters; i++)
            for (int k = 0; k < i; k++)
                if (strcmp(j->adapters[i].output, j->adapters[k].output) == 0)
                    return bad(r, "output", "names the same directory for two adapters");
        return TDM_OK;
    }
    case TDM_COTRAIN_ADMITTED:
        TRY(get_int(r, o, "host_pid", 1, INT32_MAX, &x));
        m->u.admitted.host_pid = (int32_t)x;
        return get_int32(r, o, "n_adapters", 1, TDM_COTRAIN_MAX_ADAPTERS,
                         &m->u.admitted.n_adapters);
    case TDM_COTRAIN_REJECTED: {
        static const char *names[N_STATUS];
        for (size_t i = 0; i < N_STATUS; i++)
            names[i] = STATUS_NAMES[i].name;
        TRY(get_enum(r, o, "status", names, N_STATUS, &e));
        if (STATUS_NAMES[e].status == TDM_OK)
            return bad(r, "status", "cannot be ok in a rejection");
        m->u.rejected.status = STATUS_NAMES[e].status;
        return get_str(r, o, "message", TDM_COTRAIN_TEXT_MAX, false, false, &m->u.rejected.message);
    }
    case TDM_COTRAIN_WAITING:
        TRY(get_str(r, o, "reason", 64, false, false, &m->u.waiting.reason));
        TRY(get_int(r, o, "need_mb", 0, INT64_MAX, &x));
        m->u.waiting.need_mb = (uint64_t)x;
        return get_str(r, o, "message", TDM_COTRAIN_TEXT_MAX, false, false, &m->u.waiting.message);
    case TDM_COTRAIN_PROGRESS: {
        tdm_cotrain_progress_msg *p = &m->u.progress;
        TRY(get_int32(r, o, "adapter", 0, TDM_COTRAIN_MAX_ADAPTERS - 1, &p->adapter));
        TRY(get_enum(r, o, "event", EVENT_NAMES, N_EVENT, &e));
        p->event = (tdm_trainer_event)e;
        TRY(get_int(r, o, "global_step", 0, INT64_MAX, &p->global_step));
        TRY(get_int(r, o, "step", 0, INT64_MAX, &p->step));
        TRY(get_int(r, o, "total_steps", 0, INT64_MAX, &p->total_steps));
        TRY(get_num(r, o, "epoch", 0, INFINITY, false, false, &p->epoch));
        TRY(get_int32(r, o, "epochs", 1, TDM_ADAPTER_EPOCHS_MAX, &p->epochs));
        TRY(get_num(r, o, "loss", -INFINITY, INFINITY, false, true, &p->loss));
        TRY(get_num(r, o, "learning_rate", 0, INFINITY, false, true, &p->learning_rate));
        TRY(get_num(r, o, "grad_norm", 0, INFINITY, false, true, &p->grad_norm));
        TRY(get_num(r, o, "val_loss", -INFINITY, INFINITY, false, true, &p->val_loss));
        TRY(get_num(r, o, "tokens_per_sec", 0, INFINITY, false, true, &p->tokens_per_sec));
        return get_num(r, o, "eta_sec", 0, INFINITY, false, true, &p->eta_sec);
    }
    case TDM_COTRAIN_DETACH:
        return TDM_OK;
    case TDM_COTRAIN_DONE:
        TRY(get_int32(r, o, "adapter", 0, TDM_COTRAIN_MAX_ADAPTERS - 1, &m->u.done.adapter));
        TRY(get_enum(r, o, "outcome", OUTCOME_NAMES, N_OUTCOME, &e));
        m->u.done.outcome = (tdm_cotrain_outcome)e;
        TRY(get_int(r, o, "step", 0, INT64_MAX, &m->u.done.step));
        return get_str(r, o, "message", TDM_COTRAIN_TEXT_MAX, true, false, &m->u.done.message);
    case TDM_COTRAIN_HEARTBEAT:
        return get_int(r, o, "global_step", 0, INT64_MAX, &m->u.heartbeat.global_step);
    case TDM_COTRAIN_MSG_TYPE_COUNT:
        break;
    }
    return tdm_fail(r->err, TDM_ERR_INVALID, "co-training message of unknown type");
}

tdm_status tdm_cotrain_msg_parse(const char *line, size_t len, tdm_cotrain_msg *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (len > TDM_COTRAIN_MSG_MAX)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "co-training message of %zu bytes exceeds the limit of %u", len,
                        TDM_COTRAIN_MSG_MAX);
    json_error_t jerr;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return tdm_fail(err, TDM_ERR_PARSE, "co-training message is not JSON: column %d: %s",
                        jerr.column, jerr.text);
    tdm_status st;
    reader r = {.type = "unknown", .err = err};
    int type = 0;
    int64_t v;
    if (!json_is_object(o)) {
        st = tdm_fail(err, TDM_ERR_INVALID, "co-training message is not a JSON object");
    } else if ((st = get_int(&r, o, "v", 0, INT32_MAX, &v)) != TDM_OK) {
        /* st and err set */
    } else if (v != TDM_COTRAIN_PROTOCOL_VERSION) {
        st = tdm_fail(err, TDM_ERR_UNSUPPORTED,
                      "co-training protocol version %" PRId64
                      " is not supported (this tandem speaks version %d): run the same tandem "
                      "version for both jobs, or pass --no-join",
                      v, TDM_COTRAIN_PROTOCOL_VERSION);
    } else if ((st = get_enum(&r, o, "type", TYPE_NAMES, TDM_COTRAIN_MSG_TYPE_COUNT, &type)) ==
               TDM_OK) {
        out->type = (tdm_cotrain_msg_type)type;
        r.type = TYPE_NAMES[type];
        st = parse_body(&r, o, out);
    }
    json_decref(o);
    if (st != TDM_OK) tdm_cotrain_msg_free(out);
    return st;
}

/* ---- Encoding. ---- */

static json_t *num_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *encode_train_opts(const tdm_cotrain_run_opts *p);

static json_t *encode_adapter(const tdm_cotrain_adapter *a)
{
    json_t *t = json_array();
    for (unsigned bit = 0; bit < TDM_ADAPTER_TARGET_COUNT; bit++)
        if (a->targets & (1u << bit))
            json_array_append_new(t, json_string(tdm_lora_target_name(bit)));
    return json_pack("{s:o, s:o, s:o, s:o, s:i, s:o, s:b, s:o, s:o, s:o, s:i, s:i, s:i, s:o, s:o}",
                     "data", str_or_null(a->data), "output", str_or_null(a->output), "label",
                     str_or_null(a->label), "init_adapter", str_or_null(a->init_adapter), "rank",
                     a->rank, "alpha", num_or_null(a->alpha), "use_rslora", a->use_rslora,
                     "targets", t, "lora_dropout", num_or_null(a->lora_dropout), "lr",
                     num_or_null(a->lr), "epochs", a->epochs, "batch_size", a->batch_size,
                     "max_seq_len", a->max_seq_len, "weight", num_or_null(a->weight), "opts",
                     a->opts ? encode_train_opts(a->opts) : json_null());
}

/* The training options of p, as parse_train_opts reads them. */
static json_t *encode_train_opts(const tdm_cotrain_run_opts *p)
{
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    return json_pack(
        "{s:o, s:b, s:s, s:b, s:b, s:o, s:o, s:s, s:I, s:i, s:s, s:b, s:o, s:I, s:I, s:I, s:i}",
        "task", str_or_null(p->task), "chat_template_given", p->chat_template_given,
        "chat_template", (unsigned)p->chat_template < 3 ? CHAT_NAMES[p->chat_template] : "?",
        "train_on_prompt", p->train_on_prompt, "skip_bad_lines", p->skip_bad_lines, "weight_decay",
        num_or_null(p->weight_decay), "max_grad_norm", num_or_null(p->max_grad_norm), "lr_kind",
        (unsigned)p->lr_kind < 3 ? LR_NAMES[p->lr_kind] : "?", "warmup_steps",
        (json_int_t)p->warmup_steps, "grad_accum", p->grad_accum, "seed", seed, "shuffle",
        p->shuffle, "val_split", num_or_null(p->val_split), "eval_every", (json_int_t)p->eval_every,
        "save_every", (json_int_t)p->save_every, "log_every", (json_int_t)p->log_every,
        "save_total_limit", p->save_total_limit);
}

static json_t *encode_opts(const tdm_cotrain_run_opts *p)
{
    json_t *o = encode_train_opts(p);
    json_t *w = json_pack("{s:s, s:b, s:b}", "schedule",
                          (unsigned)p->schedule < 3 ? SCHEDULE_NAMES[p->schedule] : "?", "resume",
                          p->resume, "no_wait", p->no_wait);
    if (!o || !w || json_object_update(o, w) != 0) {
        json_decref(o);
        o = NULL;
    }
    json_decref(w);
    return o;
}

static json_t *encode_body(const tdm_cotrain_msg *m)
{
    switch (m->type) {
    case TDM_COTRAIN_JOIN: {
        const tdm_cotrain_join *j = &m->u.join;
        json_t *arr = json_array();
        for (int i = 0; i < j->n_adapters; i++)
            json_array_append_new(arr, encode_adapter(&j->adapters[i]));
        return json_pack("{s:i, s:I, s:o, s:o, s:o, s:o}", "pid", (int)j->pid, "uid",
                         (json_int_t)j->uid, "user", str_or_null(j->user), "identity",
                         str_or_null(j->identity), "opts", encode_opts(&j->opts), "adapters", arr);
    }
    case TDM_COTRAIN_ADMITTED:
        return json_pack("{s:i, s:i}", "host_pid", (int)m->u.admitted.host_pid, "n_adapters",
                         m->u.admitted.n_adapters);
    case TDM_COTRAIN_REJECTED:
        return json_pack("{s:s, s:o}", "status", tdm_cotrain_status_name(m->u.rejected.status),
                         "message", str_or_null(m->u.rejected.message));
    case TDM_COTRAIN_WAITING:
        return json_pack("{s:o, s:I, s:o}", "reason", str_or_null(m->u.waiting.reason), "need_mb",
                         (json_int_t)m->u.waiting.need_mb, "message",
                         str_or_null(m->u.waiting.message));
    case TDM_COTRAIN_PROGRESS: {
        const tdm_cotrain_progress_msg *p = &m->u.progress;
        return json_pack(
            "{s:i, s:s, s:I, s:I, s:I, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "adapter",
            p->adapter, "event", (unsigned)p->event < N_EVENT ? EVENT_NAMES[p->event] : "?",
            "global_step", (json_int_t)p->global_step, "step", (json_int_t)p->step, "total_steps",
            (json_int_t)p->total_steps, "epoch", num_or_null(p->epoch), "epochs", p->epochs, "loss",
            num_or_null(p->loss), "learning_rate", num_or_null(p->learning_rate), "grad_norm",
            num_or_null(p->grad_norm), "val_loss", num_or_null(p->val_loss), "tokens_per_sec",
            num_or_null(p->tokens_per_sec), "eta_sec", num_or_null(p->eta_sec));
    }
    case TDM_COTRAIN_DETACH:
        return json_object();
    case TDM_COTRAIN_DONE:
        return json_pack("{s:i, s:s, s:I, s:o}", "adapter", m->u.done.adapter, "outcome",
                         tdm_cotrain_outcome_name(m->u.done.outcome), "step",
                         (json_int_t)m->u.done.step, "message", str_or_null(m->u.done.message));
    case TDM_COTRAIN_HEARTBEAT:
        return json_pack("{s:I}", "global_step", (json_int_t)m->u.heartbeat.global_step);
    case TDM_COTRAIN_MSG_TYPE_COUNT:
        break;
    }
    return NULL;
}

tdm_status tdm_cotrain_msg_encode(const tdm_cotrain_msg *msg, char **line, size_t *len,
                                  tdm_error *err)
{
    *line = NULL;
    *len = 0;
    json_t *o = encode_body(msg);
    if (!o)
        return tdm_fail(err, TDM_ERR_INVALID, "cannot encode a co-training %s message",
                        tdm_cotrain_msg_type_name(msg->type));
    /* "v" and "type" first, for a reader of a socket capture. */
    json_t *head = json_pack("{s:i, s:s}", "v", TDM_COTRAIN_PROTOCOL_VERSION, "type",
                             tdm_cotrain_msg_type_name(msg->type));
    if (!head || json_object_update(head, o) != 0) {
        json_decref(o);
        json_decref(head);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    json_decref(o);
    char *text = json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(head);
    if (!text) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    size_t n = strlen(text);
    /* What we send must be what a peer accepts: a field this side filled out of range (or a
     * message over the size limit) is our bug, caught here rather than at the peer. */
    tdm_cotrain_msg check;
    tdm_status st = tdm_cotrain_msg_parse(text, n, &check, err);
    if (st != TDM_OK) {
        free(text);
        return tdm_error_prefix(err, "refusing to send an invalid message");
    }
    tdm_cotrain_msg_free(&check);
    char *out = realloc(text, n + 2);
    if (!out) {
        free(text);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    out[n] = '\n';
    out[n + 1] = '\0';
    *line = out;
    *len = n + 1;
    return TDM_OK;
}

static void free_adapter(tdm_cotrain_adapter *a)
{
    free(a->data);
    free(a->output);
    free(a->label);
    free(a->init_adapter);
    if (a->opts) free(a->opts->task);
    free(a->opts);
}

void tdm_cotrain_msg_free(tdm_cotrain_msg *msg)
{
    switch (msg->type) {
    case TDM_COTRAIN_JOIN:
        free(msg->u.join.user);
        free(msg->u.join.identity);
        free(msg->u.join.opts.task);
        for (int i = 0; i < msg->u.join.n_adapters; i++)
            free_adapter(&msg->u.join.adapters[i]);
        free(msg->u.join.adapters);
        break;
    case TDM_COTRAIN_REJECTED:
        free(msg->u.rejected.message);
        break;
    case TDM_COTRAIN_WAITING:
        free(msg->u.waiting.reason);
        free(msg->u.waiting.message);
        break;
    case TDM_COTRAIN_DONE:
        free(msg->u.done.message);
        break;
    default:
        break;
    }
    memset(msg, 0, sizeof *msg);
}

static int opts_diff(const tdm_cotrain_run_opts *a, const tdm_cotrain_run_opts *b, bool all,
                     char *buf, size_t size)
{
    int n = 0;
    size_t used = 0;
    if (size) buf[0] = '\0';
#define DIFF(cond, name)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            if (used < size) {                                                                     \
                int w = snprintf(buf + used, size - used, "%s%s", n ? ", " : "", name);            \
                used += w > 0 ? (size_t)w : 0;                                                     \
            }                                                                                      \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    if (!all) goto run_wide;
    DIFF(strcmp(a->task ? a->task : "", b->task ? b->task : "") != 0, "task");
    DIFF(a->chat_template_given != b->chat_template_given ||
             (a->chat_template_given && a->chat_template != b->chat_template),
         "chat template");
    DIFF(a->train_on_prompt != b->train_on_prompt, "train-on-prompt");
    DIFF(a->skip_bad_lines != b->skip_bad_lines, "skip-bad-lines");
    DIFF(a->weight_decay != b->weight_decay, "weight-decay");
    DIFF(a->max_grad_norm != b->max_grad_norm, "max-grad-norm");
    DIFF(a->lr_kind != b->lr_kind, "lr-scheduler");
    DIFF(a->warmup_steps != b->warmup_steps, "warmup-steps");
    DIFF(a->grad_accum != b->grad_accum, "grad-accum");
    DIFF(a->seed != b->seed, "seed");
    DIFF(a->shuffle != b->shuffle, "shuffle");
    DIFF(a->val_split != b->val_split, "val-split");
    DIFF(a->eval_every != b->eval_every, "eval-every");
    DIFF(a->save_every != b->save_every, "save-every");
    DIFF(a->log_every != b->log_every, "log-every");
    DIFF(a->save_total_limit != b->save_total_limit, "save-total-limit");
run_wide:
    DIFF(a->schedule != b->schedule, "schedule");
#undef DIFF
    return n;
}

int tdm_cotrain_run_opts_diff(const tdm_cotrain_run_opts *a, const tdm_cotrain_run_opts *b,
                              char *buf, size_t size)
{
    return opts_diff(a, b, true, buf, size);
}

int tdm_cotrain_run_wide_diff(const tdm_cotrain_run_opts *a, const tdm_cotrain_run_opts *b,
                              char *buf, size_t size)
{
    return opts_diff(a, b, false, buf, size);
}
