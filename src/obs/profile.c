#include "obs/profile.h"

#include <stdatomic.h>

#include "obs/clock.h"

static const struct {
    const char *name;
    const char *span;
    tdm_phase_kind kind;
} phase_info[TDM_PHASE_COUNT] = {
#define TDM_PHASE_INFO_(id, name, span, kind) [TDM_PHASE_##id] = {name, span, kind},
    TDM_PROFILE_PHASES(TDM_PHASE_INFO_)
#undef TDM_PHASE_INFO_
};

typedef struct phase_counters {
    _Atomic int64_t count;
    _Atomic int64_t total_ns;
    _Atomic int64_t max_ns;
} phase_counters;

static atomic_bool enabled;
static phase_counters counters[TDM_PHASE_COUNT];

static bool valid(tdm_phase phase)
{
    return (unsigned)phase < TDM_PHASE_COUNT;
}

const char *tdm_phase_name(tdm_phase phase)
{
    return valid(phase) ? phase_info[phase].name : "?";
}

const char *tdm_phase_span_name(tdm_phase phase)
{
    return valid(phase) ? phase_info[phase].span : "?";
}

tdm_phase_kind tdm_phase_kind_of(tdm_phase phase)
{
    return valid(phase) ? phase_info[phase].kind : TDM_PHASE_WORK;
}

void tdm_profile_enable(bool on)
{
    atomic_store(&enabled, on);
}

bool tdm_profile_enabled(void)
{
    return atomic_load_explicit(&enabled, memory_order_relaxed);
}

void tdm_profile_reset(void)
{
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        atomic_store(&counters[i].count, 0);
        atomic_store(&counters[i].total_ns, 0);
        atomic_store(&counters[i].max_ns, 0);
    }
}

tdm_prof_t tdm_profile_begin(tdm_phase phase)
{
    if (!tdm_profile_enabled() || !valid(phase))
        return TDM_PROF_OFF;
    return tdm_obs_now_ns();
}

static void record(tdm_phase phase, int64_t dur_ns)
{
    if (dur_ns < 0)
        dur_ns = 0;
    phase_counters *c = &counters[phase];
    atomic_fetch_add_explicit(&c->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->total_ns, dur_ns, memory_order_relaxed);
    int64_t seen = atomic_load_explicit(&c->max_ns, memory_order_relaxed);
    while (dur_ns > seen && !atomic_compare_exchange_weak_explicit(
                                &c->max_ns, &seen, dur_ns, memory_order_relaxed,
                                memory_order_relaxed)) {
    }
}

void tdm_profile_end(tdm_phase phase, tdm_prof_t t)
{
    if (t == TDM_PROF_OFF || !valid(phase) || !tdm_profile_enabled())
        return;
    record(phase, tdm_obs_now_ns() - t);
}

void tdm_profile_add(tdm_phase phase, int64_t dur_ns)
{
    if (!valid(phase) || !tdm_profile_enabled())
        return;
    record(phase, dur_ns);
}

void tdm_profile_snapshot(tdm_phase_stats out[TDM_PHASE_COUNT])
{
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        out[i].count = atomic_load(&counters[i].count);
        out[i].total_ns = atomic_load(&counters[i].total_ns);
        out[i].max_ns = atomic_load(&counters[i].max_ns);
        out[i].mean_ns = out[i].count > 0 ? out[i].total_ns / out[i].count : 0;
    }
}

static void summarize_stats(const tdm_phase_stats stats[TDM_PHASE_COUNT], int64_t job_wall_ns,
                            tdm_profile_summary *out)
{
    *out = (tdm_profile_summary){.job_wall_ns = job_wall_ns};
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        if (phase_info[i].kind == TDM_PHASE_SHARING)
            out->overhead_ns += stats[i].total_ns;
        else if (phase_info[i].kind == TDM_PHASE_WAIT)
            out->wait_ns += stats[i].total_ns;
    }
    if (job_wall_ns > 0)
        out->overhead_share = (double)out->overhead_ns / (double)job_wall_ns;
    out->over_limit = out->overhead_share > TDM_PROFILE_OVERHEAD_LIMIT;
}

