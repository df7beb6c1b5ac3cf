/* rope.cu — rotary position embedding in place over the q (or k) rows of a batch: for every head,
 * the pair (j, j + head_dim/2) is rotated by angle pos * inv_freq[j] (the backward rotates by
 * -angle).
 *
 * Two numbers (H200): each element is read and written once in bf16 (4 bytes) and one sincosf
 * is taken per (row, j) for all heads: 7B q, 2048 rows x 28 heads x 128 -> 29 MB -> ~7 us at
 * 4.3 TB/s; 2048 x 64 sincosf are far below the SFU rate. Memory bound.
 * Variants:
 *   v1  (shipped, src/engine/cuda/rope.cuh) one thread per (row, j), looping over the heads
 *       (the angle computed once for all of them), accurate sincosf (angles reach thousands of
 *       radians at long positions). 2048 x 64 threads: 2 bytes per access, 64 consecutive per
 *       head. H200, 2026-12-02: 7B q 13.6 us (2.16 TB/s), 0.5B q (4096 x 14 x 64) 11.0 us; 4 calls
 *       per layer (q, k; forward and backward) make ~1.3 ms of a 7B step: not worth a v2 yet
 * Validation: positions random in [0, 32768), inv_freq as engine/rope.c computes it (theta 1e6,
 * Qwen2.5), random bf16 x (scale 2); double reference rotating by the same f32 angle
 * (f32(pos) * inv_freq[j], as the kernel forms it); compared as bf16 (tol 1e-2); the inverse
 * applied after the forward gives x back (tol 1e-2); a row stride wider than the heads (ld =
 * heads * head_dim + 64, as in a row of q, k and v together) leaves the columns past the heads
 * untouched, bit for bit.
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 -I src -I dev/cuda dev/cuda/rope.cu -o rope
 */
#include "common.h"
#include "engine/cuda/rope.cuh"

static void run_case(int64_t m, int heads, int head_dim, int64_t extra, bool check)
{
    const int half = head_dim / 2;
    const int64_t ld = (int64_t)heads * head_dim + extra;
    const size_t n = (size_t)(m * ld);
    auto x = rand_vec(n, 2, true);
    std::vector<float> inv((size_t)half);
    for (int j = 0; j < half; j++)
        inv[j] = 1.0f / powf(1e6f, (float)(2 * j) / (float)head_dim);
    std::vector<int32_t> pos((size_t)m);
    for (auto &p : pos)
        p = (int32_t)(urand() * 32768.0);
    std::vector<double> ref;
    if (check) {
        ref.assign(x.begin(), x.end());
        for (int64_t i = 0; i < m; i++)
            for (int j = 0; j < half; j++) {
                double ang = (double)((float)pos[i] * inv[j]), s = sin(ang), c = cos(ang);
                for (int h = 0; h < heads; h++) {
                    size_t o = (size_t)(i * ld + (int64_t)h * head_dim);
                    double a = x[o + j], b = x[o + j + half];
                    ref[o + j] = a * c - b * s;
                    ref[o + j + half] = b * c + a * s;
                }
            }
    }
    bf16 *dx = to_device<bf16>(x);
    float *dinv = to_device<float>(inv);
    int32_t *dpos;
    cudaCheck(cudaMalloc(&dpos, (size_t)m * 4));
    cudaCheck(cudaMemcpy(dpos, pos.data(), (size_t)m * 4, cudaMemcpyHostToDevice));
    char shp[64];
    snprintf(shp, sizeof shp, "m%lld_h%d_hd%d_ld%lld", (long long)m, heads, head_dim,
             (long long)ld);
    auto launch = [&](bool inverse) {
        rope_launch(dx, m, heads, head_dim, ld, dpos, dinv, inverse, 0);
        launchCheck("rope");
    };
    double err = 0;
    bool ok = true;
    if (check) {
        char what[96];
        launch(false);
        cudaCheck(cudaDeviceSynchronize());
        auto got = from_device(dx, n);
        snprintf(what, sizeof what, "v1 forward %s", shp);
        ok &= validate(what, got, ref, 1e-2, &err);
        size_t touched = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = (int64_t)heads * head_dim; c < ld; c++)
                touched += memcmp(&got[(size_t)(i * ld + c)], &x[(size_t)(i * ld + c)], 4) != 0;
        printf("  validate v1 columns past the heads %s: %zu changed %s\n", shp, touched,
               touched ? "FAIL" : "ok");
        if (touched) g_failures++, ok = false;
        launch(true);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<double> orig(x.begin(), x.end());
        snprintf(what, sizeof what, "v1 inverse(forward) = x %s", shp);
        ok &= validate(what, from_device(dx, n), orig, 1e-2, &err);
    }
    double us = time_us([&]() { launch(false); });
    result("rope", "v1", shp, us, "GB/s", (double)m * heads * head_dim * 4 / us / 1e3, err, ok);
    for (void *q : {(void *)dx, (void *)dinv, (void *)dpos})
        cudaCheck(cudaFree(q));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("rope");
    run_case(37, 3, 64, 0, true);      /* a small table */
    run_case(29, 4, 128, 64, true);    /* a row wider than the heads */
    run_case(4096, 14, 64, 0, false);  /* qwen2.5-0.5b q, batch 8 x 512 */
    run_case(4096, 2, 64, 0, false);   /* qwen2.5-0.5b k */
    run_case(2048, 28, 128, 0, false); /* qwen2.5-7b q, batch 4 x 512 */
    run_case(2048, 4, 128, 0, false);  /* qwen2.5-7b k */
    return g_failures ? 1 : 0;
}
