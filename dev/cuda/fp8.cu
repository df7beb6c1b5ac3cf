/* fp8.cu — the E4M3 operand kernels of --base-compute fp8 (src/engine/cuda/fp8.cuh), validated
 * against the host and timed on 7B shapes, so they can be tuned one at a time.
 *
 * What each moves (bytes per element; the floor is bytes / the memory rate, ~3.35 TB/s on an
 * H100 SXM, ~4.8 TB/s on an H200):
 *   fp8_amax_bf16       reads 2                      (X 2048 x 3584, dY 2048 x 18944)
 *   fp8_quantize_bf16   reads 2, writes 1
 *   fp8_nf4_rows        reads 0.5 + 1/64, writes 1   (the 7B gate_proj's middle forward tile)
 *   fp8_nf4_cols_t      the same, transposed         (its backward slab: 18944 rows x 1216 cols)
 * The profile of 2026-12-06 (docs/benchmarks.md, "FP8 base compute") put the two dequantizations
 * at ~40 % of the memory rate and the two quantization passes near it: these are the kernels to
 * tune first. The amax pass writes per-block maxima; the quantization reduces them first.
 * Validation: the E4M3 bytes decoded and compared with the host's conversion of the same f32
 * values (cuda_fp8.h's host path: round to nearest even, saturated), max relative error against
 * the largest value with tolerance 0.07 (one E4M3 step at the top of the range, so a rare
 * one-step difference where the device contracts absmax's a*b+c into an FMA passes, while a
 * wrong layout, scale or element order, all O(1), does not); the count of differing bytes is
 * printed. The scale derived from the amax must equal the host's exactly.
 * Build: nvcc -O3 -arch=sm_90 -I src -I dev/cuda dev/cuda/fp8.cu -o fp8 (or the CMake dev_fp8)
 * Status: every case validates on an H100 and an H200 (2026-12-06, scripts/device/fp8-ab.sh).
 * Two variants measured there and dropped (docs/benchmarks.md, "FP8 base compute"): rows with
 * 32 elements a thread and four loads in flight, and the transposed slab in groups of four
 * 64 x 64 tiles; neither was faster than v1.
 */
#include <cuda_fp8.h>

#include "common.h"
#include "engine/cuda/fp8.cuh"

static float e4m3_host(float x)
{
    __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    __half_raw h = __nv_cvt_fp8_to_halfraw(q, __NV_E4M3);
    return __half2float(__half(h));
}

static std::vector<float> decode(const std::vector<uint8_t> &b)
{
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); i++) {
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b[i], __NV_E4M3);
        f[i] = __half2float(__half(h));
    }
    return f;
}

static std::vector<uint8_t> bytes_from_device(const uint8_t *d, size_t n)
{
    std::vector<uint8_t> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
}

static void check_bytes(const char *what, const std::vector<uint8_t> &got,
                        const std::vector<float> &want, double *err)
{
    std::vector<double> w(want.begin(), want.end());
    size_t differ = 0;
    std::vector<float> g = decode(got);
    for (size_t i = 0; i < g.size(); i++)
        differ += !(g[i] == want[i]);
    printf("  %s: %zu of %zu bytes differ from the host\n", what, differ, got.size());
    validate(what, g, w, 0.07, err);
}

