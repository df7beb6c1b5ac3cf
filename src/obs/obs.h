/* obs.h — one pair of calls that feeds both the profiler (obs/profile.h) and the trace
 * (obs/trace.h) for a phase of the sharing layer.
 *
 *     tdm_obs_span o = tdm_obs_begin(TDM_PHASE_LOCK_ACQ);
 *     int rc = flock(fd, LOCK_EX);
 *     tdm_obs_end(&o, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", rc == 0 ? "locked" : "error")));
 *     // or tdm_obs_end(&o, 0, NULL) without args
 *
 * The phase is recorded in the profiler (when --profile enabled it) and written as a span named
 * after the phase's span name ("LockAcquire", category "phase") in the trace (when --trace opened
 * one), plus an NVTX range when Nsight is attached. The clock is read once at begin and once at
 * end, shared by both; with both off, begin and end read no clock at all.
 *
 * Operation-level spans that enclose several phases (LedgerReserve, LedgerCleanup, LedgerRelease)
 * are plain trace spans: tdm_trace_span_begin("LedgerReserve", "gpu").
 */
#ifndef TANDEM_OBS_OBS_H
#define TANDEM_OBS_OBS_H
#include <stddef.h>

#include "obs/profile.h"
#include "obs/trace.h"

typedef struct tdm_obs_span {
    tdm_phase phase;
    bool profiled;        /* the profiler was on at begin */
    int64_t start_ns;     /* valid when profiled or span.session != 0 */
    tdm_trace_span span;
} tdm_obs_span;

/* Begins phase: one clock read when the profiler is on or a trace is open, none otherwise. */
tdm_obs_span tdm_obs_begin(tdm_phase phase);
/* Ends it, adding the duration to the profiler and the span (with args) to the trace. */
void tdm_obs_end(tdm_obs_span *o, size_t n_args, const tdm_trace_arg *args);

#endif
