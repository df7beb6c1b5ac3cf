#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/safetensors.h"
#include "train/run_records.h"
#include "util/atomic_dir.h"
#include "util/atomic_file.h"
#include "util/json_file.h"

#define NAME_CAP 224

void tdm_checkpoint_info_free(tdm_checkpoint_info *info)
{
    json_decref(info->data_cursor);
    free(info->grad_accum);
    info->data_cursor = NULL;
    info->grad_accum = NULL;
}

static tdm_status write_json(const char *path, const json_t *doc, tdm_error *err)
{
    return tdm_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY,
                                 true, 0644, err);
}

static tdm_status read_json(const char *path, json_t **out, tdm_error *err)
{
    char *text;
    size_t len;
    *out = NULL;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st != TDM_OK) return st;
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    free(text);
    if (!*out)
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return TDM_OK;
}

static void u64_hex(uint64_t v, char buf[17])
{
    snprintf(buf, 17, "%016" PRIx64, v);
}

static bool hex_u64(const json_t *j, uint64_t *v)
{
    if (!json_is_string(j) || strlen(json_string_value(j)) != 16) return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(json_string_value(j), &end, 16);
    if (errno || *end) return false;
    *v = (uint64_t)x;
    return true;
}

/* ---- tensor files: one or more flat arrays in the adapter's layout ---- */

/* A tensor's name in these files: "<PEFT name>" (suffix NULL) or "<PEFT name>.<suffix>", into
 * out[NAME_CAP] (the PEFT name cut at 200 bytes, far beyond any real one). */
static void tensor_key(char *out, const char *base, const char *suffix)
{
    int w = suffix ? snprintf(out, NAME_CAP, "%.200s.%s", base, suffix)
                   : snprintf(out, NAME_CAP, "%.200s", base);
    if (w < 0) out[0] = '\0';
}

/* Writes n_arr arrays (each in l's flat layout) as F32 tensors named "<PEFT name>" (suffix NULL)
 * or "<PEFT name>.<suffix>", with __metadata__ format, version "1" and step. */
static tdm_status save_tensors(const char *path, const tdm_lora_params *l,
                               const float *const *arrays, const char *const *suffix, int n_arr,
                               const char *format, int64_t step_no, tdm_error *err)
{
    size_t nt = (size_t)n_arr * 2 * l->n_modules;
    tdm_st_spec *specs = calloc(nt, sizeof *specs);
    const void **data = calloc(nt, sizeof *data);
    char *names = calloc(nt, NAME_CAP);
    if (!specs || !data || !names) {
        free(specs);
        free(data);
        free(names);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory saving %s", path);
    }
    size_t k = 0;
    for (size_t i = 0; i < l->n_modules; i++) {
        const tdm_lora_module *m = &l->modules[i];
        for (int b = 0; b < 2; b++) {
            char base[NAME_CAP];
            tdm_lora_params_tensor_name(m, b, base, sizeof base);
            int64_t off = b ? m->b_offset : m->a_offset;
            for (int which = 0; which < n_arr; which++, k++) {
                char *nm = names + k * NAME_CAP;
                tensor_key(nm, base, suffix[which]);
                specs[k].name = nm;
                specs[k].dtype = TDM_DTYPE_F32;
                specs[k].rank = 2;
                specs[k].shape[0] = b ? m->out : l->rank;
                specs[k].shape[1] = b ? l->rank : m->in;
                data[k] = arrays[which] + off;
            }
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, step_no);
    const char *meta[] = {"format", format, "version", "1", "step", step};
    tdm_status st = tdm_st_save(path, specs, data, nt, meta, 3, err);
    free(specs);
    free(data);
    free(names);
    return st;
}

/* Reads what save_tensors wrote into arrays[0..n_arr) (each l->n_params floats, allocated by the
 * caller); checks the format, every name and shape, and that nothing else is in the file. */
static tdm_status load_tensors(const char *path, const tdm_lora_params *l, float *const *arrays,
                               const char *const *suffix, int n_arr, const char *format,
                               int64_t *step_no, tdm_error *err)
{
    tdm_st_file f = {0};
    tdm_status st = tdm_st_open(&f, path, err);
    if (st != TDM_OK) return st;
    const char *fmt = tdm_st_metadata(&f, "format"), *sv = tdm_st_metadata(&f, "step");
    char *end = NULL;
    long long step = sv ? strtoll(sv, &end, 10) : -1;
    if (!fmt || strcmp(fmt, format) != 0 || !sv || !*sv || *end || step < 0) {
        tdm_st_close(&f);
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: not a %s file (metadata format/step missing)",
                        path, format);
    }
    *step_no = step;
    size_t used = 0;
    for (size_t i = 0; i < l->n_modules && st == TDM_OK; i++) {
        const tdm_lora_module *m = &l->modules[i];
        for (int b = 0; b < 2 && st == TDM_OK; b++) {
            char base[NAME_CAP], nm[NAME_CAP];
            tdm_lora_params_tensor_name(m, b, base, sizeof base);
            int64_t off = b ? m->b_offset : m->a_offset;
            int64_t r0 = b ? m->out : l->rank, r1 = b ? l->rank : m->in;
            for (int which = 0; which < n_arr && st == TDM_OK; which++) {
                tensor_key(nm, base, suffix[which]);
                const tdm_st_tensor *t = tdm_st_find(&f, nm);
                if (!t || t->dtype != TDM_DTYPE_F32 || t->rank != 2 || t->shape[0] != r0 ||
                    t->shape[1] != r1)
                    st = tdm_fail(err, TDM_ERR_CORRUPT,
                                  "%s: tensor %s is missing or not F32 [%lld, %lld]", path, nm,
                                  (long long)r0, (long long)r1);
                else {
                    st = tdm_st_tensor_to_f32(t, arrays[which] + off, err);
                    used++;
                }
            }
        }
    }
    if (st == TDM_OK && used != f.n_tensors)
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: %zu tensors, expected %zu", path, f.n_tensors,
                      used);
    tdm_st_close(&f);
    return st;
}

