/* dataset.c — reading, validating, tokenizing and splitting a JSONL dataset (see dataset.h). */
#include "data/dataset.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/split.h"
#include "util/regular_file.h"

void tdm_dataset_opts_default(tdm_dataset_opts *o)
{
    memset(o, 0, sizeof *o);
    o->chat_template = TDM_CHAT_NONE;
    o->eos_id = -1;
    o->max_seq_len = 2048;
    o->vocab_size = INT32_MAX;
    o->val_split = 0.05;
}

static void add_bad(tdm_data_report *r, int64_t line, int column, const char *reason)
{
    if (r->bad_lines < TDM_DATA_MAX_BAD_REPORTED) {
        tdm_data_bad_line *b = &r->bad[r->bad_lines];
        b->line = line;
        b->column = column > 0 ? column : 0;
        size_t k = strlen(reason);
        if (k >= sizeof b->reason) k = sizeof b->reason - 1;
        memcpy(b->reason, reason, k);
        b->reason[k] = 0;
        /* keep it valid UTF-8 (a cut character, or bytes quoted by jansson): '?' for bad bytes */
        for (size_t i = 0; i < k;) {
            size_t v = tdm_utf8_valid_prefix(b->reason + i, k - i);
            if (i + v < k) b->reason[i + v] = '?';
            i += v + 1;
        }
    }
    r->bad_lines++;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

/* Growable arrays of the dataset under construction. */
typedef struct builder {
    tdm_dataset *ds;
    uint64_t tok_cap;
    uint32_t sample_cap;
} builder;

static bool reserve_tokens(builder *b, uint64_t extra)
{
    tdm_dataset *ds = b->ds;
    if (ds->n_tokens + extra <= b->tok_cap) return true;
    uint64_t cap = b->tok_cap ? b->tok_cap : 4096;
    while (cap < ds->n_tokens + extra)
        cap *= 2;
    int32_t *ids = realloc(ds->ids, cap * sizeof *ids);
    if (!ids) return false;
    ds->ids = ids;
    int32_t *labels = realloc(ds->labels, cap * sizeof *labels);
    if (!labels) return false;
    ds->labels = labels;
    b->tok_cap = cap;
    return true;
}

static bool reserve_sample(builder *b)
{
    tdm_dataset *ds = b->ds;
    if (ds->n_samples < b->sample_cap) return true;
    if (b->sample_cap >= UINT32_MAX / 2) return false;
    uint32_t cap = b->sample_cap ? b->sample_cap * 2 : 256;
    tdm_data_sample *s = realloc(ds->samples, cap * sizeof *s);
    if (!s) return false;
    ds->samples = s;
    b->sample_cap = cap;
    return true;
}

/* One non-blank, valid-UTF-8 line. TDM_OK (kept, dropped or recorded as bad) or a fatal error. */
static tdm_status do_line(builder *b, tdm_tokenizer *tok, const tdm_dataset_opts *o,
                          const char *line, size_t n, int64_t lineno, tdm_token_ids *ids,
                          tdm_token_ids *labels, tdm_error *err)
{
    tdm_dataset *ds = b->ds;
    tdm_data_report *r = &ds->report;
    json_error_t je;
    json_t *obj = json_loadb(line, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!obj) {
        char reason[300];
        snprintf(reason, sizeof reason, "invalid JSON: %s", je.text);
        add_bad(r, lineno, je.column > 0 ? je.column : (int)je.position + 1, reason);
        return TDM_OK;
    }
    tdm_data_fields f;
    tdm_error lerr = {0};
    tdm_status st = tdm_data_fields_parse(obj, o->vocab_size, &f, &lerr);
    if (st == TDM_ERR_PARSE) {
        add_bad(r, lineno, 0, lerr.message);
        json_decref(obj);
        return TDM_OK;
    }
    if (st != TDM_OK) {
        json_decref(obj);
        *err = lerr;
        return st;
    }
    char *canon = NULL;
    size_t canon_len = 0;
    ids->len = labels->len = 0;
    if (!tok && f.format != TDM_DATA_TOKENS) {
        st = tdm_fail(err, TDM_ERR_NOT_FOUND,
                      "line %lld: a %s sample needs a tokenizer, and %s does not exist (only "
                      "pre-tokenized `tokens` data is read without one)",
                      (long long)lineno, tdm_data_format_name(f.format),
                      o->tokenizer_path ? o->tokenizer_path : "tokenizer.json");
        tdm_data_fields_free(&f);
        json_decref(obj);
        return st;
    }
    tdm_render_opts ro = {o->chat_template, o->train_on_prompt, o->eos_id};
    if ((st = tdm_data_fields_canonical(&f, &canon, &canon_len, &lerr)) == TDM_OK)
        st = tdm_data_render(tok, &f, &ro, ids, labels, &lerr);
    tdm_data_format format = f.format;
    tdm_data_fields_free(&f);
    json_decref(obj);
    if (st != TDM_OK) {
        free(canon);
        if (st == TDM_ERR_NOMEM) { /* not the line's fault: stop, naming where it happened */
            *err = lerr;
            return tdm_error_prefix(err, "line %lld", (long long)lineno);
        }
        add_bad(r, lineno, 0, lerr.message);
        return TDM_OK;
    }
    for (size_t t = 0; t < ids->len; t++)
        if (ids->ids[t] < 0 || ids->ids[t] >= o->vocab_size) {
            free(canon);
            return tdm_fail(err, TDM_ERR_CORRUPT,
                            "line %lld: token id %d is not below the model's vocab_size %lld (the "
                            "tokenizer does not match the model)",
                            (long long)lineno, ids->ids[t], (long long)o->vocab_size);
        }
    bool is_val = tdm_data_split_is_val(canon, canon_len, o->seed, o->val_split);
    free(canon);

    size_t len = ids->len;
    if ((int64_t)len > r->longest) r->longest = (int64_t)len;
    if (len > (size_t)o->max_seq_len) {
        r->truncated++;
        r->tokens_cut += (int64_t)(len - (size_t)o->max_seq_len);
        len = (size_t)o->max_seq_len;
    }
    uint32_t counted = 0;
    for (size_t t = 1; t < len; t++)
        counted += labels->ids[t] != TDM_LABEL_IGNORE;
    if (counted == 0) {
        if (r->dropped_no_loss < TDM_DATA_MAX_DROPPED_REPORTED)
            r->dropped_lines[r->dropped_no_loss] = lineno;
        r->dropped_no_loss++;
        /* truncated (len = max_seq_len >= 1): did the cut take its counted tokens? */
        for (size_t t = len; t < ids->len; t++)
            if (labels->ids[t] != TDM_LABEL_IGNORE) {
                r->dropped_cut++;
                break;
            }
        return TDM_OK;
    }
    if (!reserve_tokens(b, len) || !reserve_sample(b))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory holding the dataset (%llu tokens)",
                        (unsigned long long)(ds->n_tokens + len));
    memcpy(ds->ids + ds->n_tokens, ids->ids, len * sizeof(int32_t));
    memcpy(ds->labels + ds->n_tokens, labels->ids, len * sizeof(int32_t));
    ds->samples[ds->n_samples++] = (tdm_data_sample){
        .offset = ds->n_tokens,
        .len = (uint32_t)len,
        .counted = counted,
        .line = lineno,
        .format = (uint8_t)format,
        .is_val = is_val,
    };
    ds->n_tokens += len;
    r->samples++;
    r->per_format[format]++;
    r->tokens += (int64_t)len;
    r->counted += counted;
    if (is_val) {
        r->val_samples++;
        r->val_tokens += (int64_t)len;
        r->val_counted += counted;
    } else {
        r->train_samples++;
        r->train_tokens += (int64_t)len;
        r->train_counted += counted;
    }
    return TDM_OK;
}

