/* attention.cu — causal GQA attention over packed sequences, forward and backward.
 *
 * Two numbers (H200): forward FLOPs = sum over sequences of 2 * 2 * (L^2 / 2) * D * H (QK^T and
 * PV, causal half); backward ~2.5x that. bf16 tensor cores would give ~790 TFLOP/s; these
 * kernels use CUDA cores in f32 (~60 TFLOP/s peak), so expect tens of TFLOP/s at best: the next
 * step is a wgmma/mma.sync flash kernel (docs/cuda-backend.md).
 * Variants:
 *   v1  one thread per (query, head): two passes over the keys (max, then exp-sum and PV),
 *       straight from global memory (simple reference kernel, dev only)
 *   v2  flash-style tiles: 32 queries x 32 keys in shared memory, online softmax, a warp per
 *       4 queries; backward as separate deterministic dq and dk/dv kernels [src, used]
 * Validation against a CPU reference in double: out, lse, dq, dk, dv on random q, k, v, dout
 * with several sequences of different lengths.
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/attention.cu -o attention
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

static void run_case(const std::vector<int> &lens, int H, int KVH, int D, bool check)
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
    int nt = (D + 31) / 32;
    auto v2 = [&](bool bwd) {
        att_args b = a;
        b.o = bwd ? dq : o;
        switch (nt) {
        case 1: launch_v2<1>(b, (int)lens.size(), maxlen, bwd, Di); break;
        case 2: launch_v2<2>(b, (int)lens.size(), maxlen, bwd, Di); break;
        case 3: launch_v2<3>(b, (int)lens.size(), maxlen, bwd, Di); break;
        case 4: launch_v2<4>(b, (int)lens.size(), maxlen, bwd, Di); break;
        default: launch_v2<8>(b, (int)lens.size(), maxlen, bwd, Di); break;
        }
    };
    auto v1 = [&]() {
        att_args b = a;
        b.o = o;
        att_fwd_v1<<<cuda_grid(m * H, 128), 128>>>(b, (int)lens.size());
        launchCheck("att_fwd_v1");
    };
    double flops = 0;
    for (int l : lens) flops += 2.0 * 2.0 * (double)l * (l + 1) / 2 * D * H;
    char shp[96];
    snprintf(shp, sizeof shp, "seqs%zux%d_H%d_KVH%d_D%d", lens.size(), maxlen, H, KVH, D);
    ref_out r;
    if (check) r = cpu_ref(cu, q, k, v, dout, H, KVH, D, scale, true);
    for (int var = 1; var <= 2; var++) {
        double err = 0;
        bool ok = true;
        poison(o, nq * 2);
        poison(lse, m * H * 4);
        if (var == 1) v1(); else v2(false);
        cudaCheck(cudaDeviceSynchronize());
        if (check) {
            ok &= validate("fwd out", from_device(o, (size_t)nq), r.o, 1e-2, &err);
            ok &= validate("fwd lse", from_device(lse, (size_t)(m * H)), r.lse, 1e-3, &err);
        }
        double us = time_us([&]() { if (var == 1) v1(); else v2(false); });
        char vn[8];
        snprintf(vn, sizeof vn, "v%d", var);
        result("attention_fwd", vn, shp, us, "TFLOP/s", flops / us / 1e6, err, ok);
    }
    /* backward: v2 only (v1 is a forward reference) */
    double err = 0;
    bool ok = true;
    v2(false);
    poison(dq, nq * 2), poison(dk, nk * 2), poison(dv, nk * 2);
    v2(true);
    cudaCheck(cudaDeviceSynchronize());
    if (check) {
        ok &= validate("bwd dq", from_device(dq, (size_t)nq), r.dq, 2e-2, &err);
        ok &= validate("bwd dk", from_device(dk, (size_t)nk), r.dk, 2e-2, &err);
        ok &= validate("bwd dv", from_device(dv, (size_t)nk), r.dv, 2e-2, &err);
    }
    double us = time_us([&]() { v2(true); });
    result("attention_bwd", "v2", shp, us, "TFLOP/s", 2.5 * flops / us / 1e6, err, ok);
    for (void *p : {(void *)a.cu, (void *)a.q, (void *)a.k, (void *)a.v, (void *)a.dout, (void *)o,
                    (void *)dq, (void *)dk, (void *)dv, (void *)lse, (void *)Di})
        cudaCheck(cudaFree(p));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("attention");
    /* validated shapes (CPU reference in double) */
    run_case({37, 1, 130, 64}, 4, 2, 64, true);
    run_case({200, 77}, 8, 2, 128, true);
    /* timing shapes: 7B-like (Qwen2.5-7B: H 28, KVH 4, D 128), batch 4 x 512; 0.5B (H 14,
     * KVH 2, D 64), 8 x 512 */
    run_case({512, 512, 512, 512}, 28, 4, 128, false);
    run_case({512, 512, 512, 512, 512, 512, 512, 512}, 14, 2, 64, false);
    return g_failures ? 1 : 0;
}
