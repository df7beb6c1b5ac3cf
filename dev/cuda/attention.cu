/* attention.cu — causal GQA attention over packed sequences, forward and backward.
 *
 * Two numbers (H200): forward FLOPs = sum over sequences of 2 * 2 * (L^2 / 2) * D * H (QK^T and
 * PV, causal half); backward ~2.5x that. v1/v2 run on CUDA cores in f32 (~60 TFLOP/s peak, 5-6
 * fwd / 3.5 bwd measured); v3 runs on bf16 tensor cores through mma.sync (dense bf16 peak ~990
 * TFLOP/s, a few hundred reachable with mma.sync on Hopper).
 * Variants:
 *   v1  one thread per (query, head): two passes over the keys (max, then exp-sum and PV),
 *       straight from global memory (simple reference kernel, dev only)
 *   v2  flash-style tiles: 32 queries x 32 keys in shared memory, online softmax, a warp per
 *       4 queries; backward as separate deterministic dq and dk/dv kernels [src, used for head
 *       dims other than 64 and 128]
 *   v3  bf16 tensor cores (mma.sync m16n8k16 + ldmatrix + cp.async), FlashAttention-2 split:
 *       a warp per 16 queries (fwd, dq) or 16 keys (dk/dv), 64-key / 64- or 32-query tiles,
 *       P and dS kept in registers; dk/dv over chunks of the GQA group with a fixed-order
 *       reduction when the grid is small; deterministic [src, used for head_dim 64 and 128]
 * Before anything else a one-warp self-check multiplies 16x16x16 through the v3 fragment
 * helpers (ldmatrix A, ldmatrix B from [n][k] and .trans from [k][n], accumulator -> A repack)
 * against the CPU, so a fragment-layout bug shows up as "selfcheck ... FAIL" at the top.
 * Validation against a CPU reference in double: out, lse, dq, dk, dv on random q, k, v, dout
 * with several sequences of different lengths.
 * Build: nvcc -O3 -arch=sm_90 -std=c++17 -I src -I dev/cuda dev/cuda/attention.cu -o attention
 * (or cmake --build build --target dev_attention -> build/dev/cuda/attention)
 */
#include "common.h"
#include "engine/cuda/attention.cuh"

__global__ void att_fwd_v1(att_args a, int n_seqs)
{
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= a.m * a.H) return;
    int64_t row = t / a.H;
    int h = (int)(t % a.H), kvh = h / (a.H / a.KVH), D = a.D;
    int s = 0;
    while (s + 1 < n_seqs && a.cu[s + 1] <= row) s++;
    int64_t base = a.cu[s];
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    const __nv_bfloat16 *q = a.q + row * qld + h * D;
    float mx = -INFINITY;
    for (int64_t j = base; j <= row; j++) {
        float sc = 0;
        for (int d = 0; d < D; d++)
            sc += __bfloat162float(q[d]) * __bfloat162float(a.k[j * kld + kvh * D + d]);
        mx = fmaxf(mx, sc * a.scale);
    }
    float sum = 0, acc[256];
    for (int d = 0; d < D; d++) acc[d] = 0;
    for (int64_t j = base; j <= row; j++) {
        float sc = 0;
        for (int d = 0; d < D; d++)
            sc += __bfloat162float(q[d]) * __bfloat162float(a.k[j * kld + kvh * D + d]);
        float p = expf(sc * a.scale - mx);
        sum += p;
        for (int d = 0; d < D; d++) acc[d] += p * __bfloat162float(a.v[j * kld + kvh * D + d]);
    }
    for (int d = 0; d < D; d++) a.o[row * qld + h * D + d] = __float2bfloat16_rn(acc[d] / sum);
    a.lse[(int64_t)h * a.m + row] = mx + logf(sum);
}

/* One warp: C1 = A B1^T with B1 stored [n][k] (ldmatrix), C2 = A B2 with B2 stored [k][n]
 * (ldmatrix.trans), E = bf16(C1) B2 with C1's accumulators repacked as the A operand (the P V
 * path). All 16x16; out = C1, C2, E (3 x 256 f32, row-major). */
