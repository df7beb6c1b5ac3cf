/* cpu_memory_plan.c — the CPU backend's scratch sizes from shapes alone (cpu_memory_plan.h). */
#include "engine/cpu/cpu_memory_plan.h"

#include <stdlib.h>

#include "engine/cpu/cpu_internal.h" /* cpu_panel_isa_name */

bool cpu_ce_widens_bf16(bool blas_threaded)
{
    return cpu_panel_isa_name() != NULL && !blas_threaded;
}

tdm_status tdm_cpu_att_keep_cap(int64_t *bytes, tdm_error *err)
{
    const char *v = getenv("TANDEM_CPU_ATT_KEEP_KIB");
    *bytes = (int64_t)TDM_CPU_ATT_KEEP_KIB << 10;
    if (!v || !*v) return TDM_OK;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (*end || n < 0 || n > (1LL << 30))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "TANDEM_CPU_ATT_KEEP_KIB=%s: want KiB from 0 to 2^30, or unset for %d", v,
                        TDM_CPU_ATT_KEEP_KIB);
    *bytes = (int64_t)n << 10;
    return TDM_OK;
}

static int64_t round16(int64_t x)
{
    return (x + 15) / 16 * 16;
}

int64_t tdm_cpu_weight_tile_rows(int64_t rows, int64_t cols)
{
    /* equal tiles of at most 4 Mi floats (16 MiB; a multiple of 16 rows): a 4864 x 896 gate_proj
     * is 2 tiles of 2432 rows, not 4 of 1170 and one of 184 (a product of 184 columns is all
     * narrow GEMM tiles) */
    int64_t max_rows = ((int64_t)1 << 22) / cols;
    if (max_rows < 16) max_rows = 16;
    int64_t n = (rows + max_rows - 1) / max_rows;
    int64_t t = round16((rows + n - 1) / n);
    return t > rows ? rows : t;
}

/* the widest panel of cpu_panel_gemm.c's kernels (AVX-512: 32 columns; AVX2's 16 fit) */
#define PANEL_NR_MAX 32
/* the tallest row group (AVX-512: 12 rows; AVX2's 6 divide it) */
#define PANEL_MR_MAX 12

uint64_t tdm_cpu_panel_bytes(int64_t n, int64_t k)
{
    int64_t panels = (n + PANEL_NR_MAX - 1) / PANEL_NR_MAX;
    if (panels * PANEL_NR_MAX * k > TDM_CPU_PANEL_MAX_FLOATS) return 0;
    return (uint64_t)(panels * PANEL_NR_MAX * k) * sizeof(float);
}

uint64_t tdm_cpu_panel_a_bytes(int64_t m, int64_t k)
{
    int64_t rows = (m + PANEL_MR_MAX - 1) / PANEL_MR_MAX * PANEL_MR_MAX;
    if (m < TDM_CPU_PANEL_MIN_ROWS || rows * k > TDM_CPU_PANEL_MAX_FLOATS) return 0;
    return (uint64_t)(rows * k) * sizeof(float);
}

/* dH's vocabulary blocks: V cut in CE_VBLOCKS blocks (a multiple of 16, not under CE_VBLOCK_MIN
 * rows), so that with a chunk's 2 row tasks 16 threads run 4 full rounds; blocks of 4096 gave
 * Qwen2.5's 152K vocabulary 38 blocks, 76 tasks, the fifth round 3/4 idle. A function of V
 * alone. */
#define CE_VBLOCKS 32
#define CE_VBLOCK_MIN 1024

int64_t tdm_cpu_ce_vblock(int64_t V)
{
    int64_t b = round16((V + CE_VBLOCKS - 1) / CE_VBLOCKS);
    return b < CE_VBLOCK_MIN ? CE_VBLOCK_MIN : b;
}

