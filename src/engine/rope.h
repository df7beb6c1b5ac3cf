/* rope.h — the rotary inverse frequencies of a model, computed on the host exactly as Hugging Face
 * transformers computes them (in f32), including "linear" and "llama3" scaling.
 *
 *   default: inv_freq[i] = 1 / theta^((2i) / d)          (f32: powf, then 1.0f / x), i < d/2
 *   linear:  inv_freq[i] /= factor
 *   llama3:  wavelen = 2 pi / inv_freq; low_wl = orig_max / low_freq_factor,
 *            high_wl = orig_max / high_freq_factor;
 *            f = wavelen > low_wl ? inv_freq / factor : inv_freq;
 *            medium (high_wl <= wavelen <= low_wl): smooth = (orig_max / wavelen - low) /
 *            (high - low); f = (1 - smooth) * f / factor + smooth * f
 * The attention scaling of these types is 1 (cos and sin are not rescaled).
 */
#ifndef TANDEM_ENGINE_ROPE_H
#define TANDEM_ENGINE_ROPE_H
#include "model/config.h"

/* Fills inv_freq[0 .. head_dim/2) for cfg (head_dim = cfg->head_dim). */
void tdm_rope_inv_freq(const tdm_model_config *cfg, float *inv_freq);

#endif
