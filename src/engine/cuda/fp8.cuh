/* fp8.cuh — the FP8 (E4M3) operands of the frozen base's GEMMs under --base-compute fp8
 * (device code and small launch helpers; included by cuda_backend.cu and the dev program).
 *
 * Scaling (docs/cuda-backend.md, "FP8 base compute"): one f32 scale per tensor, the tensor's
 * largest magnitude / 448 (E4M3's largest finite value). A value x is stored as
 * e4m3(x * (448 / amax)), rounded to nearest even and saturated; the GEMM multiplies its f32
 * accumulator by the two scales (amax_a / 448) (amax_b / 448).
 *   - activations X (m, in) and output gradients dY (m, out): amax over the whole tensor, found
 *     on the device each time the tensor is quantized (no host round trip: cuBLASLt reads the
 *     scale through a device pointer);
 *   - an NF4 weight: amax = the largest block absmax (an NF4 block's largest magnitude is its
 *     absmax: code 1.0 is exact), found once per weight (the base is frozen) and kept on the
 *     host: the dequantization kernels take 448 / amax as an argument and the GEMM's alpha is
 *     amax / 448, so a projection call spends no launch on the weight's scale.
 * Why per tensor: E4M3's exponent spans 2^-6 .. 448 in normal numbers (2^-9 with subnormals), a
 * range of 2^15, so a weight's values, which differ between blocks by a few hundred at most,
 * keep E4M3's full 3-bit mantissa everywhere; finer scales would change which values round,
 * not how finely.
 * The activation amax is two kernels and no memset: fp8_amax_bf16 writes each block's maximum
 * to its own partial word, and every block of fp8_quantize_bf16 first takes the maximum of
 * those partials (at most FP8_AMAX_PARTIALS words, from L2). A maximum does not depend on the
 * order in which it is taken, so the scales, and hence every result, are the same bits on
 * every run. The weight amax (once per weight) uses atomicMax on the f32 bits of non-negative
 * values (their order as unsigned integers is their order as floats).
 *
 * The scale words live in scratch slot 9 (fp8_scales). Kernels:
 *   fp8_amax_bf16       per-block amax of n bf16 values (8 a thread, 16-byte loads)
 *   fp8_quantize_bf16   e4m3 of n bf16 values with the scale of those partials; writes the scale
 *   fp8_nf4_amax        the largest |absmax| of an NF4 weight's blocks (once per weight)
 *   fp8_nf4_rows        NF4 rows [r0, r1) as e4m3 (rows, cols): the forward's operand (K = in)
 *   fp8_nf4_cols_t      NF4 columns [c0, c1) of every row, transposed to (c1 - c0, rows): the
 *                       backward's operand dX = dY W needs W's rows (out) as its K, contiguous.
 */
#ifndef TANDEM_ENGINE_CUDA_FP8_CUH
#define TANDEM_ENGINE_CUDA_FP8_CUH
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "engine/cuda/nf4_dequant.cuh"

#define FP8_E4M3_MAX 448.0f

/* Blocks of the activation amax / quantization grid at most, hence partial words. */
#define FP8_AMAX_PARTIALS 1024

/* Scratch slot 9 (TDM_CUDA_FP8_SCALE_BYTES): the activation scale cuBLASLt reads, on its own 16
 * bytes (cublasLtMatmul answers NOT_SUPPORTED for scale pointers that are only 4-byte aligned),
 * the word of a weight's one-time amax (f32 bits), and the per-block activation maxima. */
struct fp8_scales {
    alignas(16) float scale_act; /* amax_act / 448 (1 when amax is 0) */
    alignas(16) unsigned amax_w;
    float amax_part[FP8_AMAX_PARTIALS];
};

__host__ __device__ __forceinline__ float fp8_inv_scale(float amax)
{
    return amax > 0.0f ? FP8_E4M3_MAX / amax : 1.0f;
}
__host__ __device__ __forceinline__ float fp8_scale_of(float amax)
{
    return amax > 0.0f ? amax / FP8_E4M3_MAX : 1.0f;
}

/* Two f32 values as two e4m3 bytes (x in the low byte), round to nearest even, saturated. */
__device__ __forceinline__ uint16_t fp8_pack2(float x, float y)
{
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float fp8_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The block's largest value (v >= 0, NaN-free; blockDim.x a multiple of 32, at most 1024),
 * valid in thread 0. */
__device__ __forceinline__ float fp8_block_max(float v)
{
    __shared__ float warp_max[32];
    v = fp8_warp_max(v);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? warp_max[threadIdx.x] : 0.0f;
        v = fp8_warp_max(v);
    }
    return v;
}

/* One atomicMax per block of the block's largest value. Why per block: one address taking an
 * atomic from every warp of a 7B projection's 28k warps serialized them (76 us for 7.3 M
 * values, measured). */