static const char *const adamw_suffix[2] = {"exp_avg", "exp_avg_sq"};
static const char *const grad_suffix[1] = {NULL};

static tdm_status save_optimizer(const char *path, const tdm_lora_params *l,
                                 const tdm_adamw_state *opt, tdm_error *err)
{
    const float *arrays[2] = {opt->m, opt->v};
    return save_tensors(path, l, arrays, adamw_suffix, 2, "tandem-adamw", opt->step, err);
}

static tdm_status load_optimizer(const char *path, const tdm_lora_params *l, tdm_adamw_state *opt,
                                 tdm_error *err)
{
    tdm_status st = tdm_adamw_state_init(opt, l->n_params, err);
    if (st != TDM_OK) return st;
    float *arrays[2] = {opt->m, opt->v};
    st = load_tensors(path, l, arrays, adamw_suffix, 2, "tandem-adamw", &opt->step, err);
    if (st != TDM_OK) tdm_adamw_state_free(opt);
    return st;
}

/* ---- state file ---- */

/* A double that may be unknown (NaN): null in JSON. */
static json_t *real_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* The "trainer" object: one key per field of tdm_trainer_ckpt. */
static json_t *trainer_json(const tdm_trainer_ckpt *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "global_step", json_integer(c->global_step));
    json_object_set_new(o, "rr_next", json_integer(c->rr_next));
    json_object_set_new(o, "done", json_boolean(c->done));
    json_object_set_new(o, "credit", real_or_null(c->credit));
    json_object_set_new(o, "last_val", real_or_null(c->last_val));
    json_object_set_new(o, "last_train_loss", real_or_null(c->last_train_loss));
    json_object_set_new(o, "last_grad_norm", real_or_null(c->last_grad_norm));
    json_object_set_new(o, "last_lr", real_or_null(c->last_lr));
    json_object_set_new(o, "tokens_seen", json_integer(c->tokens_seen));
    json_object_set_new(o, "samples_seen", json_integer(c->samples_seen));
    json_object_set_new(o, "epoch_loss_sum", json_real(c->epoch_loss_sum));
    json_object_set_new(o, "epoch_tokens", json_integer(c->epoch_tokens));
    json_object_set_new(o, "last_epoch_loss", real_or_null(c->last_epoch_loss));
    json_object_set_new(o, "log_loss_sum", json_real(c->log_loss_sum));
    json_object_set_new(o, "log_tokens", json_integer(c->log_tokens));
    json_object_set_new(o, "log_due", json_boolean(c->log_due));
    json_object_set_new(o, "metrics_lines", json_integer(c->metrics_lines));
    json_object_set_new(o, "eval_step", json_integer(c->eval_step));
    json_object_set_new(o, "train_schedule", json_string(c->train_schedule));
    json_t *piece = json_null();
    if (c->in_piece) {
        piece = json_object();
        json_object_set_new(piece, "seqs_done", json_integer(c->piece_seqs_done));
        json_object_set_new(piece, "loss_sum", json_real(c->piece_loss_sum));
    }
    json_object_set_new(o, "piece", piece);
    return o;
}