static tdm_status check_opts(const tdm_dataset_opts *o, tdm_error *err)
{
    if (o->max_seq_len <= 0)
        return tdm_fail(err, TDM_ERR_INVALID, "max_seq_len must be positive (got %d)",
                        o->max_seq_len);
    if (o->vocab_size <= 0)
        return tdm_fail(err, TDM_ERR_INVALID, "vocab_size must be positive (got %lld)",
                        (long long)o->vocab_size);
    if (!(o->val_split >= 0 && o->val_split < 1))
        return tdm_fail(err, TDM_ERR_INVALID, "val_split must be in [0, 1) (got %g)", o->val_split);
    return TDM_OK;
}

static tdm_status read_all(builder *b, FILE *in, const char *path, tdm_tokenizer *tok,
                           const tdm_dataset_opts *o, tdm_error *err)
{
    tdm_data_report *r = &b->ds->report;
    tdm_sha256 hash;
    tdm_sha256_init(&hash);
    tdm_token_ids ids = {0}, labels = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    tdm_status st = TDM_OK;
    while (st == TDM_OK && (got = getline(&line, &cap, in)) >= 0) {
        size_t n = (size_t)got;
        tdm_sha256_update(&hash, line, n);
        int64_t lineno = ++r->lines;
        const char *s = line;
        if (lineno == 1 && n >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) {
            s += 3;
            n -= 3;
        }
        if (is_blank(s, n)) {
            r->blank_lines++;
            continue;
        }
        size_t valid = tdm_utf8_valid_prefix(s, n);
        if (valid < n) {
            add_bad(r, lineno, (int)(valid + 1 + (size_t)(s - line)), "invalid UTF-8");
            continue;
        }
        while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
            n--; /* so that jansson's columns stay within the line */
        st = do_line(b, tok, o, s, n, lineno, &ids, &labels, err);
    }
    if (st == TDM_ERR_INVALID || st == TDM_ERR_NOMEM || st == TDM_ERR_NOT_FOUND ||
        st == TDM_ERR_CORRUPT)
        tdm_error_prefix(err, "%s", path);
    if (st == TDM_OK && ferror(in))
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "%s: read error", path);
    free(line);
    tdm_token_ids_free(&ids);
    tdm_token_ids_free(&labels);
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&hash, d);
    tdm_sha256_tagged(d, r->data_hash);
    return st;
}

