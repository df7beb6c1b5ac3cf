#include "report/report.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/run_records.h"
#include "util/atomic_file.h"

/* ------------------------------------------------------------------ loading */

static bool series_add(tdm_report_series *s, int64_t step, double v)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        int64_t *st = realloc(s->step, (size_t)cap * sizeof *st);
        if (!st) return false;
        s->step = st;
        double *va = realloc(s->value, (size_t)cap * sizeof *va);
        if (!va) return false;
        s->value = va;
        s->cap = cap;
    }
    s->step[s->n] = step;
    s->value[s->n] = v;
    s->n++;
    return true;
}

static void series_free(tdm_report_series *s)
{
    free(s->step);
    free(s->value);
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A number member of o, or NAN. */
static double num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static tdm_status read_metrics(const char *path, tdm_report_run *r, tdm_error *err)
{
    char *text;
    size_t len;
    TDM_TRY(tdm_read_file(path, &text, &len, err));
    tdm_status st = TDM_OK;
    int line = 0;
    for (char *p = text; p < text + len && st == TDM_OK;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) break; /* a line being written */
        line++;
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &je);
        const json_t *s = o ? json_object_get(o, "step") : NULL;
        if (!json_is_integer(s)) {
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "%s:%d: not a metrics line (a JSON object with an integer \"step\")%s%s",
                          path, line, o ? "" : ": ", o ? "" : je.text);
        } else {
            int64_t step = json_integer_value(s);
            double loss = num(o, "loss"), val = num(o, "val_loss");
            double lr = num(o, "learning_rate"), tps = num(o, "tokens_per_sec");
            double ep = num(o, "epoch");
            const json_t *tok = json_object_get(o, "tokens");
            bool ok = (isnan(loss) || series_add(&r->train_loss, step, loss)) &&
                      (isnan(val) || series_add(&r->val_loss, step, val)) &&
                      (isnan(lr) || series_add(&r->learning_rate, step, lr)) &&
                      (isnan(tps) || series_add(&r->tokens_per_sec, step, tps));
            if (!ok) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
            if (json_is_integer(tok)) r->tokens += json_integer_value(tok);
            if (step > r->last_step) r->last_step = step;
            if (!isnan(ep) && ep > r->last_epoch) r->last_epoch = ep;
        }
        json_decref(o);
        p = nl + 1;
    }
    free(text);
    return st;
}

static tdm_status load_one(const char *dir, tdm_report_run *r, tdm_error *err)
{
    memset(r, 0, sizeof *r);
    r->dir = strdup(dir);
    if (!r->dir) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, TDM_METRICS_FILE);
    TDM_TRY(read_metrics(path, r, err));
    snprintf(path, sizeof path, "%s/%s", dir, TDM_TRAINER_STATE_FILE);
    json_t *ts = is_file(path) ? json_load_file(path, 0, NULL) : NULL;
    const json_t *bs = json_object_get(ts, "best_global_step");
    double bm = num(ts, "best_metric");
    if (json_is_integer(bs) && !isnan(bm)) {
        r->has_best = true;
        r->best_step = json_integer_value(bs);
        r->best_val = bm;
    }
    json_decref(ts);
    if (!r->has_best && r->val_loss.n > 0) { /* no trainer_state.json: the lowest val_loss */
        int b = 0;
        for (int i = 1; i < r->val_loss.n; i++)
            if (r->val_loss.value[i] < r->val_loss.value[b]) b = i;
        r->has_best = true;
        r->best_step = r->val_loss.step[b];
        r->best_val = r->val_loss.value[b];
    }
    snprintf(path, sizeof path, "%s/%s", dir, TDM_METADATA_FILE);
    json_t *md = is_file(path) ? json_load_file(path, 0, NULL) : NULL;
    const json_t *label = json_object_get(md, "label");
    if (json_is_string(label) && json_string_length(label) > 0) {
        r->label = strdup(json_string_value(label));
        if (!r->label) {
            json_decref(md);
            return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        }
    }
    json_decref(md);
    return TDM_OK;
}

static tdm_status push_run(const char *dir, tdm_report_run **runs, int *n, int *cap, tdm_error *err)
{
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 8;
        tdm_report_run *g = realloc(*runs, (size_t)c * sizeof *g);
        if (!g) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        *runs = g;
        *cap = c;
    }
    tdm_status st = load_one(dir, &(*runs)[*n], err);
    (*n)++; /* counted even when it failed: freed with the others */
    return st;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

