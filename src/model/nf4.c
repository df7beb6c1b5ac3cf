#include "model/nf4.h"

/* No fused multiply-add: dequantization must round code * absmax (and map * absmax2 + offset)
 * exactly as the fp32 reference does, on every target. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const float tdm_nf4_code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* torch.linspace(start, end, steps) in fp32 as the CPU kernel computes it: the first half
 * counts up from start, the second half counts down from end, with a fp32 step, each point one
 * fused multiply-add (the vectorised kernel uses FMA; plain multiply-then-add differs by an ulp
 * or two at some points, which the golden test against torch caught). */
static void linspace_f32(float start, float end, int steps, float *out)
{
    float step = (end - start) / (float)(steps - 1);
    int halfway = steps / 2;
    for (int i = 0; i < steps; i++)
        out[i] = i < halfway ? fmaf(step, (float)i, start)
                             : fmaf(-step, (float)(steps - i - 1), end);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void tdm_nf4_dynamic_map(float map[256])
{
    /* signed, 7 exponent bits, 8 bits: for i in 0..6 there are 2^i fraction values, the means
     * of consecutive points of linspace(0.1, 1, 2^i + 1), scaled by 10^(i - 6), with both
     * signs; then 0 and 1.0. 2 * 127 + 2 = 256 values. */
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1;
        float bounds[65];
        linspace_f32(0.1f, 1.0f, items, bounds);
        /* bitsandbytes multiplies a fp32 tensor by a Python float: torch rounds the scalar
         * to fp32 and multiplies in fp32. */
        float scale = (float)pow(10.0, (double)(i - 6));
        for (int j = 0; j + 1 < items; j++) {
            float mean = (bounds[j] + bounds[j + 1]) / 2.0f;
            map[k++] = scale * mean;
            map[k++] = -scale * mean;
        }
    }
    map[k++] = 0.0f;
    map[k++] = 1.0f;
    qsort(map, 256, sizeof *map, cmp_float);
}

/* Index of the nearest entry of an ascending table of distinct values, exactly as an argmin of
 * fabsf(x - table[i]) over the whole table would pick it (ties to the lower index): binary search
 * for the first entry >= x, compare the two neighbours, then walk left over equal distances
 * (fp32 rounding can make neighbouring distances equal). NaN gives index 0. */
