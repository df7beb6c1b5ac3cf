/* report.h — `tandem report`: one self-contained HTML page over the run records of adapters
 * (docs/report.md).
 *
 * tdm_report_load reads each adapter's OUT_DIR (metrics.jsonl, trainer_state.json, metadata.json,
 * docs/run-records.md); an argument without metrics.jsonl is taken as a folder of OUT_DIRs (a
 * finetune's parent folder, `cluster pull --all DEST`) and its subfolders holding one are read, in
 * name order. tdm_report_html renders them: inline SVG charts (train and validation loss of every
 * adapter on shared axes with each best checkpoint marked, learning rate, tokens/s) and a
 * leaderboard table; no network, no script. Every curve carries its points as data attributes
 * and the plot's mapping from values to pixels, so a test can check the drawn coordinates.
 */
#ifndef TANDEM_REPORT_REPORT_H
#define TANDEM_REPORT_REPORT_H
#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_report_series {
    int64_t *step; /* (n) */
    double *value; /* (n) */
    int n, cap;
} tdm_report_series;

typedef struct tdm_report_run {
    char *dir;   /* the OUT_DIR as found */
    char *label; /* metadata.json's label, or NULL */
    tdm_report_series train_loss, val_loss, learning_rate, tokens_per_sec;
    bool has_best;
    int64_t best_step; /* trainer_state.json's best_global_step (else the lowest val_loss) */
    double best_val;
    int64_t last_step;
    double last_epoch;
    int64_t tokens; /* sum of metrics.jsonl's "tokens" */
} tdm_report_run;

/* Reads the adapters under the n paths. Errors: a path that is neither an OUT_DIR nor a folder
 * holding some (TDM_ERR_NOT_FOUND, naming it and what was looked for), a malformed metrics.jsonl
 * line (TDM_ERR_PARSE, FILE:LINE). */
tdm_status tdm_report_load(char *const *paths, int n, tdm_report_run **runs, int *n_runs,
                           tdm_error *err);
void tdm_report_runs_free(tdm_report_run *runs, int n);

/* The page (malloc'd, NUL-terminated), or NULL when out of memory. */
char *tdm_report_html(const tdm_report_run *runs, int n);

#endif