__global__ void att3_selfcheck_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B1,
                                      const __nv_bfloat16 *B2, float *out)
{
    constexpr int SD = 24;
    __shared__ __align__(16) __nv_bfloat16 sa[16 * SD], sb1[16 * SD], sb2[16 * SD];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 256; i += 32) {
        sa[(i / 16) * SD + i % 16] = A[i];
        sb1[(i / 16) * SD + i % 16] = B1[i];
        sb2[(i / 16) * SD + i % 16] = B2[i];
    }
    __syncwarp();
    uint32_t a[4], b[4], c[4];
    att3_ldA<SD>(a, sa, 0, 0, lane);
    float c1[2][4] = {}, c2[2][4] = {}, e[2][4] = {};
    att3_ldB_nk<SD>(b, sb1, 0, 0, lane);
    att3_mma(c1[0], a, b[0], b[1]);
    att3_mma(c1[1], a, b[2], b[3]);
    att3_ldB_kn<SD>(b, sb2, 0, 0, lane);
    att3_mma(c2[0], a, b[0], b[1]);
    att3_mma(c2[1], a, b[2], b[3]);
    c[0] = att3_pack(c1[0][0], c1[0][1]);
    c[1] = att3_pack(c1[0][2], c1[0][3]);
    c[2] = att3_pack(c1[1][0], c1[1][1]);
    c[3] = att3_pack(c1[1][2], c1[1][3]);
    att3_mma(e[0], c, b[0], b[1]);
    att3_mma(e[1], c, b[2], b[3]);
    for (int n = 0; n < 2; n++)
        for (int q = 0; q < 4; q++) {
            int row = g + 8 * (q >> 1), col = n * 8 + 2 * t + (q & 1);
            out[row * 16 + col] = c1[n][q];
            out[256 + row * 16 + col] = c2[n][q];
            out[512 + row * 16 + col] = e[n][q];
        }
}

static void att3_selfcheck(void)
{
    auto A = rand_vec(256, 1, true), B1 = rand_vec(256, 1, true), B2 = rand_vec(256, 1, true);
    std::vector<double> want(768, 0);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            for (int k = 0; k < 16; k++) {
                want[i * 16 + j] += (double)A[i * 16 + k] * B1[j * 16 + k];
                want[256 + i * 16 + j] += (double)A[i * 16 + k] * B2[k * 16 + j];
            }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            for (int k = 0; k < 16; k++)
                want[512 + i * 16 + j] += (double)bf16r((float)want[i * 16 + k]) * B2[k * 16 + j];
    __nv_bfloat16 *dA = to_device<__nv_bfloat16>(A), *dB1 = to_device<__nv_bfloat16>(B1),
                  *dB2 = to_device<__nv_bfloat16>(B2);
    float *dout;
    cudaCheck(cudaMalloc(&dout, 768 * sizeof(float)));
    poison(dout, 768 * sizeof(float));
    att3_selfcheck_kernel<<<1, 32>>>(dA, dB1, dB2, dout);
    launchCheck("att3_selfcheck_kernel");
    auto got = from_device(dout, 768);
    const char *names[3] = {"selfcheck mma A*B^T (ldmatrix [n][k])", "selfcheck mma A*B (ldmatrix.trans [k][n])",
                            "selfcheck mma C->A repack"};
    for (int p = 0; p < 3; p++)
        validate(names[p], std::vector<float>(got.begin() + 256 * p, got.begin() + 256 * (p + 1)),
                 std::vector<double>(want.begin() + 256 * p, want.begin() + 256 * (p + 1)),
                 p < 2 ? 1e-5 : 1e-2, nullptr);
    for (void *q : {(void *)dA, (void *)dB1, (void *)dB2, (void *)dout}) cudaCheck(cudaFree(q));
}

struct ref_out {
    std::vector<double> o, lse, dq, dk, dv;
};