int64_t tdm_cpu_ce_vblock_count(int64_t V)
{
    return (V + tdm_cpu_ce_vblock(V) - 1) / tdm_cpu_ce_vblock(V);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

void tdm_cpu_scratch_requests(const tdm_be_step_shape *s, int64_t att_keep_cap,
                              uint64_t slot[CPU_SCRATCH_N])
{
    for (int i = 0; i < CPU_SCRATCH_N; i++)
        slot[i] = 0;
    if (s->m <= 0) return;
    /* the decoder's projections (rows = out features, cols = in): q, k/v, o, gate/up, down */
    const int64_t shapes[][2] = {{s->q_dim, s->hidden}, {s->kv_dim, s->hidden},
                                 {s->hidden, s->q_dim}, {s->inter, s->hidden},
                                 {s->hidden, s->inter}};
    for (unsigned i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t rows = shapes[i][0], cols = shapes[i][1];
        if (rows <= 0 || cols <= 0) continue;
        /* NF4 is multiplied a dequantized tile of rows at a time, f32 as a whole */
        int64_t tile = s->nf4 ? tdm_cpu_weight_tile_rows(rows, cols) : rows;
        /* the (tile of) W in panels, the forward's of its rows, the backward's of its columns,
         * each with X or dY in row groups when W is laid out; an NF4 tile is dequantized
         * straight into its panels (the weight tile's slot), the panels' slot then holds X or
         * dY alone */
        uint64_t fwd = tdm_cpu_panel_bytes(tile, cols), bwd = tdm_cpu_panel_bytes(cols, tile);
        if (s->nf4)
            slot[CPU_SCRATCH_WEIGHT_TILE] =
                max_u64(slot[CPU_SCRATCH_WEIGHT_TILE],
                        fwd && bwd ? max_u64(fwd, s->backward ? bwd : 0) : (uint64_t)(tile * cols) * 4);
        uint64_t w_panels = s->nf4 && fwd && bwd ? 0 : 1; /* W's panels in the panels' slot */
        uint64_t panels = fwd ? w_panels * fwd + tdm_cpu_panel_a_bytes(s->m, cols) : 0;
        if (s->backward && bwd)
            panels = max_u64(panels, w_panels * bwd + tdm_cpu_panel_a_bytes(s->m, tile));
        slot[CPU_SCRATCH_PANELS] = max_u64(slot[CPU_SCRATCH_PANELS], panels);
    }
    int64_t chunk = s->ce_chunk < s->m ? s->ce_chunk : s->m;
    slot[CPU_SCRATCH_CE_LOGITS] = (uint64_t)(chunk * s->vocab) * 4;
    if (s->lm_head_bf16 && !cpu_ce_widens_bf16(false))
        slot[CPU_SCRATCH_CE_WEIGHT] = (uint64_t)(s->vocab * s->hidden) * 4;
    if (s->backward) {
        slot[CPU_SCRATCH_CE_PARTIAL] =
            (uint64_t)(tdm_cpu_ce_vblock_count(s->vocab) * chunk * s->hidden) * 4;
        /* a round keeps 2 x heads x sum(len^2) floats, at most the cap; sum(len^2) <= m x the
         * longest (equal when every sequence is that long) */
        int64_t longest = s->max_seq > 0 && s->max_seq < s->m ? s->max_seq : s->m;
        uint64_t all = (uint64_t)s->m * (uint64_t)longest * 2 * (uint64_t)s->heads * 4;
        slot[CPU_SCRATCH_ATT_KEEP] = all < (uint64_t)att_keep_cap ? all : (uint64_t)att_keep_cap;
    }
}

uint64_t tdm_cpu_scratch_bytes(const tdm_be_step_shape *s)
{
    int64_t cap;
    tdm_error err = {0};
    if (tdm_cpu_att_keep_cap(&cap, &err) != TDM_OK) cap = (int64_t)TDM_CPU_ATT_KEEP_KIB << 10;
    uint64_t slot[CPU_SCRATCH_N], total = 0;
    tdm_cpu_scratch_requests(s, cap, slot);
    for (int i = 0; i < CPU_SCRATCH_N; i++)
        total += slot[i];
    return total;
}
