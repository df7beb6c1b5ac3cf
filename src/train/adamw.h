/* adamw.h — host reference AdamW and gradient-norm clipping over flat fp32 arrays.
 *
 * This is the reference the backends' fused AdamW op is tested against, and what the CPU path
 * uses directly. It mirrors torch.optim.AdamW's single-tensor implementation (the one torch uses
 * for CPU tensors) operation by operation, in fp32 with the scalars computed in double as Python
 * does, so that for one element it gives torch's bits (no fused multiply-add; x86-64 without
 * -mfma never contracts):
 *
 *     t     = t + 1
 *     p     = p * (float)(1 - lr * wd)                      (only when wd != 0)
 *     m     = m + (float)(1 - b1) * (g - m)                 (torch's lerp, weight < 0.5)
 *     v     = v * (float)b2 + ((float)(1 - b2) * g) * g     (mul_, addcmul_)
 *     bc1   = 1 - b1^t,  bc2 = 1 - b2^t                     (double)
 *     denom = sqrt(v) / (float)sqrt(bc2) + (float)eps
 *     p     = p + ((float)(-lr / bc1) * m) / denom          (addcdiv_)
 *
 * Clipping as torch.nn.utils.clip_grad_norm_(params, max_norm) over ONE adapter's parameters:
 *     norm = sqrt(sum g^2) over all of them (summed here in double, in array order; torch sums
 *            per-tensor fp32 norms, so the norms agree to float rounding)
 *     coef = max_norm / (norm + 1e-6);  if coef < 1: g = g * (float)coef
 * (torch multiplies by min(coef, 1); multiplying by 1 changes nothing.)
 */
#ifndef TANDEM_TRAIN_ADAMW_H
#define TANDEM_TRAIN_ADAMW_H
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_adamw_config {
    double beta1;        /* 0.9 */
    double beta2;        /* 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 0 (decoupled: p *= 1 - lr * wd before the update) */
} tdm_adamw_config;

/* The defaults above (torch's betas and eps; tandem's --weight-decay default 0). */
tdm_adamw_config tdm_adamw_defaults(void);

/* Checks 0 <= b < 1, eps > 0, wd >= 0, all finite. */
tdm_status tdm_adamw_config_check(const tdm_adamw_config *c, tdm_error *err);

/* One adapter's optimizer state: the moments in the flat layout of its parameters. */
typedef struct tdm_adamw_state {
    float *m; /* (n) f32, exp_avg */
    float *v; /* (n) f32, exp_avg_sq */
    int64_t n;
    int64_t step; /* updates taken (torch's state["step"]) */
} tdm_adamw_state;

/* Allocates zeroed moments for n parameters, step 0. On failure s is zeroed. */
tdm_status tdm_adamw_state_init(tdm_adamw_state *s, int64_t n, tdm_error *err);
void tdm_adamw_state_free(tdm_adamw_state *s);

/* One AdamW update of params (n = s->n) with gradients g at learning rate lr. */
void tdm_adamw_step(tdm_adamw_state *s, const tdm_adamw_config *c, double lr, float *params,
                    const float *g);

/* L2 norm of g[0..n) (double accumulation in order). */
double tdm_grad_norm(const float *g, int64_t n);

/* Clips g in place as described above when max_norm > 0; returns the norm before clipping
 * (computed also when max_norm <= 0, for logging). */
double tdm_clip_grad_norm(float *g, int64_t n, double max_norm);

#endif