/* X (rows, cols) bf16: amax, then the quantization, each timed. */
static void activation_case(int64_t rows, int64_t cols, fp8_scales *dsc)
{
    int64_t n = rows * cols;
    std::vector<float> x = rand_vec((size_t)n, 3.0f, true);
    __nv_bfloat16 *dx = to_device<__nv_bfloat16>(x);
    uint8_t *out;
    cudaCheck(cudaMalloc(&out, (size_t)n));
    float amax = 0;
    for (float v : x) amax = std::max(amax, fabsf(v));
    float inv = fp8_inv_scale(amax);
    std::vector<float> want((size_t)n);
    for (int64_t i = 0; i < n; i++) want[(size_t)i] = e4m3_host(x[(size_t)i] * inv);
    char shp[48];
    snprintf(shp, sizeof shp, "%lldx%lld", (long long)rows, (long long)cols);
    unsigned blocks = fp8_blocks(n / 8);
    auto amax_run = [&]() {
        fp8_amax_bf16<<<blocks, 256>>>(dx, n, dsc->amax_part);
        launchCheck("fp8_amax_bf16");
    };
    auto quant_run = [&]() {
        fp8_quantize_bf16<<<blocks, 256>>>(dx, n, dsc->amax_part, &dsc->scale_act, out);
        launchCheck("fp8_quantize_bf16");
    };
    amax_run();
    poison(out, (size_t)n);
    quant_run();
    /* the scale the device derived from its amax equals the host's (amax / 448) exactly */
    float got_scale;
    cudaCheck(cudaMemcpy(&got_scale, &dsc->scale_act, sizeof got_scale, cudaMemcpyDeviceToHost));
    bool amax_ok = got_scale == fp8_scale_of(amax);
    printf("  scale %s: device %.9g host %.9g (amax %.9g) %s\n", shp, got_scale,
           fp8_scale_of(amax), amax, amax_ok ? "ok" : "FAIL");
    if (!amax_ok) g_failures++;
    double err = amax_ok ? 0 : INFINITY, us_amax = time_us(amax_run);
    result("fp8_amax_bf16", "v1", shp, us_amax, "GB/s", 2.0 * n / us_amax / 1e3, err, amax_ok);
    err = 0;
    char what[96];
    snprintf(what, sizeof what, "fp8_quantize_bf16 %s", shp);
    check_bytes(what, bytes_from_device(out, (size_t)n), want, &err);
    double us = time_us(quant_run);
    result("fp8_quantize_bf16", "v1", shp, us, "GB/s", 3.0 * n / us / 1e3, err, err <= 0.07);
    cudaCheck(cudaFree(dx));
    cudaCheck(cudaFree(out));
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("fp8");
    /* the real NF4 code table and dynamic map: the amax rule (largest absmax) needs code 1.0 */
    float code[16] = {-1.0f, -0.6961928f, -0.52507305f, -0.39491749f, -0.28444138f,
                      -0.18477343f, -0.09105004f, 0.0f, 0.0795803f, 0.1609302f, 0.2461123f,
                      0.33791524f, 0.44070983f, 0.562617f, 0.72295684f, 1.0f};
    float dmap[256];
    for (int i = 0; i < 256; i++) dmap[i] = (float)(i - 128) / 128.0f;
    cudaCheck(cudaMemcpyToSymbol(nf4_code_c, code, sizeof code));
    cudaCheck(cudaMemcpyToSymbol(nf4_dmap_c, dmap, sizeof dmap));
    fp8_scales *dsc;
    cudaCheck(cudaMalloc(&dsc, sizeof(fp8_scales)));
    unsigned hword[4];

    activation_case(2048, 3584, dsc);  /* 7B: X of q/k/v, o, gate/up */
    activation_case(2048, 18944, dsc); /* 7B: X of down, dY of gate/up */

    /* 7B gate_proj (18944 x 3584), double-quantized */
    const int64_t rows = 18944, cols = 3584, n_all = rows * cols, nb = n_all / 64;
    std::vector<uint8_t> codes((size_t)n_all / 2), aq((size_t)nb);
    for (auto &c : codes) c = (uint8_t)(urand() * 256);
    for (auto &q : aq) q = (uint8_t)(130 + urand() * 120); /* positive absmax */
    std::vector<float> absmax2((size_t)(nb + 255) / 256);
    for (auto &x : absmax2) x = (float)(0.01 + 0.05 * urand());
    const float offset = 0.001f;
    std::vector<float> wval((size_t)n_all); /* code * absmax: the bf16 path's f32 value */
    float amax_w = 0;
    for (int64_t b = 0; b < nb; b++) {
        float s = dmap[aq[(size_t)b]] * absmax2[(size_t)(b / 256)] + offset;
        amax_w = std::max(amax_w, fabsf(s));
        for (int64_t j = 0; j < 64; j++) {
            int64_t e = b * 64 + j;
            uint8_t byte = codes[(size_t)(e / 2)];
            wval[(size_t)e] = code[(e & 1) ? (byte & 15) : (byte >> 4)] * s;
        }
    }
    float inv = fp8_inv_scale(amax_w);
    uint8_t *dcodes, *daq, *out;
    cudaCheck(cudaMalloc(&dcodes, codes.size()));
    cudaCheck(cudaMemcpy(dcodes, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&daq, aq.size()));
    cudaCheck(cudaMemcpy(daq, aq.data(), aq.size(), cudaMemcpyHostToDevice));
    float *dabs2 = to_device<float>(absmax2);
    nf4_args a;
    a.codes = dcodes, a.absmax = NULL, a.absmax_q = daq, a.absmax2 = dabs2, a.offset = offset;
    a.e0 = 0, a.n = 0, a.width = 0, a.ld = cols;
    auto w_amax = [&]() {
        cudaCheck(cudaMemsetAsync(&dsc->amax_w, 0, sizeof(unsigned)));
        fp8_nf4_amax<<<fp8_blocks(nb), 256>>>(a, nb, &dsc->amax_w);
        launchCheck("fp8_nf4_amax");
    };
    w_amax();
    cudaCheck(cudaMemcpy(hword, &dsc->amax_w, sizeof(unsigned), cudaMemcpyDeviceToHost));
    float got_w;
    memcpy(&got_w, hword, sizeof got_w);
    /* the device may contract dmap * absmax2 + offset into an FMA: equal within an ulp */
    bool wok = fabsf(got_w - amax_w) <= 1e-6f * amax_w;
    printf("  weight amax: device %.9g host %.9g %s\n", got_w, amax_w, wok ? "ok" : "FAIL");
    if (!wok) g_failures++;
    double us = time_us(w_amax);
    result("fp8_nf4_amax", "v1", "dq_18944x3584", us, "GB/s", (double)nb / us / 1e3,
           wok ? 0 : INFINITY, wok);

    /* forward: the middle of the three 32 Mi-element tiles (rows 6336 .. 12672) */
    const int64_t r0 = 6336, r1 = 12672, n = (r1 - r0) * cols;
    cudaCheck(cudaMalloc(&out, (size_t)n));
    std::vector<float> want((size_t)n);
    for (int64_t i = 0; i < n; i++) want[(size_t)i] = e4m3_host(wval[(size_t)(r0 * cols + i)] * inv);
    nf4_args t = a;
    t.e0 = r0 * cols, t.n = n;
    for (int blocks : {256, 1024, 4096}) {
        auto run = [&]() {
            fp8_nf4_rows<<<blocks, 256>>>(t, inv, out);
            launchCheck("fp8_nf4_rows");
        };
        poison(out, (size_t)n);
        run();
        double err = 0;
        char what[64], var[32];
        snprintf(what, sizeof what, "fp8_nf4_rows %d blocks", blocks);
        check_bytes(what, bytes_from_device(out, (size_t)n), want, &err);
        us = time_us(run);
        snprintf(var, sizeof var, "v1/blocks%d", blocks);
        result("fp8_nf4_rows", var, "dq_18944x3584_rows6336-12672", us, "GB/s",
               (n / 2.0 + n / 64.0 + n) / us / 1e3, err, err <= 0.07);
    }
    cudaCheck(cudaFree(out));

    /* backward: the first of three column slabs (cols 0 .. 1216), transposed to (1216, 18944) */
    const int64_t width = 1216, ns = rows * width;
    cudaCheck(cudaMalloc(&out, (size_t)ns));
    std::vector<float> want_t((size_t)ns);
    for (int64_t c = 0; c < width; c++)
        for (int64_t r = 0; r < rows; r++)
            want_t[(size_t)(c * rows + r)] = e4m3_host(wval[(size_t)(r * cols + c)] * inv);
    int sms = 0;
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int per_sm : {4, 8, 16}) {
        unsigned blocks = (unsigned)(per_sm * sms);
        auto run = [&]() {
            fp8_nf4_cols_t<<<blocks, 256>>>(a, rows, 0, width, inv, out);
            launchCheck("fp8_nf4_cols_t");
        };
        poison(out, (size_t)ns);
        run();
        double err = 0;
        char what[64], var[32];
        snprintf(what, sizeof what, "fp8_nf4_cols_t %d blocks/SM", per_sm);
        check_bytes(what, bytes_from_device(out, (size_t)ns), want_t, &err);
        us = time_us(run);
        snprintf(var, sizeof var, "v1/%dperSM", per_sm);
        result("fp8_nf4_cols_t", var, "dq_18944x3584_cols0-1216", us, "GB/s",
               (ns / 2.0 + ns / 64.0 + ns) / us / 1e3, err, err <= 0.07);
    }
    cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dcodes));
    cudaCheck(cudaFree(daq));
    cudaCheck(cudaFree(dabs2));
    cudaCheck(cudaFree(dsc));
    printf("%s\n", g_failures ? "FAILED" : "all validations passed");
    return g_failures ? 1 : 0;
}