tdm_status tdm_dataset_load(tdm_dataset *ds, const char *path, tdm_tokenizer *tok,
                            const tdm_dataset_opts *opts, tdm_data_report *report, tdm_error *err)
{
    memset(ds, 0, sizeof *ds);
    if (report) memset(report, 0, sizeof *report);
    tdm_status st = check_opts(opts, err);
    if (st != TDM_OK) return st;
    FILE *in;
    if ((st = tdm_fopen_regular(path, &in, err)) != TDM_OK) return st;
    builder b = {.ds = ds};
    st = read_all(&b, in, path, tok, opts, err);
    fclose(in);
    if (st == TDM_OK && ds->report.bad_lines > 0 && !opts->skip_bad_lines) {
        const tdm_data_bad_line *first = &ds->report.bad[0];
        char col[16] = "";
        if (first->column) snprintf(col, sizeof col, ":%d", first->column);
        if (ds->report.bad_lines > 1)
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "%s:%lld%s: %s (and %lld more bad lines; --skip-bad-lines leaves "
                          "them out)",
                          path, (long long)first->line, col, first->reason,
                          (long long)ds->report.bad_lines - 1);
        else
            st = tdm_fail(err, TDM_ERR_PARSE, "%s:%lld%s: %s", path, (long long)first->line, col,
                          first->reason);
    }
    if (st == TDM_OK && ds->n_samples) {
        ds->train = malloc((size_t)ds->n_samples * sizeof *ds->train);
        ds->val = malloc((size_t)ds->n_samples * sizeof *ds->val);
        if (!ds->train || !ds->val)
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory indexing the dataset");
        for (uint32_t i = 0; st == TDM_OK && i < ds->n_samples; i++) {
            if (ds->samples[i].is_val)
                ds->val[ds->n_val++] = i;
            else
                ds->train[ds->n_train++] = i;
        }
    }
    if (report) *report = ds->report;
    if (st != TDM_OK) tdm_dataset_free(ds);
    return st;
}

void tdm_dataset_free(tdm_dataset *ds)
{
    free(ds->ids);
    free(ds->labels);
    free(ds->samples);
    free(ds->train);
    free(ds->val);
    memset(ds, 0, sizeof *ds);
}

char *tdm_data_report_bad_text(const tdm_data_report *r, const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    int64_t shown =
        r->bad_lines < TDM_DATA_MAX_BAD_REPORTED ? r->bad_lines : TDM_DATA_MAX_BAD_REPORTED;
    for (int64_t i = 0; i < shown; i++) {
        const tdm_data_bad_line *b = &r->bad[i];
        if (b->column)
            fprintf(m, "%s:%lld:%d: %s\n", path, (long long)b->line, b->column, b->reason);
        else
            fprintf(m, "%s:%lld: %s\n", path, (long long)b->line, b->reason);
    }
    if (r->bad_lines > shown)
        fprintf(m, "... and %lld more bad lines\n", (long long)(r->bad_lines - shown));
    if (fclose(m) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

tdm_status tdm_data_no_train_sample(const tdm_data_report *r, const char *path,
                                    const tdm_dataset_opts *o, tdm_error *err)
{
    char why[768] = "";
    size_t n = 0;
#define WHY(...)                                                                                   \
    do {                                                                                           \
        if (n < sizeof why)                                                                        \
            n += (size_t)snprintf(why + n, sizeof why - n, "%s", n ? "; " : "");                   \
        if (n < sizeof why) n += (size_t)snprintf(why + n, sizeof why - n, __VA_ARGS__);           \
    } while (0)
    if (!r->samples && !r->dropped_no_loss)
        WHY("the file has no sample (%lld lines: %lld blank, %lld bad)", (long long)r->lines,
            (long long)r->blank_lines, (long long)r->bad_lines);
    if (r->dropped_cut)
        WHY("%lld sample(s) lost every token counted in the loss (their completion) when cut to "
            "--max-seq-len %d tokens: raise --max-seq-len (the longest sample has %lld tokens)",
            (long long)r->dropped_cut, (int)o->max_seq_len, (long long)r->longest);
    if (r->dropped_no_loss > r->dropped_cut)
        WHY("%lld sample(s) have no token counted in the loss even uncut (a single token, or "
            "every label -100): fix them (`tandem data check` lists their lines)",
            (long long)(r->dropped_no_loss - r->dropped_cut));
    if (r->samples)
        WHY("%s %lld sample(s) went to validation (--val-split %g): lower --val-split",
            r->dropped_no_loss ? "the other" : "all", (long long)r->samples, o->val_split);
#undef WHY
    return tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: no training sample (%lld samples, %lld for "
                    "validation): %s", path, (long long)r->samples, (long long)r->val_samples, why);
}
