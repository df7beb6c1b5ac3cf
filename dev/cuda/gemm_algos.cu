/* gemm_algos.cu — what the frozen base's GEMMs lose to cuBLASLt's first heuristic choice and to
 * the way the engine cuts NF4 weights into dequantization tiles (issue 19, items 1 and 5).
 *
 * For every shape the engine's training step runs (random Qwen2.5 0.5B / 1.5B / 7B projections,
 * batch x 512 rows), in the engine's own call form (row-major Y = X W^T forward, dX = dY W
 * backward, bf16 in and out, f32 compute, 32 MiB workspace, tandem's gemm_same_types mapping):
 * asks cublasLtMatmulAlgoGetHeuristic for up to 16 algorithms, times each (median of the runs),
 * and prints the first one's rate, the fastest one's, and whether the fastest one's output has
 * the same bits as the first's (a run-time choice would otherwise change results with timing).
 * Then the same products cut as the engine cuts 7B weights (tiles of rows forward, slabs of
 * columns backward, tdm_cuda_dequant_tile_elems() elements a piece at most) against whole, and
 * the NF4 dequantization (v5) beside a device-to-device copy of the same bytes.
 *
 * Output: RESULT lines (common.h) and one "ALGO" line per shape:
 *   ALGO <shape> first_us best_us best_idx n_algos first_tflops best_tflops same_bits tile stages splitk
 */
#include <cublasLt.h>

#include "common.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/nf4_dequant.cuh"

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "cuBLASLt error %d: %s at %s:%d\n", (int)s_, #call, __FILE__,         \
                    __LINE__);                                                                     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static cublasLtHandle_t g_lt;
static void *g_ws;
static const size_t WS_BYTES = (size_t)32 << 20;

/* Row-major C (m, n) = A (m, k) op(B); trans_b: B is (n, k) (the forward's W), else (k, n). */
struct gemm {
    int64_t m, n, k;
    bool trans_b;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

static void gemm_plan(gemm *g, int want)
{
    cublasOperation_t opa = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    /* column-major: C^T (n, m) = op(B)^T (n, k) . A^T (k, m) */
    LT_CHECK(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (g->trans_b)
        LT_CHECK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, g->k, g->n, g->k));
    else
        LT_CHECK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, g->n, g->k, g->n));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, g->k, g->m, g->k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_16BF, g->n, g->m, g->n));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &WS_BYTES, sizeof WS_BYTES));
    g->algos.resize(want);
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g_lt, g->op, g->la, g->lb, g->lc, g->lc, pref, want,
                                            g->algos.data(), &found));
    g->algos.resize(found);
    cublasLtMatmulPreferenceDestroy(pref);
}

static void gemm_run(const gemm *g, int idx, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                     __nv_bfloat16 *c)
{
    float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(cublasLtMatmul(g_lt, g->op, &alpha, b, g->la, a, g->lb, &beta, c, g->lc, c, g->lc,
                            &g->algos[idx].algo, g_ws, WS_BYTES, 0));
}

static uint32_t algo_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at)
{
    uint32_t v = 0;
    size_t w = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS)
        return v;
    uint16_t s = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &s, sizeof s, &w) == CUBLAS_STATUS_SUCCESS)
        return s;
    return 0xffffffffu;
}

/* Device buffers big enough for every shape below (bf16 elements). */
static __nv_bfloat16 *g_a, *g_b, *g_c, *g_c0;
static const size_t MAX_ELEMS = (size_t)576 << 20; /* the 7B lm_head: 152064 x 3584 */

struct sweep_out {
    double first_us, best_us;
    int best_idx;
};

