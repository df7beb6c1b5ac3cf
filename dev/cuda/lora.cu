/* lora.cu — segmented LoRA forward / backward over a fused multi-adapter batch, one launch for
 * all segments (per phase).
 *
 * Two numbers (H200), M rows, in = out = C, rank r: FLOPs ~ 2*M*r*C per product (fwd: 2
 * products, bwd: 4), tiny next to the frozen GEMM (2*M*C*C); bytes: X and Y/dY, dX once each in
 * bf16 (~2*M*C*2 per pass). So these kernels are memory bound: the floor is bytes / 4.3 TB/s
 * (3 x 2048 rows, C 4096: fwd ~34 MB -> ~8 us).
 * Variants (each run validates and times every one on the same inputs):
 *   v1  fwd fused U = X A^T then Y += s U B^T; bwd rows kernel (dU, dX) + reduction kernel
 *       (dA, dB) with one block per 64 columns over ALL of a segment's rows: 28 blocks for a
 *       896-wide module, 1.07 ms per call on 4096 rows (H200, 2026-12-01 profile) - too little
 *       parallelism (gone)
 *   v2  (lora_v2.cuh) the reduction split into row chunks (up to 16 of >= 256 rows) with f32
 *       partials summed in chunk order by a finish kernel. Its row kernels still walk all of K
 *       per 16-row block, 64 wide with two barriers per step: 0.43 ms per 7B q_proj backward,
 *       0.15 ms per forward (2026-12-01 profile) - latency bound
 *   v3  (lora_v3.cuh's down and up kernels; lora.cuh's grad and finish) down kernel with K split in slices across blocks
 *       (partials summed in slice order by the up kernel), 4 rows x 16 ranks per warp folded by a
 *       reduce-scatter butterfly; up kernel 32 rows x 256 columns per block; grad kernel 128
 *       columns x 16 ranks x a row chunk per block, 4 warps over the rows. Same determinism: no
 *       atomics, fixed summation orders. CUDA-core f32 FMAs: the down kernel's 64 sums a lane
 *       held 178 registers (one block per SM): 41 us for a 7B q_proj forward (~0.36 TB/s)
 *   v4  (promoted, src/engine/cuda/lora.cuh) down and up on tensor cores (mma m16n8k8 tf32):
 *       down 64 rows (4 warps x 16) x 16 ranks x one K slice, 16-byte X loads per lane; up
 *       32 x 256 with each warp on 16 rows x 64 columns, 16-byte read-modify-writes of Y / dX;
 *       grad and finish as v3
 *   v5  (promoted, src/engine/cuda/lora.cuh) v4's down and up; grad kernel 64 columns per block
 *       with the chunk's rows split over its 4 warps (4x the warps of v4's, dev/cuda/lora_v4.cuh,
 *       whose 4 warps each took 64 of 256 columns over all the chunk's rows), summed in warp order
 * Validation: 3 adapters with ranks 8 / 16 / 64, a segment without LoRA, against a CPU reference
 * in double (from the same bf16-rounded inputs); the same with LoRA dropout 0.1 / 0.5 on two
 * segments (the reference builds the mask from engine/dropout.h on the host); segments of several
 * reduction chunks and an in-width that is not a multiple of 4 (the scalar load paths); timings
 * with and without dropout (the mask hash is computed where X is loaded).
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/lora.cu -o lora
 */
#include <functional>

#include "common.h"
#include "engine/cuda/lora.cuh"
#include "lora_v2.cuh"
#include "lora_v3.cuh"
#include "lora_v4.cuh"

struct seg {
    int64_t b, e;
    int r;
    float s;
    float p; /* LoRA dropout */
};

/* The dropout factor of element (row, col) of segment sg's X, as the kernels apply it. */
static double drop_factor(const seg &sg, uint64_t mask_seed, int64_t row, int64_t k)
{
    if (sg.p == 0) return 1.0;
    return tdm_dropout_keep(mask_seed, tdm_dropout_threshold(sg.p), (uint64_t)(row - sg.b),
                            (uint64_t)k)
               ? tdm_dropout_scale(sg.p)
               : 0.0;
}

/* Fills a segment table entry (either version's struct: same field names) for segment i. */
template <typename D>
static void fill_seg(D &d, const seg &s, size_t i, float *a, float *b, float *ga, float *gb)
{
    memset(&d, 0, sizeof d);
    d.row_begin = s.b, d.row_end = s.e, d.a = a, d.b = b, d.da = ga, d.db = gb;
    d.scale = s.s, d.rank = s.r;
    d.drop = s.p > 0, d.keep_thr = tdm_dropout_threshold(s.p);
    d.keep_scale = tdm_dropout_scale(s.p), d.mask_seed = tdm_dropout_derive(12345, i);
}

