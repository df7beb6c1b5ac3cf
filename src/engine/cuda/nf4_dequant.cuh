/* nf4_dequant.cuh — NF4 / double-quantized NF4 dequantization kernels (device code only).
 *
 * Variants (dev/cuda/nf4_dequant.cu times them): v5 (bf16 output, contiguous range, start on an
 * 8-element boundary: the forward's tiles) keeps the code table in shared memory and has each
 * warp read and write contiguous runs, four 8-element groups per thread in flight; v4 (bf16,
 * 16-element boundary) serves the backward's column slabs, 16 elements per thread; v2 (8
 * elements per thread from one 32-bit code word) serves f32 output and 8-aligned starts; v1 (one
 * element per thread) any start. Layout (model/nf4.h): element e of the row-major weight sits in
 * byte e/2 (even e in the high nibble); block b = e/64 has absmax absmax[b], or
 * dmap[absmax_q[b]] * absmax2[b/256] + offset when double-quantized.
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
    int64_t e0; /* first element (row_begin * cols, or the slab's first column) */
    int64_t n;  /* elements to write */
    /* v4 only: 0 for a contiguous range; else a column slab of W: `width` columns of every row,
     * rows `ld` (= W's cols) elements apart, written densely (out row stride = width). width,
     * ld and e0 multiples of 16. */
    int64_t width, ld;
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

/* The elements [done, a.n) that a vector loop left (fewer than its group, so fewer than a block's
 * threads), one per thread of block 0; `code` is the code table in constant or shared memory.
 * Contiguous ranges only. */
template <typename T>
__device__ __forceinline__ void nf4_dequant_tail(const nf4_args &a, T *out, int64_t done,
                                                 const float *code)
{
    int64_t t = done + threadIdx.x;
    if (blockIdx.x == 0 && t < a.n) {
        int64_t e = a.e0 + t;
        uint8_t byte = a.codes[e >> 1];
        uint8_t q = (e & 1) ? (byte & 0x0f) : (byte >> 4);
        out[t] = nf4_from_f32<T>(code[q] * nf4_block_absmax(a, e >> 6));
    }
}

/* The code table, and with double quantization the dynamic map, copied into shared memory by the
 * block (the kernels that look codes up there: v4, v5), then a barrier. */
__device__ __forceinline__ void nf4_tables_to_shared(const nf4_args &a, float *code_s,
                                                     float *dmap_s)
{
    for (int i = threadIdx.x; i < 16; i += blockDim.x)
        code_s[i] = nf4_code_c[i];
    if (!a.absmax)
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            dmap_s[i] = nf4_dmap_c[i];
    __syncthreads();
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
        for (int j = 0; j < 8; j++)
            o[j] = v[j];
    }
    nf4_dequant_tail(a, out, n8 * 8, nf4_code_c);
}

/* Variant 4: 16 elements per thread from one 64-bit load of codes, two 16-byte bf16 stores, and
 * the code table (and the double-quant map) in SHARED memory; also column slabs (a.width > 0)
 * for the backward's dX column blocks. Why: the __constant__ cache
 * serves one address per cycle, so a warp whose 32 lanes look up 16 different codes was
 * serialized (v2/v3 measured ~590 GB/s on an H200 whatever the store width); shared memory
 * serves the 16 distinct words from 16 banks at once. Requires e0 % 16 == 0 (the 16 elements share
 * one 64-block; the 8 code bytes are 8-byte aligned) and out 16-byte aligned; tail elementwise. */
