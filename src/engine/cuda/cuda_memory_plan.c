/* tandem — the CUDA backend's workspace and scratch, predicted from shapes (see the header). */
#include "engine/cuda/cuda_memory_plan.h"

#include <stdlib.h>

/* n items in pieces of at most `max` (>= 1): equal pieces rounded up to `unit` (when max allows) */
static int64_t even_piece(int64_t n, int64_t max, int64_t unit)
{
    if (n <= max) return n;
    if (max < unit) return max < 1 ? 1 : max;
    int64_t pieces = (n + max - 1) / max;
    int64_t p = (n + pieces - 1) / pieces;
    p = (p + unit - 1) / unit * unit;
    return p <= max ? p : max / unit * unit;
}

int64_t tdm_cuda_dequant_tile_elems(void)
{
    const char *s = getenv("TANDEM_CUDA_DEQUANT_TILE_MI");
    if (!s || !*s) return TDM_CUDA_DEQUANT_TILE_ELEMS;
    char *end;
    long mi = strtol(s, &end, 10);
    return *end == '\0' && mi >= 1 && mi <= 1024 ? (int64_t)mi << 20 : TDM_CUDA_DEQUANT_TILE_ELEMS;
}

int64_t tdm_cuda_tile_rows(int64_t rows, int64_t cols)
{
    return even_piece(rows, tdm_cuda_dequant_tile_elems() / (cols > 0 ? cols : 1), 64);
}