static int nearest(const float *table, int n, float x)
{
    int lo = 0, hi = n; /* first index with table[i] >= x */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (table[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    int best;
    if (lo == 0)
        best = 0;
    else if (lo == n)
        best = n - 1;
    else
        best = fabsf(x - table[lo]) < fabsf(x - table[lo - 1]) ? lo : lo - 1;
    float d = fabsf(x - table[best]);
    while (best > 0 && fabsf(x - table[best - 1]) <= d)
        best--;
    return best;
}

/* The NF4 codes of a block of 64 scaled values: per value, the argmin of fabsf(x - code[j])
 * over the 16 codes, ties to the lower index (NaN gives 0) — the definition nearest() above
 * computes for one value. Written as 15 compare-and-select passes over the whole block (no
 * data-dependent branch, a fixed trip count the compiler vectorizes): the binary search's
 * unpredictable branches were half of the time a 0.5B model took to load. */
static void nearest_codes(const float x[TDM_NF4_BLOCK], uint8_t out[TDM_NF4_BLOCK])
{
    float best_d[TDM_NF4_BLOCK];
    int32_t best[TDM_NF4_BLOCK];
    for (int k = 0; k < TDM_NF4_BLOCK; k++) {
        best_d[k] = fabsf(x[k] - tdm_nf4_code[0]);
        best[k] = 0;
    }
    for (int32_t j = 1; j < 16; j++) {
        const float c = tdm_nf4_code[j];
        for (int k = 0; k < TDM_NF4_BLOCK; k++) {
            float d = fabsf(x[k] - c);
            int32_t closer = -(int32_t)(d < best_d[k]); /* all ones or 0: a select, no branch */
            best_d[k] = closer ? d : best_d[k];
            best[k] = (best[k] & ~closer) | (j & closer);
        }
    }
    for (int k = 0; k < TDM_NF4_BLOCK; k++)
        out[k] = (uint8_t)best[k];
}

uint8_t tdm_nf4_quantize_value(float x)
{
    return (uint8_t)nearest(tdm_nf4_code, 16, x);
}

void tdm_nf4_free(tdm_nf4 *q)
{
    if (!q)
        return;
    free(q->packed);
    free(q->absmax);
    free(q->absmax_q);
    free(q->absmax2);
    memset(q, 0, sizeof *q);
}

uint64_t tdm_nf4_bytes(int64_t n, bool double_quant)
{
    uint64_t nb = (uint64_t)((n + TDM_NF4_BLOCK - 1) / TDM_NF4_BLOCK);
    uint64_t bytes = (uint64_t)(n + 1) / 2;
    if (!double_quant)
        return bytes + 4 * nb;
    return bytes + nb + 4 * ((nb + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK) + 4;
}

void tdm_nf4_double_quantize(const float *absmax, int64_t nblocks, uint8_t *absmax_q,
                             float *absmax2, float *offset)
{
    float map[256];
    tdm_nf4_dynamic_map(map);
    double sum = 0;
    for (int64_t b = 0; b < nblocks; b++)
        sum += absmax[b];
    float off = (float)(sum / (double)nblocks);
    *offset = off;
    int64_t nb2 = (nblocks + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < nb2; j++) {
        int64_t lo = j * TDM_NF4_DQ_BLOCK, hi = lo + TDM_NF4_DQ_BLOCK;
        if (hi > nblocks)
            hi = nblocks;
        float amax = 0.0f;
        for (int64_t b = lo; b < hi; b++) {
            float c = absmax[b] - off;
            if (fabsf(c) > amax)
                amax = fabsf(c);
        }
        absmax2[j] = amax;
        float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
        for (int64_t b = lo; b < hi; b++)
            absmax_q[b] = (uint8_t)nearest(map, 256, (absmax[b] - off) * inv);
    }
}

tdm_status tdm_nf4_quantize(const float *w, int64_t n, bool double_quant, tdm_nf4 *q,
                            tdm_error *err)
{
    memset(q, 0, sizeof *q);
    if (n <= 0)
        return tdm_fail(err, TDM_ERR_INVALID, "nf4: cannot quantize %lld elements", (long long)n);
    q->numel = n;
    q->nblocks = (n + TDM_NF4_BLOCK - 1) / TDM_NF4_BLOCK;
    q->double_quant = double_quant;
    q->packed = malloc((size_t)(n + 1) / 2);
    float *absmax = malloc((size_t)q->nblocks * sizeof(float));
    if (!q->packed || !absmax) {
        free(absmax);
        tdm_nf4_free(q);
        return tdm_fail(err, TDM_ERR_NOMEM, "nf4: out of memory for %lld elements",
                        (long long)n);
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < q->nblocks; b++) {
        int64_t lo = b * TDM_NF4_BLOCK, hi = lo + TDM_NF4_BLOCK;
        if (hi > n)
            hi = n;
        float amax = 0.0f;
        for (int64_t i = lo; i < hi; i++)
            if (fabsf(w[i]) > amax)
                amax = fabsf(w[i]);
        absmax[b] = amax;
        float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
        float x[TDM_NF4_BLOCK] = {0}; /* the last block's missing tail: 0, codes unused */
        uint8_t code[TDM_NF4_BLOCK];
        for (int64_t i = lo; i < hi; i++)
            x[i - lo] = w[i] * inv;
        nearest_codes(x, code);
        /* lo is even (blocks are 64 long), so pairs never straddle blocks; an odd count's last
         * byte pads its low half with code 7 (0.0) */
        for (int64_t i = lo; i < hi; i += 2) {
            uint8_t hi4 = code[i - lo], lo4 = i + 1 < hi ? code[i + 1 - lo] : 7;
            q->packed[i / 2] = (uint8_t)(hi4 << 4 | lo4);
        }
    }
    if (!double_quant) {
        q->absmax = absmax;
        return TDM_OK;
    }
    int64_t nb2 = (q->nblocks + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK;
    q->absmax_q = malloc((size_t)q->nblocks);
    q->absmax2 = malloc((size_t)nb2 * sizeof(float));
    if (!q->absmax_q || !q->absmax2) {
        free(absmax);
        tdm_nf4_free(q);
        return tdm_fail(err, TDM_ERR_NOMEM, "nf4: out of memory");
    }
    tdm_nf4_double_quantize(absmax, q->nblocks, q->absmax_q, q->absmax2, &q->offset);
    free(absmax);
    return TDM_OK;
}

static float dyn_map[256];
static pthread_once_t dyn_map_once = PTHREAD_ONCE_INIT;

static void dyn_map_init(void)
{
    tdm_nf4_dynamic_map(dyn_map);
}

float tdm_nf4_block_absmax(const tdm_nf4 *q, int64_t b)
{
    if (!q->double_quant)
        return q->absmax[b];
    pthread_once(&dyn_map_once, dyn_map_init);
    return dyn_map[q->absmax_q[b]] * q->absmax2[b / TDM_NF4_DQ_BLOCK] + q->offset;
}

void tdm_nf4_dequantize_block(const uint8_t *packed, int64_t e0, int64_t e1, float amax,
                              float *out)
{
    if (e0 % TDM_NF4_BLOCK == 0 && e1 - e0 == TDM_NF4_BLOCK) {
        float value[16];
        for (int j = 0; j < 16; j++)
            value[j] = tdm_nf4_code[j] * amax;
        const uint8_t *q = packed + e0 / 2;
        for (int i = 0; i < TDM_NF4_BLOCK / 2; i++) {
            out[2 * i] = value[q[i] >> 4];
            out[2 * i + 1] = value[q[i] & 0x0f];
        }
        return;
    }
    for (int64_t i = e0; i < e1; i++) {
        uint8_t byte = packed[i / 2];
        out[i - e0] = tdm_nf4_code[(i & 1) ? (byte & 0x0f) : (byte >> 4)] * amax;
    }
}

void tdm_nf4_dequantize(const tdm_nf4 *q, float *out)
{
    pthread_once(&dyn_map_once, dyn_map_init);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < q->nblocks; b++) {
        int64_t lo = b * TDM_NF4_BLOCK, hi = lo + TDM_NF4_BLOCK;
        if (hi > q->numel)
            hi = q->numel;
        tdm_nf4_dequantize_block(q->packed, lo, hi, tdm_nf4_block_absmax(q, b), out + lo);
    }
}
