/* nf4_dequant.cu — NF4 (and double-quantized NF4) tile dequantization to bf16.
 *
 * Two numbers (H200): a tile of n elements reads n/2 code bytes + n/64 absmax bytes (1 with
 * double quant, 4 without) and writes 2n bytes of bf16: ~2.52n bytes, no arithmetic to speak of,
 * so the floor is bytes / ~4.3 TB/s (a 4096 x 4096 weight: 42 MB -> ~10 us).
 * Variants:
 *   v1  one element per thread (any alignment)                        [src: nf4_dequant_v1]
 *   v2  8 elements per thread from one 32-bit code load              [src: nf4_dequant_v2, f32 out]
 *   v3  16 elements per thread: one 64-bit code load, two 16-byte stores (dev only)
 *   v4  v3 with the code table and double-quant map in shared memory  [src: nf4_dequant_v4, slabs]
 *   v5  v4's tables, warp-contiguous 32-bit code loads and 16-byte stores, four 8-element groups
 *       per thread in flight                                         [src: nf4_dequant_v5, tiles]
 * H200, 2026-12-01 (scripts/device/gpu-final-bench.sh), the 7B gate_proj middle tile (21.2 Mi
 * elements, double quant): v5 25.5 us (2243 GB/s) at 256 threads, v4 25.8 us (at 512; 36.4 at
 * 128, v5 28.5), v3 90 us: v5 is at most a few percent ahead, inside one run's spread; it ships
 * for the forward's tiles because it is never slower at any block size, and it is the variant the
 * benchmark of that day measured (docs/benchmarks.md).
 * Validation: random codes, random absmax / double-quant tables, random code and dynamic maps
 * (the kernels are table driven, so any tables test them), against a CPU reference in double.
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/nf4_dequant.cu -o nf4_dequant
 */
#include "common.h"
#include "engine/cuda/nf4_dequant.cuh"

