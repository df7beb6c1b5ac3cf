/* lora.cu — segmented LoRA forward / backward over a fused multi-adapter batch, one launch for
 * all segments (per phase).
 *
 * Two numbers (H200), M rows, in = out = C, rank r: FLOPs ~ 2*M*r*C per product (fwd: 2
 * products, bwd: 4), tiny next to the frozen GEMM (2*M*C*C); bytes: X and Y/dY, dX once each in
 * bf16 (~2*M*C*2 per pass). So these kernels are memory bound: the floor is bytes / 4.3 TB/s
 * (3 x 2048 rows, C 4096: fwd ~34 MB -> ~8 us).
 * Variants:
 *   v1  fwd fused U = X A^T then Y += s U B^T; bwd rows kernel (dU, dX) + reduction kernel
 *       (dA, dB) with one block per 64 columns over ALL of a segment's rows: 28 blocks for a
 *       896-wide module, 1.07 ms per call on 4096 rows (H200, 2026-12-01 profile) - too little
 *       parallelism
 *   v2  (promoted, src/engine/cuda/lora.cuh) the reduction also split into row chunks (up to
 *       16 of >= 256 rows) with f32 partials summed in chunk order by a finish kernel: no
 *       atomics, the same bits every run
 * Validation: 3 adapters with ranks 8 / 16 / 64, a segment without LoRA, against a CPU reference
 * in double (from the same bf16-rounded inputs); the same with LoRA dropout 0.1 / 0.5 on two
 * segments (the reference builds the mask from engine/dropout.h on the host), and timings with
 * and without dropout (the mask hash is computed where X is loaded).
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/lora.cu -o lora
 */
