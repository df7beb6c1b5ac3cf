/* dropout.h — the LoRA dropout mask as a pure function of integers: no mask is ever stored.
 *
 * PEFT computes, for every targeted module of an adapter, y = base(x) + lora_B(lora_A(drop(x)))
 * * scale with its own nn.Dropout(p) per module: each element of the module's input is kept with
 * probability 1 - p and then multiplied by 1 / (1 - p), or zeroed; training only. tandem draws the
 * same Bernoulli mask from a counter-based generator instead of a stateful one, so the forward,
 * the backward and a gradient-checkpointing recompute all regenerate the very same mask, and the
 * CPU and CUDA backends (which both include this header) produce IDENTICAL masks:
 *
 *   keep(seed, row, col) = hi32(splitmix64_mix(seed + (n + 1) * GAMMA)) >= thr,
 *       n = row * 2^32 + col,  GAMMA = 0x9e3779b97f4a7c15,
 *       thr = floor(p * 2^32) (tdm_dropout_threshold, one uint32 computed once from p),
 *   i.e. element (row, col) takes the n-th output of the SplitMix64 generator started at state
 *   `seed`, and P(keep) = 1 - thr / 2^32 = 1 - p to within 2^-32.
 *
 * SplitMix64 is the generator of Steele, Lea and Flood, "Fast Splittable Pseudorandom Number
 * Generators" (OOPSLA 2014; java.util.SplittableRandom), with the finalizer constants of
 * Vigna's reference splitmix64.c (prng.di.unimi.it), which is Stafford's "Mix13" (the paper
 * reports that the generator passes TestU01's BigCrush). The keep test is an integer comparison,
 * so no floating-point rounding can make two backends disagree.
 *
 * row is the row index RELATIVE TO THE ADAPTER'S SEGMENT of the fused batch (row - row_begin) and
 * col the input feature, so an adapter's mask does not depend on where its rows sit in a fused
 * batch (fused = alone). seed is per (step, piece, layer, module): engine/model.h derives it with
 * tdm_dropout_derive from the run's seed, the adapter's optimizer step, the piece's position in
 * that step's batch (sequences done before it), the layer and the module index (q_proj, k_proj
 * and v_proj read the same x but get independent masks).
 * Limits: row < 2^32 and col < 2^32 (the backends' shapes are far below).
 */
#ifndef TANDEM_ENGINE_DROPOUT_H
#define TANDEM_ENGINE_DROPOUT_H
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TDM_DROPOUT_FN static inline __host__ __device__
#else
#define TDM_DROPOUT_FN static inline
#endif

#define TDM_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

/* The SplitMix64 output function (Vigna's splitmix64.c: z ^= z >> 30, * 0xbf58476d1ce4e5b9,
 * z ^= z >> 27, * 0x94d049bb133111eb, z ^= z >> 31): a bijection of 64-bit integers. */
TDM_DROPOUT_FN uint64_t tdm_splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A child seed of `key` for the value v (a step, a layer, a module index): distinct v give
 * unrelated seeds. */
TDM_DROPOUT_FN uint64_t tdm_dropout_derive(uint64_t key, uint64_t v)
{
    return tdm_splitmix64_mix(key ^ tdm_splitmix64_mix(v + TDM_SPLITMIX64_GAMMA));
}

/* The keep threshold for probability p in [0, 1): floor(p * 2^32), computed in double from the
 * f32 p (exact: p * 2^32 is a power-of-two scaling). */
TDM_DROPOUT_FN uint32_t tdm_dropout_threshold(float p)
{
    double t = (double)p * 4294967296.0;
    if (!(t > 0)) return 0;
    return t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}

/* The factor of a kept element, 1 / (1 - p), in f32 as torch's dropout computes it. */
TDM_DROPOUT_FN float tdm_dropout_scale(float p)
{
    return 1.0f / (1.0f - p);
}

/* Whether element (row, col) of the module input is kept (see the header comment). */
TDM_DROPOUT_FN bool tdm_dropout_keep(uint64_t seed, uint32_t thr, uint64_t row, uint64_t col)
{
    uint64_t n = (row << 32) | (col & 0xffffffffull);
    return (uint32_t)(tdm_splitmix64_mix(seed + (n + 1) * TDM_SPLITMIX64_GAMMA) >> 32) >= thr;
}

/* The seed whose mask at row r equals `seed`'s mask at row r + rows, for every r and col (with
 * r + rows < 2^32): n grows by rows * 2^32, so seed + (n + 1) * GAMMA grows by rows * 2^32 *
 * GAMMA (mod 2^64). A segment cut into row blocks (the MLP's, engine/model.c) keeps its mask by
 * giving each piece the seed of its first row. */
TDM_DROPOUT_FN uint64_t tdm_dropout_skip_rows(uint64_t seed, uint64_t rows)
{
    return seed + (rows << 32) * TDM_SPLITMIX64_GAMMA;
}

#endif
