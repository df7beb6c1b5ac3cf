/* trace.h — timeline spans for `--trace FILE.json` (Chrome Trace Event Format) and NVTX ranges.
 *
 * Usage (the CLI opens and closes; library code only brackets spans):
 *
 *     tdm_trace_open("run.json", &err);                          // --trace run.json
 *     tdm_trace_span s = tdm_trace_span_begin("LedgerReserve", "gpu");
 *     ...
 *     tdm_trace_span_end(&s, TDM_TRACE_ARGS(TDM_TRACE_INT("budget_mb", 4096),
 *                                            TDM_TRACE_STR("gpu", uuid),
 *                                            TDM_TRACE_STR("outcome", "granted")));
 *     tdm_trace_close(&err);                                     // writes run.json atomically
 *
 * File format (opens in https://ui.perfetto.dev and chrome://tracing):
 *   {"traceEvents": [
 *      {"name": "process_name", "ph": "M", "pid": P, "tid": P, "args": {"name": "tandem"}},
 *      {"name": "LedgerReserve", "cat": "gpu", "ph": "X", "ts": 81234567.891, "dur": 153.2,
 *       "pid": P, "tid": T, "args": {"budget_mb": 4096, "gpu": "GPU-...", "outcome": "granted"}},
 *      ...],
 *    "displayTimeUnit": "ms",
 *    "otherData": {"tool": "tandem", "version": "0.1.0", "clock": "CLOCK_MONOTONIC",
 *                  "dropped_events": 0}}
 *   The process name is "tandem", or "tandem: LABEL" after tdm_trace_set_label(LABEL).
 *   Every span is a complete event ("ph": "X"). ts and dur are microseconds (fractional, ns
 *   resolution); ts is CLOCK_MONOTONIC, so traces of several tandem processes on one machine can
 *   be merged by concatenating their traceEvents arrays. pid is the process id, tid the kernel
 *   thread id. Events are sorted by ts (a parent before the children it encloses). A span still
 *   open when the trace is closed (a wait interrupted by a signal) is written with dur up to the
 *   close and "unfinished": true in its args.
 *
 * Memory: events are buffered in memory and written once, at close, with util/atomic_file.h, so
 * the file is either absent or complete valid JSON: a process that catches SIGINT/SIGTERM and exits
 * through the normal path (closing the trace) leaves a valid trace; SIGKILL leaves none. At most
 * TDM_TRACE_MAX_EVENTS events are kept (about 300 bytes each); later ones are counted in
 * "dropped_events" and a warning is emitted at close. At most TDM_TRACE_MAX_OPEN spans can be open
 * at once for the unfinished-span rescue; more are still recorded when ended.
 *
 * Off (no trace open), begin and end read no clock, take no lock and allocate nothing (besides
 * the NVTX calls below).
 *
 * NVTX: in builds with CUDA (TANDEM_HAVE_CUDA), every span is also an NVTX range in the domain
 * "tandem" (nvtxDomainRangeStartEx/End, so ranges may cross threads and need not nest), visible in
 * Nsight Systems (`nsys profile tandem ...`). NVTX ranges are emitted whether or not a trace file
 * is open; NVTX's loader finds the tool (NVTX_INJECTION64_PATH, which nsys sets, or a statically
 * linked injection) on the first call, and without one each later call is a null-pointer check,
 * so without Nsight they cost next to nothing (they read no tandem clock and take no lock).
 *
 * Thread safety: any thread may begin and end spans; one mutex guards the buffer (taken only while
 * a trace is open). open and close must not race with each other.
 */
#ifndef TANDEM_OBS_TRACE_H
#define TANDEM_OBS_TRACE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define TDM_TRACE_MAX_EVENTS 65536
#define TDM_TRACE_MAX_OPEN 256

typedef enum tdm_trace_arg_kind { TDM_TRACE_ARG_STR, TDM_TRACE_ARG_INT } tdm_trace_arg_kind;

/* One key/value of a span's "args". Strings are copied when the span ends; NULL writes null. */
typedef struct tdm_trace_arg {
    const char *key;
    tdm_trace_arg_kind kind;
    const char *str; /* TDM_TRACE_ARG_STR */
    int64_t num;     /* TDM_TRACE_ARG_INT */
} tdm_trace_arg;

#define TDM_TRACE_STR(k, v) ((tdm_trace_arg){.key = (k), .kind = TDM_TRACE_ARG_STR, .str = (v)})
#define TDM_TRACE_INT(k, v) ((tdm_trace_arg){.key = (k), .kind = TDM_TRACE_ARG_INT, .num = (v)})
/* Expands to the (n_args, args) pair of tdm_trace_span_end from a list of TDM_TRACE_STR/INT. */
#define TDM_TRACE_ARGS(...)                                                                        \
    (sizeof((tdm_trace_arg[]){__VA_ARGS__}) / sizeof(tdm_trace_arg)),                              \
        ((const tdm_trace_arg[]){__VA_ARGS__})

/* A span handle, returned by value by begin; pass its address to end exactly once. */
typedef struct tdm_trace_span {
    uint32_t session; /* the trace it belongs to; 0 when not recording to a file */
    int32_t slot;     /* its place in the open-span table, -1 when none */
    int64_t start_ns; /* CLOCK_MONOTONIC (obs/clock.h) */
    const char *name; /* caller's strings, valid until end */
    const char *cat;
    uint64_t nvtx_id; /* NVTX range id when nvtx is true */
    bool nvtx;
} tdm_trace_span;

/* Starts recording to path (written at close). Fails with TDM_ERR_INVALID when a trace is already
 * open or path is empty, TDM_ERR_IO when path's directory is not a writable directory,
 * TDM_ERR_NOMEM when the buffer cannot be allocated. */
tdm_status tdm_trace_open(const char *path, tdm_error *err);

/* Names this process in the trace ("process_name" metadata: "tandem: <label>", e.g. the --task
 * name), so that merged traces of several jobs are told apart. Copied (up to 127 bytes); only
 * while a trace is open; the last call wins. */
void tdm_trace_set_label(const char *label);

/* True while a trace file is open. */
bool tdm_trace_active(void);

/* Begins a span named name (category cat, e.g. "gpu"): reads the clock only when a trace is open.
 * name and cat must stay valid until the matching end (string literals, typically). */
tdm_trace_span tdm_trace_span_begin(const char *name, const char *cat);
/* Ends it with n_args key/values (TDM_TRACE_ARGS(...), or 0, NULL). Records nothing when the span
 * was begun with no trace open, or the trace was closed (or reopened) since. */
void tdm_trace_span_end(tdm_trace_span *span, size_t n_args, const tdm_trace_arg *args);

/* The same with a time the caller already read from tdm_obs_now_ns() (for obs/obs.h, which shares
 * one clock read between the profiler and the trace). */
tdm_trace_span tdm_trace_span_begin_at(const char *name, const char *cat, int64_t start_ns);
void tdm_trace_span_end_at(tdm_trace_span *span, int64_t end_ns, size_t n_args,
                           const tdm_trace_arg *args);

/* Writes the trace file atomically (temp + fsync + rename + dirsync), frees the buffer and stops
 * recording, also when the write fails. Spans still open are written as unfinished. Closing when
 * no trace is open is a no-op returning TDM_OK. */
tdm_status tdm_trace_close(tdm_error *err);

#endif
