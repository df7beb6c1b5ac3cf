#include "train/lr_schedule.h"

#include <math.h>
#include <string.h>

const char *tdm_lr_kind_name(tdm_lr_kind kind)
{
    switch (kind) {
    case TDM_LR_COSINE:
        return "cosine";
    case TDM_LR_LINEAR:
        return "linear";
    case TDM_LR_CONSTANT:
        return "constant";
    }
    return "?";
}

tdm_status tdm_lr_kind_parse(const char *name, tdm_lr_kind *kind, tdm_error *err)
{
    for (int k = TDM_LR_COSINE; k <= TDM_LR_CONSTANT; k++)
        if (strcmp(name, tdm_lr_kind_name((tdm_lr_kind)k)) == 0) {
            *kind = (tdm_lr_kind)k;
            return TDM_OK;
        }
    return tdm_fail(err, TDM_ERR_INVALID,
                    "unknown learning-rate schedule \"%s\" (use cosine, linear or constant)", name);
}

tdm_status tdm_lr_schedule_check(const tdm_lr_schedule *s, tdm_error *err)
{
    if (!(s->peak_lr > 0) || !isfinite(s->peak_lr))
        return tdm_fail(err, TDM_ERR_INVALID, "learning rate %g must be finite and > 0",
                        s->peak_lr);
    if (s->warmup_steps < 0 || s->total_steps < 0)
        return tdm_fail(err, TDM_ERR_INVALID, "warmup and total steps must be >= 0");
    if (s->kind < TDM_LR_COSINE || s->kind > TDM_LR_CONSTANT)
        return tdm_fail(err, TDM_ERR_INVALID, "unknown learning-rate schedule %d", (int)s->kind);
    return TDM_OK;
}

static double max1(int64_t v)
{
    return (double)(v > 1 ? v : 1);
}

double tdm_lr_factor(const tdm_lr_schedule *s, int64_t step)
{
    int64_t w = s->warmup_steps, t = s->total_steps;
    if (step < w) return (double)step / max1(w);
    switch (s->kind) {
    case TDM_LR_COSINE: {
        double progress = (double)(step - w) / max1(t - w);
        double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
        return f > 0.0 ? f : 0.0;
    }
    case TDM_LR_LINEAR: {
        double f = (double)(t - step) / max1(t - w);
        return f > 0.0 ? f : 0.0;
    }
    case TDM_LR_CONSTANT:
        return 1.0;
    }
    return 1.0;
}

double tdm_lr_at(const tdm_lr_schedule *s, int64_t step)
{
    return s->peak_lr * tdm_lr_factor(s, step);
}
