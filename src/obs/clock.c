#include "obs/clock.h"

#include <stdatomic.h>

#include "util/timeutil.h"

static _Atomic(tdm_obs_clock_fn) clock_fn = tdm_now_mono_ns;

int64_t tdm_obs_now_ns(void)
{
    return atomic_load_explicit(&clock_fn, memory_order_relaxed)();
}

void tdm_obs_set_clock(tdm_obs_clock_fn fn)
{
    atomic_store(&clock_fn, fn ? fn : tdm_now_mono_ns);
}
