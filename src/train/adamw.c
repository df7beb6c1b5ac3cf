#include "train/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

tdm_adamw_config tdm_adamw_defaults(void)
{
    return (tdm_adamw_config){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
}

tdm_status tdm_adamw_config_check(const tdm_adamw_config *c, tdm_error *err)
{
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return tdm_fail(err, TDM_ERR_INVALID, "AdamW betas (%g, %g) must be in [0, 1)", c->beta1,
                        c->beta2);
    if (!(c->eps > 0) || !isfinite(c->eps))
        return tdm_fail(err, TDM_ERR_INVALID, "AdamW eps %g must be finite and > 0", c->eps);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return tdm_fail(err, TDM_ERR_INVALID, "weight decay %g must be finite and >= 0",
                        c->weight_decay);
    return TDM_OK;
}

tdm_status tdm_adamw_state_init(tdm_adamw_state *s, int64_t n, tdm_error *err)
{
    memset(s, 0, sizeof *s);
    if (n < 0) return tdm_fail(err, TDM_ERR_INVALID, "negative parameter count");
    size_t cnt = n > 0 ? (size_t)n : 1;
    s->m = calloc(cnt, sizeof(float));
    s->v = calloc(cnt, sizeof(float));
    if (!s->m || !s->v) {
        tdm_adamw_state_free(s);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for optimizer state (%lld floats)",
                        (long long)n);
    }
    s->n = n;
    return TDM_OK;
}

void tdm_adamw_state_free(tdm_adamw_state *s)
{
    free(s->m);
    free(s->v);
    memset(s, 0, sizeof *s);
}

void tdm_adamw_step(tdm_adamw_state *s, const tdm_adamw_config *c, double lr, float *params,
                    const float *g)
{
    s->step++;
    const double t = (double)s->step;
    const float decay = (float)(1.0 - lr * c->weight_decay);
    const float w1 = (float)(1.0 - c->beta1);
    const float b2 = (float)c->beta2;
    const float w2 = (float)(1.0 - c->beta2);
    const double bc1 = 1.0 - pow(c->beta1, t);
    const double bc2 = 1.0 - pow(c->beta2, t);
    const float neg_step = (float)(-(lr / bc1));
    const float bc2_sqrt = (float)sqrt(bc2);
    const float eps = (float)c->eps;
    const int decays = c->weight_decay != 0;
    float *m = s->m, *v = s->v;
    for (int64_t i = 0; i < s->n; i++) {
        float p = params[i], gi = g[i];
        if (decays) p = p * decay;
        float mi = m[i] + w1 * (gi - m[i]);
        float vi = v[i] * b2;
        vi = vi + (w2 * gi) * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p = p + (neg_step * mi) / denom;
        m[i] = mi;
        v[i] = vi;
        params[i] = p;
    }
}

double tdm_grad_norm(const float *g, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return sqrt(s);
}

double tdm_clip_grad_norm(float *g, int64_t n, double max_norm)
{
    double norm = tdm_grad_norm(g, n);
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            float cf = (float)coef;
            for (int64_t i = 0; i < n; i++)
                g[i] = g[i] * cf;
        }
    }
    return norm;
}