/* Strict readers of one key of object o (named where in messages): missing or of another type
 * fails naming the file and the key. */
static tdm_status key_missing(const char *path, const char *where, const char *key,
                              const char *type, const json_t *v, tdm_error *err)
{
    return tdm_fail(err, TDM_ERR_CORRUPT,
                    "%s: \"%s.%s\" %s (expected %s; the checkpoint is damaged or was not "
                    "written by this tandem: resume from another checkpoint or start afresh)",
                    path, where, key, v ? "has the wrong type" : "is missing", type);
}
static tdm_status get_int(const char *path, const json_t *o, const char *where, const char *key,
                          int64_t *out, tdm_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return key_missing(path, where, key, "an integer", v, err);
    *out = json_integer_value(v);
    return TDM_OK;
}
static tdm_status get_bool(const char *path, const json_t *o, const char *where, const char *key,
                           bool *out, tdm_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_boolean(v)) return key_missing(path, where, key, "true or false", v, err);
    *out = json_is_true(v);
    return TDM_OK;
}
/* nullable: null reads as NaN */
static tdm_status get_real(const char *path, const json_t *o, const char *where, const char *key,
                           bool nullable, double *out, tdm_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (nullable && json_is_null(v)) {
        *out = NAN;
        return TDM_OK;
    }
    if (!json_is_number(v))
        return key_missing(path, where, key, nullable ? "a number or null" : "a number", v, err);
    *out = json_number_value(v);
    return TDM_OK;
}

/* a string, cut to fit out[cap] */
static tdm_status get_string(const char *path, const json_t *o, const char *where, const char *key,
                             char *out, size_t cap, tdm_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return key_missing(path, where, key, "a string", v, err);
    snprintf(out, cap, "%s", json_string_value(v));
    return TDM_OK;
}

static tdm_status parse_trainer(const char *path, const json_t *o, tdm_trainer_ckpt *c,
                                tdm_error *err)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(o))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: \"trainer\" %s (expected an object)", path,
                        o ? "has the wrong type" : "is missing");
    const char *w = "trainer";
    TDM_TRY(get_int(path, o, w, "global_step", &c->global_step, err));
    TDM_TRY(get_int(path, o, w, "rr_next", &c->rr_next, err));
    TDM_TRY(get_bool(path, o, w, "done", &c->done, err));
    TDM_TRY(get_real(path, o, w, "credit", true, &c->credit, err));
    TDM_TRY(get_real(path, o, w, "last_val", true, &c->last_val, err));
    TDM_TRY(get_real(path, o, w, "last_train_loss", true, &c->last_train_loss, err));
    TDM_TRY(get_real(path, o, w, "last_grad_norm", true, &c->last_grad_norm, err));
    TDM_TRY(get_real(path, o, w, "last_lr", true, &c->last_lr, err));
    TDM_TRY(get_int(path, o, w, "tokens_seen", &c->tokens_seen, err));
    TDM_TRY(get_int(path, o, w, "samples_seen", &c->samples_seen, err));
    TDM_TRY(get_real(path, o, w, "epoch_loss_sum", false, &c->epoch_loss_sum, err));
    TDM_TRY(get_int(path, o, w, "epoch_tokens", &c->epoch_tokens, err));
    TDM_TRY(get_real(path, o, w, "last_epoch_loss", true, &c->last_epoch_loss, err));
    TDM_TRY(get_real(path, o, w, "log_loss_sum", false, &c->log_loss_sum, err));
    TDM_TRY(get_int(path, o, w, "log_tokens", &c->log_tokens, err));
    TDM_TRY(get_bool(path, o, w, "log_due", &c->log_due, err));
    TDM_TRY(get_int(path, o, w, "metrics_lines", &c->metrics_lines, err));
    TDM_TRY(get_int(path, o, w, "eval_step", &c->eval_step, err));
    TDM_TRY(
        get_string(path, o, w, "train_schedule", c->train_schedule, sizeof c->train_schedule, err));
    const json_t *piece = json_object_get(o, "piece");
    if (json_is_null(piece)) return TDM_OK;
    if (!json_is_object(piece))
        return key_missing(path, w, "piece", "an object or null", piece, err);
    c->in_piece = true;
    TDM_TRY(get_int(path, piece, "trainer.piece", "seqs_done", &c->piece_seqs_done, err));
    TDM_TRY(get_real(path, piece, "trainer.piece", "loss_sum", false, &c->piece_loss_sum, err));
    return TDM_OK;
}

