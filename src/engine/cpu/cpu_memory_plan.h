/* tandem — the CPU backend's own memory, predicted from shapes alone.
 *
 * Besides the buffers its caller allocates (weights, activations, adapters), the CPU backend
 * keeps a few scratch buffers between op calls (cpu_scratch: fresh pages of a per-call malloc
 * fault one by one, ~16 us a page in the VMs measured): a dequantized weight tile, the
 * cross-entropy's logits and dH partial products, attention's kept P and dS. They grow to the
 * largest request and stay. The CPU placement budget (run/placement_budget.c) and
 * tdm_be_reserve_scratch size them with the functions below, which use the rules the ops
 * allocate by, so the prediction and the allocation cannot drift apart
 * (tests/unit/test_memory_estimate.c holds them equal). What an op mallocs for the length of
 * one call (LoRA's dropout copy and dU, attention's per-thread rows, the small-product copies of
 * cpu_blas_sgemm: each a few MiB at most at 7B shapes) is not here; TDM_CPU_PROCESS_MIB
 * (run/device_open.h) covers it. */
#ifndef TANDEM_ENGINE_CPU_MEMORY_PLAN_H
#define TANDEM_ENGINE_CPU_MEMORY_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/backend.h" /* tdm_be_step_shape */
#include "util/error.h"

/* The backend's scratch buffers, kept from one op call to the next (cpu_scratch). */
typedef enum {
    CPU_SCRATCH_WEIGHT_TILE, /* linear_fwd / linear_bwd: one dequantized tile of W's rows */
    CPU_SCRATCH_CE_WEIGHT,   /* cross_entropy: the lm_head in f32 when it is stored otherwise */
    CPU_SCRATCH_CE_LOGITS,   /* cross_entropy: a chunk's logits, then its dlogits */
    CPU_SCRATCH_CE_PARTIAL,  /* cross_entropy: dH's per-vocabulary-block partial products */
    CPU_SCRATCH_ATT_KEEP,    /* attention_bwd: P and dS of the dq pass for the dk, dv pass */
    CPU_SCRATCH_PANELS,      /* linear_fwd / linear_bwd: W (or its tile) in the kernels' panels */
    CPU_SCRATCH_N
} cpu_scratch_slot;

/* attention_bwd keeps P and dS (2 x heads x len^2 floats a sequence) for sequences whose sum
 * over a round fits this cap (KiB; TANDEM_CPU_ATT_KEEP_KIB overrides it, 0: always recompute).
 * A constant for the process, so a sequence's bits never depend on the thread count or on the
 * other sequences. */
#define TDM_CPU_ATT_KEEP_KIB 65536

/* The cap in bytes: TDM_CPU_ATT_KEEP_KIB, or TANDEM_CPU_ATT_KEEP_KIB when set. Errors:
 * TDM_ERR_INVALID naming the variable when it is not KiB from 0 to 2^30. */
tdm_status tdm_cpu_att_keep_cap(int64_t *bytes, tdm_error *err);

/* The tile of rows a non-f32 weight (rows, cols) is dequantized in by linear_fwd / linear_bwd:
 * equal tiles of at most 4 Mi floats (16 MiB), a multiple of 16 rows, dequantized by all threads
 * and then multiplied while in the caches. */
int64_t tdm_cpu_weight_tile_rows(int64_t rows, int64_t cols);

/* The largest operand (floats) the panel kernels lay out in panels: 256 MiB, every projection
 * of a Qwen2.5-3B; larger ones (a 7B's MLP in f32, an lm_head) are read in place. */
#define TDM_CPU_PANEL_MAX_FLOATS ((int64_t)1 << 26)

/* Bytes of an n x k operand (n the product's columns) laid out in the panel kernels' panels
 * (cpu_panel_gemm.c): n rounded up to the widest panel, 32 columns; 0 over
 * TDM_CPU_PANEL_MAX_FLOATS (read in place). */
uint64_t tdm_cpu_panel_bytes(int64_t n, int64_t k);

/* Products of fewer rows read W in place rather than laying it out (the pass over W would cost
 * about what the product does). */
#define TDM_CPU_PANEL_MIN_ROWS 64

/* Bytes of the m x k left operand laid out in the kernels' row groups beside W's panels: m
 * rounded up to the tallest group, 12 rows; 0 under TDM_CPU_PANEL_MIN_ROWS rows or over
 * TDM_CPU_PANEL_MAX_FLOATS (then each tile lays out its own rows). */
uint64_t tdm_cpu_panel_a_bytes(int64_t m, int64_t k);

/* dH's vocabulary blocks of the cross-entropy: rows per block, and the count covering V. */
int64_t tdm_cpu_ce_vblock(int64_t V);
int64_t tdm_cpu_ce_vblock_count(int64_t V);

/* Whether the cross-entropy multiplies a bf16 lm_head as it is, each tile widening its slice
 * to f32 as it packs it (tandem's panel kernels, on this CPU, in the tiles GEMM mode: not
 * blas_threaded); else it converts the whole lm_head into the CE_WEIGHT scratch first. */
bool cpu_ce_widens_bf16(bool blas_threaded);

/* Bytes of each slot for steps of shape s on the CPU backend in its default GEMM mode (tiles;
 * the threaded-call mode needs no CE_PARTIAL), with attention's kept P and dS capped at
 * att_keep_cap bytes. The dense weights are f32 there (its activation dtype); the lm_head too,
 * or bf16 (s->lm_head_bf16: qlora keeps it as a bf16 checkpoint stores it), which needs
 * CE_WEIGHT only where cpu_ce_widens_bf16 says no. */
void tdm_cpu_scratch_requests(const tdm_be_step_shape *s, int64_t att_keep_cap,
                              uint64_t slot[CPU_SCRATCH_N]);

/* Their sum, with the cap tdm_cpu_att_keep_cap gives (the default when the variable is not
 * valid: the backend refuses to start then). */
uint64_t tdm_cpu_scratch_bytes(const tdm_be_step_shape *s);

#endif
