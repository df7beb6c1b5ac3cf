/* cpu_internal.h — the CPU backend's object and helpers shared by its op files.
 *
 * Everything is f32 (act dtype F32). Device memory is host memory. Parallel loops use OpenMP
 * with `num_threads(cpu->n_threads)`; every output element is produced by exactly one thread
 * with a fixed inner order, and every reduction over many elements uses fixed-size blocks
 * combined in index order, so results do not depend on the thread count. GEMMs go to OpenBLAS
 * through cpu_blas_sgemm, which cuts them so that their bits depend neither on the thread count
 * nor on the number of rows (tests/unit/test_backend_ops.c checks 1 vs several threads, and rows
 * alone vs in a larger product).
 */
#ifndef TANDEM_ENGINE_CPU_INTERNAL_H
#define TANDEM_ENGINE_CPU_INTERNAL_H
#include <stdint.h>

#include "engine/backend_impl.h"
#include "engine/cpu/cpu_memory_plan.h" /* cpu_scratch_slot */

/* Loops over fewer elements than this run on the calling thread: a parallel region costs
 * microseconds, more than small ops take. (Which thread computes an element never changes the
 * result, so this only affects speed.) */
#define TDM_CPU_PAR_MIN ((int64_t)1 << 15)

typedef struct cpu_backend {
    struct tdm_backend base;
    int n_threads;
    bool blas_threaded;     /* one threaded OpenBLAS call per product, not tiles (cpu_sgemm) */
    int64_t tile_m;         /* rows of cpu_sgemm's tiles (GEMM_TILE_M in cpu_backend.c) */
    int64_t att_keep_bytes; /* attention_bwd's cap on kept P and dS (tdm_cpu_att_keep_cap) */
    uint64_t used, peak;
    struct alloc_hdr *allocs; /* live allocations (cpu_backend.c) */
    float dmap[256];          /* NF4 double-quant dynamic map */
    bool nf4_avx512;          /* NF4 blocks dequantized by lane permutes (cpu_nf4_range) */
    struct {
        void *p;
        size_t bytes;
    } scratch[CPU_SCRATCH_N];
} cpu_backend;

static inline cpu_backend *cpu_of(tdm_backend *be)
{
    return (cpu_backend *)be;
}

/* C = alpha op(A) op(B) + beta C, f32 row-major: threaded OpenBLAS calls (one per K block) with
 * the OpenMP build, else single-threaded calls on tiles over the backend's threads
 * (cpu_backend.c). */
void cpu_sgemm(const cpu_backend *cpu, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
               float *c, int64_t ldc);

/* cpu_sgemm with C cut in tiles of tm rows by tn columns (the caller's choice, a function of the
 * shape alone, so the bits do not depend on the thread count; cpu_sgemm picks them with
 * gemm_tiles). The threaded-calls mode ignores them: one call per K block. */
void cpu_sgemm_tiles(const cpu_backend *cpu, int64_t tm, int64_t tn, bool ta, bool tb, int64_t m,
                     int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc);

/* cpu_sgemm_tiles for a product computed per segment of rows (LoRA: one adapter's rows), in
 * both GEMM modes: each tile one cpu_blas_sgemm_1t call (OpenBLAS's own kernels for the tile's
 * shape, small ones included, with no copies). A tile's shape is a function of the segment's
 * (m, n) and tm, tn alone (0: cpu_sgemm's tiles), and other segments never change it, so an
 * adapter gets the same bits alone or beside others, at any thread count. */