/* The "trained_on" object: what tdm_checkpoint_trained_on holds, the base as metadata.json's
 * "method" and "double_quant" (docs/run-records.md). */
static json_t *trained_on_json(const tdm_checkpoint_trained_on *t)
{
    json_t *o = json_object();
    json_object_set_new(o, "data_file", json_string(t->data_file));
    json_object_set_new(o, "data_hash", json_string(t->data_hash));
    json_object_set_new(o, "method", json_string(t->nf4 ? "qlora" : "lora"));
    json_object_set_new(o, "double_quant", json_boolean(t->nf4 && t->double_quant));
    return o;
}

/* Absent (a checkpoint of a tandem that did not record it): known stays false. Present: every
 * key required. */
static tdm_status parse_trained_on(const char *path, const json_t *o, tdm_checkpoint_trained_on *t,
                                   tdm_error *err)
{
    memset(t, 0, sizeof *t);
    if (!o) return TDM_OK;
    const char *w = "trained_on";
    if (!json_is_object(o))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: \"%s\" has the wrong type (expected an object)",
                        path, w);
    TDM_TRY(get_string(path, o, w, "data_file", t->data_file, sizeof t->data_file, err));
    TDM_TRY(get_string(path, o, w, "data_hash", t->data_hash, sizeof t->data_hash, err));
    char method[8];
    TDM_TRY(get_string(path, o, w, "method", method, sizeof method, err));
    if (strcmp(method, "qlora") != 0 && strcmp(method, "lora") != 0)
        return key_missing(path, w, "method", "\"qlora\" or \"lora\"", json_object_get(o, "method"),
                           err);
    t->nf4 = !strcmp(method, "qlora");
    TDM_TRY(get_bool(path, o, w, "double_quant", &t->double_quant, err));
    t->known = true;
    return TDM_OK;
}

static json_t *state_json(const tdm_checkpoint_info *info, bool with_trainer_state)
{
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("tandem-checkpoint"));
    json_object_set_new(o, "version", json_integer(TDM_CHECKPOINT_VERSION));
    json_object_set_new(o, "step", json_integer(info->step));
    json_object_set_new(o, "epoch", json_real(info->epoch));
    json_t *s = json_object();
    json_object_set_new(s, "kind", json_string(tdm_lr_kind_name(info->schedule.kind)));
    json_object_set_new(s, "peak_lr", json_real(info->schedule.peak_lr));
    json_object_set_new(s, "warmup_steps", json_integer(info->schedule.warmup_steps));
    json_object_set_new(s, "total_steps", json_integer(info->schedule.total_steps));
    json_object_set_new(o, "schedule", s);
    json_t *r = json_object(), *words = json_array();
    char hex[17];
    for (int i = 0; i < 4; i++) {
        u64_hex(info->rng.s[i], hex);
        json_array_append_new(words, json_string(hex));
    }
    uint64_t bits;
    memcpy(&bits, &info->rng.spare, sizeof bits);
    u64_hex(bits, hex);
    json_object_set_new(r, "algorithm", json_string("xoshiro256**"));
    json_object_set_new(r, "s", words);
    json_object_set_new(r, "has_spare", json_boolean(info->rng.has_spare));
    json_object_set_new(r, "spare_bits", json_string(hex));
    json_object_set_new(o, "rng", r);
    json_object_set_new(o, "data_cursor", json_deep_copy(info->data_cursor));
    json_object_set_new(o, "trainer", trainer_json(&info->trainer));
    if (info->trained_on.known)
        json_object_set_new(o, "trained_on", trained_on_json(&info->trained_on));
    json_t *files = json_array();
    json_array_append_new(files, json_string(TDM_PEFT_CONFIG_FILE));
    json_array_append_new(files, json_string(TDM_PEFT_WEIGHTS_FILE));
    json_array_append_new(files, json_string(TDM_CHECKPOINT_OPTIMIZER_FILE));
    if (info->grad_accum) json_array_append_new(files, json_string(TDM_CHECKPOINT_GRAD_FILE));
    if (with_trainer_state)
        json_array_append_new(files, json_string(TDM_CHECKPOINT_TRAINER_STATE_FILE));
    json_object_set_new(o, "files", files);
    return o;
}