static ref_out cpu_ref(const std::vector<int> &cu, const std::vector<float> &q,
                       const std::vector<float> &k, const std::vector<float> &v,
                       const std::vector<float> &dout, int H, int KVH, int D, float scale,
                       bool bwd)
{
    int64_t m = cu.back(), qld = (int64_t)H * D, kld = (int64_t)KVH * D;
    ref_out r;
    r.o.assign((size_t)(m * qld), 0);
    r.lse.assign((size_t)(m * H), 0);
    r.dq.assign((size_t)(m * qld), 0);
    r.dk.assign((size_t)(m * kld), 0);
    r.dv.assign((size_t)(m * kld), 0);
    std::vector<double> p;
    for (size_t s = 0; s + 1 < cu.size(); s++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / KVH);
            for (int64_t i = cu[s]; i < cu[s + 1]; i++) {
                p.assign((size_t)(i - cu[s] + 1), 0);
                double mx = -INFINITY;
                for (int64_t j = cu[s]; j <= i; j++) {
                    double sc = 0;
                    for (int d = 0; d < D; d++)
                        sc += (double)q[(size_t)(i * qld + h * D + d)] * k[(size_t)(j * kld + g * D + d)];
                    p[(size_t)(j - cu[s])] = sc * scale;
                    mx = std::max(mx, sc * scale);
                }
                double sum = 0;
                for (auto &x : p) sum += (x = exp(x - mx));
                r.lse[(size_t)(h * m + i)] = mx + log(sum);
                double di = 0;
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int64_t j = cu[s]; j <= i; j++)
                        o += p[(size_t)(j - cu[s])] / sum * v[(size_t)(j * kld + g * D + d)];
                    r.o[(size_t)(i * qld + h * D + d)] = o;
                    di += o * dout[(size_t)(i * qld + h * D + d)];
                }
                if (!bwd) continue;
                for (int64_t j = cu[s]; j <= i; j++) {
                    double pij = p[(size_t)(j - cu[s])] / sum, dp = 0;
                    for (int d = 0; d < D; d++)
                        dp += (double)dout[(size_t)(i * qld + h * D + d)] * v[(size_t)(j * kld + g * D + d)];
                    double ds = pij * (dp - di);
                    for (int d = 0; d < D; d++) {
                        r.dq[(size_t)(i * qld + h * D + d)] += scale * ds * k[(size_t)(j * kld + g * D + d)];
                        r.dk[(size_t)(j * kld + g * D + d)] += scale * ds * q[(size_t)(i * qld + h * D + d)];
                        r.dv[(size_t)(j * kld + g * D + d)] += pij * dout[(size_t)(i * qld + h * D + d)];
                    }
                }
            }
        }
    return r;
}

template <int NT> static void launch_v2(att_args a, int n_seqs, int maxlen, bool bwd, float *Di)
{
    dim3 grid((maxlen + ATT_ROWS - 1) / ATT_ROWS, n_seqs, bwd ? 1 : a.H);
    size_t sf = att_fwd_smem(a.D), sq = att_dq_smem(a.D), skv = att_dkv_smem(a.D);
    cudaCheck(cudaFuncSetAttribute(att_fwd_v2<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sf));
    cudaCheck(cudaFuncSetAttribute(att_bwd_dq_v2<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq));
    cudaCheck(cudaFuncSetAttribute(att_bwd_dkv_v2<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv));
    if (!bwd) {
        att_fwd_v2<NT><<<grid, ATT_WARPS * 32, sf>>>(a);
    } else {
        att_bwd_di<<<cuda_grid(a.m * a.H * 32, 256), 256>>>(a, Di);
        dim3 gq(grid.x, n_seqs, a.H), gkv(grid.x, n_seqs, a.KVH);
        att_bwd_dq_v2<NT><<<gq, ATT_WARPS * 32, sq>>>(a);
        att_bwd_dkv_v2<NT><<<gkv, ATT_WARPS * 32, skv>>>(a);
    }
    launchCheck("attention v2");
}

static int g_sms = 0;

/* v3 through the shipped launchers: bwd = att_bwd_di, then att3_bwd (dq, dk/dv split over the
 * group when the grid is small, as the backend does). ws: att3_ws_bytes(split, ...) bytes. */
static void launch_v3(att_args a, int n_seqs, int maxlen, bool bwd, float *Di, int split, float *ws)
{
    if (!bwd) {
        cudaCheck(a.D == 64 ? att3_fwd<64>(a, n_seqs, maxlen, 0) : att3_fwd<128>(a, n_seqs, maxlen, 0));
        return;
    }
    att_bwd_di<<<cuda_grid(a.m * a.H * 32, 256), 256>>>(a, Di);
    launchCheck("att_bwd_di");
    cudaCheck(a.D == 64 ? att3_bwd<64>(a, n_seqs, maxlen, split, ws, 0)
                        : att3_bwd<128>(a, n_seqs, maxlen, split, ws, 0));
}