__device__ __forceinline__ void fp8_block_amax_store(float v, unsigned *word)
{
    v = fp8_block_max(v);
    if (threadIdx.x == 0 && v > 0.0f) atomicMax(word, __float_as_uint(v));
}

/* Blocks of 256 threads for the grid-stride FP8 kernels over `items` work items (each thread one
 * item a pass): at most FP8_AMAX_PARTIALS. */
static inline unsigned fp8_blocks(int64_t items)
{
    int64_t b = (items + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > FP8_AMAX_PARTIALS ? FP8_AMAX_PARTIALS : b);
}

/* part[b] = max |x[i]| over block b's share of n bf16 values; x 16-byte aligned; launched with
 * at most FP8_AMAX_PARTIALS blocks, the same count as the fp8_quantize_bf16 reading them. */
__global__ void fp8_amax_bf16(const __nv_bfloat16 *x, int64_t n, float *part)
{
    float m = 0.0f;
    const int64_t n8 = n >> 3;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint4 raw = __ldg((const uint4 *)x + i);
        const __nv_bfloat162 *p = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __bfloat1622float2(p[j]);
            m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
    }
    for (int64_t i = n8 * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    m = fp8_block_max(m);
    if (threadIdx.x == 0) part[blockIdx.x] = m;
}

/* out[i] = e4m3(x[i] * 448 / amax) with amax the largest of part[0 .. gridDim.x) (the amax
 * kernel's partials, same grid); block 0 writes amax / 448 to *scale. x 16-byte aligned, out
 * 8-byte aligned. */