static tdm_status parse_state(const char *path, const json_t *o, tdm_checkpoint_info *info,
                              tdm_error *err)
{
    memset(info, 0, sizeof *info);
    const json_t *fmt = json_object_get(o, "format"), *ver = json_object_get(o, "version");
    if (!json_is_object(o) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), "tandem-checkpoint") != 0 || !json_is_integer(ver))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: not a tandem checkpoint state", path);
    if (json_integer_value(ver) != TDM_CHECKPOINT_VERSION)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: checkpoint version %lld (this tandem reads version %d; train "
                        "afresh or resume with the tandem that wrote it)",
                        path, (long long)json_integer_value(ver), TDM_CHECKPOINT_VERSION);
    const json_t *step = json_object_get(o, "step"), *epoch = json_object_get(o, "epoch");
    const json_t *s = json_object_get(o, "schedule"), *r = json_object_get(o, "rng");
    if (!json_is_integer(step) || json_integer_value(step) < 0 || !json_is_number(epoch) ||
        !json_is_object(s) || !json_is_object(r) || !json_object_get(o, "data_cursor"))
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: step, epoch, schedule, rng or data_cursor "
                        "missing",
                        path);
    info->step = json_integer_value(step);
    info->epoch = json_number_value(epoch);
    const json_t *kind = json_object_get(s, "kind"), *lr = json_object_get(s, "peak_lr");
    const json_t *w = json_object_get(s, "warmup_steps"), *t = json_object_get(s, "total_steps");
    tdm_error e2 = {0};
    if (!json_is_string(kind) ||
        tdm_lr_kind_parse(json_string_value(kind), &info->schedule.kind, &e2) != TDM_OK ||
        !json_is_number(lr) || !json_is_integer(w) || !json_is_integer(t))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: bad \"schedule\"", path);
    info->schedule.peak_lr = json_number_value(lr);
    info->schedule.warmup_steps = json_integer_value(w);
    info->schedule.total_steps = json_integer_value(t);
    const json_t *words = json_object_get(r, "s"), *hs = json_object_get(r, "has_spare");
    uint64_t bits;
    if (!json_is_array(words) || json_array_size(words) != 4 || !json_is_boolean(hs) ||
        !hex_u64(json_object_get(r, "spare_bits"), &bits))
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: bad \"rng\"", path);
    for (size_t i = 0; i < 4; i++)
        if (!hex_u64(json_array_get(words, i), &info->rng.s[i]))
            return tdm_fail(err, TDM_ERR_CORRUPT, "%s: bad \"rng\".s[%zu]", path, i);
    info->rng.has_spare = json_is_true(hs);
    memcpy(&info->rng.spare, &bits, sizeof bits);
    tdm_status st = parse_trainer(path, json_object_get(o, "trainer"), &info->trainer, err);
    if (st != TDM_OK) return st;
    st = parse_trained_on(path, json_object_get(o, "trained_on"), &info->trained_on, err);
    if (st != TDM_OK) return st;
    info->data_cursor = json_incref(json_object_get(o, "data_cursor"));
    return TDM_OK;
}

/* ---- save / load ---- */

