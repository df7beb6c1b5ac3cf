/* adamw.cu — one fused multi-tensor AdamW launch over all LoRA parameters (f32 master weights and
 * moments), plus the per-adapter gradient sums of squares.
 *
 * Two numbers (H200): AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter; 40 M
 * parameters (7B, all 7 targets, r 16) -> 1.1 GB -> ~260 us at 4.3 TB/s. Sum of squares: 4 bytes
 * per element.
 * Variants:
 *   v1  the promoted kernels (src/engine/cuda/multi_tensor.cuh): chunk table, one block per
 *       chunk (grid-stride)
 * Validation: bit-level agreement is not expected with a CPU torch reference, so against a CPU
 * implementation of the same f32 formula (max relative error ~1e-6).
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/adamw.cu -o adamw
 */
#include "common.h"
#include "engine/cuda/multi_tensor.cuh"

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("adamw");
    for (int big = 0; big < 2; big++) {
        /* many tensors of LoRA shapes: A (16, C), B (C', 16) */
        std::vector<int64_t> sizes;
        int layers = big ? 28 * 7 : 24 * 2;
        for (int l = 0; l < layers; l++) sizes.push_back(16 * (big ? 3584 : 896)), sizes.push_back((big ? 3584 : 896) * 16);
        if (big) for (auto &s : sizes) s *= 3; /* 3 adapters' worth */
        int64_t total = 0;
        for (auto s : sizes) total += s;
        auto P = rand_vec((size_t)total, 1, false), G = rand_vec((size_t)total, 0.01f, false);
        float *p = to_device<float>(P), *g = to_device<float>(G), *mm, *vv;
        cudaCheck(cudaMalloc(&mm, total * 4));
        cudaCheck(cudaMalloc(&vv, total * 4));
        cudaCheck(cudaMemset(mm, 0, total * 4));
        cudaCheck(cudaMemset(vv, 0, total * 4));
        std::vector<adamw_desc> descs;
        std::vector<mt_chunk> chunks, schunks;
        int64_t off = 0;
        for (size_t t = 0; t < sizes.size(); t++) {
            adamw_desc d;
            adamw_desc_fill(&d, p + off, g + off, mm + off, vv + off, NULL, 2e-4, 0.9, 0.999,
                            1e-8, t % 2 ? 0.01 : 0.0, 1);
            descs.push_back(d);
            for (int64_t o = 0; o < sizes[t]; o += MT_ADAMW_CHUNK)
                chunks.push_back({NULL, o, std::min<int64_t>(MT_ADAMW_CHUNK, sizes[t] - o), (int)t, 0});
            for (int64_t o = 0; o < sizes[t]; o += MT_SUMSQ_CHUNK)
                schunks.push_back({g + off, o, std::min<int64_t>(MT_SUMSQ_CHUNK, sizes[t] - o), (int)(t % 3), 0});
            off += sizes[t];
        }
        adamw_desc *dd;
        mt_chunk *dc, *ds;
        float *partial, *out;
        cudaCheck(cudaMalloc(&dd, descs.size() * sizeof(adamw_desc)));
        cudaCheck(cudaMalloc(&dc, chunks.size() * sizeof(mt_chunk)));
        cudaCheck(cudaMalloc(&ds, schunks.size() * sizeof(mt_chunk)));
        cudaCheck(cudaMalloc(&partial, schunks.size() * 4));
        cudaCheck(cudaMalloc(&out, 3 * 4));
        cudaCheck(cudaMemcpy(dd, descs.data(), descs.size() * sizeof(adamw_desc), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dc, chunks.data(), chunks.size() * sizeof(mt_chunk), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(ds, schunks.data(), schunks.size() * sizeof(mt_chunk), cudaMemcpyHostToDevice));
        int64_t nc = (int64_t)chunks.size(), ns = (int64_t)schunks.size();
        auto step = [&]() {
            adamw_kernel<<<cuda_grid(nc, 1), MT_THREADS>>>(dd, dc, nc);
            launchCheck("adamw_kernel");
        };
        auto norms = [&]() {
            sumsq_chunks_kernel<<<cuda_grid(ns, 1), MT_THREADS>>>(ds, ns, partial);
            sumsq_groups_kernel<<<1, 64>>>(ds, partial, ns, 3, out);
            launchCheck("sumsq kernels");
        };
        step();
        norms();
        cudaCheck(cudaDeviceSynchronize());
        /* reference: one step from m = v = 0 */
        std::vector<double> rp((size_t)total), rs(3, 0.0);
        off = 0;
        for (size_t t = 0; t < sizes.size(); t++) {
            const adamw_desc &d = descs[t];
            for (int64_t i = off; i < off + sizes[t]; i++) {
                float gi = G[i], pi = P[i];
                if (d.wd) pi *= d.decay;
                float mi = 0.0f + d.w1 * (gi - 0.0f);
                float vi = 0.0f * d.b2 + d.w2 * gi * gi;
                rp[i] = pi + d.neg_step * mi / (sqrtf(vi) / d.bc2_sqrt + d.eps);
                rs[t % 3] += (double)gi * gi;
            }
            off += sizes[t];
        }
        double err = 0;
        bool ok = validate("adamw p after 1 step", from_device(p, (size_t)total), rp, 1e-5, &err);
        ok &= validate("sumsq per group", from_device(out, 3), rs, 1e-5, &err);
        char shp[64];
        snprintf(shp, sizeof shp, "%zutensors_%lldparams", sizes.size(), (long long)total);
        double us = time_us(step);
        result("adamw", "v1", shp, us, "GB/s", 28.0 * total / us / 1e3, err, ok);
        us = time_us(norms);
        result("sumsq", "v1", shp, us, "GB/s", 4.0 * total / us / 1e3, err, ok);
        for (void *q : {(void *)p, (void *)g, (void *)mm, (void *)vv, (void *)dd, (void *)dc,
                        (void *)ds, (void *)partial, (void *)out})
            cudaCheck(cudaFree(q));
    }
    return g_failures ? 1 : 0;
}
