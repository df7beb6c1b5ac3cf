/* nf4_dequant.cuh — NF4 / double-quantized NF4 dequantization kernels (device code only).
 *
 * Promoted from dev/cuda/nf4_dequant.cu (variant 2): each thread turns 8 consecutive elements (4
 * bytes of codes) into 8 outputs, reading the codes as one 32-bit word when the tile starts on an
 * 8-element boundary, else byte by byte (variant 1). Layout (model/nf4.h): element e of the
 * row-major weight sits in byte e/2 (even e in the high nibble); block b = e/64 has absmax
 * absmax[b], or dmap[absmax_q[b]] * absmax2[b/256] + offset when double-quantized.
 * Included by exactly one library translation unit (cuda_backend.cu) and by the dev program.
 */
#ifndef TANDEM_ENGINE_CUDA_NF4_DEQUANT_CUH
#define TANDEM_ENGINE_CUDA_NF4_DEQUANT_CUH
#include <cuda_bf16.h>
#include <stdint.h>

/* NF4 code values and the signed dynamic 8-bit map, filled once by nf4_dequant_init_tables. */
__constant__ float nf4_code_c[16];
__constant__ float nf4_dmap_c[256];

template <typename T> __device__ __forceinline__ T nf4_from_f32(float x);
template <> __device__ __forceinline__ float nf4_from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 nf4_from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

struct nf4_args {
    const uint8_t *codes;
    const float *absmax;     /* plain NF4, or NULL */
    const uint8_t *absmax_q; /* double quant */
    const float *absmax2;
    float offset;
    int64_t e0; /* first element (row_begin * cols) */
    int64_t n;  /* elements to write */
};

__device__ __forceinline__ float nf4_block_absmax(const nf4_args &a, int64_t blk)
{
    if (a.absmax) return a.absmax[blk];
    return nf4_dmap_c[a.absmax_q[blk]] * a.absmax2[blk / 256] + a.offset;
}

/* Variant 1: one element per thread (grid-stride). Any alignment. */
template <typename T> __global__ void nf4_dequant_v1(nf4_args a, T *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = a.e0 + i;
        uint8_t byte = a.codes[e >> 1];
        uint8_t q = (e & 1) ? (byte & 0x0f) : (byte >> 4);
        out[i] = nf4_from_f32<T>(nf4_code_c[q] * nf4_block_absmax(a, e >> 6));
    }
}

/* Variant 2: 8 elements per thread from one 32-bit load of codes (e0 % 8 == 0 required, so the
 * 8 elements share one 64-block and the word is 4-byte aligned); the tail is done elementwise. */
template <typename T> __global__ void nf4_dequant_v2(nf4_args a, T *out)
{
    int64_t n8 = a.n >> 3;
    const uint32_t *words = (const uint32_t *)(a.codes + (a.e0 >> 1));
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t w = __ldg(words + i);
        float amax = nf4_block_absmax(a, (a.e0 + i * 8) >> 6);
        T v[8];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            uint32_t byte = (w >> (8 * b)) & 0xff;
            v[2 * b] = nf4_from_f32<T>(nf4_code_c[byte >> 4] * amax);
            v[2 * b + 1] = nf4_from_f32<T>(nf4_code_c[byte & 0x0f] * amax);
        }
        T *o = out + i * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = v[j];
    }
    /* tail (< 8 elements): the first block's threads */
    int64_t t = n8 * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (blockIdx.x == 0 && t < a.n) {
        int64_t e = a.e0 + t;
        uint8_t byte = a.codes[e >> 1];
        uint8_t q = (e & 1) ? (byte & 0x0f) : (byte >> 4);
        out[t] = nf4_from_f32<T>(nf4_code_c[q] * nf4_block_absmax(a, e >> 6));
    }
}

/* Dense f32 -> T conversion (f32/bf16 weights read as tiles). */
template <typename S, typename T> __global__ void convert_kernel(const S *in, T *out, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = nf4_from_f32<T>((float)in[i]);
}

#endif
