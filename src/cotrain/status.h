/* status.h — a co-training host's live state, as `tandem gpu status` shows it: the adapters it
 * trains, whose joiner each belongs to, each one's step, epoch and share of the fused passes.
 *
 * The host publishes it in its advertisement (endpoint.h), as the field "status", rewritten
 * atomically at a step boundary at most once per TDM_COTRAIN_STATUS_PERIOD_MS (and at once when
 * an adapter joins, finishes or is handed back). Readers only read files: no connection, no
 * peer check, no load on the host's service thread, and a frozen host still shows its last
 * state with its age (docs/co-training.md "Live status" says why not a query message):
 *
 *   "status": {"v": 1, "updated_ms": 1764680012345, "global_step": 42,
 *              "schedule": "synchronized",
 *              "plan": {"grad_checkpoint": true, "recompute": "attn", "split": 1},
 *              "adapters": [
 *                {"index": 0, "label": "greet", "data": "data/greet.jsonl", "output": "out/greet",
 *                 "joiner": null, "state": "training", "step": 6, "total_steps": 24,
 *                 "epoch": 0.5, "epochs": 2, "loss": 1.23, "tokens_per_sec": 812.5,
 *                 "weight": 1, "share": 0.5},
 *                {"index": 1, ..., "joiner": {"pid": 4250, "user": "bob"}, ...}]}
 *
 * index: the adapter's index in the host's trainer; joiner: null for the host's own adapters;
 * state: training | finished | detached (handed back to its joiner); loss (latest step),
 * tokens_per_sec and share may be null (no step yet; no pass since the last update); share: the
 * adapter's fraction of the sequences of the fused passes since the previous update (the
 * synchronized schedule gives weight / max weight per pass; round-robin one adapter per step).
 * plan: the memory plan the host's fused passes use now (it changes when joins make the host
 * re-plan: docs/co-training.md "Memory admission"): gradient checkpointing, its recompute mode
 * (null without checkpointing) and the split (1: each adapter's whole batch in one pass). It is
 * optional: a status without it (an older tandem) is read with has_plan false.
 * The status has its own "v": an advertisement without it (a host before its first step
 * boundary, or an older tandem) is listed without adapters.
 */
#ifndef TANDEM_COTRAIN_STATUS_H
#define TANDEM_COTRAIN_STATUS_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cotrain/endpoint.h"
#include "util/error.h"

#define TDM_COTRAIN_STATUS_VERSION 1
#define TDM_COTRAIN_STATUS_PERIOD_MS 1000    /* at most one rewrite per period (plus changes) */
#define TDM_COTRAIN_STATUS_MAX_ADAPTERS 4096 /* a reader refuses longer lists */

typedef enum tdm_cotrain_adapter_state {
    TDM_COTRAIN_ADAPTER_TRAINING,
    TDM_COTRAIN_ADAPTER_FINISHED,
    TDM_COTRAIN_ADAPTER_DETACHED,
} tdm_cotrain_adapter_state;

const char *tdm_cotrain_adapter_state_name(tdm_cotrain_adapter_state s);

typedef struct tdm_cotrain_status_adapter {
    int index;                   /* in the host's trainer */
    char *label, *data, *output; /* owned (status_free); paths as the host was given them */
    int32_t joiner_pid;          /* 0: the host's own adapter */
    char joiner_user[64];
    tdm_cotrain_adapter_state state;
    int64_t step, total_steps; /* optimizer steps */
    double epoch;              /* fractional epochs done */
    int epochs;
    double loss;           /* latest step's; NaN: none yet */
    double tokens_per_sec; /* NaN: none yet */
    double weight;
    double share; /* in [0, 1]; NaN: no pass since the previous update */
} tdm_cotrain_status_adapter;

typedef struct tdm_cotrain_status {
    int64_t updated_ms; /* Unix milliseconds of the write */
    int64_t global_step;
    char schedule[32];
    bool has_plan;        /* false: the host published no plan (an older tandem) */
    bool grad_checkpoint; /* plan: */
    char recompute[16];   /* "layer" | "mlp" | "attn"; "" without checkpointing */
    int split;            /* >= 1 */
    int n_adapters;
    tdm_cotrain_status_adapter *adapters; /* owned */
} tdm_cotrain_status;

/* The "status" object of s (new reference; NULL when out of memory). */
json_t *tdm_cotrain_status_json(const tdm_cotrain_status *s);

/* Reads a "status" object into *out (zeroed first; free with tdm_cotrain_status_free).
 * TDM_ERR_UNSUPPORTED for another "v"; TDM_ERR_PARSE naming the field for a missing or
 * mistyped field, an out-of-range number or too many adapters (anyone who can write the
 * ledger directory can write this file). */
tdm_status tdm_cotrain_status_parse(const json_t *o, tdm_cotrain_status *out, tdm_error *err);
void tdm_cotrain_status_free(tdm_cotrain_status *s);

/* One host as `gpu status` lists it. */
typedef struct tdm_cotrain_host_view {
    tdm_cotrain_advert advert;
    bool has_status; /* false: none published yet, or one this version does not read */
    tdm_cotrain_status status;
} tdm_cotrain_host_view;

/* Every live host advertised in dir (tdm_cotrain_discover: oldest first, dead hosts' files
 * removed) with its published status, into a malloc'd *out (tdm_cotrain_host_views_free). */
tdm_status tdm_cotrain_status_list(const char *dir, tdm_cotrain_host_view **out, size_t *n,
                                   tdm_error *err);
void tdm_cotrain_host_views_free(tdm_cotrain_host_view *v, size_t n);

#endif