tdm_status tdm_checkpoint_save(const char *out_dir, const tdm_lora_params *l,
                               const tdm_peft_meta *meta, const tdm_adamw_state *opt,
                               const tdm_checkpoint_info *info, const json_t *trainer_state,
                               char *path, size_t cap, tdm_error *err)
{
    if (opt->n != l->n_params)
        return tdm_fail(err, TDM_ERR_INVALID, "optimizer state has %lld values, adapter %lld",
                        (long long)opt->n, (long long)l->n_params);
    if (!info->data_cursor)
        return tdm_fail(err, TDM_ERR_INVALID, "checkpoint without a data cursor");
    if (info->step < 0) return tdm_fail(err, TDM_ERR_INVALID, "negative checkpoint step");
    char final[PATH_MAX], tmp[PATH_MAX], file[PATH_MAX + 64];
    if (snprintf(final, sizeof final, "%s/" TDM_CHECKPOINT_PREFIX "%" PRId64, out_dir,
                 info->step) >= (int)sizeof final)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", out_dir);
    tdm_status st = tdm_atomic_dir_begin(final, tmp, sizeof tmp, err);
    if (st != TDM_OK) return st;
    st = tdm_peft_write_files(tmp, l, meta, err);
    if (st == TDM_OK) {
        snprintf(file, sizeof file, "%s/%s", tmp, TDM_CHECKPOINT_OPTIMIZER_FILE);
        st = save_optimizer(file, l, opt, err);
    }
    if (st == TDM_OK && info->grad_accum) {
        snprintf(file, sizeof file, "%s/%s", tmp, TDM_CHECKPOINT_GRAD_FILE);
        const float *arrays[1] = {info->grad_accum};
        st = save_tensors(file, l, arrays, grad_suffix, 1, "tandem-grad-accum", info->step, err);
    }
    if (st == TDM_OK && trainer_state) {
        snprintf(file, sizeof file, "%s/%s", tmp, TDM_CHECKPOINT_TRAINER_STATE_FILE);
        st = write_json(file, trainer_state, err);
    }
    if (st == TDM_OK) {
        json_t *doc = state_json(info, trainer_state != NULL);
        snprintf(file, sizeof file, "%s/%s", tmp, TDM_CHECKPOINT_STATE_FILE);
        st = write_json(file, doc, err);
        json_decref(doc);
    }
    if (st != TDM_OK) {
        tdm_atomic_dir_abort(tmp);
        return st;
    }
    st = tdm_atomic_dir_commit(tmp, final, err);
    if (st == TDM_OK && path) snprintf(path, cap, "%s", final);
    return st;
}

tdm_status tdm_checkpoint_load(const char *ckpt_dir, const tdm_model_config *cfg,
                               tdm_lora_params *l, tdm_peft_meta *meta, tdm_adamw_state *opt,
                               tdm_checkpoint_info *info, tdm_error *err)
{
    memset(l, 0, sizeof *l);
    memset(opt, 0, sizeof *opt);
    memset(info, 0, sizeof *info);
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/%s", ckpt_dir, TDM_CHECKPOINT_STATE_FILE);
    json_t *doc;
    tdm_status st = read_json(file, &doc, err);
    if (st != TDM_OK) return st;
    st = parse_state(file, doc, info, err);
    bool has_grad = false;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(doc, "files"), i, f)
    {
        has_grad |= json_is_string(f) && !strcmp(json_string_value(f), TDM_CHECKPOINT_GRAD_FILE);
    }
    json_decref(doc);
    if (st != TDM_OK) {
        tdm_checkpoint_info_free(info);
        return st;
    }
    st = tdm_peft_load(ckpt_dir, cfg, l, meta, err);
    if (st == TDM_OK) {
        snprintf(file, sizeof file, "%s/%s", ckpt_dir, TDM_CHECKPOINT_OPTIMIZER_FILE);
        st = load_optimizer(file, l, opt, err);
        if (st == TDM_OK && opt->step != info->step)
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: optimizer step %lld but checkpoint step "
                          "%lld",
                          file, (long long)opt->step, (long long)info->step);
    }
    if (st == TDM_OK && has_grad) {
        snprintf(file, sizeof file, "%s/%s", ckpt_dir, TDM_CHECKPOINT_GRAD_FILE);
        info->grad_accum = malloc((size_t)l->n_params * sizeof(float));
        int64_t gstep = -1;
        if (!info->grad_accum)
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", file);
        else
            st = load_tensors(file, l, &info->grad_accum, grad_suffix, 1, "tandem-grad-accum",
                              &gstep, err);
        if (st == TDM_OK && gstep != info->step)
            st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: step %lld but checkpoint step %lld", file,
                          (long long)gstep, (long long)info->step);
    }
    if (st != TDM_OK) {
        tdm_lora_params_free(l);
        tdm_adamw_state_free(opt);
        tdm_checkpoint_info_free(info);
    }
    return st;
}

