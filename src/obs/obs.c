#include "obs/obs.h"

#include "obs/clock.h"

tdm_obs_span tdm_obs_begin(tdm_phase phase)
{
    tdm_obs_span o = {.phase = phase, .profiled = tdm_profile_enabled()};
    bool tracing = tdm_trace_active();
    if (o.profiled || tracing)
        o.start_ns = tdm_obs_now_ns();
    o.span = tdm_trace_span_begin_at(tdm_phase_span_name(phase), "phase", o.start_ns);
    return o;
}

void tdm_obs_end(tdm_obs_span *o, size_t n_args, const tdm_trace_arg *args)
{
    bool profile = o->profiled && tdm_profile_enabled();
    bool trace = o->span.session != 0 && tdm_trace_active();
    int64_t end_ns = profile || trace ? tdm_obs_now_ns() : 0;
    if (profile)
        tdm_profile_add(o->phase, end_ns - o->start_ns);
    tdm_trace_span_end_at(&o->span, end_ns, n_args, args);
    o->profiled = false;
}