void tdm_profile_summarize(int64_t job_wall_ns, tdm_profile_summary *out)
{
    tdm_phase_stats stats[TDM_PHASE_COUNT];
    tdm_profile_snapshot(stats);
    summarize_stats(stats, job_wall_ns, out);
}

static const char *kind_name(tdm_phase_kind kind)
{
    switch (kind) {
    case TDM_PHASE_SHARING:
        return "sharing";
    case TDM_PHASE_WAIT:
        return "wait";
    case TDM_PHASE_WORK:
        break;
    }
    return "work";
}

tdm_status tdm_profile_report(FILE *out, int64_t job_wall_ns, tdm_error *err)
{
    tdm_phase_stats stats[TDM_PHASE_COUNT];
    tdm_profile_snapshot(stats);
    tdm_profile_summary sum;
    summarize_stats(stats, job_wall_ns, &sum);

    fprintf(out, "profile of the GPU sharing layer (job wall time %.3f s)\n", job_wall_ns / 1e9);
    fprintf(out, "%-12s %8s %12s %12s %12s\n", "phase", "count", "total ms", "mean us", "max us");
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        const char *note = phase_info[i].kind == TDM_PHASE_WAIT   ? "  (waiting for memory, not overhead)"
                           : phase_info[i].kind == TDM_PHASE_WORK ? "  (job work, not overhead)"
                                                                  : "";
        fprintf(out, "%-12s %8lld %12.3f %12.3f %12.3f%s\n", phase_info[i].name,
                (long long)stats[i].count, stats[i].total_ns / 1e6, stats[i].mean_ns / 1e3,
                stats[i].max_ns / 1e3, note);
    }
    if (job_wall_ns > 0)
        fprintf(out, "sharing overhead: %.3f ms = %.3f %% of wall time (limit %g %%)%s\n",
                sum.overhead_ns / 1e6, sum.overhead_share * 100.0,
                TDM_PROFILE_OVERHEAD_LIMIT * 100.0,
                sum.over_limit ? ": ABOVE the limit" : "");
    else
        fprintf(out, "sharing overhead: %.3f ms = n/a of wall time (no wall time given)\n",
                sum.overhead_ns / 1e6);
    if (fflush(out) != 0 || ferror(out))
        return tdm_fail(err, TDM_ERR_IO, "cannot write the profile report");
    return TDM_OK;
}

json_t *tdm_profile_report_json(int64_t job_wall_ns)
{
    tdm_phase_stats stats[TDM_PHASE_COUNT];
    tdm_profile_snapshot(stats);
    tdm_profile_summary sum;
    summarize_stats(stats, job_wall_ns, &sum);

    json_t *phases = json_array();
    if (!phases)
        return NULL;
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        json_t *p = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "name", phase_info[i].name, "kind",
                              kind_name(phase_info[i].kind), "count", (json_int_t)stats[i].count,
                              "total_ns", (json_int_t)stats[i].total_ns, "mean_ns",
                              (json_int_t)stats[i].mean_ns, "max_ns", (json_int_t)stats[i].max_ns);
        if (!p || json_array_append_new(phases, p) != 0) {
            json_decref(phases);
            return NULL;
        }
    }
    return json_pack("{s:I, s:o, s:I, s:I, s:f, s:f, s:b}", "job_wall_ns", (json_int_t)job_wall_ns,
                     "phases", phases, "overhead_ns", (json_int_t)sum.overhead_ns, "wait_ns",
                     (json_int_t)sum.wait_ns, "overhead_share", sum.overhead_share,
                     "overhead_limit", TDM_PROFILE_OVERHEAD_LIMIT, "over_limit", sum.over_limit);
}