tdm_status tdm_report_load(char *const *paths, int n, tdm_report_run **runs, int *n_runs,
                           tdm_error *err)
{
    *runs = NULL;
    *n_runs = 0;
    int cap = 0;
    tdm_status st = TDM_OK;
    for (int i = 0; i < n && st == TDM_OK; i++) {
        char m[4400];
        snprintf(m, sizeof m, "%s/%s", paths[i], TDM_METRICS_FILE);
        if (is_file(m)) {
            st = push_run(paths[i], runs, n_runs, &cap, err);
            continue;
        }
        struct dirent **names = NULL;
        int k = scandir(paths[i], &names, NULL, by_name);
        if (k < 0) { /* exit status as for a folder without run records */
            st = errno == ENOENT ? tdm_fail(err, TDM_ERR_NOT_FOUND,
                                            "%s does not exist: give an adapter's OUT_DIR",
                                            paths[i])
                                 : tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: %s: give an adapter's "
                                            "OUT_DIR", paths[i], strerror(errno));
            break;
        }
        int found = 0;
        for (int j = 0; j < k; j++) {
            char sub[4096];
            if (names[j]->d_name[0] != '.' && st == TDM_OK) {
                snprintf(sub, sizeof sub, "%s/%s", paths[i], names[j]->d_name);
                snprintf(m, sizeof m, "%s/%s", sub, TDM_METRICS_FILE);
                if (is_file(m)) {
                    st = push_run(sub, runs, n_runs, &cap, err);
                    found++;
                }
            }
            free(names[j]);
        }
        free(names);
        if (st == TDM_OK && found == 0)
            st = tdm_fail(err, TDM_ERR_NOT_FOUND,
                          "%s: no %s in it or in its subfolders: give an adapter's OUT_DIR (or "
                          "the folder above several, e.g. `tandem cluster pull --all` DEST)",
                          paths[i], TDM_METRICS_FILE);
    }
    if (st != TDM_OK) {
        tdm_report_runs_free(*runs, *n_runs);
        *runs = NULL;
        *n_runs = 0;
    }
    return st;
}

void tdm_report_runs_free(tdm_report_run *runs, int n)
{
    for (int i = 0; i < n; i++) {
        free(runs[i].dir);
        free(runs[i].label);
        series_free(&runs[i].train_loss);
        series_free(&runs[i].val_loss);
        series_free(&runs[i].learning_rate);
        series_free(&runs[i].tokens_per_sec);
    }
    free(runs);
}

/* ------------------------------------------------------------------ rendering */

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_PALETTE (int)(sizeof palette / sizeof palette[0])

static const char *color(int run)
{
    return palette[run % N_PALETTE];
}

static void esc(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&#39;", f);
            break;
        default:
            fputc(*s, f);
        }
}

static const char *name(const tdm_report_run *r)
{
    return r->label ? r->label : r->dir;
}

/* Chart geometry (SVG user units). */
enum { CW = 760, CH = 300, ML = 72, MR = 16, MT = 12, MB = 40 };
#define PW (CW - ML - MR)
#define PH (CH - MT - MB)

typedef struct axes {
    double x0, x1, y0, y1;
} axes;

static double px(const axes *a, double x)
{
    return ML + (x - a->x0) / (a->x1 - a->x0) * PW;
}

static double py(const axes *a, double y)
{
    return MT + PH - (y - a->y0) / (a->y1 - a->y0) * PH;
}

static double nice_step(double range, int want)
{
    double raw = range / want;
    double mag = pow(10, floor(log10(raw)));
    double norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

/* series picks one of a run's series */
typedef const tdm_report_series *(*pick_fn)(const tdm_report_run *r);

static const tdm_report_series *pick_train(const tdm_report_run *r)
{
    return &r->train_loss;
}
static const tdm_report_series *pick_val(const tdm_report_run *r)
{
    return &r->val_loss;
}
static const tdm_report_series *pick_lr(const tdm_report_run *r)
{
    return &r->learning_rate;
}
static const tdm_report_series *pick_tps(const tdm_report_run *r)
{
    return &r->tokens_per_sec;
}

typedef struct series_kind {
    const char *id; /* data-series */
    pick_fn pick;
    bool dashed, dots;
} series_kind;

static void path(FILE *f, const axes *a, const tdm_report_run *r, int run, const series_kind *k)
{
    const tdm_report_series *s = k->pick(r);
    if (s->n == 0) return;
    fprintf(f, "<path class=\"series\" data-run=\"%d\" data-adapter=\"", run);
    esc(f, name(r));
    fprintf(f, "\" data-series=\"%s\" data-points=\"", k->id);
    for (int i = 0; i < s->n; i++)
        fprintf(f, "%s%lld,%.17g", i ? " " : "", (long long)s->step[i], s->value[i]);
    fputs("\" d=\"", f);
    for (int i = 0; i < s->n; i++)
        fprintf(f, "%s%.3f %.3f", i ? " L" : "M", px(a, (double)s->step[i]), py(a, s->value[i]));
    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s><title>", color(run),
            k->dashed ? " stroke-dasharray=\"6 4\"" : "");
    esc(f, name(r));
    fprintf(f, " %s</title></path>\n", k->id);
    for (int i = 0; k->dots && i < s->n; i++)
        fprintf(f, "<circle class=\"point\" cx=\"%.3f\" cy=\"%.3f\" r=\"2.6\" fill=\"%s\"/>\n",
                px(a, (double)s->step[i]), py(a, s->value[i]), color(run));
}

