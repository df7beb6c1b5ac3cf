/* tandem — the CUDA backend's own device memory, predicted from shapes alone.
 *
 * The backend holds, besides the buffers its caller allocates (weights, activations, adapters),
 * a cuBLASLt workspace and a few scratch slots that grow on demand to the largest request and are
 * then reused (docs/cuda-backend.md). --vram auto must reserve them before any CUDA context
 * exists, so their sizes are a pure function of the shapes the model will run; the constants
 * below are the ones cuda_backend.cu uses, so prediction and allocation cannot drift apart.
 * Plain C: compiled into every build (the estimate is also printed by builds without CUDA). */
#ifndef TANDEM_ENGINE_CUDA_MEMORY_PLAN_H
#define TANDEM_ENGINE_CUDA_MEMORY_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/backend.h" /* tdm_be_step_shape: the shape these sizes are a function of */

/* cuBLASLt workspace (bytes), allocated once at backend creation. */
#define TDM_CUDA_LT_WORKSPACE_BYTES ((uint64_t)32 << 20)
/* Elements of a frozen NF4 / f32 weight dequantized to bf16 per tile (64 MiB): most projections
 * of a 7B model in one piece, the MLP ones in three (8 Mi elements, the first size, split a 7B
 * gate_proj into 9 tiles and its backward into 9 f32-accumulated partial products). */
#define TDM_CUDA_DEQUANT_TILE_ELEMS ((int64_t)32 << 20)
/* The tile limit in force: TDM_CUDA_DEQUANT_TILE_ELEMS, or TANDEM_CUDA_DEQUANT_TILE_MI Mi elements
 * (1..1024) when that is set: a benchmark knob (scripts/device/gemm-cut-ab.sh) to measure other
 * cuts of the 7B MLP weights, whose thirds make products of 1216 output columns. The memory plan
 * and the backend both read it here, so the plan still equals what is allocated. */
int64_t tdm_cuda_dequant_tile_elems(void);
/* The tensor-core attention backward splits dk/dv over the GQA group into f32 partials of at
 * most this many bytes (attention.cuh, att3_dkv_split). */
#define TDM_CUDA_ATT_SPLIT_MAX_BYTES ((uint64_t)256 << 20)
/* A scratch slot grows to request * (1 + 1/TDM_CUDA_SCRATCH_HEADROOM_DIV). */
#define TDM_CUDA_SCRATCH_HEADROOM_DIV 4

/* The segmented LoRA backward sums dA = dU^T X and dB = dY^T U over a segment's rows in chunks
 * (more blocks in flight than one pass over all rows), each chunk into f32 partials of
 * rank * (in + out) floats that a second kernel adds in chunk order (scratch slot 7).
 * Rows per chunk for a segment of R rows: the larger of 256 and ceil(R / 16) rounded up to 32,
 * so at most 16 chunks; a pure function of R, hence the same summation order on every run. */
#define TDM_CUDA_LORA_RED_MIN_CHUNK_ROWS 256
#define TDM_CUDA_LORA_RED_MAX_CHUNKS 16
static inline int64_t tdm_cuda_lora_red_chunk_rows(int64_t R)
{
    int64_t c = (R + TDM_CUDA_LORA_RED_MAX_CHUNKS - 1) / TDM_CUDA_LORA_RED_MAX_CHUNKS;
    c = (c + 31) / 32 * 32;
    return c > TDM_CUDA_LORA_RED_MIN_CHUNK_ROWS ? c : TDM_CUDA_LORA_RED_MIN_CHUNK_ROWS;
}
static inline int64_t tdm_cuda_lora_red_chunks(int64_t R)
{
    int64_t c = tdm_cuda_lora_red_chunk_rows(R);
    return R > 0 ? (R + c - 1) / c : 0;
}

/* The segmented LoRA down-projections (U = X A^T, dU = s dY B: K = in or out features reduced to
 * the rank) split K across blocks in slices, each slice's sums kept as f32 (m x u_ld) partials in
 * scratch slot 3 that the up-projection kernel adds in slice order (lora.cuh). Slices: at most 16,
 * at least 512 wide where K allows, widths a multiple of 256; a pure function of K, so the same
 * summation order on every run and every GPU. */
#define TDM_CUDA_LORA_K_SLICE_MIN 512
#define TDM_CUDA_LORA_MAX_K_SLICES 16
static inline int64_t tdm_cuda_lora_k_slice(int64_t K)
{
    int64_t s = (K + TDM_CUDA_LORA_K_SLICE_MIN - 1) / TDM_CUDA_LORA_K_SLICE_MIN;
    if (s > TDM_CUDA_LORA_MAX_K_SLICES) s = TDM_CUDA_LORA_MAX_K_SLICES;
    if (s < 1) s = 1;
    int64_t w = (K + s - 1) / s;
    return (w + 255) / 256 * 256;
}
static inline int64_t tdm_cuda_lora_k_slices(int64_t K)
{
    return K > 0 ? (K + tdm_cuda_lora_k_slice(K) - 1) / tdm_cuda_lora_k_slice(K) : 1;
}

/* Rows of W (rows x cols) dequantized per tile in the forward (Y's column blocks): whole rows;
 * when W needs several tiles, equal tiles of a multiple of 64 rows (the last one shorter). */
int64_t tdm_cuda_tile_rows(int64_t rows, int64_t cols);
/* Columns of W per slab in the backward dX = dY W (dX's column blocks, so no partial sums):
 * all rows, equal slabs of a multiple of 64 columns; cols when W fits one tile. 0 when W cannot
 * be cut in slabs (cols not a multiple of 64): then the backward tiles rows and sums the tile
 * products in an f32 accumulator (m x cols). */
int64_t tdm_cuda_slab_cols(int64_t rows, int64_t cols);

/* Scratch slots of the CUDA backend (cuda_internal.h's cuda_backend.scratch). */
#define TDM_CUDA_SCRATCH_SLOTS 10

/* Slot 9 under --base-compute fp8: fp8.cuh's struct fp8_scales (the activation scale, a weight's
 * amax word and 1024 per-block activation maxima), checked against sizeof there. */
#define TDM_CUDA_FP8_SCALE_BYTES 4128

/* The largest request (bytes, before headroom) each scratch slot will get for that shape; 0 for
 * a slot the shape never uses. The backend reserves these at the start of a run; the estimate
 * adds them up with their headroom. */
void tdm_cuda_scratch_requests(const tdm_be_step_shape *s,
                               uint64_t request[TDM_CUDA_SCRATCH_SLOTS]);

/* Bytes of the backend's workspace + scratch at their largest for that shape. */
uint64_t tdm_cuda_scratch_bytes(const tdm_be_step_shape *s);

#ifdef __cplusplus
}
#endif

#endif
