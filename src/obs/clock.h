/* clock.h — the one clock the profiler and the tracer read, with a test seam.
 *
 * Both read CLOCK_MONOTONIC through tdm_obs_now_ns(). A test may install another clock (for
 * example one that counts its calls, to prove that disabled instrumentation reads no clock at
 * all). The hook is process-wide; swap it only while no other thread is instrumenting.
 */
#ifndef TANDEM_OBS_CLOCK_H
#define TANDEM_OBS_CLOCK_H
#include <stdint.h>

typedef int64_t (*tdm_obs_clock_fn)(void);

/* Nanoseconds from the installed clock (CLOCK_MONOTONIC by default). */
int64_t tdm_obs_now_ns(void);

/* Installs fn as the clock; NULL restores CLOCK_MONOTONIC (util/timeutil.h tdm_now_mono_ns). */
void tdm_obs_set_clock(tdm_obs_clock_fn fn);

#endif