__global__ void nf4_dequant_v4(nf4_args a, __nv_bfloat16 *out)
{
    __shared__ float code_s[16];
    __shared__ float dmap_s[256];
    nf4_tables_to_shared(a, code_s, dmap_s);
    int64_t n16 = a.n >> 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = a.e0 + i * 16;
        if (a.width) {
            int64_t o = i * 16, r = o / a.width;
            e = a.e0 + r * a.ld + (o - r * a.width);
        }
        uint2 w = __ldg((const uint2 *)(a.codes + (e >> 1)));
        int64_t blk = e >> 6;
        float amax =
            a.absmax ? __ldg(a.absmax + blk)
                     : dmap_s[__ldg(a.absmax_q + blk)] * __ldg(a.absmax2 + blk / 256) + a.offset;
        __align__(16) __nv_bfloat162 v[8];
#pragma unroll
        for (int b = 0; b < 8; b++) {
            uint32_t word = b < 4 ? w.x : w.y;
            uint32_t byte = (word >> (8 * (b & 3))) & 0xff;
            v[b] = __floats2bfloat162_rn(code_s[byte >> 4] * amax, code_s[byte & 0x0f] * amax);
        }
        uint4 *o = (uint4 *)(out + i * 16);
        o[0] = *(uint4 *)&v[0];
        o[1] = *(uint4 *)&v[4];
    }
    nf4_dequant_tail(a, out, n16 * 16, code_s);
}

/* Variant 5: v4's shared-memory tables with warp-contiguous accesses and four groups in flight.
 * A warp takes 1024 elements at a time as four runs of 256; lane l dequantizes elements 8l..8l+7
 * of each run: one 32-bit code load per group (a warp reads 128 contiguous bytes) and one
 * 16-byte store (a warp writes 512 contiguous bytes; v4's two stores per thread each covered
 * half of every 32-byte sector of 1 KB), the four groups' loads issued before any store.
 * Requires e0 % 8 == 0 (a group shares one 64-block and its word is 4-byte aligned), out 16-byte
 * aligned, a contiguous range (a.width == 0); the tail (< 8 elements) elementwise. */
__global__ void nf4_dequant_v5(nf4_args a, __nv_bfloat16 *out)
{
    __shared__ float code_s[16];
    __shared__ float dmap_s[256];
    nf4_tables_to_shared(a, code_s, dmap_s);
    const int lane = threadIdx.x & 31;
    const int64_t n8 = a.n >> 3;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t c = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); c * 128 < n8;
         c += warps) {
        uint32_t w[4];
        float amax[4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const int64_t g = c * 128 + h * 32 + lane;
            w[h] = 0, amax[h] = 0.0f;
            if (g >= n8) continue;
            const int64_t e = a.e0 + g * 8, blk = e >> 6;
            w[h] = __ldg((const uint32_t *)(a.codes + (e >> 1)));
            amax[h] = a.absmax ? __ldg(a.absmax + blk)
                               : dmap_s[__ldg(a.absmax_q + blk)] * __ldg(a.absmax2 + blk / 256) +
                                     a.offset;
        }
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const int64_t g = c * 128 + h * 32 + lane;
            if (g >= n8) continue;
            __align__(16) __nv_bfloat162 v[4];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                uint32_t byte = (w[h] >> (8 * b)) & 0xff;
                v[b] = __floats2bfloat162_rn(code_s[byte >> 4] * amax[h],
                                             code_s[byte & 0x0f] * amax[h]);
            }
            *(uint4 *)(out + g * 8) = *(uint4 *)&v[0];
        }
    }
    nf4_dequant_tail(a, out, n8 * 8, code_s);
}

/* Blocks of 256 threads for v5 over n elements: one 1024-element chunk per warp, at most
 * 2^20 blocks (the kernel is warp-stride beyond that). */
static inline unsigned nf4_dequant_v5_blocks(int64_t n)
{
    int64_t b = (n + 8 * 1024 - 1) / (8 * 1024);
    return (unsigned)(b < 1 ? 1 : b > (1 << 20) ? (1 << 20) : b);
}

/* Dense column slab: out (rows, width) = T(in[r * ld + c]) for c < width (in already offset to
 * the slab's first column). */
template <typename S, typename T>
__global__ void convert_slab_kernel(const S *in, int64_t ld, int64_t width, int64_t rows, T *out)
{
    int64_t n = rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / width;
        out[i] = nf4_from_f32<T>((float)in[r * ld + (i - r * width)]);
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