static void chart(FILE *f, const char *id, const char *title, const char *ylabel,
                  const tdm_report_run *runs, int n, const series_kind *kinds, int nk,
                  bool mark_best)
{
    axes a = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    int points = 0;
    for (int r = 0; r < n; r++)
        for (int k = 0; k < nk; k++) {
            const tdm_report_series *s = kinds[k].pick(&runs[r]);
            for (int i = 0; i < s->n; i++) {
                if (!isfinite(s->value[i])) continue;
                a.x0 = fmin(a.x0, (double)s->step[i]);
                a.x1 = fmax(a.x1, (double)s->step[i]);
                a.y0 = fmin(a.y0, s->value[i]);
                a.y1 = fmax(a.y1, s->value[i]);
                points++;
            }
        }
    fprintf(f, "<section class=\"chart\"><h2>%s</h2>\n", title);
    if (points == 0) {
        fputs("<p class=\"empty\">nothing logged</p></section>\n", f);
        return;
    }
    if (a.x1 <= a.x0) a.x1 = a.x0 + 1;
    double pad = (a.y1 - a.y0) * 0.05;
    if (pad <= 0) pad = fmax(fabs(a.y0) * 0.05, 1e-9);
    a.y0 -= pad;
    a.y1 += pad;
    fprintf(f,
            "<svg id=\"chart-%s\" class=\"plot\" "
            "viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" data-x0=\"%.17g\" data-x1=\"%.17g\" "
            "data-y0=\"%.17g\" data-y1=\"%.17g\" data-left=\"%d\" data-top=\"%d\" "
            "data-width=\"%d\" data-height=\"%d\">\n",
            id, CW, CH, CW, CH, a.x0, a.x1, a.y0, a.y1, ML, MT, PW, PH);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n", ML, MT, PW,
            PH);
    double ys = nice_step(a.y1 - a.y0, 5);
    for (double y = ceil(a.y0 / ys) * ys; y <= a.y1; y += ys) {
        double yy = py(&a, y);
        fprintf(f,
                "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.3f\" y2=\"%.3f\"/>"
                "<text class=\"tick\" x=\"%d\" y=\"%.3f\" text-anchor=\"end\">%.4g</text>\n",
                ML, ML + PW, yy, yy, ML - 6, yy + 4, fabs(y) < ys * 1e-6 ? 0.0 : y);
    }
    double xs = fmax(1, nice_step(a.x1 - a.x0, 8));
    for (double x = ceil(a.x0 / xs) * xs; x <= a.x1; x += xs) {
        double xx = px(&a, x);
        fprintf(f,
                "<line class=\"grid\" x1=\"%.3f\" x2=\"%.3f\" y1=\"%d\" y2=\"%d\"/>"
                "<text class=\"tick\" x=\"%.3f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n",
                xx, xx, MT, MT + PH, xx, MT + PH + 16, x);
    }
    fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
            ML + PW / 2, CH - 6);
    fprintf(f,
            "<text class=\"axis\" transform=\"translate(14 %d) rotate(-90)\" "
            "text-anchor=\"middle\">%s</text>\n",
            MT + PH / 2, ylabel);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < nk; k++)
            path(f, &a, &runs[r], r, &kinds[k]);
    for (int r = 0; mark_best && r < n; r++) {
        if (!runs[r].has_best) continue;
        double cx = px(&a, (double)runs[r].best_step), cy = py(&a, runs[r].best_val);
        fprintf(f,
                "<circle class=\"best\" data-run=\"%d\" data-step=\"%lld\" data-value=\"%.17g\" "
                "cx=\"%.3f\" cy=\"%.3f\" r=\"7\" fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\">"
                "<title>best checkpoint of ",
                r, (long long)runs[r].best_step, runs[r].best_val, cx, cy, color(r));
        esc(f, name(&runs[r]));
        fprintf(f, ": step %lld, val_loss %.4f</title></circle>\n", (long long)runs[r].best_step,
                runs[r].best_val);
        bool right = cx > ML + PW - 40; /* near the right edge: the label goes left */
        fprintf(f,
                "<text class=\"best-label\" x=\"%.3f\" y=\"%.3f\" fill=\"%s\" "
                "text-anchor=\"%s\">best</text>\n",
                right ? cx - 9 : cx + 9, cy - 9, color(r), right ? "end" : "start");
    }
    fputs("</svg>\n", f);
    fputs("<div class=\"legend\">", f);
    for (int r = 0; r < n; r++) {
        fprintf(f, "<span><i style=\"background:%s\"></i>", color(r));
        esc(f, name(&runs[r]));
        fputs("</span>", f);
    }
    if (nk > 1)
        fputs("<span class=\"note\">solid: train · dashed with dots: validation · "
              "circle: best checkpoint</span>",
              f);
    fputs("</div></section>\n", f);
}