/* force_split > 0 overrides the dk/dv split (1 = the direct bf16 path, no workspace) */
static void run_case(const std::vector<int> &lens, int H, int KVH, int D, bool check,
                     int force_split = 0)
{
    std::vector<int> cu(1, 0);
    int maxlen = 0;
    for (int l : lens) cu.push_back(cu.back() + l), maxlen = std::max(maxlen, l);
    int64_t m = cu.back(), nq = m * H * D, nk = m * KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    auto q = rand_vec((size_t)nq, 1, true), k = rand_vec((size_t)nk, 1, true),
         v = rand_vec((size_t)nk, 1, true), dout = rand_vec((size_t)nq, 1, true);
    att_args a = {};
    a.cu = to_device<int>(std::vector<float>(cu.begin(), cu.end()));
    a.q = to_device<__nv_bfloat16>(q);
    a.k = to_device<__nv_bfloat16>(k);
    a.v = to_device<__nv_bfloat16>(v);
    a.dout = to_device<__nv_bfloat16>(dout);
    __nv_bfloat16 *o, *dq, *dk, *dv;
    float *lse, *Di;
    cudaCheck(cudaMalloc(&o, nq * 2));
    cudaCheck(cudaMalloc(&dq, nq * 2));
    cudaCheck(cudaMalloc(&dk, nk * 2));
    cudaCheck(cudaMalloc(&dv, nk * 2));
    cudaCheck(cudaMalloc(&lse, m * H * 4));
    cudaCheck(cudaMalloc(&Di, m * H * 4));
    a.out = o;
    a.lse = lse;
    a.Di = Di;
    a.dk = dk;
    a.dv = dv;
    a.m = m;
    a.H = H;
    a.KVH = KVH;
    a.D = D;
    a.scale = scale;
    const bool has_v3 = D == 64 || D == 128;
    const int n_seqs = (int)lens.size();
    /* the same split choice as cuda_attention_bwd (256 MiB cap on the partials) */
    const int64_t kv_blocks = (int64_t)((maxlen + ATT3_ROWS - 1) / ATT3_ROWS) * n_seqs * KVH;
    int split = has_v3 ? att3_dkv_split(H / KVH, kv_blocks, g_sms, m, KVH, D, 256u << 20) : 1;
    if (force_split > 0) split = force_split;
    float *ws = nullptr;
    if (split > 1) cudaCheck(cudaMalloc(&ws, att3_ws_bytes(split, m, KVH, D)));
    int nt = (D + 31) / 32;
    auto v2 = [&](bool bwd) {
        att_args b = a;
        b.o = bwd ? dq : o;
        switch (nt) {
        case 1: launch_v2<1>(b, n_seqs, maxlen, bwd, Di); break;
        case 2: launch_v2<2>(b, n_seqs, maxlen, bwd, Di); break;
        case 3: launch_v2<3>(b, n_seqs, maxlen, bwd, Di); break;
        case 4: launch_v2<4>(b, n_seqs, maxlen, bwd, Di); break;
        default: launch_v2<8>(b, n_seqs, maxlen, bwd, Di); break;
        }
    };
    auto v3 = [&](bool bwd) {
        att_args b = a;
        b.o = bwd ? dq : o;
        launch_v3(b, n_seqs, maxlen, bwd, Di, split, ws);
    };
    auto v1 = [&]() {
        att_args b = a;
        b.o = o;
        att_fwd_v1<<<cuda_grid(m * H, 128), 128>>>(b, n_seqs);
        launchCheck("att_fwd_v1");
    };
    auto fwd = [&](int var) {
        if (var == 1) v1(); else if (var == 2) v2(false); else v3(false);
    };
    double flops = 0;
    for (int l : lens) flops += 2.0 * 2.0 * (double)l * (l + 1) / 2 * D * H;
    char shp[96];
    snprintf(shp, sizeof shp, "seqs%zux%d_H%d_KVH%d_D%d", lens.size(), maxlen, H, KVH, D);
    printf("-- %s (m %lld, lens", shp, (long long)m);
    for (size_t i = 0; i < lens.size() && i < 8; i++) printf(" %d", lens[i]);
    printf("%s; dk/dv split %d)\n", lens.size() > 8 ? " ..." : "", split);
    ref_out r;
    if (check) r = cpu_ref(cu, q, k, v, dout, H, KVH, D, scale, true);
    const int last = has_v3 ? 3 : 2;
    for (int var = check ? 1 : 2; var <= last; var++) {
        double err = 0;
        bool ok = true;
        poison(o, nq * 2);
        poison(lse, m * H * 4);
        fwd(var);
        cudaCheck(cudaDeviceSynchronize());
        if (check) {
            ok &= validate("fwd out", from_device(o, (size_t)nq), r.o, 1e-2, &err);
            ok &= validate("fwd lse", from_device(lse, (size_t)(m * H)), r.lse, 1e-3, &err);
        }
        double us = time_us([&]() { fwd(var); });
        char vn[16];
        snprintf(vn, sizeof vn, "v%d", var);
        result("attention_fwd", vn, shp, us, "TFLOP/s", flops / us / 1e6, err, ok);
    }
    /* backward: v2 and v3 (v1 is a forward reference); each from its own forward's out/lse */
    for (int var = 2; var <= last; var++) {
        double err = 0;
        bool ok = true;
        auto bwd = [&]() { if (var == 2) v2(true); else v3(true); };
        if (var == 2) v2(false); else v3(false);
        poison(dq, nq * 2), poison(dk, nk * 2), poison(dv, nk * 2);
        bwd();
        cudaCheck(cudaDeviceSynchronize());
        if (check) {
            ok &= validate("bwd dq", from_device(dq, (size_t)nq), r.dq, 2e-2, &err);
            ok &= validate("bwd dk", from_device(dk, (size_t)nk), r.dk, 2e-2, &err);
            ok &= validate("bwd dv", from_device(dv, (size_t)nk), r.dv, 2e-2, &err);
        }
        if (var == 3) { /* determinism: a second run gives the same bits */
            auto dq1 = from_device(dq, (size_t)nq), dk1 = from_device(dk, (size_t)nk),
                 dv1 = from_device(dv, (size_t)nk);
            poison(dq, nq * 2), poison(dk, nk * 2), poison(dv, nk * 2);
            bwd();
            bool same = dq1 == from_device(dq, (size_t)nq) && dk1 == from_device(dk, (size_t)nk) &&
                        dv1 == from_device(dv, (size_t)nk);
            printf("  validate %-40s %s\n", "bwd v3 twice: identical bits", same ? "ok" : "FAIL");
            if (!same) g_failures++, ok = false;
        }
        double us = time_us(bwd);
        char vn[16];
        snprintf(vn, sizeof vn, "v%d", var);
        result("attention_bwd", vn, shp, us, "TFLOP/s", 2.5 * flops / us / 1e6, err, ok);
    }
    for (void *p : {(void *)a.cu, (void *)a.q, (void *)a.k, (void *)a.v, (void *)a.dout, (void *)o,
                    (void *)dq, (void *)dk, (void *)dv, (void *)lse, (void *)Di, (void *)ws})
        cudaCheck(cudaFree(p));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("attention");
    cudaCheck(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    att3_selfcheck(); /* fragment layouts first */
    /* validated shapes (CPU reference in double): lengths not multiples of 64, length 1, GQA
     * ratios 2, 4, 6, 7, D 64 and 128 (v3) and 80 (v2 only) */
    run_case({37, 1, 130, 64}, 4, 2, 64, true);
    run_case({200, 77}, 8, 2, 128, true);
    run_case({1, 65, 128, 300, 3, 64}, 14, 2, 64, true);
    run_case({513, 1, 127, 64}, 12, 2, 128, true);
    run_case({513, 1, 127, 64}, 12, 2, 128, true, 1); /* dk/dv without the split */
    run_case({1, 65, 128, 300, 3, 64}, 14, 2, 64, true, 1);
    run_case({190, 33}, 28, 4, 128, true);
    run_case({45, 96}, 2, 2, 80, true);
    /* timing shapes: Qwen2.5-0.5B (H 14, KVH 2, D 64) 8 x 512; 1.5B (H 12, KVH 2, D 128) and
     * 7B (H 28, KVH 4, D 128) 4 x 512 */
    run_case({512, 512, 512, 512, 512, 512, 512, 512}, 14, 2, 64, false);
    run_case({512, 512, 512, 512}, 12, 2, 128, false);
    run_case({512, 512, 512, 512}, 28, 4, 128, false);
    /* longer sequences: 0.5B at 4 x 2048 (few, long tiles) */
    run_case({2048, 2048, 2048, 2048}, 14, 2, 64, false);
    return g_failures ? 1 : 0;
}