/* ---- discovery, retention, best ---- */

static bool checkpoint_step(const char *name, int64_t *step)
{
    size_t pl = strlen(TDM_CHECKPOINT_PREFIX);
    if (strncmp(name, TDM_CHECKPOINT_PREFIX, pl) != 0) return false;
    const char *d = name + pl;
    if (!*d || strlen(d) > 18 || (d[0] == '0' && d[1])) return false;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return false;
        v = v * 10 + (*d - '0');
    }
    *step = v;
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

tdm_status tdm_checkpoint_list(const char *out_dir, int64_t **steps, size_t *n, tdm_error *err)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(out_dir);
    if (!d)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "cannot open directory %s", out_dir);
    size_t cap = 0;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        if (!checkpoint_step(e->d_name, &s)) continue;
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        if (lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *ns = realloc(*steps, cap * sizeof *ns);
            if (!ns) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                *n = 0;
                return tdm_fail(err, TDM_ERR_NOMEM, "out of memory listing %s", out_dir);
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (*n) qsort(*steps, *n, sizeof **steps, cmp_i64);
    return TDM_OK;
}

tdm_status tdm_checkpoint_load_state(const char *ckpt_dir, tdm_checkpoint_info *info,
                                     tdm_error *err)
{
    memset(info, 0, sizeof *info);
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/%s", ckpt_dir, TDM_CHECKPOINT_STATE_FILE);
    json_t *doc;
    tdm_status st = read_json(file, &doc, err);
    if (st != TDM_OK) return st;
    st = parse_state(file, doc, info, err);
    json_decref(doc);
    if (st != TDM_OK) tdm_checkpoint_info_free(info);
    return st;
}

tdm_status tdm_checkpoint_verify(const char *ckpt_dir, tdm_error *err)
{
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/%s", ckpt_dir, TDM_CHECKPOINT_STATE_FILE);
    json_t *doc;
    tdm_status st = read_json(file, &doc, err);
    if (st != TDM_OK) return st;
    tdm_checkpoint_info info;
    st = parse_state(file, doc, &info, err);
    tdm_checkpoint_info_free(&info);
    const json_t *files = json_object_get(doc, "files");
    if (st == TDM_OK && !json_is_array(files))
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: \"files\" missing", file);
    size_t i;
    json_t *f;
    if (st == TDM_OK) {
        json_array_foreach(files, i, f)
        {
            const char *name = json_string_value(f);
            if (!name || strchr(name, '/') || name[0] == '.') {
                st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: bad file name in \"files\"", file);
                break;
            }
            char p[PATH_MAX + 64];
            snprintf(p, sizeof p, "%s/%s", ckpt_dir, name);
            size_t nl = strlen(name);
            if (nl > 12 && strcmp(name + nl - 12, ".safetensors") == 0) {
                tdm_st_file sf = {0};
                st = tdm_st_open(&sf, p, err);
                tdm_st_close(&sf);
            } else {
                struct stat sb;
                if (stat(p, &sb) != 0)
                    st = tdm_fail_errno(err, TDM_ERR_CORRUPT, errno, "%s is missing", p);
            }
            if (st != TDM_OK) break;
        }
    }
    json_decref(doc);
    return st;
}

bool tdm_checkpoint_usable(const char *ckpt_dir)
{
    tdm_error e = {0};
    if (tdm_checkpoint_verify(ckpt_dir, &e) == TDM_OK) return true;
    tdm_warn("skipping damaged checkpoint %s: %s", ckpt_dir, e.message);
    return false;
}