static double last(const tdm_report_series *s)
{
    return s->n ? s->value[s->n - 1] : NAN;
}

static void cell_num(FILE *f, double v, int decimals)
{
    fputs("<td class=\"num\">", f);
    if (isnan(v))
        fputs("–", f);
    else
        fprintf(f, "%.*f", decimals, v);
    fputs("</td>", f);
}

/* leaderboard order: the lowest best val_loss first, adapters without one after, by final loss */
static bool before(const tdm_report_run *a, const tdm_report_run *b)
{
    if (a->has_best != b->has_best) return a->has_best;
    double x = a->has_best ? a->best_val : last(&a->train_loss);
    double y = b->has_best ? b->best_val : last(&b->train_loss);
    if (isnan(x) != isnan(y)) return !isnan(x);
    return x < y;
}

static void leaderboard(FILE *f, const tdm_report_run *runs, int n)
{
    int *order = malloc((size_t)n * sizeof *order);
    if (!order) return;
    for (int i = 0; i < n; i++) { /* insertion sort: stable, n is small */
        int j = i;
        for (; j > 0 && before(&runs[i], &runs[order[j - 1]]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    fputs("<section><h2>Leaderboard</h2><table id=\"leaderboard\"><thead><tr><th>#</th>"
          "<th>adapter</th><th>best val_loss</th><th>best step</th><th>final train loss</th>"
          "<th>steps</th><th>epochs</th><th>tokens</th><th>tokens/s</th><th>OUT_DIR</th>"
          "</tr></thead><tbody>\n",
          f);
    for (int k = 0; k < n; k++) {
        const tdm_report_run *r = &runs[order[k]];
        fprintf(f,
                "<tr data-run=\"%d\"><td class=\"num\">%d</td><td><i class=\"sw\" "
                "style=\"background:%s\"></i>",
                order[k], k + 1, color(order[k]));
        esc(f, name(r));
        fputs("</td>", f);
        cell_num(f, r->has_best ? r->best_val : NAN, 4);
        cell_num(f, r->has_best ? (double)r->best_step : NAN, 0);
        cell_num(f, last(&r->train_loss), 4);
        fprintf(f, "<td class=\"num\">%lld</td>", (long long)r->last_step);
        cell_num(f, r->last_epoch, 2);
        fprintf(f, "<td class=\"num\">%lld</td>", (long long)r->tokens);
        cell_num(f, last(&r->tokens_per_sec), 0);
        fputs("<td><code>", f);
        esc(f, r->dir);
        fputs("</code></td></tr>\n", f);
    }
    fputs("</tbody></table></section>\n", f);
    free(order);
}

static const char style[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:820px}"
    "h1{font-size:20px}h2{font-size:16px;margin:20px 0 6px}"
    "table{border-collapse:collapse}th,td{padding:3px 8px;border-bottom:1px solid #ddd;"
    "text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "i.sw,.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;"
    "vertical-align:-1px}.legend span{margin-right:14px}.legend .note{color:#666}"
    ".frame{fill:#fff;stroke:#bbb}.grid{stroke:#eee}.tick{font-size:11px;fill:#555}"
    ".axis{font-size:12px;fill:#333}.best-label{font-size:11px;font-weight:bold}"
    "code{font-size:12px}";

char *tdm_report_html(const tdm_report_run *runs, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>tandem report</title><style>",
          f);
    fputs(style, f);
    fprintf(f, "</style></head><body>\n<h1>tandem report: %d adapter%s</h1>\n", n,
            n == 1 ? "" : "s");
    leaderboard(f, runs, n);
    static const series_kind loss[] = {{"train_loss", pick_train, false, false},
                                       {"val_loss", pick_val, true, true}};
    static const series_kind lr[] = {{"learning_rate", pick_lr, false, false}};
    static const series_kind tps[] = {{"tokens_per_sec", pick_tps, false, false}};
    chart(f, "loss", "Loss", "loss", runs, n, loss, 2, true);
    chart(f, "lr", "Learning rate", "learning rate", runs, n, lr, 1, false);
    chart(f, "tps", "Tokens per second", "tokens/s", runs, n, tps, 1, false);
    fputs("<p class=\"note\">made by <code>tandem report</code> from each OUT_DIR's "
          "metrics.jsonl and trainer_state.json</p>\n</body></html>\n",
          f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