int64_t tdm_cuda_slab_cols(int64_t rows, int64_t cols)
{
    int64_t limit = tdm_cuda_dequant_tile_elems();
    if (rows * cols <= limit) return cols;
    if (cols % 64 != 0) return 0;
    int64_t max = limit / (rows > 0 ? rows : 1) / 64 * 64;
    return even_piece(cols, max < 64 ? 64 : max, 64);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* A slot's size once grown to serve `request` bytes. */
static uint64_t grown(uint64_t request)
{
    return request ? request + request / TDM_CUDA_SCRATCH_HEADROOM_DIV : 0;
}

/* Largest NF4 tile or slab (slot 0) and f32 tile accumulator of linear_bwd (slot 1, only for
 * weights that cannot be cut in column slabs) over the decoder projections (rows = out
 * features, cols = in features). */
static void tiles(const tdm_be_step_shape *s, uint64_t *tile, uint64_t *acc)
{
    const int64_t shapes[][2] = {{s->q_dim, s->hidden},
                                 {s->kv_dim, s->hidden},
                                 {s->hidden, s->q_dim},
                                 {s->inter, s->hidden},
                                 {s->hidden, s->inter}};
    *tile = *acc = 0;
    for (unsigned i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t rows = shapes[i][0], cols = shapes[i][1];
        int64_t tr = tdm_cuda_tile_rows(rows, cols);
        *tile = max_u64(*tile, (uint64_t)(tr * cols) * 2);
        if (!s->backward) continue;
        int64_t sc = tdm_cuda_slab_cols(rows, cols);
        if (sc > 0)
            *tile = max_u64(*tile, (uint64_t)(rows * sc) * 2);
        else if (tr < rows)
            *acc = max_u64(*acc, (uint64_t)(s->m * cols) * 4);
    }
}

/* Largest f32 dk/dv partials of the tensor-core attention backward: the split is chosen on the
 * device from its SM count, so take the largest divisor of the GQA group the rule can pick. */
static uint64_t attention_split_bytes(const tdm_be_step_shape *s)
{
    if (!s->backward || (s->head_dim != 64 && s->head_dim != 128) || s->kv_heads < 1) return 0;
    int64_t group = s->heads / s->kv_heads;
    uint64_t best = 0;
    for (int64_t k = 2; k <= group; k++) {
        if (group % k) continue;
        uint64_t b = (uint64_t)(2 * k * s->m * s->kv_heads * s->head_dim) * 4;
        if (b > TDM_CUDA_ATT_SPLIT_MAX_BYTES) break;
        best = b;
    }
    return best;
}

void tdm_cuda_scratch_requests(const tdm_be_step_shape *s,
                               uint64_t slot[TDM_CUDA_SCRATCH_SLOTS])
{
    for (int i = 0; i < TDM_CUDA_SCRATCH_SLOTS; i++)
        slot[i] = 0;
    uint64_t tile = 0, acc = 0;
    if (s->nf4) tiles(s, &tile, &acc);
    slot[0] = tile;
    /* slot 1: linear_bwd accumulator, cross-entropy logits (f32), attention backward's Di */
    slot[1] = max_u64(acc, (uint64_t)(s->ce_chunk * s->vocab) * 4);
    if (s->backward) slot[1] = max_u64(slot[1], (uint64_t)(s->heads * s->m) * 4);
    /* slot 2: bf16 dlogits of a chunk, or the attention backward's dk/dv partials */
    if (s->backward)
        slot[2] = max_u64((uint64_t)(s->ce_chunk * s->vocab) * 2, attention_split_bytes(s));
    /* slot 3: the LoRA down-projections' per-K-slice partials (slices x m x u_ld f32), and in
     * the backward dU (m x u_ld) after them; K is a module's in or out features */
    if (s->max_rank > 0) {
        /* (the slice count is not monotonic in K: take the largest over the dimensions) */
        const int64_t dims[] = {s->hidden, s->inter, s->q_dim, s->kv_dim};
        int64_t slices = 1;
        for (unsigned i = 0; i < sizeof dims / sizeof dims[0]; i++)
            if (tdm_cuda_lora_k_slices(dims[i]) > slices) slices = tdm_cuda_lora_k_slices(dims[i]);
        int64_t blocks = slices + (s->backward ? 1 : 0);
        slot[3] = (uint64_t)(blocks * s->m * s->max_rank) * 4;
    }
    /* slots 4, 5: op tables (AdamW chunks of 4096 parameters, sum-of-squares chunks of 8192,
     * LoRA segment tables) and per-chunk partial sums: small */
    slot[4] = (uint64_t)(s->lora_params / 4096 + 64) * 64;
    slot[5] = (uint64_t)(s->lora_params / 8192 + 64) * 4;
    /* slot 7: the LoRA backward's per-chunk partials of dA and dB (cuda_memory_plan.h): a
     * segment of R <= m rows has at most min(16, ceil(m / 256)) chunks */
    if (s->backward && s->max_rank > 0) {
        int64_t chunks =
            (s->m + TDM_CUDA_LORA_RED_MIN_CHUNK_ROWS - 1) / TDM_CUDA_LORA_RED_MIN_CHUNK_ROWS;
        if (chunks > TDM_CUDA_LORA_RED_MAX_CHUNKS) chunks = TDM_CUDA_LORA_RED_MAX_CHUNKS;
        slot[7] = (uint64_t)(chunks * s->lora_module_params) * 4;
    }
    /* slots 8, 9: --base-compute fp8 (fp8.cuh): one e4m3 operand, X (m, in) in the forward or
     * dY (m, out) in the backward, and the scale words; the weight's e4m3 tile or slab takes
     * half of slot 0's bf16 size */
    if (s->nf4 && s->base_fp8) {
        const int64_t dims[] = {s->hidden, s->inter, s->q_dim, s->kv_dim};
        int64_t widest = 0;
        for (unsigned i = 0; i < sizeof dims / sizeof dims[0]; i++)
            if (dims[i] > widest) widest = dims[i];
        slot[8] = (uint64_t)(s->m * widest);
        slot[9] = TDM_CUDA_FP8_SCALE_BYTES;
    }
}

uint64_t tdm_cuda_scratch_bytes(const tdm_be_step_shape *s)
{
    uint64_t slot[TDM_CUDA_SCRATCH_SLOTS];
    tdm_cuda_scratch_requests(s, slot);
    uint64_t total = TDM_CUDA_LT_WORKSPACE_BYTES;
    for (int i = 0; i < TDM_CUDA_SCRATCH_SLOTS; i++)
        total += grown(slot[i]);
    return total;
}