__global__ void fp8_quantize_bf16(const __nv_bfloat16 *x, int64_t n, const float *part,
                                  float *scale, uint8_t *out)
{
    __shared__ float amax_s;
    float pm = 0.0f;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        pm = fmaxf(pm, __ldg(part + b));
    pm = fp8_block_max(pm);
    if (threadIdx.x == 0) amax_s = pm;
    __syncthreads();
    const float amax = amax_s, inv = fp8_inv_scale(amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale = fp8_scale_of(amax);
    const int64_t n8 = n >> 3;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint4 raw = __ldg((const uint4 *)x + i);
        const __nv_bfloat162 *p = (const __nv_bfloat162 *)&raw;
        uint16_t q[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __bfloat1622float2(p[j]);
            q[j] = fp8_pack2(f.x * inv, f.y * inv);
        }
        uint2 o;
        o.x = (uint32_t)q[0] | ((uint32_t)q[1] << 16);
        o.y = (uint32_t)q[2] | ((uint32_t)q[3] << 16);
        *((uint2 *)out + i) = o;
    }
    for (int64_t i = n8 * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (uint8_t)__nv_cvt_float_to_fp8(__bfloat162float(x[i]) * inv, __NV_SATFINITE,
                                                __NV_E4M3);
}

/* *word = max(*word, max_b |absmax_b|) over the weight's nblk blocks (a.e0, a.n unused). */
__global__ void fp8_nf4_amax(nf4_args a, int64_t nblk, unsigned *word)
{
    float m = 0.0f;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk;
         b += (int64_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(nf4_block_absmax(a, b)));
    fp8_block_amax_store(m, word);
}

/* The 16 e4m3 bytes of the 16 NF4 codes in w (8 bytes, element order: high nibble first) of
 * one 64-block with absmax s, scaled by inv. */
__device__ __forceinline__ uint4 fp8_nf4_16(uint2 w, float s, float inv, const float *code_s)
{
    uint32_t o[4];
#pragma unroll
    for (int b = 0; b < 4; b++) {
        uint32_t word = b < 2 ? w.x : w.y;
        uint32_t lo = (word >> (16 * (b & 1))) & 0xff, hi = (word >> (16 * (b & 1) + 8)) & 0xff;
        /* the bf16 path's value code * absmax, then the tensor scale */
        uint32_t q0 = fp8_pack2(code_s[lo >> 4] * s * inv, code_s[lo & 0x0f] * s * inv);
        uint32_t q1 = fp8_pack2(code_s[hi >> 4] * s * inv, code_s[hi & 0x0f] * s * inv);
        o[b] = q0 | (q1 << 16);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

__device__ __forceinline__ float fp8_nf4_absmax_s(const nf4_args &a, const float *dmap_s,
                                                  int64_t blk)
{
    return a.absmax ? __ldg(a.absmax + blk)
                    : dmap_s[__ldg(a.absmax_q + blk)] * __ldg(a.absmax2 + blk / 256) + a.offset;
}

/* out[i] = e4m3(code * absmax * inv) (inv = 448 / the weight's amax) for the contiguous
 * elements [a.e0, a.e0 + a.n) (a.e0 % 16 == 0, out 16-byte aligned). Lane l of a warp
 * takes 16 elements (8 code bytes, one 16-byte store) of each 512-element run, so a warp reads
 * 256 and writes 512 contiguous bytes; two runs in flight. The tail (< 16) elementwise. */
__global__ void fp8_nf4_rows(nf4_args a, float inv, uint8_t *out)
{
    __shared__ float code_s[16];
    __shared__ float dmap_s[256];
    nf4_tables_to_shared(a, code_s, dmap_s);
    const int64_t n16 = a.n >> 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < n16; g += 2 * stride) {
        const int64_t g2 = g + stride;
        const int64_t e = a.e0 + g * 16, e2 = a.e0 + g2 * 16;
        uint2 w = __ldg((const uint2 *)(a.codes + (e >> 1)));
        float s = fp8_nf4_absmax_s(a, dmap_s, e >> 6);
        uint2 w2 = make_uint2(0, 0);
        float s2 = 0.0f;
        if (g2 < n16) {
            w2 = __ldg((const uint2 *)(a.codes + (e2 >> 1)));
            s2 = fp8_nf4_absmax_s(a, dmap_s, e2 >> 6);
        }
        *((uint4 *)out + g) = fp8_nf4_16(w, s, inv, code_s);
        if (g2 < n16) *((uint4 *)out + g2) = fp8_nf4_16(w2, s2, inv, code_s);
    }
    const int64_t t = n16 * 16 + threadIdx.x;
    if (blockIdx.x == 0 && t < a.n) {
        const int64_t e = a.e0 + t;
        uint8_t byte = a.codes[e >> 1];
        uint8_t c = (e & 1) ? (byte & 0x0f) : (byte >> 4);
        out[t] = (uint8_t)__nv_cvt_float_to_fp8(code_s[c] * nf4_block_absmax(a, e >> 6) * inv,
                                                __NV_SATFINITE, __NV_E4M3);
    }
}

/* The transposed column slab: out[c][r] = e4m3(W[r][c0 + c] * inv) for r < rows,
 * c < width; out row stride = rows. A block of 256 threads walks 64 x 64 tiles (grid-stride,
 * so the code tables are loaded once a block): each thread dequantizes 16 consecutive elements
 * of one row (8 code bytes) into a shared tile of W's layout (four 4-byte stores), and after the
 * barrier each thread gathers 16 bytes down one column (16 rows) and stores them as 16 bytes of
 * one output row. The tile's rows are 68 bytes apart (17 words: the 16 rows a thread gathers
 * fall in different banks). Requires ld (W's cols), c0 and width multiples of 64 and rows a
 * multiple of 16 (every 16-byte store is whole inside or outside the matrix). */
#define FP8_T_TILE 64
#define FP8_T_LD 68
__global__ void __launch_bounds__(256) fp8_nf4_cols_t(nf4_args a, int64_t rows, int64_t c0,
                                                      int64_t width, float inv,
                                                      uint8_t *out)
{
    __shared__ float code_s[16];
    __shared__ float dmap_s[256];
    __shared__ __align__(16) uint8_t tile[FP8_T_TILE * FP8_T_LD];
    nf4_tables_to_shared(a, code_s, dmap_s);
    const int64_t row_tiles = (rows + FP8_T_TILE - 1) / FP8_T_TILE, col_tiles = width / FP8_T_TILE;
    const int rr = threadIdx.x >> 2, cg = (threadIdx.x & 3) * 16;
    const int oc = threadIdx.x >> 2, part = (threadIdx.x & 3) * 16;
    for (int64_t t = blockIdx.x; t < row_tiles * col_tiles; t += gridDim.x) {
        const int64_t r0 = (t / col_tiles) * FP8_T_TILE, cc0 = (t % col_tiles) * FP8_T_TILE;
        const int64_t r = r0 + rr;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows) {
            const int64_t e = r * a.ld + c0 + cc0 + cg;
            uint2 w = __ldg((const uint2 *)(a.codes + (e >> 1)));
            v = fp8_nf4_16(w, fp8_nf4_absmax_s(a, dmap_s, e >> 6), inv, code_s);
        }
        uint32_t *dst = (uint32_t *)(tile + rr * FP8_T_LD + cg);
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
        __syncthreads();
        const int64_t orow = r0 + part;
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint8_t *src = tile + (part + 4 * j) * FP8_T_LD + oc;
            o[j] = (uint32_t)src[0] | ((uint32_t)src[FP8_T_LD] << 8) |
                   ((uint32_t)src[2 * FP8_T_LD] << 16) | ((uint32_t)src[3 * FP8_T_LD] << 24);
        }
        if (orow < rows)
            *(uint4 *)(out + (cc0 + oc) * rows + orow) = make_uint4(o[0], o[1], o[2], o[3]);
        __syncthreads(); /* the tile is rewritten by the next pass */
    }
}

#endif
