/* half.h — 16-bit floats (bfloat16 and IEEE binary16) to and from f32.
 *
 * Values travel as their raw bit patterns in uint16_t (little-endian in files, as safetensors
 * stores them). f32 -> 16-bit rounds to nearest, ties to even; NaN stays NaN (quiet), infinities
 * and signed zeros are kept; f16 overflow gives infinity and tiny values become f16 subnormals or
 * zero. 16-bit -> f32 is exact.
 */
#ifndef TANDEM_UTIL_HALF_H
#define TANDEM_UTIL_HALF_H
#include <stddef.h>
#include <stdint.h>

uint16_t tdm_f32_to_bf16(float f);
float tdm_bf16_to_f32(uint16_t h);
uint16_t tdm_f32_to_f16(float f);
float tdm_f16_to_f32(uint16_t h);

/* Array forms: n elements, in and out must not overlap. */
void tdm_bf16_to_f32_n(const uint16_t *in, float *out, size_t n);
void tdm_f32_to_bf16_n(const float *in, uint16_t *out, size_t n);
void tdm_f16_to_f32_n(const uint16_t *in, float *out, size_t n);
void tdm_f32_to_f16_n(const float *in, uint16_t *out, size_t n);

#endif
