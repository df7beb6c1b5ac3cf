/* rope.c — rotary inverse frequencies (see rope.h). */
#include "engine/rope.h"

#include <math.h>

void tdm_rope_inv_freq(const tdm_model_config *cfg, float *inv_freq)
{
    int64_t d = cfg->head_dim, half = d / 2;
    const tdm_rope *r = &cfg->rope;
    float base = (float)r->theta;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)d;
        inv_freq[i] = 1.0f / powf(base, e);
    }
    if (r->type == TDM_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++)
            inv_freq[i] = inv_freq[i] / (float)r->factor;
    } else if (r->type == TDM_ROPE_LLAMA3) {
        double old = (double)r->original_max_position_embeddings;
        float low_wl = (float)(old / r->low_freq_factor);
        float high_wl = (float)(old / r->high_freq_factor);
        float two_pi = (float)(2.0 * M_PI), factor = (float)r->factor;
        for (int64_t i = 0; i < half; i++) {
            float f = inv_freq[i];
            float wl = two_pi / f;
            float fl = wl > low_wl ? f / factor : f;
            float smooth = ((float)old / wl - (float)r->low_freq_factor) /
                           (float)(r->high_freq_factor - r->low_freq_factor);
            float smoothed = (1.0f - smooth) * fl / factor + smooth * fl;
            bool medium = !(wl < high_wl) && !(wl > low_wl);
            inv_freq[i] = medium ? smoothed : fl;
        }
    }
}