/* v3: 16 elements per thread (e0 % 16 == 0), vectorized 16-byte bf16 stores. */
__global__ void nf4_dequant_v3(nf4_args a, __nv_bfloat16 *out)
{
    int64_t n16 = a.n >> 4;
    const uint2 *words = (const uint2 *)(a.codes + (a.e0 >> 1));
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint2 w = __ldg(words + i);
        float amax = nf4_block_absmax(a, (a.e0 + i * 16) >> 6);
        __align__(16) __nv_bfloat162 v[8];
#pragma unroll
        for (int b = 0; b < 8; b++) {
            uint32_t word = b < 4 ? w.x : w.y;
            uint32_t byte = (word >> (8 * (b & 3))) & 0xff;
            v[b] = __floats2bfloat162_rn(nf4_code_c[byte >> 4] * amax,
                                         nf4_code_c[byte & 0x0f] * amax);
        }
        uint4 *o = (uint4 *)(out + i * 16);
        o[0] = *(uint4 *)&v[0];
        o[1] = *(uint4 *)&v[4];
    }
    nf4_dequant_tail(a, out, n16 * 16, nf4_code_c);
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("nf4_dequant");
    float code[16], dmap[256];
    for (int i = 0; i < 16; i++) code[i] = rnd1(1.0f);
    for (int i = 0; i < 256; i++) dmap[i] = rnd1(1.0f);
    cudaCheck(cudaMemcpyToSymbol(nf4_code_c, code, sizeof code));
    cudaCheck(cudaMemcpyToSymbol(nf4_dmap_c, dmap, sizeof dmap));
    struct shape { int64_t rows, cols, r0, r1; } shapes[] = {
        {896, 896, 0, 896},        /* 0.5B q_proj */
        {4096, 4096, 0, 2048},     /* 7B-like, one 8 Mi tile */
        {11008, 4096, 2048, 4096}, /* MLP weight, a middle tile */
        {18944, 3584, 6336, 12672}, /* 7B gate_proj, the middle of its three 32 Mi tiles */
        {1000, 100, 3, 500},       /* odd start: e0 % 8 != 0 -> v1 only */
    };
    for (int dq = 0; dq < 2; dq++)
        for (auto &s : shapes) {
            int64_t n_all = s.rows * s.cols, nb = (n_all + 63) / 64;
            std::vector<uint8_t> codes((size_t)(n_all + 1) / 2);
            for (auto &c : codes) c = (uint8_t)(urand() * 256);
            std::vector<float> absmax(nb), absmax2((nb + 255) / 256);
            std::vector<uint8_t> aq(nb);
            for (auto &x : absmax) x = (float)(0.01 + urand());
            for (auto &x : aq) x = (uint8_t)(urand() * 256);
            for (auto &x : absmax2) x = (float)(0.01 + urand());
            float offset = 0.25f;
            int64_t e0 = s.r0 * s.cols, n = (s.r1 - s.r0) * s.cols;
            std::vector<double> ref((size_t)n);
            for (int64_t i = 0; i < n; i++) {
                int64_t e = e0 + i, b = e / 64;
                uint8_t byte = codes[(size_t)(e / 2)];
                int q = (e & 1) ? (byte & 15) : (byte >> 4);
                float am = dq ? dmap[aq[(size_t)b]] * absmax2[(size_t)(b / 256)] + offset
                              : absmax[(size_t)b];
                ref[(size_t)i] = (double)(code[q] * am);
            }
            uint8_t *dcodes, *daq;
            cudaCheck(cudaMalloc(&dcodes, codes.size()));
            cudaCheck(cudaMemcpy(dcodes, codes.data(), codes.size(), cudaMemcpyHostToDevice));
            cudaCheck(cudaMalloc(&daq, aq.size()));
            cudaCheck(cudaMemcpy(daq, aq.data(), aq.size(), cudaMemcpyHostToDevice));
            float *dabs = to_device<float>(absmax), *dabs2 = to_device<float>(absmax2);
            __nv_bfloat16 *out;
            cudaCheck(cudaMalloc(&out, (size_t)n * 2));
            nf4_args a;
            a.codes = dcodes;
            a.absmax = dq ? NULL : dabs;
            a.absmax_q = daq;
            a.absmax2 = dabs2;
            a.offset = offset;
            a.e0 = e0;
            a.n = n;
            a.width = a.ld = 0;
            double bytes = n / 2.0 + (double)n / 64 * (dq ? 1 : 4) + 2.0 * n;
            char shp[64];
            snprintf(shp, sizeof shp, "%s_%lldx%lld_rows%lld-%lld", dq ? "dq" : "nf4",
                     (long long)s.rows, (long long)s.cols, (long long)s.r0, (long long)s.r1);
            for (int v = 1; v <= 5; v++) {
                if ((v == 2 || v == 5) && e0 % 8) continue;
                if ((v == 3 || v == 4) && e0 % 16) continue;
                for (int bs : {128, 256, 512}) {
                    auto run = [&]() {
                        if (v == 1)
                            nf4_dequant_v1<__nv_bfloat16><<<cuda_grid(n, bs * 4), bs>>>(a, out);
                        else if (v == 2)
                            nf4_dequant_v2<__nv_bfloat16><<<cuda_grid(n / 8 + 1, bs), bs>>>(a, out);
                        else if (v == 3)
                            nf4_dequant_v3<<<cuda_grid(n / 16 + 1, bs), bs>>>(a, out);
                        else if (v == 4)
                            nf4_dequant_v4<<<cuda_grid(n / 16 + 1, bs), bs>>>(a, out);
                        else
                            nf4_dequant_v5<<<cuda_grid(n / 8 + 1, bs * 4), bs>>>(a, out);
                        launchCheck("nf4_dequant");
                    };
                    poison(out, (size_t)n * 2);
                    run();
                    cudaCheck(cudaDeviceSynchronize());
                    double err = 0;
                    char what[96];
                    snprintf(what, sizeof what, "v%d bs %d %s", v, bs, shp);
                    bool ok = validate(what, from_device(out, (size_t)n), ref, 4e-3, &err);
                    double us = time_us(run);
                    char var[16];
                    snprintf(var, sizeof var, "v%d/bs%d", v, bs);
                    result("nf4_dequant", var, shp, us, "GB/s", bytes / us / 1e3, err, ok);
                }
            }
            cudaCheck(cudaFree(dcodes));
            cudaCheck(cudaFree(daq));
            cudaCheck(cudaFree(dabs));
            cudaCheck(cudaFree(dabs2));
            cudaCheck(cudaFree(out));
        }
    return g_failures ? 1 : 0;
}