static void run_case(const std::vector<seg> &segs, int64_t m, int64_t in, int64_t out, bool check)
{
    int64_t u_ld = 64;
    auto X = rand_vec((size_t)(m * in), 1, true), Y = rand_vec((size_t)(m * out), 1, true);
    auto DY = rand_vec((size_t)(m * out), 1, true), DX = rand_vec((size_t)(m * in), 1, true);
    std::vector<std::vector<float>> A, B;
    for (auto &s : segs) {
        A.push_back(rand_vec((size_t)(std::max(s.r, 1) * in), 0.1f, false));
        B.push_back(rand_vec((size_t)(out * std::max(s.r, 1)), 0.1f, false));
    }
    /* CPU reference in double: y after one fwd, dx / dA / dB after one bwd */
    std::vector<double> ry(Y.begin(), Y.end()), rdx(DX.begin(), DX.end());
    std::vector<std::vector<double>> rda, rdb;
    for (size_t i = 0; i < segs.size(); i++) {
        const seg &s = segs[i];
        int r = s.r;
        rda.emplace_back(A[i].size(), 0.0), rdb.emplace_back(B[i].size(), 0.0);
        if (!r || !check) continue;
        uint64_t seed = tdm_dropout_derive(12345, i);
        for (int64_t row = s.b; row < s.e; row++) {
            std::vector<double> uu(r, 0), duu(r, 0), xd(in);
            for (int64_t k = 0; k < in; k++)
                xd[k] = X[row * in + k] * drop_factor(s, seed, row, k);
            for (int c = 0; c < r; c++)
                for (int64_t k = 0; k < in; k++)
                    uu[c] += xd[k] * A[i][c * in + k];
            for (int64_t o = 0; o < out; o++) {
                double t = 0;
                for (int c = 0; c < r; c++)
                    t += uu[c] * B[i][o * r + c];
                ry[row * out + o] += s.s * t;
                for (int c = 0; c < r; c++) {
                    duu[c] += s.s * DY[row * out + o] * B[i][o * r + c];
                    rdb[i][o * r + c] += s.s * DY[row * out + o] * uu[c];
                }
            }
            for (int c = 0; c < r; c++)
                for (int64_t k = 0; k < in; k++) {
                    rda[i][c * in + k] += duu[c] * xd[k];
                    rdx[row * in + k] += duu[c] * A[i][c * in + k] * drop_factor(s, seed, row, k);
                }
        }
    }
    __nv_bfloat16 *x = to_device<__nv_bfloat16>(X), *y = to_device<__nv_bfloat16>(Y);
    __nv_bfloat16 *dy = to_device<__nv_bfloat16>(DY), *dx = to_device<__nv_bfloat16>(DX);
    float *u, *du;
    cudaCheck(cudaMalloc(&u, m * u_ld * 4));
    cudaCheck(cudaMalloc(&du, m * u_ld * 4));
    std::vector<float *> da, db, ab;
    for (size_t i = 0; i < segs.size(); i++) {
        ab.push_back(to_device<float>(A[i])), ab.push_back(to_device<float>(B[i]));
        float *ga, *gb;
        cudaCheck(cudaMalloc(&ga, A[i].size() * 4));
        cudaCheck(cudaMalloc(&gb, B[i].size() * 4));
        da.push_back(ga), db.push_back(gb);
    }
    auto reset = [&]() {
        cudaCheck(cudaMemcpy(y, std::vector<__nv_bfloat16>(Y.begin(), Y.end()).data(),
                             Y.size() * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dx, std::vector<__nv_bfloat16>(DX.begin(), DX.end()).data(),
                             DX.size() * 2, cudaMemcpyHostToDevice));
        poison(u, m * u_ld * 4), poison(du, m * u_ld * 4);
        for (size_t i = 0; i < segs.size(); i++) {
            cudaCheck(cudaMemset(da[i], 0, A[i].size() * 4));
            cudaCheck(cudaMemset(db[i], 0, B[i].size() * 4));
        }
    };

    /* v2 (baseline): rows kernels one block per 16 rows; reduction as in v3's grad layout */
    lora_v2::lora_params p2;
    memset(&p2, 0, sizeof p2);
    /* v3: down / up / grad layouts */
    lora_params p3;
    memset(&p3, 0, sizeof p3);
    for (size_t i = 0; i < segs.size(); i++) {
        if (!segs[i].r) continue;
        lora_v2::lora_seg_d &d2 = p2.seg[p2.n_segs++];
        fill_seg(d2, segs[i], i, ab[2 * i], ab[2 * i + 1], da[i], db[i]);
        d2.tile0 = p2.n_blocks;
        p2.n_blocks += (int)((segs[i].e - segs[i].b + V2_LORA_TM - 1) / V2_LORA_TM);
        fill_seg(p3.seg[p3.n_segs++], segs[i], i, ab[2 * i], ab[2 * i + 1], da[i], db[i]);
    }
    p2.x = x, p2.y = y, p2.dy = dy, p2.dx = dx, p2.u = u, p2.du = du;
    p2.u_ld = u_ld, p2.in = in, p2.out = out;
    lora_v2::lora_params r2 = p2;
    int64_t part2 = lora_v2::lora_plan_reduction(&r2);
    p3.x = x, p3.y = y, p3.dy = dy, p3.dx = dx, p3.u = u, p3.du = du;
    p3.m = m, p3.u_ld = u_ld, p3.in = in, p3.out = out;
    lora_params f_down = p3, f_up = p3, b_down = p3, b_up = p3, grad = p3;
    lora_v3::lora_plan_down(&f_down, false), lora_plan_up(&f_up, false);
    lora_v3::lora_plan_down(&b_down, true), lora_plan_up(&b_up, true);
    int64_t part3 = lora_v3::lora_plan_reduction(&grad);
    /* v4: the same parameters, its own down (64-row tiles) and grad (256 columns) layouts; the
     * partials' layout is the same */
    lora_params f_down4 = p3, b_down4 = p3, grad4 = p3, grad5 = p3;
    lora_plan_down(&f_down4, false), lora_plan_down(&b_down4, true);
    lora_v4::lora_plan_reduction(&grad4);
    /* v5: v4's down and up, its own grad layout (64 columns) */
    lora_plan_reduction(&grad5);
    int64_t slices = std::max(tdm_cuda_lora_k_slices(in), tdm_cuda_lora_k_slices(out));
    float *part, *ws;
    cudaCheck(cudaMalloc(&part, (size_t)std::max<int64_t>(1, std::max(part2, part3)) * 4));
    cudaCheck(cudaMalloc(&ws, (size_t)(slices * m * u_ld) * 4));
    r2.part = part;
    for (lora_params *q : {&f_down, &f_up, &b_down, &b_up, &grad, &f_down4, &b_down4, &grad4, &grad5})
        q->ws = ws, q->part = part;
    /* the v3 launches after a fwd copy their k_slices from the down layout (the up kernel sums
     * that many slices) */
    f_up.k_slice = f_down.k_slice, f_up.k_slices = f_down.k_slices;
    b_up.k_slice = b_down.k_slice, b_up.k_slices = b_down.k_slices;

    auto fwd2 = [&]() {
        lora_v2::lora_fwd_kernel<<<p2.n_blocks, V2_LORA_THREADS, V2_LORA_FWD_SMEM>>>(p2);
        launchCheck("v2 lora_fwd_kernel");
    };
    auto bwd2 = [&]() {
        lora_v2::lora_bwd_rows_kernel<<<p2.n_blocks, V2_LORA_THREADS, V2_LORA_BWD_ROWS_SMEM>>>(p2);
        lora_v2::lora_bwd_red_kernel<<<r2.n_blocks, V2_LORA_THREADS, V2_LORA_RED_SMEM>>>(r2);
        lora_v2::lora_red_finish_kernel<<<(unsigned)((r2.n_elems + 255) / 256), 256>>>(r2);
        launchCheck("v2 lora_bwd kernels");
    };
    auto fwd3 = [&]() {
        lora_v3::lora_down_kernel<false><<<f_down.n_blocks, V3_LORA_THREADS>>>(f_down);
        lora_v3::lora_up_kernel<false><<<f_up.n_blocks, V3_LORA_THREADS>>>(f_up);
        launchCheck("v3 lora fwd kernels");
    };
    auto bwd3 = [&]() {
        lora_v3::lora_down_kernel<true><<<b_down.n_blocks, V3_LORA_THREADS>>>(b_down);
        lora_v3::lora_up_kernel<true><<<b_up.n_blocks, V3_LORA_THREADS>>>(b_up);
        lora_v3::lora_grad_kernel<<<grad.n_blocks, V3_LORA_GRAD_THREADS>>>(grad);
        lora_red_finish_kernel<<<(unsigned)((grad.n_elems + 255) / 256), 256>>>(grad);
        launchCheck("v3 lora bwd kernels");
    };
    auto fwd4 = [&]() {
        lora_down_kernel<false><<<f_down4.n_blocks, LORA_DOWN_THREADS>>>(f_down4);
        lora_up_kernel<false><<<f_up.n_blocks, LORA_UP_THREADS>>>(f_up);
        launchCheck("v4 lora fwd kernels");
    };
    /* v4 and v5 share the down and up kernels; their grad kernels and layouts differ */
    auto grad_v4 = [&]() { lora_v4::lora_grad_kernel<<<grad4.n_blocks, V4_LORA_GRAD_THREADS>>>(grad4); };
    auto grad_v5 = [&]() { lora_grad_kernel<<<grad5.n_blocks, LORA_GRAD_THREADS>>>(grad5); };
    auto bwd_tc = [&](const std::function<void()> &grad, const lora_params &g, const char *what) {
        lora_down_kernel<true><<<b_down4.n_blocks, LORA_DOWN_THREADS>>>(b_down4);
        lora_up_kernel<true><<<b_up.n_blocks, LORA_UP_THREADS>>>(b_up);
        grad();
        lora_red_finish_kernel<<<(unsigned)((g.n_elems + 255) / 256), 256>>>(g);
        launchCheck(what);
    };
    auto bwd4 = [&]() { bwd_tc(grad_v4, grad4, "v4 lora bwd kernels"); };
    auto bwd5 = [&]() { bwd_tc(grad_v5, grad5, "v5 lora bwd kernels"); };

    char shp[96];
    bool any_drop = false;
    for (auto &s : segs)
        any_drop |= s.p > 0;
    snprintf(shp, sizeof shp, "%zusegs_M%lld_in%lld_out%lld%s", segs.size(), (long long)m,
             (long long)in, (long long)out, any_drop ? "_dropout" : "");
    double fbytes = 2.0 * m * in + 4.0 * m * out, bbytes = 2.0 * (2.0 * m * out + 3.0 * m * in);
    struct variant {
        const char *name;
        std::function<void()> fwd, bwd;
    } variants[] = {{"v2", fwd2, bwd2}, {"v3", fwd3, bwd3}, {"v4", fwd4, bwd4}, {"v5", fwd4, bwd5}};
    for (auto &v : variants) {
        reset();
        v.fwd();
        v.bwd();
        cudaCheck(cudaDeviceSynchronize());
        double err = 0;
        bool ok = true;
        if (check) {
            char what[64];
            snprintf(what, sizeof what, "%s fwd y", v.name);
            ok &= validate(what, from_device(y, (size_t)(m * out)), ry, 1e-2, &err);
            snprintf(what, sizeof what, "%s bwd dx", v.name);
            ok &= validate(what, from_device(dx, (size_t)(m * in)), rdx, 1e-2, &err);
            for (size_t i = 0; i < segs.size(); i++) {
                if (!segs[i].r) continue;
                snprintf(what, sizeof what, "%s bwd dA (segment %zu)", v.name, i);
                ok &= validate(what, from_device(da[i], A[i].size()), rda[i], 1e-2, &err);
                snprintf(what, sizeof what, "%s bwd dB (segment %zu)", v.name, i);
                ok &= validate(what, from_device(db[i], B[i].size()), rdb[i], 1e-2, &err);
            }
        }
        double us = time_us(v.fwd);
        result("lora_fwd", v.name, shp, us, "GB/s", fbytes / us / 1e3, err, ok);
        us = time_us(v.bwd);
        result("lora_bwd", v.name, shp, us, "GB/s", bbytes / us / 1e3, err, ok);
    }
    /* v3's and v4's kernels one at a time (re-runs accumulate into Y / dX / dA / dB, harmless
     * for timing): where the time goes */
    double t_fd = time_us([&]() { lora_v3::lora_down_kernel<false><<<f_down.n_blocks, V3_LORA_THREADS>>>(f_down); });
    double t_fu = time_us([&]() { lora_v3::lora_up_kernel<false><<<f_up.n_blocks, V3_LORA_THREADS>>>(f_up); });
    double t_bd = time_us([&]() { lora_v3::lora_down_kernel<true><<<b_down.n_blocks, V3_LORA_THREADS>>>(b_down); });
    double t_bu = time_us([&]() { lora_v3::lora_up_kernel<true><<<b_up.n_blocks, V3_LORA_THREADS>>>(b_up); });
    double t_g = time_us([&]() { lora_v3::lora_grad_kernel<<<grad.n_blocks, V3_LORA_GRAD_THREADS>>>(grad); });
    double t_f = time_us([&]() {
        lora_red_finish_kernel<<<(unsigned)((grad.n_elems + 255) / 256), 256>>>(grad);
    });
    printf("  v3 parts %s: fwd down %.1f us (%d blocks, %d K slices), up %.1f us (%d blocks); "
           "bwd down %.1f us (%d blocks, %d K slices), up %.1f us (%d blocks), grad %.1f us (%d "
           "blocks), finish %.1f us\n",
           shp, t_fd, f_down.n_blocks, f_down.k_slices, t_fu, f_up.n_blocks, t_bd,
           b_down.n_blocks, b_down.k_slices, t_bu, b_up.n_blocks, t_g, grad.n_blocks, t_f);
    t_fd = time_us([&]() { lora_down_kernel<false><<<f_down4.n_blocks, LORA_DOWN_THREADS>>>(f_down4); });
    t_fu = time_us([&]() { lora_up_kernel<false><<<f_up.n_blocks, LORA_UP_THREADS>>>(f_up); });
    t_bd = time_us([&]() { lora_down_kernel<true><<<b_down4.n_blocks, LORA_DOWN_THREADS>>>(b_down4); });
    t_bu = time_us([&]() { lora_up_kernel<true><<<b_up.n_blocks, LORA_UP_THREADS>>>(b_up); });
    t_g = time_us(grad_v4);
    double t_g5 = time_us(grad_v5);
    printf("  v4 parts %s: fwd down %.1f us (%d blocks), up %.1f us; bwd down %.1f us (%d "
           "blocks), up %.1f us, grad %.1f us (%d blocks); v5 grad %.1f us (%d blocks)\n",
           shp, t_fd, f_down4.n_blocks, t_fu, t_bd, b_down4.n_blocks, t_bu, t_g, grad4.n_blocks,
           t_g5, grad5.n_blocks);
    for (auto q : da)
        cudaCheck(cudaFree(q));
    for (auto q : db)
        cudaCheck(cudaFree(q));
    for (auto q : ab)
        cudaCheck(cudaFree(q));
    for (void *q : {(void *)x, (void *)y, (void *)dy, (void *)dx, (void *)u, (void *)du,
                    (void *)part, (void *)ws})
        cudaCheck(cudaFree(q));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("lora");
    run_case({{0, 100, 8, 2.0f, 0},
              {100, 130, 0, 0, 0},
              {130, 300, 16, 0.5f, 0},
              {310, 400, 64, 1.0f, 0}},
             400, 320, 200, true);
    run_case({{0, 100, 8, 2.0f, 0.1f},
              {100, 130, 0, 0, 0},
              {130, 300, 16, 0.5f, 0},
              {310, 400, 64, 1.0f, 0.5f}},
             400, 320, 200, true);
    /* segments of several reduction chunks (700 rows: 3 of 256; 5000 rows: 16 of 320) */
    run_case({{0, 700, 16, 2.0f, 0}, {700, 5700, 8, 0.5f, 0.1f}}, 5700, 96, 160, true);
    /* in 1030 (not a multiple of 4: scalar loads; 3 K slices of 512) and out 1300, rank 24 */
    run_case({{0, 37, 24, 1.5f, 0.2f}, {37, 300, 24, 0.7f, 0}}, 300, 1030, 1300, true);
    /* 7B q_proj (3584 -> 3584) and v_proj (3584 -> 512) at batch 4 x 512; 0.5B at batch 8 x 512
     * (896 -> 896, 896 -> 128); 3 adapters x batch 4 x 512 (4096 -> 4096) */
    for (float p : {0.0f, 0.1f}) {
        run_case({{0, 2048, 16, 2.0f, p}}, 2048, 3584, 3584, false);
        run_case({{0, 2048, 16, 2.0f, p}}, 2048, 3584, 512, false);
        run_case({{0, 4096, 16, 2.0f, p}}, 4096, 896, 896, false);
        run_case({{0, 4096, 16, 2.0f, p}}, 4096, 896, 128, false);
        run_case({{0, 2048, 16, 2.0f, p}, {2048, 4096, 16, 2.0f, p}, {4096, 6144, 16, 2.0f, p}},
                 6144, 4096, 4096, false);
        /* 1.5B q and v (1536 -> 1536, 1536 -> 256), three co-trained adapters of batch 8 x ~288
         * variable-length tokens (scripts/device/cotrain-gpu.sh) */
        run_case({{0, 2304, 16, 2.0f, p}, {2304, 4608, 16, 2.0f, p}, {4608, 6912, 16, 2.0f, p}},
                 6912, 1536, 1536, false);
        run_case({{0, 2304, 16, 2.0f, p}, {2304, 4608, 16, 2.0f, p}, {4608, 6912, 16, 2.0f, p}},
                 6912, 1536, 256, false);
    }
    return g_failures ? 1 : 0;
}
