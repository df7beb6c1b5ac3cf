/* speed.c — the GPU speed factor table. */
#include "cluster/speed.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *pattern;
    double factor;
} table[] = {
    {"H200", 2.8},  {"H100", 2.5},  {"A100", 1.5}, {"4090", 1.0},
    {"4080", 0.75}, {"3090", 0.55}, {"Orin", 0.06},
};

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++)
        if (!strncasecmp(hay, needle, n))
            return true;
    return false;
}

double tdm_gpu_speed_factor(const char *name)
{
    if (!name || !*name)
        return TDM_SPEED_UNKNOWN_GPU;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (contains_ci(name, table[i].pattern))
            return table[i].factor;
    return TDM_SPEED_UNKNOWN_GPU;
}
