/* timeutil.h — clocks and RFC 3339 timestamps. */
#ifndef TANDEM_UTIL_TIMEUTIL_H
#define TANDEM_UTIL_TIMEUTIL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds: for durations and deadlines. */
int64_t tdm_now_mono_ns(void);
/* CLOCK_REALTIME in nanoseconds since the Unix epoch: for timestamps other processes compare. */
int64_t tdm_now_real_ns(void);

/* "2026-11-29T21:30:26Z" (UTC, whole seconds). buf must hold 32 bytes. */
void tdm_format_rfc3339(time_t t, char *buf, size_t size);
/* Parses the form above (and a fractional-second or +00:00 suffix); false when malformed. */
bool tdm_parse_rfc3339(const char *s, time_t *out);

/* Sleeps for ms milliseconds, resuming after signals. */
void tdm_sleep_ms(int64_t ms);

#endif
