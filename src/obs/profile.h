/* profile.h — phase timings of the GPU sharing layer (and, later, of training), zero cost when off.
 *
 * Code brackets each phase:
 *
 *     tdm_prof_t t = tdm_profile_begin(TDM_PHASE_LOCK_ACQ);
 *     ... flock(...) ...
 *     tdm_profile_end(TDM_PHASE_LOCK_ACQ, t);
 *
 * and the CLI (`--profile`) calls tdm_profile_enable(true) at start and tdm_profile_report() at the
 * end. Per phase the profiler keeps count, total, mean and max in nanoseconds.
 *
 * Disabled (the default), begin and end read no clock and touch no shared memory beyond one
 * relaxed atomic load of the on/off flag; tests/unit/test_profile.c proves "no clock read" with a
 * counting clock (obs/clock.h).
 *
 * Overhead: the phases of kind TDM_PHASE_SHARING (taking the lock, reading the ledger, querying
 * VRAM, writing the ledger, releasing the lock) are the cost of the sharing mechanism, and the
 * report gives their sum as a share of the job's wall time, flagged above
 * TDM_PROFILE_OVERHEAD_LIMIT (5 %). Time spent waiting for memory (TDM_PHASE_WAIT: wait_poll,
 * the sleeps between admission attempts) is not overhead of the mechanism — without sharing the
 * job could not have run at all then — so it is reported but not counted. Lock contention is
 * counted (it is inside lock_acq). Phases must not nest inside one another, or time is counted
 * twice; wait_poll should cover only the sleep between attempts, whose own phases are separate.
 *
 * Thread safety: counters are C11 atomics (relaxed), so any number of threads of one process may
 * record at once without a lock. A snapshot taken while threads still record is per-field exact
 * but not one consistent cut across fields; take the report after the workers are done.
 */
#ifndef TANDEM_OBS_PROFILE_H
#define TANDEM_OBS_PROFILE_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "util/error.h"

typedef enum tdm_phase_kind {
    TDM_PHASE_SHARING, /* cost of the sharing mechanism: counted as overhead */
    TDM_PHASE_WAIT,    /* waiting for memory to become free: reported, not overhead */
    TDM_PHASE_WORK,    /* the job's own work (training phases): reported, not overhead */
} tdm_phase_kind;

/* The phase table. Adding a phase is one line here:
 *   X(ENUM_SUFFIX, "report_name", "TraceSpanName", kind)
 * The report name is what --profile prints; the span name is what obs/obs.h writes to traces. */
#define TDM_PROFILE_PHASES(X)                                                                      \
    X(LOCK_ACQ, "lock_acq", "LockAcquire", TDM_PHASE_SHARING)                                      \
    X(LEDGER_RD, "ledger_rd", "LedgerRead", TDM_PHASE_SHARING)                                     \
    X(VRAM_QRY, "vram_qry", "VramQuery", TDM_PHASE_SHARING)                                        \
    X(LEDGER_WR, "ledger_wr", "LedgerWrite", TDM_PHASE_SHARING)                                    \
    X(LOCK_REL, "lock_rel", "LockRelease", TDM_PHASE_SHARING)                                      \
    X(WAIT_POLL, "wait_poll", "WaitPoll", TDM_PHASE_WAIT)

typedef enum tdm_phase {
#define TDM_PHASE_ENUM_(id, name, span, kind) TDM_PHASE_##id,
    TDM_PROFILE_PHASES(TDM_PHASE_ENUM_)
#undef TDM_PHASE_ENUM_
        TDM_PHASE_COUNT
} tdm_phase;

/* Share of the job's wall time above which the report flags the sharing overhead. */
#define TDM_PROFILE_OVERHEAD_LIMIT 0.05

/* What begin returns: the start time in ns, or TDM_PROF_OFF when the profiler was off. */
typedef int64_t tdm_prof_t;
#define TDM_PROF_OFF INT64_MIN

/* "lock_acq"; "?" for an out-of-range value. */
const char *tdm_phase_name(tdm_phase phase);
/* "LockAcquire": the trace span name of the phase; "?" for an out-of-range value. */
const char *tdm_phase_span_name(tdm_phase phase);
tdm_phase_kind tdm_phase_kind_of(tdm_phase phase);

/* Turns recording on or off for the whole process. Off is the default. Counters are kept. */
void tdm_profile_enable(bool on);
bool tdm_profile_enabled(void);
/* Zeroes every counter. */
void tdm_profile_reset(void);

/* Starts timing a phase: reads the clock only when enabled; TDM_PROF_OFF otherwise. */
tdm_prof_t tdm_profile_begin(tdm_phase phase);
/* Ends it: when t is not TDM_PROF_OFF and the profiler is still on, reads the clock once and adds
 * (now - t) to the phase. Otherwise does nothing and reads no clock. */
void tdm_profile_end(tdm_phase phase, tdm_prof_t t);
/* Adds one occurrence of dur_ns to the phase when enabled (for callers that already measured it,
 * e.g. obs/obs.h). Negative durations count as 0. */
void tdm_profile_add(tdm_phase phase, int64_t dur_ns);

typedef struct tdm_phase_stats {
    int64_t count;
    int64_t total_ns;
    int64_t mean_ns; /* total_ns / count, 0 when count is 0 */
    int64_t max_ns;
} tdm_phase_stats;

/* Copies the counters: out[phase] for every phase. */
void tdm_profile_snapshot(tdm_phase_stats out[TDM_PHASE_COUNT]);

typedef struct tdm_profile_summary {
    int64_t job_wall_ns;   /* as given */
    int64_t overhead_ns;   /* sum over TDM_PHASE_SHARING phases */
    int64_t wait_ns;       /* sum over TDM_PHASE_WAIT phases */
    double overhead_share; /* overhead_ns / job_wall_ns; 0 when job_wall_ns <= 0 */
    bool over_limit;       /* overhead_share > TDM_PROFILE_OVERHEAD_LIMIT */
} tdm_profile_summary;

void tdm_profile_summarize(int64_t job_wall_ns, tdm_profile_summary *out);

/* Writes the human-readable table and the overhead line to out (the CLI picks stderr or a file):
 *
 *     profile of the GPU sharing layer (job wall time 12.000 s)
 *     phase           count     total ms      mean us       max us
 *     lock_acq           12        0.120       10.000       30.000
 *     ...
 *     wait_poll           3     2000.000   666666.667  1000000.000  (waiting for memory, not overhead)
 *     sharing overhead: 0.500 ms = 0.004 % of wall time (limit 5 %)
 *
 * When the share is above the limit the last line ends ": ABOVE the limit". job_wall_ns <= 0
 * prints "n/a" for the share. Fails with TDM_ERR_IO when writing fails. */
tdm_status tdm_profile_report(FILE *out, int64_t job_wall_ns, tdm_error *err);

/* The same as a JSON object (new reference; NULL when out of memory):
 *   {"job_wall_ns": N, "phases": [{"name": "lock_acq", "kind": "sharing"|"wait"|"work",
 *    "count": N, "total_ns": N, "mean_ns": N, "max_ns": N}, ...], "overhead_ns": N,
 *    "wait_ns": N, "overhead_share": X, "overhead_limit": 0.05, "over_limit": bool} */
json_t *tdm_profile_report_json(int64_t job_wall_ns);

#endif
