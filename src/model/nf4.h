/* nf4.h — 4-bit NormalFloat quantization, bit-compatible with bitsandbytes (QLoRA).
 *
 * A weight of n elements is taken in row-major order and cut into blocks of 64 consecutive
 * elements (the last block may be shorter). Per block b: absmax[b] = max |w| (fp32); each element
 * is normalized, x = w * (1 / absmax[b]) in fp32, and replaced by the index of the NEAREST of the
 * 16 NF4 code values (tdm_nf4_code; ties go to the lower index; an all-zero block gives index 7,
 * the code 0.0). Two indices per byte, the first element in the high nibble; with an odd n the
 * last low nibble holds the code of 0.0 (7), as bitsandbytes pads the block with zeros.
 * Dequantization: w ≈ code[q] * absmax[b].
 *
 * Double quantization (on by default, QLoRA): the absmax vector itself is stored in 8 bits.
 * offset = mean(absmax) (accumulated in double, rounded to fp32); c = absmax - offset (fp32);
 * c is cut into blocks of 256 with absmax2[j] = max |c| per block, and each element becomes the
 * index of the nearest value of the signed dynamic 8-bit map (tdm_nf4_dynamic_map) to
 * c * (1 / absmax2[j]). Reconstruction: absmax[b] ≈ dmap[qabsmax[b]] * absmax2[b / 256] + offset.
 * Sizes: n/2 bytes of codes + nblocks bytes + 4 * ceil(nblocks / 256) bytes + 4 bytes (offset)
 * with double quant; n/2 + 4 * nblocks bytes without.
 */
#ifndef TANDEM_MODEL_NF4_H
#define TANDEM_MODEL_NF4_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define TDM_NF4_BLOCK 64
#define TDM_NF4_DQ_BLOCK 256

/* The 16 NF4 code values (bitsandbytes' table, ascending, code[7] == 0). */
extern const float tdm_nf4_code[16];

/* Fills map[256] with bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7,
 * total_bits=8), ascending, computed the same way (fp32 linspace, means, powers of ten). */
void tdm_nf4_dynamic_map(float map[256]);

typedef struct tdm_nf4 {
    int64_t numel;
    int64_t nblocks;    /* ceil(numel / 64) */
    uint8_t *packed;    /* (numel + 1) / 2 bytes */
    bool double_quant;
    float *absmax;      /* nblocks, when !double_quant */
    uint8_t *absmax_q;  /* nblocks, when double_quant */
    float *absmax2;     /* ceil(nblocks / 256), when double_quant */
    float offset;       /* when double_quant */
} tdm_nf4;

/* Index of the nearest NF4 code value to x (x normally in [-1, 1]). */
uint8_t tdm_nf4_quantize_value(float x);

/* Quantizes w[0..n) into q (allocating its arrays). Parallel over blocks (OpenMP); the result
 * does not depend on the thread count. */
tdm_status tdm_nf4_quantize(const float *w, int64_t n, bool double_quant, tdm_nf4 *q,
                            tdm_error *err);

/* QLoRA's double quantization of nblocks first-level absmax values: offset (their mean),
 * absmax2 (ceil(nblocks / 256) f32) and absmax_q (nblocks u8), as tdm_nf4_quantize computes them
 * with double_quant; for a backend that quantizes the first level itself (the CUDA load). */
void tdm_nf4_double_quantize(const float *absmax, int64_t nblocks, uint8_t *absmax_q,
                             float *absmax2, float *offset);

/* Writes the n dequantized values into out. */
void tdm_nf4_dequantize(const tdm_nf4 *q, float *out);

/* Elements [e0, e1) of one block (scale amax) of the packed codes into out[0 .. e1 - e0): code *
 * amax. A whole block takes its 16 values once and looks each element up (the same product, the
 * same bits, without a division and a branch per element). */
void tdm_nf4_dequantize_block(const uint8_t *packed, int64_t e0, int64_t e1, float amax,
                              float *out);

/* The (reconstructed, when double-quantized) absmax of block b. */
float tdm_nf4_block_absmax(const tdm_nf4 *q, int64_t b);

void tdm_nf4_free(tdm_nf4 *q);

/* Bytes the quantized form of n elements takes (see the sizes above). */
uint64_t tdm_nf4_bytes(int64_t n, bool double_quant);

#endif
