#include "util/timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int64_t tdm_now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t tdm_now_real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void tdm_format_rfc3339(time_t t, char *buf, size_t size)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

bool tdm_parse_rfc3339(const char *s, time_t *out)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest)
        return false;
    if (*rest == '.') {
        rest++;
        while (*rest >= '0' && *rest <= '9')
            rest++;
    }
    if (strcmp(rest, "Z") != 0 && strcmp(rest, "+00:00") != 0)
        return false;
    *out = timegm(&tm);
    return true;
}

void tdm_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