#include "common.h"
#include "engine/cuda/lora.cuh"

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
    lora_params p;
    memset(&p, 0, sizeof p);
    __nv_bfloat16 *x = to_device<__nv_bfloat16>(X), *y = to_device<__nv_bfloat16>(Y);
    __nv_bfloat16 *dy = to_device<__nv_bfloat16>(DY), *dx = to_device<__nv_bfloat16>(DX);
    float *u, *du;
    cudaCheck(cudaMalloc(&u, m * u_ld * 4));
    cudaCheck(cudaMalloc(&du, m * u_ld * 4));
    cudaCheck(cudaMemset(u, 0, m * u_ld * 4));
    std::vector<float *> da, db, ab;
    int blocks_f = 0, nsg = 0;
    lora_params pr;
    for (size_t i = 0; i < segs.size(); i++) {
        float *a = to_device<float>(A[i]), *b = to_device<float>(B[i]);
        ab.push_back(a), ab.push_back(b);
        float *ga, *gb;
        cudaCheck(cudaMalloc(&ga, A[i].size() * 4));
        cudaCheck(cudaMalloc(&gb, B[i].size() * 4));
        cudaCheck(cudaMemset(ga, 0, A[i].size() * 4));
        cudaCheck(cudaMemset(gb, 0, B[i].size() * 4));
        da.push_back(ga), db.push_back(gb);
        if (!segs[i].r) continue;
        uint64_t seed = tdm_dropout_derive(12345, i);
        lora_seg_d d;
        memset(&d, 0, sizeof d);
        d.row_begin = segs[i].b, d.row_end = segs[i].e, d.a = a, d.b = b, d.da = ga, d.db = gb;
        d.scale = segs[i].s, d.rank = segs[i].r, d.tile0 = blocks_f;
        d.drop = segs[i].p > 0, d.keep_thr = tdm_dropout_threshold(segs[i].p);
        d.keep_scale = tdm_dropout_scale(segs[i].p), d.mask_seed = seed;
        p.seg[nsg++] = d;
        blocks_f += (int)((segs[i].e - segs[i].b + LORA_TM - 1) / LORA_TM);
    }
    p.n_segs = nsg;
    p.n_blocks = blocks_f;
    p.x = x, p.y = y, p.dy = dy, p.dx = dx, p.u = u, p.du = du;
    p.u_ld = u_ld, p.in = in, p.out = out;
    pr = p;
    float *part;
    int64_t part_n = lora_plan_reduction(&pr);
    cudaCheck(cudaMalloc(&part, (size_t)(part_n > 0 ? part_n : 1) * 4));
    pr.part = part;
    auto fwd = [&]() {
        lora_fwd_kernel<<<p.n_blocks, LORA_THREADS, LORA_FWD_SMEM>>>(p);
        launchCheck("lora_fwd_kernel");
    };
    auto bwd = [&]() {
        lora_bwd_rows_kernel<<<p.n_blocks, LORA_THREADS, LORA_BWD_ROWS_SMEM>>>(p);
        lora_bwd_red_kernel<<<pr.n_blocks, LORA_THREADS, LORA_RED_SMEM>>>(pr);
        lora_red_finish_kernel<<<(unsigned)((pr.n_elems + 255) / 256), 256>>>(pr);
        launchCheck("lora_bwd kernels");
    };
    fwd();
    bwd();
    cudaCheck(cudaDeviceSynchronize());
    double err = 0;
    bool ok = true;
    if (check) {
        std::vector<double> ry(Y.begin(), Y.end()), rdx(DX.begin(), DX.end());
        std::vector<std::vector<double>> rda, rdb;
        for (size_t i = 0; i < segs.size(); i++) {
            const seg &s = segs[i];
            int r = s.r;
            rda.emplace_back(A[i].size(), 0.0), rdb.emplace_back(B[i].size(), 0.0);
            if (!r) continue;
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
                        rdx[row * in + k] +=
                            duu[c] * A[i][c * in + k] * drop_factor(s, seed, row, k);
                    }
            }
        }
        /* y after one fwd, dx after one bwd: compare before timing runs accumulate further */
        ok &= validate("fwd y", from_device(y, (size_t)(m * out)), ry, 1e-2, &err);
        ok &= validate("bwd dx", from_device(dx, (size_t)(m * in)), rdx, 1e-2, &err);
        for (size_t i = 0; i < segs.size(); i++) {
            if (!segs[i].r) continue;
            ok &= validate("bwd dA", from_device(da[i], A[i].size()), rda[i], 1e-2, &err);
            ok &= validate("bwd dB", from_device(db[i], B[i].size()), rdb[i], 1e-2, &err);
        }
    }
    char shp[96];
    bool any_drop = false;
    for (auto &s : segs)
        any_drop |= s.p > 0;
    snprintf(shp, sizeof shp, "%zusegs_M%lld_in%lld_out%lld%s", segs.size(), (long long)m,
             (long long)in, (long long)out, any_drop ? "_dropout" : "");
    double fbytes = 2.0 * m * in + 4.0 * m * out, bbytes = 2.0 * (2.0 * m * out + 3.0 * m * in);
    double us = time_us(fwd);
    result("lora_fwd", "v1", shp, us, "GB/s", fbytes / us / 1e3, err, ok);
    us = time_us(bwd);
    result("lora_bwd", "v2", shp, us, "GB/s", bbytes / us / 1e3, err, ok);
    /* the backward's three kernels one at a time (each re-run on the same inputs accumulates
     * into dX / dA / dB, harmless for timing): which one the time goes to */
    double us_rows = time_us(
        [&]() { lora_bwd_rows_kernel<<<p.n_blocks, LORA_THREADS, LORA_BWD_ROWS_SMEM>>>(p); });
    double us_red =
        time_us([&]() { lora_bwd_red_kernel<<<pr.n_blocks, LORA_THREADS, LORA_RED_SMEM>>>(pr); });
    double us_fin = time_us(
        [&]() { lora_red_finish_kernel<<<(unsigned)((pr.n_elems + 255) / 256), 256>>>(pr); });
    printf("  lora_bwd parts %s: rows kernel %.1f us (%d blocks), reduction %.1f us (%d blocks), "
           "finish %.1f us\n",
           shp, us_rows, p.n_blocks, us_red, pr.n_blocks, us_fin);
    for (auto q : da)
        cudaCheck(cudaFree(q));
    for (auto q : db)
        cudaCheck(cudaFree(q));
    for (auto q : ab)
        cudaCheck(cudaFree(q));
    for (void *q :
         {(void *)x, (void *)y, (void *)dy, (void *)dx, (void *)u, (void *)du, (void *)part})
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
    /* 3 adapters x batch 4 x 512 tokens, 7B-like q_proj (4096 -> 4096) and 0.5B (896 -> 896) */
    for (float p : {0.0f, 0.1f}) {
        run_case({{0, 2048, 16, 2.0f, p}, {2048, 4096, 16, 2.0f, p}, {4096, 6144, 16, 2.0f, p}},
                 6144, 4096, 4096, false);
        run_case({{0, 2048, 16, 2.0f, p}, {2048, 4096, 16, 2.0f, p}, {4096, 6144, 16, 2.0f, p}},
                 6144, 896, 896, false);
    }
    return g_failures ? 1 : 0;
}