static sweep_out sweep(const char *name, int64_t m, int64_t n, int64_t k, bool trans_b)
{
    gemm g = {};
    g.m = m, g.n = n, g.k = k, g.trans_b = trans_b;
    gemm_plan(&g, 16);
    sweep_out o = {0, 1e30, 0};
    if (g.algos.empty()) {
        printf("ALGO %s none\n", name);
        return o;
    }
    double flop = 2.0 * m * n * k;
    size_t cn = (size_t)m * n;
    for (int i = 0; i < (int)g.algos.size(); i++) {
        double us = time_us([&] { gemm_run(&g, i, g_a, g_b, g_c); });
        if (i == 0) {
            o.first_us = us;
            cudaCheck(cudaMemcpy(g_c0, g_c, cn * 2, cudaMemcpyDeviceToDevice));
        }
        if (us < o.best_us) o.best_us = us, o.best_idx = i;
    }
    gemm_run(&g, o.best_idx, g_a, g_b, g_c);
    std::vector<uint16_t> h0(cn), h1(cn);
    cudaCheck(cudaMemcpy(h0.data(), g_c0, cn * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h1.data(), g_c, cn * 2, cudaMemcpyDeviceToHost));
    bool same = memcmp(h0.data(), h1.data(), cn * 2) == 0;
    const cublasLtMatmulAlgo_t *fa = &g.algos[0].algo, *ba = &g.algos[o.best_idx].algo;
    printf("ALGO %-34s m %6lld n %6lld k %6lld  first %8.1f us %6.1f TF/s  best %8.1f us %6.1f TF/s"
           " (#%d of %zu, %+.1f%%) same_bits %d  tile %u/%u stages %u/%u splitk %u/%u\n",
           name, (long long)m, (long long)n, (long long)k, o.first_us, flop / o.first_us / 1e6,
           o.best_us, flop / o.best_us / 1e6, o.best_idx, g.algos.size(),
           100.0 * (o.first_us / o.best_us - 1.0), (int)same,
           algo_attr(fa, CUBLASLT_ALGO_CONFIG_TILE_ID), algo_attr(ba, CUBLASLT_ALGO_CONFIG_TILE_ID),
           algo_attr(fa, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           algo_attr(ba, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           algo_attr(fa, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           algo_attr(ba, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
    fflush(stdout);
    cublasLtMatrixLayoutDestroy(g.la);
    cublasLtMatrixLayoutDestroy(g.lb);
    cublasLtMatrixLayoutDestroy(g.lc);
    cublasLtMatmulDescDestroy(g.op);
    return o;
}

struct proj {
    const char *name;
    int64_t out, in;
};

/* One model's projections at m rows: whole-weight products forward and backward, and for weights
 * over the tile limit the engine's pieces (cuda_memory_plan.c, linked in: per-piece time x
 * pieces). */
static void model_shapes(const char *model, int64_t m, const proj *p, int np, double *sum_first,
                         double *sum_best)
{
    char name[96];
    for (int i = 0; i < np; i++) {
        int64_t rows = p[i].out, cols = p[i].in;
        snprintf(name, sizeof name, "%s.%s.fwd.m%lld", model, p[i].name, (long long)m);
        sweep_out f = sweep(name, m, rows, cols, true);
        snprintf(name, sizeof name, "%s.%s.bwd.m%lld", model, p[i].name, (long long)m);
        sweep_out b = sweep(name, m, cols, rows, false);
        *sum_first += f.first_us + b.first_us;
        *sum_best += f.best_us + b.best_us;
        if (rows * cols > tdm_cuda_dequant_tile_elems()) {
            int64_t tr = tdm_cuda_tile_rows(rows, cols);
            int64_t pieces = (rows + tr - 1) / tr;
            snprintf(name, sizeof name, "%s.%s.fwd-tile%lld.m%lld", model, p[i].name,
                     (long long)tr, (long long)m);
            sweep_out ft = sweep(name, m, tr, cols, true);
            int64_t sc = tdm_cuda_slab_cols(rows, cols);
            sweep_out bt = {0, 0, 0};
            int64_t slabs = 0;
            if (sc > 0) {
                slabs = (cols + sc - 1) / sc;
                snprintf(name, sizeof name, "%s.%s.bwd-slab%lld.m%lld", model, p[i].name,
                         (long long)sc, (long long)m);
                /* a slab of W's columns, all rows: dX's column block = dY (m, rows) . W[:, slab];
                 * W's row stride is cols in the engine; here the slab is dense (its copy) */
                bt = sweep(name, m, sc, rows, false);
            }
            printf("CUT %s.%s m %lld: fwd %lld tiles of %lld rows %.1f us (whole %.1f, first algo), "
                   "bwd %lld slabs of %lld cols %.1f us (whole %.1f)\n",
                   model, p[i].name, (long long)m, (long long)pieces, (long long)tr,
                   ft.first_us * pieces, f.first_us, (long long)slabs, (long long)sc,
                   bt.first_us * slabs, b.first_us);
        }
    }
}

static void dequant_vs_copy(const char *name, int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    std::vector<uint8_t> codes(n / 2), aq(n / 64);
    for (auto &c : codes) c = (uint8_t)(urand() * 256);
    for (auto &c : aq) c = (uint8_t)(urand() * 256);
    std::vector<float> a2(n / 64 / 256 + 1);
    for (auto &x : a2) x = 0.01f + (float)urand();
    uint8_t *d_codes, *d_aq;
    float *d_a2;
    cudaCheck(cudaMalloc(&d_codes, codes.size()));
    cudaCheck(cudaMalloc(&d_aq, aq.size()));
    cudaCheck(cudaMalloc(&d_a2, a2.size() * 4));
    cudaCheck(cudaMemcpy(d_codes, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_aq, aq.data(), aq.size(), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_a2, a2.data(), a2.size() * 4, cudaMemcpyHostToDevice));
    nf4_args a = {};
    a.codes = d_codes, a.absmax_q = d_aq, a.absmax2 = d_a2, a.offset = 0.01f, a.e0 = 0, a.n = n;
    double bytes = n * 2.0 + n / 2.0 + n / 64.0;
    char shape[64];
    snprintf(shape, sizeof shape, "%s_%lldx%lld", name, (long long)rows, (long long)cols);
    double us = time_us([&] {
        nf4_dequant_v5<<<nf4_dequant_v5_blocks(n), 256>>>(a, g_c);
    });
    result("dequant", "v5", shape, us, "GB/s", bytes / us / 1e3, 0, true);
    int sms = 0;
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int per_sm : {4, 8, 16}) {
        char v[32];
        snprintf(v, sizeof v, "v5-grid%dxSM", per_sm);
        unsigned blocks = std::min<unsigned>(nf4_dequant_v5_blocks(n), (unsigned)(sms * per_sm));
        double u = time_us([&] { nf4_dequant_v5<<<blocks, 256>>>(a, g_c); });
        result("dequant", v, shape, u, "GB/s", bytes / u / 1e3, 0, true);
    }
    /* the roof: a copy that reads and writes the same bf16 bytes (2n read + 2n written would be
     * more traffic than the dequantization's n/2 read + 2n written: copy n*1.25 bytes) */
    size_t cb = (size_t)(n * 1.25);
    double uc = time_us([&] { cudaCheck(cudaMemcpyAsync(g_c0, g_a, cb, cudaMemcpyDeviceToDevice)); });
    result("dequant", "memcpy-same-bytes", shape, uc, "GB/s", 2.0 * cb / uc / 1e3, 0, true);
    cudaFree(d_codes), cudaFree(d_aq), cudaFree(d_a2);
}

int main(int argc, char **argv)
{
    dev_parse_args(argc, argv);
    dev_header("gemm_algos");
    LT_CHECK(cublasLtCreate(&g_lt));
    cudaCheck(cudaMalloc(&g_ws, WS_BYTES));
    cudaCheck(cudaMalloc(&g_a, MAX_ELEMS * 2));
    cudaCheck(cudaMalloc(&g_b, MAX_ELEMS * 2));
    cudaCheck(cudaMalloc(&g_c, MAX_ELEMS * 2));
    cudaCheck(cudaMalloc(&g_c0, MAX_ELEMS * 2));
    {
        std::vector<float> h((size_t)1 << 24);
        for (auto &x : h) x = rnd1(0.05f);
        __nv_bfloat16 *t = to_device<__nv_bfloat16>(h);
        for (size_t off = 0; off < MAX_ELEMS; off += h.size()) {
            cudaCheck(cudaMemcpy(g_a + off, t, h.size() * 2, cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemcpy(g_b + off, t, h.size() * 2, cudaMemcpyDeviceToDevice));
        }
        cudaFree(t);
    }
    float code[16] = {-1.0f, -0.6961928f, -0.5250731f, -0.3949175f, -0.2844414f, -0.1847734f,
                      -0.0910500f, 0.0f, 0.0795803f, 0.1609302f, 0.2461123f, 0.3379152f,
                      0.4407098f, 0.5626170f, 0.7229568f, 1.0f};
    float dmap[256];
    for (int i = 0; i < 256; i++) dmap[i] = (i - 128) / 128.0f;
    cudaCheck(cudaMemcpyToSymbol(nf4_code_c, code, sizeof code));
    cudaCheck(cudaMemcpyToSymbol(nf4_dmap_c, dmap, sizeof dmap));

    const proj p7[] = {{"q", 3584, 3584}, {"kv", 512, 3584}, {"o", 3584, 3584},
                       {"gate", 18944, 3584}, {"down", 3584, 18944}};
    const proj p15[] = {{"q", 1536, 1536}, {"kv", 256, 1536}, {"o", 1536, 1536},
                        {"gate", 8960, 1536}, {"down", 1536, 8960}};
    const proj p05[] = {{"q", 896, 896}, {"kv", 128, 896}, {"o", 896, 896},
                        {"gate", 4864, 896}, {"down", 896, 4864}};
    double f = 0, b = 0;
    model_shapes("7b", 2048, p7, 5, &f, &b);
    printf("SUM 7b m2048 (q kv o gate down, fwd+bwd, whole weights) first %.1f us best %.1f us\n",
           f, b);
    f = b = 0;
    model_shapes("1.5b", 6144, p15, 5, &f, &b);
    printf("SUM 1.5b m6144 first %.1f us best %.1f us\n", f, b);
    f = b = 0;
    model_shapes("0.5b", 4096, p05, 5, &f, &b);
    printf("SUM 0.5b m4096 first %.1f us best %.1f us\n", f, b);
    /* merged projections: q,k,v as one (7B: 3584 + 2 x 512 rows) and gate,up as one */
    sweep("7b.qkv-merged.fwd.m2048", 2048, 4608, 3584, true);
    sweep("7b.qkv-merged.bwd.m2048", 2048, 3584, 4608, false);
    sweep("7b.gateup-merged.bwd.m2048", 2048, 3584, 37888, false);
    sweep("1.5b.qkv-merged.fwd.m6144", 6144, 2048, 1536, true);
    sweep("1.5b.qkv-merged.bwd.m6144", 6144, 1536, 2048, false);
    sweep("1.5b.gateup-merged.fwd.m6144", 6144, 17920, 1536, true);
    sweep("1.5b.gateup-merged.bwd.m6144", 6144, 1536, 17920, false);
    /* the cross-entropy's products: 441-row chunks of the 7B vocabulary, 1.5B's 441 */
    sweep("7b.lm_head.fwd.m441", 441, 152064, 3584, true);
    sweep("7b.lm_head.bwd.m441", 441, 3584, 152064, false);
    sweep("1.5b.lm_head.fwd.m441", 441, 151936, 1536, true);
    sweep("1.5b.lm_head.bwd.m441", 441, 1536, 151936, false);
    sweep("square8192", 8192, 8192, 8192, true);
    dequant_vs_copy("7b.gate-tile", 6336, 3584);
    dequant_vs_copy("7b.gate", 18944, 3584);
    dequant_vs_copy("7b.q", 3584, 3584);
    dequant_vs_copy("1.5b.gate", 8960, 1536);
    return 0;
}