tdm_status tdm_checkpoint_find_latest(const char *out_dir, char *path, size_t cap, int64_t *step,
                                      tdm_error *err)
{
    int64_t *steps;
    size_t n;
    tdm_status st = tdm_checkpoint_list(out_dir, &steps, &n, err);
    if (st != TDM_OK) return st;
    char p[PATH_MAX];
    for (size_t i = n; i-- > 0;) {
        snprintf(p, sizeof p, "%s/" TDM_CHECKPOINT_PREFIX "%" PRId64, out_dir, steps[i]);
        if (tdm_checkpoint_usable(p)) {
            if (path) snprintf(path, cap, "%s", p);
            if (step) *step = steps[i];
            free(steps);
            return TDM_OK;
        }
    }
    free(steps);
    return tdm_fail(err, TDM_ERR_NOT_FOUND, "no complete checkpoint in %s", out_dir);
}

bool tdm_is_adapter_or_run_dir(const char *dir, char *marker, size_t cap)
{
    static const char *const files[] = {TDM_PEFT_CONFIG_FILE,   TDM_PEFT_WEIGHTS_FILE,
                                        TDM_METRICS_FILE,       TDM_METADATA_FILE,
                                        TDM_TRAINER_STATE_FILE, TDM_CHECKPOINT_STATE_FILE};
    char path[PATH_MAX + 64];
    struct stat sb;
    bool found = false;
    for (size_t i = 0; !found && i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        found = lstat(path, &sb) == 0;
    }
    if (!found) {
        snprintf(path, sizeof path, "%s/%s", dir, TDM_BEST_DIR);
        found = lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    }
    int64_t *steps;
    size_t n;
    tdm_error ignored = {0};
    if (!found && tdm_checkpoint_list(dir, &steps, &n, &ignored) == TDM_OK && n > 0) {
        snprintf(path, sizeof path, "%s/" TDM_CHECKPOINT_PREFIX "%" PRId64, dir, steps[0]);
        free(steps);
        found = true;
    }
    if (found && marker && cap) snprintf(marker, cap, "%s", path);
    return found;
}

tdm_status tdm_checkpoint_prune(const char *out_dir, int keep_last, tdm_error *err)
{
    if (keep_last <= 0) return TDM_OK;
    int64_t *steps;
    size_t n;
    tdm_status st = tdm_checkpoint_list(out_dir, &steps, &n, err);
    if (st != TDM_OK) return st;
    char p[PATH_MAX];
    for (size_t i = 0; st == TDM_OK && i + (size_t)keep_last < n; i++) {
        snprintf(p, sizeof p, "%s/" TDM_CHECKPOINT_PREFIX "%" PRId64, out_dir, steps[i]);
        st = tdm_remove_tree(p, err);
    }
    free(steps);
    return st;
}

tdm_status tdm_checkpoint_save_best(const char *out_dir, const tdm_lora_params *l,
                                    const tdm_peft_meta *meta, int64_t step,
                                    const char *metric_name, double value, tdm_error *err)
{
    char final[PATH_MAX], tmp[PATH_MAX], file[PATH_MAX + 64];
    if (snprintf(final, sizeof final, "%s/%s", out_dir, TDM_BEST_DIR) >= (int)sizeof final)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", out_dir);
    if (!isfinite(value))
        return tdm_fail(err, TDM_ERR_INVALID, "best metric %g is not finite", value);
    tdm_status st = tdm_atomic_dir_begin(final, tmp, sizeof tmp, err);
    if (st != TDM_OK) return st;
    st = tdm_peft_write_files(tmp, l, meta, err);
    if (st == TDM_OK) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "metric", json_string(metric_name));
        json_object_set_new(o, "value", json_real(value));
        snprintf(file, sizeof file, "%s/%s", tmp, TDM_BEST_FILE);
        st = write_json(file, o, err);
        json_decref(o);
    }
    if (st != TDM_OK) {
        tdm_atomic_dir_abort(tmp);
        return st;
    }
    return tdm_atomic_dir_commit(tmp, final, err);
}

tdm_status tdm_checkpoint_read_best(const char *out_dir, int64_t *step, double *value,
                                    tdm_error *err)
{
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/%s/%s", out_dir, TDM_BEST_DIR, TDM_BEST_FILE);
    json_t *o;
    tdm_status st = read_json(file, &o, err);
    if (st != TDM_OK) return st;
    const json_t *s = json_object_get(o, "step"), *v = json_object_get(o, "value");
    if (!json_is_integer(s) || !json_is_number(v))
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: step or value missing", file);
    else {
        *step = json_integer_value(s);
        *value = json_number_value(v);
    }
    json_decref(o);
    return st;
}
