/* grad_clip.h — the gradient-norm clip coefficient as one pure function, shared by the CPU and
 * CUDA backends (both include this header, as they do engine/dropout.h), so the two cannot drift
 * apart.
 *
 * torch.nn.utils.clip_grad_norm_(params, max_norm): norm = sqrt(sum of squares of every gradient
 * element of the group), coef = min(1, max_norm / (norm + 1e-6)); every gradient is multiplied
 * by coef. max_norm <= 0 turns clipping off (coef 1). All in f32, as torch computes it for f32
 * gradients.
 */
#ifndef TANDEM_ENGINE_GRAD_CLIP_H
#define TANDEM_ENGINE_GRAD_CLIP_H
#include <math.h>

#ifdef __CUDACC__
#define TDM_GRAD_CLIP_FN static inline __host__ __device__
#else
#define TDM_GRAD_CLIP_FN static inline
#endif

/* The norm of a group from its sum of squares. */
TDM_GRAD_CLIP_FN float tdm_grad_norm(float sumsq)
{
    return sqrtf(sumsq);
}

/* The factor the group's gradients are scaled by, for its norm and max_norm. */
TDM_GRAD_CLIP_FN float tdm_grad_clip_coef(float norm, float max_norm)
{
    if (!(max_norm > 0)) return 1.0f;
    float c = max_norm / (norm + 1e-6f);
    return c > 1.0f ? 1.0f : c;
}

#endif