void cpu_sgemm_segment(const cpu_backend *cpu, int64_t tm, int64_t tn, bool ta, bool tb, int64_t m,
                       int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* One product through OpenBLAS with nt threads (OpenMP build; 1 inside a parallel region, and
 * always 1 with other builds), cut so that its bits depend neither on the thread count nor on
 * m or n (cpu_backend.c says how). Every cblas_sgemm of the backend goes through it. */
void cpu_blas_sgemm(int nt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                    int64_t ldc);

/* One product through OpenBLAS on one thread, as OpenBLAS computes it for that shape (its
 * small-matrix kernels included; K not cut): its bits depend on (ta, tb, m, n, k) alone, never on
 * the thread count, but a row is not the same bits as in a product of more rows. For products
 * whose shape is fixed by what they compute, whatever else the batch holds: attention's blocks
 * of one sequence (cpu_layers.c). */
void cpu_blas_sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* C (m x n) = A (m x k) op(B) + beta C with tandem's own kernels (cpu_panel_gemm.c): op(B) =
 * B^T, B (n x k) row-major when tb (the frozen forward X W^T), else B (k x n) row-major (the
 * frozen backward dY W); beta 0 or 1. Every element one FMA chain over k in order, so its bits
 * depend on nothing but its row, its column and the ISA-independent chain (not threads, tiles,
 * or the rows beside it). False when it cannot: no AVX2 + FMA on this CPU, TANDEM_CPU_PANELS=0,
 * TANDEM_CPU_GEMM=blas, another beta, or no memory for the panels (the caller then uses
 * cpu_sgemm). */
bool cpu_panel_gemm(cpu_backend *cpu, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* A frozen f32 weight W (rows x cols, row-major) laid out in place in the forward's panels
 * (TDM_BE_W_F32_PANELS, *pw rows a panel): true when done; false (W untouched) when this CPU's
 * frozen GEMMs are not tandem's kernels, rows is not a multiple of the kernel's panel, there
 * is no memory for a panel's copy a thread, or (backward_panels: a projection, whose backward
 * lays its own panels out from these) those panels would exceed the scratch's cap. */
bool cpu_panel_lay_out(cpu_backend *cpu, int64_t rows, int64_t cols, float *w,
                       bool backward_panels, int32_t *pw);

/* A frozen f32 weight's product through cpu_panel_gemm: the forward (fwd: C (m x rows) = A
 * (m x cols) W^T) or the backward (C (m x cols) = A (m x rows) W), W row-major (TDM_BE_W_F32;
 * the TANDEM_CPU_PANEL_CACHE=1 measurement aid may keep its panels) or laid out by
 * cpu_panel_lay_out (TDM_BE_W_F32_PANELS: the forward reads the panels as they are, the
 * backward lays its own out from them). The same bits either way. False when it cannot (the
 * caller then uses cpu_sgemm, or for a laid-out weight cpu_weight_rows_f32's tiles). */
bool cpu_panel_gemm_weight(cpu_backend *cpu, bool fwd, const tdm_be_weight *w, const float *a,
                           int64_t m, float beta, float *c);

/* Whether w is laid out in panels that tandem's kernels read as they are now (the forward
 * product of such a weight, cpu_panel_gemm_weight with fwd and beta 0 or 1, cannot fail). */
bool cpu_panel_reads_laid_out(const cpu_backend *cpu, const tdm_be_weight *w);

/* Rows [r0, r1) of an NF4 / NF4_DQ weight dequantized straight into the NR-wide panels of
 * op(B) that cpu_panel_gemm_panels reads: fwd, op(B) = the tile's W^T (its rows as columns,
 * tdm_cpu_panel_bytes(r1 - r0, cols) bytes); else op(B) = the tile's W (its columns as columns,
 * tdm_cpu_panel_bytes(cols, r1 - r0) bytes). The values of cpu_weight_rows_f32 in one pass
 * (before: dequantized into rows, then laid out by the product: two). False (out untouched)
 * when tandem's kernels are off. */
bool cpu_nf4_tile_panels(cpu_backend *cpu, const tdm_be_weight *w, int64_t r0, int64_t r1,
                         bool fwd, float *out);

/* C (m x n) = A (m x k) op(B) + beta C with op(B) given in the kernels' NR-wide panels (as
 * cpu_nf4_tile_panels lays them out): the same bits as cpu_panel_gemm. False when it cannot. */
bool cpu_panel_gemm_panels(cpu_backend *cpu, int64_t m, int64_t n, int64_t k, const float *a,
                           int64_t lda, const float *panels, float beta, float *c, int64_t ldc);

/* Rows [r0, r1) of a laid-out weight, row-major, into out ((r1 - r0) x cols). */
void cpu_panel_rows(const float *w, int pw, int64_t cols, int64_t r0, int64_t r1, float *out);

/* Drops the TANDEM_CPU_PANEL_CACHE panels of weights inside [p, p + bytes) (cpu_free). */
void cpu_panel_cache_forget(cpu_backend *cpu, const void *p, size_t bytes);

/* cpu_panel_gemm on the calling thread alone (inside a parallel region: a task's product), each
 * K block of B packed as it is used: the same bits as cpu_panel_gemm. False when it cannot. */
bool cpu_panel_gemm_1t(bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* cpu_panel_gemm_1t with B in bf16 (a weight as its checkpoint stores it): each K block of B
 * widened to f32 as it is packed, so the same bits as cpu_panel_gemm_1t on B's f32 values. */
bool cpu_panel_gemm_1t_bf16(bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc);

/* The tiles of a C = A B^T product whose B (n x k, row-major: the lm_head) each tile packs
 * itself: CPU_WT_TILE_M rows of A by CPU_WT_TILE_N rows of B, so a tile packs its slice of B
 * once for a whole cross-entropy chunk (cpu_sgemm's 128-row tiles packed all of a 152K x 896
 * lm_head, 545 MB in f32, once per 128 rows), and a decoded token's one row still has n / 256
 * tasks (594 at Qwen2.5's vocabulary). A tile is a sub-block: no other bits. */
#define CPU_WT_TILE_M 512
#define CPU_WT_TILE_N 256

/* C (m x n) = A (m x k) B^T + beta C over all threads in those tiles, B f32 (b) or bf16 (b16,
 * widened as packed; the other NULL), each tile through cpu_panel_gemm_1t's path: the bits of
 * cpu_panel_gemm on B's f32 values. False when tandem's kernels are off (no AVX2 kernel,
 * TANDEM_CPU_PANELS=0, the threaded-call GEMM mode) or beta is neither 0 nor 1. */
bool cpu_panel_gemm_wt_tiles(const cpu_backend *cpu, int64_t m, int64_t n, int64_t k,
                             const float *a, const float *b, const uint16_t *b16, float beta,
                             float *c);

/* Y (m x w->rows) = A (m x w->cols) W^T + beta Y for a bf16 weight (TDM_BE_W_BF16):
 * cpu_panel_gemm_wt_tiles on it. linear_fwd's with qlora's bf16 lm_head. False for other
 * formats and where cpu_panel_gemm_wt_tiles is. */
bool cpu_panel_gemm_bf16_weight(const cpu_backend *cpu, const tdm_be_weight *w, const float *a,
                                int64_t m, float beta, float *c);

/* C (m x w->cols) = A (m x k) W[row0 .. row0 + k) + beta C on the calling thread alone: rows of
 * an f32 weight (TDM_BE_W_F32, or laid out by cpu_panel_lay_out: each K block of the rows is
 * transposed back from the panels as it is used) or of a bf16 one (TDM_BE_W_BF16, widened as
 * packed). The same bits in every case. The cross-entropy's dH = dlogits W a vocabulary block
 * at a time. */
bool cpu_panel_gemm_1t_rows(int64_t m, int64_t k, const float *a, int64_t lda,
                            const tdm_be_weight *w, int64_t row0, float beta, float *c,
                            int64_t ldc);

/* "avx512", "avx2", or NULL when cpu_panel_gemm is off (TANDEM_CPU_PANELS=0, or no kernel for
 * this CPU). TANDEM_CPU_PANELS=avx2 takes the AVX2 kernel on an AVX-512 CPU (a comparison). */
const char *cpu_panel_isa_name(void);

/* Tests: use the kernel named ("avx512", "avx2", "none"; NULL: as TANDEM_CPU_PANELS and the CPU
 * say). False, nothing changed, when this CPU lacks it. */
bool cpu_panel_isa_use(const char *name);

/* Whether the OpenBLAS loaded is its OpenMP build (threads from OpenMP's pool). */
bool cpu_blas_threaded(void);

/* Whether OpenBLAS runs kernels (its core) on which cpu_blas_sgemm's bits were measured
 * independent of threads, rows and columns (unit.cpu_gemm): SkylakeX, Cooperlake,
 * SapphireRapids. */
bool cpu_blas_bits_measured(void);

/* Dequantizes / converts rows [r0, r1) of w into out ((r1-r0), cols) f32. */
void cpu_weight_rows_f32(cpu_backend *cpu, const tdm_be_weight *w, int64_t r0, int64_t r1,
                         float *out);

/* Elements [e0, e1) of an NF4 / NF4_DQ weight's row-major flattening dequantized into out, on
 * the calling thread (cpu_weight_rows_f32's values). */
void cpu_nf4_range(const cpu_backend *cpu, const tdm_be_weight *w, int64_t e0, int64_t e1,
                   float *out);

/* A buffer of at least `bytes` for one op call, kept for the next call (grown when too small,
 * freed with the backend); its contents are undefined. NULL on allocation failure. Why: a
 * buffer malloc'd per call and larger than glibc's mmap threshold (32 MiB at most) is mapped
 * fresh every time, so each call pays a page fault per 4 KiB page and the unmap's TLB
 * shootdowns: the cross-entropy's 268 MB of logits at a 0.5B B4 x 256 step were 65K faults a
 * call, about 1 s on the 2-core VM (docs/benchmarks.md, issue 20). One op at a time uses a
 * slot: the backend's ops are called from one thread. */
void *cpu_scratch(cpu_backend *cpu, cpu_scratch_slot slot, size_t bytes);

/* posix_memalign(align, bytes) for buffers under 2 MiB; larger ones on a 2 MiB boundary with
 * transparent huge pages asked for (cpu_backend.c says why). free() frees either. */
void *cpu_big_alloc(size_t align, size_t bytes);

/* A full f32 view of a dense weight: w->data itself when F32, else its conversion into the
 * CPU_SCRATCH_CE_WEIGHT scratch buffer. NULL on allocation failure. */
const float *cpu_dense_f32(cpu_backend *cpu, const tdm_be_weight *w);

/* Op entry points defined in cpu_layers.c and cpu_train.c. */
tdm_status cpu_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                         void *out, tdm_error *err);
tdm_status cpu_rmsnorm_fwd(tdm_backend *be, const void *x, const float *w, int64_t rows, int64_t d,
                           float eps, void *y, float *rstd, tdm_error *err);
tdm_status cpu_rmsnorm_bwd(tdm_backend *be, const void *dy, const void *x, const float *w,
                           const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                           tdm_error *err);
tdm_status cpu_rope(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                    int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                    tdm_error *err);
tdm_status cpu_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                             const void *v, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, void *out, float *lse, tdm_error *err);
tdm_status cpu_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, const void *dout,
                             int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                             void *dq, void *dk, void *dv, tdm_error *err);
tdm_status cpu_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs, int64_t m,
                            const void *q, const void *k, const void *v, void *k_cache,
                            void *v_cache, int64_t n_slots, int64_t cap, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, void *out,
                            tdm_error *err);
tdm_status cpu_swiglu_fwd(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                          void *h, tdm_error *err);
tdm_status cpu_swiglu_bwd(tdm_backend *be, const void *g, const void *u, const void *dh, int64_t m,
                          int64_t n, void *dg, void *du, tdm_error *err);
tdm_status cpu_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                             const int32_t *labels, const float *weight, int64_t m,
                             int64_t chunk_rows, float *loss, void *dh, tdm_error *err);
tdm_status cpu_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                        int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                        tdm_error *err);
tdm_status cpu_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                        const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                        int64_t out, void *dx, tdm_error *err);
tdm_status cpu_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                     float *out, tdm_error *err);
tdm_status cpu_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm, int n_groups,
                         float *coef, float *norm, tdm_error *err);
tdm_status cpu_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                     tdm_error *err);

#endif
