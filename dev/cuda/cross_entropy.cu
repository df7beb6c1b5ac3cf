/* cross_entropy.cu — the cross-entropy row kernel over a chunk of f32 logits: per row the
 * log-sum-exp, loss = lse - logit[label], and dlogits = weight * (softmax - onehot) in bf16.
 *
 * Two numbers (H200): a chunk of c rows of V logits reads c * V * 4 bytes twice (the max/sum pass
 * and the dlogits pass) and writes c * V * 2: 441 rows x 151936 (qwen2.5, 256 MiB of logits)
 * -> 670 MB -> ~160 us at 4.3 TB/s; 2 expf per element (~67 M) are far below the SFU rate.
 * Variants:
 *   v1  one block of 256 threads per row, scalar loads and stores (shipped until 2026-12-01,
 *       with ~110-row chunks: 29 ms of a 116 ms qwen2.5-0.5b step with the chunk GEMMs). The
 *       shipped kernel's scalar path is that kernel, so v1 is ce_rows_kernel<1> on 256 threads
 *   v2  (shipped, src/engine/cuda/cross_entropy.cuh) 512 threads per row, float4 loads and
 *       8-byte bf16 stores when V % 4 == 0 (v2/vec1 otherwise)
 * Validation: random logits (scale 4) with a fifth of the rows ignored (-100), against a double
 * reference of the same formula; loss and dlogits (dlogits compared as bf16, tol 1e-2).
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/cross_entropy.cu -o cross_entropy
 */
#include "common.h"
#include "engine/cuda/cross_entropy.cuh"

static void run_case(int64_t c, int64_t V, bool check)
{
    auto L = rand_vec((size_t)(c * V), 4, false);
    std::vector<int32_t> lab((size_t)c);
    std::vector<float> wt((size_t)c);
    for (int64_t i = 0; i < c; i++) {
        lab[i] = i % 5 == 2 ? IGNORE_INDEX : (int32_t)(urand() * (double)V) % (int32_t)V;
        wt[i] = lab[i] == IGNORE_INDEX ? 0.0f : 1.0f / (float)c;
    }
    float *dl = to_device<float>(L), *dw = to_device<float>(wt), *dloss;
    int32_t *dlab;
    int *derr;
    __nv_bfloat16 *dd;
    cudaCheck(cudaMalloc(&dlab, c * 4));
    cudaCheck(cudaMemcpy(dlab, lab.data(), c * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&dloss, c * 4));
    cudaCheck(cudaMalloc(&dd, c * V * 2));
    cudaCheck(cudaMalloc(&derr, 4));
    cudaCheck(cudaMemset(derr, 0, 4));
    std::vector<double> rloss, rd;
    if (check) {
        rloss.assign((size_t)c, 0.0);
        rd.assign((size_t)(c * V), 0.0);
        for (int64_t i = 0; i < c; i++) {
            if (lab[i] == IGNORE_INDEX) continue;
            double mx = -INFINITY, s = 0;
            for (int64_t j = 0; j < V; j++)
                mx = std::max(mx, (double)L[i * V + j]);
            for (int64_t j = 0; j < V; j++)
                s += exp((double)L[i * V + j] - mx);
            double lse = mx + log(s);
            rloss[i] = lse - L[i * V + lab[i]];
            for (int64_t j = 0; j < V; j++)
                rd[i * V + j] = wt[i] * (exp((double)L[i * V + j] - lse) - (j == lab[i] ? 1 : 0));
        }
    }
    char shp[64];
    snprintf(shp, sizeof shp, "rows%lld_V%lld", (long long)c, (long long)V);
    double bytes = (double)c * V * (4 + 4 + 2);
    for (int v = 1; v <= 2; v++) {
        auto launch = [&]() {
            if (v == 1)
                ce_rows_kernel<1><<<(unsigned)c, 256>>>(dl, V, dlab, dw, dloss, dd, derr);
            else
                ce_rows_launch(c, dl, V, dlab, dw, dloss, dd, derr, 0);
            launchCheck("ce rows");
        };
        double err = 0;
        bool ok = true;
        if (check) {
            poison(dloss, (size_t)c * 4);
            poison(dd, (size_t)(c * V) * 2);
            launch();
            cudaCheck(cudaDeviceSynchronize());
            char what[96];
            snprintf(what, sizeof what, "v%d loss %s", v, shp);
            ok &= validate(what, from_device(dloss, (size_t)c), rloss, 1e-5, &err);
            snprintf(what, sizeof what, "v%d dlogits %s", v, shp);
            ok &= validate(what, from_device(dd, (size_t)(c * V)), rd, 1e-2, &err);
        }
        double us = time_us(launch);
        char var[16];
        snprintf(var, sizeof var, "v%d", v);
        result("ce_rows", var, shp, us, "GB/s", bytes / us / 1e3, err, ok);
    }
    for (void *q : {(void *)dl, (void *)dw, (void *)dloss, (void *)dlab, (void *)dd, (void *)derr})
        cudaCheck(cudaFree(q));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("cross_entropy");
    run_case(37, 1000, true);     /* vectorized path */
    run_case(23, 1001, true);     /* scalar path (rows not 16-byte aligned) */
    run_case(9, 151936, true);    /* a real vocabulary */
    run_case(110, 151936, false); /* the old 64 MiB chunk */
    run_case(441, 151936, false); /* the 256 MiB chunk the CUDA backend uses */
    return g_failures ? 1 : 0;
}
