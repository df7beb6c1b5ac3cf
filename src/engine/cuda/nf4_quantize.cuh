/* nf4_quantize.cuh — NF4 quantization of a frozen weight on the GPU (device code only), bit for
 * bit what tdm_nf4_quantize (model/nf4.c) computes on the host.
 *
 * Why on the GPU: a 7B base has 6.5e9 quantized elements. On the host each is widened to f32,
 * scaled and compared with the 16 codes, which with the uploads was most of the ~35 s the load
 * took on the H200's 16 cores, and a co-training joiner waits for that load before its first
 * step. Here the tensor's own bytes are uploaded (bf16: half the f32 traffic) and quantized in
 * milliseconds.
 *
 * Exactness: one thread per 64-element block does the host's operations in the host's order
 * with IEEE-rounded intrinsics that the compiler may not contract into FMAs: the absmax is the
 * running maximum of fabsf (NaN never wins a `>`), inv = 1 / absmax rounded (__fdiv_rn), each
 * scaled x = w * inv rounded (__fmul_rn), d = |x - code| rounded (__fsub_rn), and the first code
 * of the strictly smallest d wins (a NaN x gives code 0). Widening bf16 / f16 to f32 is exact on
 * both sides. Layout (model/nf4.h): element e in byte e/2, even e in the high nibble; an odd
 * count's last byte pads its low half with code 7.
 * Included by exactly one library translation unit (cuda_backend.cu), after nf4_dequant.cuh
 * (nf4_code_c).
 */
#ifndef TANDEM_ENGINE_CUDA_NF4_QUANTIZE_CUH
#define TANDEM_ENGINE_CUDA_NF4_QUANTIZE_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* The source element types: a safetensors tensor's bytes as stored. */
enum nf4q_src { NF4Q_F32, NF4Q_BF16, NF4Q_F16 };

__device__ __forceinline__ float nf4q_load(const void *src, int kind, int64_t i)
{
    if (kind == NF4Q_F32) return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    if (kind == NF4Q_BF16) return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* Grid: one thread per block of 64 elements. */
__global__ void nf4_quantize_kernel(const void *src, int kind, int64_t n, uint8_t *codes,
                                    float *absmax)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t lo = b * 64;
    if (lo >= n) return;
    int64_t hi = lo + 64 < n ? lo + 64 : n;
    float amax = 0.0f;
    for (int64_t i = lo; i < hi; i++) {
        float a = fabsf(nf4q_load(src, kind, i));
        if (a > amax) amax = a;
    }
    absmax[b] = amax;
    float inv = amax > 0.0f ? __fdiv_rn(1.0f, amax) : 0.0f;
    uint8_t prev = 0;
    for (int64_t i = lo; i < hi; i++) {
        float x = __fmul_rn(nf4q_load(src, kind, i), inv);
        float best_d = fabsf(__fsub_rn(x, nf4_code_c[0]));
        int best = 0;
        for (int j = 1; j < 16; j++) {
            float d = fabsf(__fsub_rn(x, nf4_code_c[j]));
            if (d < best_d) best_d = d, best = j;
        }
        if (((i - lo) & 1) == 0) {
            prev = (uint8_t)best;
            if (i + 1 == hi) codes[i / 2] = (uint8_t)(prev << 4 | 7);
        } else {
            codes[i / 2] = (uint8_t)(prev << 4 | best);
        }
    }
}

#endif
