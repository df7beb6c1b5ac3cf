/* model.c — loading the frozen base onto a backend, LoRA adapters, and the fused forward +
 * hand-written backward (see model.h; activations kept for backward: docs/engine.md). */
#include "engine/model.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cpu/cpu_memory_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dropout.h"
#include "engine/rope.h"
#include "model/layout.h"
#include "model/nf4.h"
#include "model/weights.h"
#include "util/fault.h"
#include "util/timeutil.h"

#define NT TDM_LORA_N_TARGETS

/* ------------------------------------------------------------ model state ---- */

typedef struct layer_weights {
    float *in_norm, *post_norm; /* (H) */
    float *q_norm, *k_norm;     /* (head_dim), Qwen3 */
    tdm_be_weight w[NT];        /* projections, indexed by tdm_lora_target */
    float *bias[NT];            /* q, k, v (qkv_bias), o (o_bias); NULL otherwise */
} layer_weights;

/* Activations of one layer kept for its backward. */
typedef struct acts {
    float *rstd1, *rstd2;   /* (M) */
    float *rstd_q, *rstd_k; /* (M * heads), (M * kv_heads): Qwen3 q/k norms */
    float *lse;             /* (heads, M) */
    void *xn1;              /* (M, H) normed layer input: q/k/v input */
    void *q_pre, *k_pre;    /* (M, Q), (M, K): q/k before their norm (Qwen3) */
    void *q, *k, *v;        /* (M, Q), (M, K), (M, K): after norm and RoPE */
    void *attn;             /* (M, Q): attention output = o_proj input */
    void *x_mid;            /* (M, H): residual after attention */
    void *xn2;              /* (M, H): normed, gate/up input */
    void *g, *u;            /* (M, I): gate and up outputs */
    float *U[NT];           /* (M, u_ld) f32: x A^T of each module some adapter targets */
} acts;

/* Groups of a layer's activations that a training step keeps per layer (workspace.keep); what a
 * layer does not keep lives in one copy shared by all layers and is recomputed in backward from
 * what it keeps (recompute_layer). docs/engine.md, "Recompute". */
enum {
    KEEP_SMALL = 1u << 0, /* rstd1, rstd2 and the U of every targeted module (f32, rows x rank) */
    KEEP_XN1 = 1u << 1,   /* xn1 */
    KEEP_QKV = 1u << 2,   /* q, k, v (and q_pre, k_pre, rstd_q, rstd_k with q/k norms) */
    KEEP_ATTN = 1u << 3,  /* attn, lse */
    KEEP_XMID = 1u << 4,  /* x_mid */
    KEEP_XN2 = 1u << 5,   /* xn2 */
    KEEP_GU = 1u << 6,    /* g, u */
    KEEP_ALL = (1u << 7) - 1,
};

/* What a training step keeps per layer: everything without checkpointing, else by o->recompute. */
static unsigned keep_of(const tdm_model_opts *o)
{
    if (!o->grad_checkpoint) return KEEP_ALL;
    switch (o->recompute) {
    case TDM_RECOMPUTE_MLP: /* the two norms are recomputed too: elementwise, nearly free */
        return KEEP_SMALL | KEEP_QKV | KEEP_ATTN | KEEP_XMID;
    case TDM_RECOMPUTE_ATTN:
        return KEEP_SMALL | KEEP_ATTN | KEEP_XMID | KEEP_GU;
    case TDM_RECOMPUTE_LAYER:
    default:
        return 0;
    }
}

/* Rows of one MLP block for a step of M rows. */
static int64_t mlp_rows_of(const tdm_model_opts *o, int64_t M)
{
    int64_t r = o->mlp_block_rows > 0 ? o->mlp_block_rows : TDM_MLP_BLOCK_ROWS;
    return M < r ? M : r;
}

static const char *const recompute_names[] = {"layer", "mlp", "attn"};

bool tdm_recompute_parse(const char *s, tdm_recompute *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, recompute_names[i])) {
            *out = (tdm_recompute)i;
            return true;
        }
    return false;
}

const char *tdm_recompute_name(tdm_recompute r)
{
    return (unsigned)r < 3 ? recompute_names[r] : "?";
}

/* Device workspace of a step, carved out of one allocation. */
typedef struct workspace {
    int64_t m, cu_cap, u_ld;
    unsigned tmask;
    int n_sets;    /* L (a training step) or 1 (forward only) */
    unsigned keep; /* the KEEP_* groups each set keeps (0 forward only); the rest is shared */
    int64_t mlp_rows; /* rows of one MLP block (mlp_block_rows): g, u unkept, d1, d2, hre */
    bool offload;     /* opts.offload_activations: x in two device slots, kept in host memory */
    void *base;
    uint64_t bytes;
    void **x;   /* (L + 1) x (M, H): each layer's input, x[L] the final norm's input; with
                 * offload x[l] is slot l % 2 of two */
    void *host; /* with offload and a training shape: (L - 1) x (M, H), host copies of x[0..L-2] */
    uint64_t host_bytes;
    acts *sets; /* L sets (their unkept tensors one shared copy), or 1 set (forward only) */
    void *dres, *dxn, *dattn, *dq, *dk, *dv, *hf; /* (M, H or Q or K) */
    void *d1, *d2, *hre;                          /* (mlp_rows, I) */
    float *rstd_f, *loss, *lw;
    int32_t *tokens, *labels, *pos, *cu;
} workspace;

struct tdm_model {
    tdm_backend *be;
    tdm_model_config cfg;
    tdm_model_opts opts;
    tdm_be_dtype act, dense;
    tdm_be_weight embed, lm_head;
    float *final_norm;
    float *inv_freq; /* (head_dim / 2) */
    layer_weights *layers;
    void **bufs; /* every device allocation of the weights */
    size_t n_bufs, cap_bufs;
    uint64_t weight_bytes;
    tdm_model_load_times load_times;
    workspace ws;
};

const tdm_model_config *tdm_model_get_config(const tdm_model *m)
{
    return &m->cfg;
}

tdm_backend *tdm_model_backend(const tdm_model *m)
{
    return m->be;
}

uint64_t tdm_model_weight_bytes(const tdm_model *m)
{
    return m->weight_bytes;
}

const tdm_model_load_times *tdm_model_get_load_times(const tdm_model *m)
{
    return &m->load_times;
}

static double seconds_since(int64_t *t0)
{
    int64_t now = tdm_now_mono_ns();
    double s = (double)(now - *t0) * 1e-9;
    *t0 = now;
    return s;
}

uint64_t tdm_model_activation_bytes(const tdm_model *m)
{
    return m->ws.bytes;
}

uint64_t tdm_model_host_activation_bytes(const tdm_model *m)
{
    return m->ws.host_bytes;
}

void tdm_model_target_shape(const tdm_model *m, tdm_lora_target t, int64_t *in, int64_t *out)
{
    const tdm_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size, Q = c->num_heads * c->head_dim,
            K = c->num_kv_heads * c->head_dim;
    switch (t) {
    case TDM_LORA_Q:
        *in = H, *out = Q;
        return;
    case TDM_LORA_K:
    case TDM_LORA_V:
        *in = H, *out = K;
        return;
    case TDM_LORA_O:
        *in = Q, *out = H;
        return;
    case TDM_LORA_GATE:
    case TDM_LORA_UP:
        *in = H, *out = I;
        return;
    case TDM_LORA_DOWN:
    default:
        *in = I, *out = H;
        return;
    }
}

static tdm_status dev_alloc(tdm_model *m, tdm_be_dtype dt, int64_t n, void **out, tdm_error *err)
{
    if (m->n_bufs == m->cap_bufs) {
        size_t cap = m->cap_bufs ? 2 * m->cap_bufs : 64;
        void **nb = realloc(m->bufs, cap * sizeof *nb);
        if (!nb) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        m->bufs = nb, m->cap_bufs = cap;
    }
    TDM_TRY(tdm_be_alloc(m->be, dt, n, out, err));
    m->bufs[m->n_bufs++] = *out;
    m->weight_bytes += (uint64_t)n * tdm_be_dtype_size(dt);
    return TDM_OK;
}

/* Uploads host f32 data as a device array of dtype dt. */
static tdm_status put(tdm_model *m, const float *host, int64_t n, tdm_be_dtype dt, void **out,
                      tdm_error *err)
{
    TDM_TRY(dev_alloc(m, dt, n, out, err));
    return tdm_be_upload_f32(m->be, *out, dt, host, n, err);
}

/* The double-quantized absmax of an NF4 weight onto the device: absmax_q (nblocks u8), absmax2
 * (ceil(nblocks / 256) f32) and offset into w, which becomes NF4_DQ. */
static tdm_status put_absmax_dq(tdm_model *m, const uint8_t *absmax_q, const float *absmax2,
                                int64_t nblocks, float offset, tdm_be_weight *w, tdm_error *err)
{
    void *aq = NULL, *a2 = NULL;
    int64_t n2 = (nblocks + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK;
    w->format = TDM_BE_W_NF4_DQ;
    tdm_status st = dev_alloc(m, TDM_BE_U8, nblocks, &aq, err);
    if (st == TDM_OK) st = tdm_be_upload(m->be, aq, absmax_q, (size_t)nblocks, err);
    if (st == TDM_OK) st = put(m, absmax2, n2, TDM_BE_F32, &a2, err);
    w->absmax_q = aq, w->absmax2 = a2, w->offset = offset;
    return st;
}

/* The dtype the embedding table and the lm_head are stored in: the dense dtype (the activation
 * dtype), except qlora on a backend computing in f32 (the CPU) with a bf16 checkpoint: bf16,
 * exactly as the checkpoint stores them (the CPU's kernels widen each tile as they pack it:
 * the same bits as f32 copies), half the memory of f32. They are the bulk of what qlora does not
 * quantize (at Qwen2.5-0.5B the tied table is 27 % of the parameters: 545 MB in f32). Not with
 * o->dense_embed (generation). */
static tdm_be_dtype embed_dtype(const tdm_model_config *c, const tdm_model_opts *o,
                                tdm_be_dtype dense)
{
    bool as_stored = o->nf4 && !o->dense_embed && dense == TDM_BE_F32 &&
                     strcmp(c->torch_dtype, "bfloat16") == 0;
    return as_stored ? TDM_BE_BF16 : dense;
}

/* Fills a frozen weight descriptor from host f32 data: NF4 (quantized here) or dense in dtype
 * dense (F32 or BF16). */
static tdm_status put_weight(tdm_model *m, const float *host, int64_t rows, int64_t cols,
                             bool quantize, tdm_be_dtype dense, tdm_be_weight *w, tdm_error *err)
{
    memset(w, 0, sizeof *w);
    w->rows = rows, w->cols = cols;
    if (!quantize) {
        w->format = dense == TDM_BE_F32 ? TDM_BE_W_F32 : TDM_BE_W_BF16;
        int64_t t0 = tdm_now_mono_ns();
        tdm_status st = put(m, host, rows * cols, dense, (void **)&w->data, err);
        m->load_times.upload_s += seconds_since(&t0);
        return st;
    }
    tdm_nf4 q;
    int64_t t0 = tdm_now_mono_ns();
    TDM_TRY(tdm_nf4_quantize(host, rows * cols, m->opts.double_quant, &q, err));
    m->load_times.quantize_s += seconds_since(&t0);
    tdm_status st;
    void *codes = NULL;
    st = dev_alloc(m, TDM_BE_U8, (q.numel + 1) / 2, &codes, err);
    if (st == TDM_OK) st = tdm_be_upload(m->be, codes, q.packed, (size_t)(q.numel + 1) / 2, err);
    w->codes = codes;
    if (st == TDM_OK && q.double_quant) {
        st = put_absmax_dq(m, q.absmax_q, q.absmax2, q.nblocks, q.offset, w, err);
    } else if (st == TDM_OK) {
        void *am = NULL;
        w->format = TDM_BE_W_NF4;
        st = put(m, q.absmax, q.nblocks, TDM_BE_F32, &am, err);
        w->absmax = am;
    }
    tdm_nf4_free(&q);
    m->load_times.upload_s += seconds_since(&t0);
    return st;
}

/* The device staging of tdm_be_quantize_nf4: a tensor's bytes and, with double quantization,
 * its first-level absmax; grown to the largest tensor, freed at the end of the load (before the
 * activation workspace exists, so it never raises the peak a plan accounts for). */
typedef struct quant_staging {
    void *src, *absmax;
    size_t src_bytes, absmax_bytes;
} quant_staging;

static void quant_staging_free(tdm_backend *be, quant_staging *q)
{
    tdm_be_free(be, q->src);
    tdm_be_free(be, q->absmax);
    memset(q, 0, sizeof *q);
}

static tdm_status staging_grow(tdm_backend *be, void **buf, size_t *cap, size_t bytes,
                               tdm_error *err)
{
    if (bytes <= *cap) return TDM_OK;
    tdm_be_free(be, *buf);
    *buf = NULL, *cap = 0;
    TDM_TRY(tdm_be_alloc(be, TDM_BE_U8, (int64_t)bytes, buf, err));
    *cap = bytes;
    return TDM_OK;
}

/* Whether tensor t is quantized on the device (the backend can, and t's bytes are floats). */
static bool quantizes_on_device(const tdm_model *m, const tdm_st_tensor *t, tdm_be_src_dtype *kind)
{
    if (!tdm_be_has_quantize_nf4(m->be)) return false;
    switch (t->dtype) {
    case TDM_DTYPE_F32: *kind = TDM_BE_SRC_F32; return true;
    case TDM_DTYPE_BF16: *kind = TDM_BE_SRC_BF16; return true;
    case TDM_DTYPE_F16: *kind = TDM_BE_SRC_F16; return true;
    default: return false;
    }
}

/* put_weight's NF4 case on the device: t's bytes uploaded as stored, quantized there. */
static tdm_status put_weight_quantized_on_device(tdm_model *m, const tdm_st_tensor *t,
                                                 tdm_be_src_dtype kind, int64_t rows,
                                                 int64_t cols, quant_staging *qs,
                                                 tdm_be_weight *w, tdm_error *err)
{
    memset(w, 0, sizeof *w);
    w->rows = rows, w->cols = cols;
    int64_t n = rows * cols, nblocks = (n + TDM_NF4_BLOCK - 1) / TDM_NF4_BLOCK;
    int64_t t0 = tdm_now_mono_ns();
    void *codes = NULL, *absmax = NULL;
    TDM_TRY(staging_grow(m->be, &qs->src, &qs->src_bytes, t->nbytes, err));
    TDM_TRY(tdm_be_upload(m->be, qs->src, t->data, t->nbytes, err));
    m->load_times.read_s += seconds_since(&t0); /* the upload faults the mapped file in */
    TDM_TRY(dev_alloc(m, TDM_BE_U8, (n + 1) / 2, &codes, err));
    w->codes = codes;
    if (!m->opts.double_quant) {
        TDM_TRY(dev_alloc(m, TDM_BE_F32, nblocks, &absmax, err));
        TDM_TRY(tdm_be_quantize_nf4(m->be, qs->src, kind, n, codes, absmax, err));
        w->format = TDM_BE_W_NF4, w->absmax = absmax;
        TDM_TRY(tdm_be_synchronize(m->be, err));
        m->load_times.quantize_s += seconds_since(&t0);
        return TDM_OK;
    }
    TDM_TRY(staging_grow(m->be, &qs->absmax, &qs->absmax_bytes, (size_t)nblocks * sizeof(float),
                         err));
    TDM_TRY(tdm_be_quantize_nf4(m->be, qs->src, kind, n, codes, qs->absmax, err));
    /* the second level on the host (1/64 of the elements), as tdm_nf4_quantize does it */
    int64_t n2 = (nblocks + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK;
    float *absmax_h = malloc((size_t)nblocks * sizeof(float));
    uint8_t *absmax_q = malloc((size_t)nblocks);
    float *absmax2 = malloc((size_t)n2 * sizeof(float));
    tdm_status st = absmax_h && absmax_q && absmax2
                        ? tdm_be_download(m->be, absmax_h, qs->absmax,
                                          (size_t)nblocks * sizeof(float), err)
                        : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    if (st == TDM_OK) {
        float offset;
        tdm_nf4_double_quantize(absmax_h, nblocks, absmax_q, absmax2, &offset);
        m->load_times.quantize_s += seconds_since(&t0);
        st = put_absmax_dq(m, absmax_q, absmax2, nblocks, offset, w, err);
    }
    free(absmax_h);
    free(absmax_q);
    free(absmax2);
    TDM_TRY(st);
    m->load_times.upload_s += seconds_since(&t0);
    return TDM_OK;
}

static void ws_free(tdm_model *m);

void tdm_model_free(tdm_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_bufs; i++)
        tdm_be_free(m->be, m->bufs[i]);
    ws_free(m);
    free(m->bufs);
    free(m->layers);
    free(m);
}

/* Which projection a layout name is, or -1. */
static int target_of(const char *name)
{
    for (int t = 0; t < NT; t++) {
        char suffix[64];
        snprintf(suffix, sizeof suffix, ".%s.weight", tdm_lora_target_path(t));
        size_t n = strlen(name), k = strlen(suffix);
        if (n > k && strcmp(name + n - k, suffix) == 0) return t;
    }
    return -1;
}

static int bias_target_of(const char *name)
{
    for (int t = 0; t < NT; t++) {
        char suffix[64];
        snprintf(suffix, sizeof suffix, ".%s.bias", tdm_lora_target_path(t));
        size_t n = strlen(name), k = strlen(suffix);
        if (n > k && strcmp(name + n - k, suffix) == 0) return t;
    }
    return -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

tdm_status tdm_model_load(tdm_model **out, tdm_backend *be, const char *dir,
                          const tdm_model_opts *opts, tdm_error *err)
{
    *out = NULL;
    tdm_model *m = calloc(1, sizeof *m);
    if (!m) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    m->be = be;
    if (opts) m->opts = *opts;
    m->act = tdm_be_act_dtype(be);
    m->dense = m->act;
    int64_t t_start = tdm_now_mono_ns();
    tdm_weights w = {0};
    tdm_tensor_desc *layout = NULL;
    float *host = NULL;
    size_t n_layout = 0;
    tdm_status st = tdm_model_config_load(&m->cfg, dir, err);
    if (st == TDM_OK) st = tdm_weights_open(&w, dir, err);
    if (st == TDM_OK) st = tdm_model_check_weights(&m->cfg, &w, NULL, err);
    if (st == TDM_OK) st = tdm_model_layout(&m->cfg, &layout, &n_layout, err);
    const tdm_model_config *c = &m->cfg;
    if (st == TDM_OK && c->head_dim % 2 != 0)
        st = tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: head_dim %lld is odd (RoPE needs pairs)", dir,
                      (long long)c->head_dim);
    if (st == TDM_OK && !(m->layers = calloc((size_t)c->num_layers, sizeof *m->layers)))
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int64_t max_numel = 0;
    for (size_t i = 0; st == TDM_OK && i < n_layout; i++) {
        int64_t n = layout[i].shape[0] * (layout[i].rank == 2 ? layout[i].shape[1] : 1);
        if (n > max_numel) max_numel = n;
    }
    if (st == TDM_OK && !(host = malloc((size_t)max_numel * sizeof(float))))
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a %lld-element tensor",
                      (long long)max_numel);
    quant_staging qs = {0};
    for (size_t i = 0; st == TDM_OK && i < n_layout; i++) {
        const tdm_tensor_desc *d = &layout[i];
        const tdm_st_tensor *t = tdm_weights_find(&w, d->name);
        tdm_be_src_dtype kind;
        if (d->role == TDM_ROLE_LINEAR && m->opts.nf4 && quantizes_on_device(m, t, &kind)) {
            st = put_weight_quantized_on_device(m, t, kind, d->shape[0], d->shape[1], &qs,
                                                &m->layers[d->layer].w[target_of(d->name)], err);
            if (st != TDM_OK) tdm_error_prefix(err, "%s", d->name);
            continue;
        }
        int64_t t0 = tdm_now_mono_ns();
        st = tdm_st_tensor_to_f32(t, host, err);
        m->load_times.read_s += seconds_since(&t0);
        if (st != TDM_OK) {
            tdm_error_prefix(err, "%s", d->name);
            break;
        }
        int64_t rows = d->shape[0], cols = d->rank == 2 ? d->shape[1] : 1;
        layer_weights *L = d->layer >= 0 ? &m->layers[d->layer] : NULL;
        switch (d->role) {
        case TDM_ROLE_EMBED:
            st = put_weight(m, host, rows, cols, false, embed_dtype(c, &m->opts, m->dense),
                            &m->embed, err);
            break;
        case TDM_ROLE_LM_HEAD:
            st = put_weight(m, host, rows, cols, false, embed_dtype(c, &m->opts, m->dense),
                            &m->lm_head, err);
            break;
        case TDM_ROLE_LINEAR: {
            int tg = target_of(d->name);
            st = put_weight(m, host, rows, cols, m->opts.nf4, m->dense, &L->w[tg], err);
            /* the CPU's own GEMMs read W^T in panels: laid out once here, not per product */
            if (st == TDM_OK)
                st = tdm_be_lay_out_frozen(m->be, &L->w[tg], TDM_BE_FROZEN_PROJECTION, err);
            break;
        }
        case TDM_ROLE_BIAS:
            st = put(m, host, rows, TDM_BE_F32, (void **)&L->bias[bias_target_of(d->name)], err);
            break;
        case TDM_ROLE_NORM: {
            float **slot = !L                                                      ? &m->final_norm
                           : ends_with(d->name, "input_layernorm.weight")          ? &L->in_norm
                           : ends_with(d->name, "post_attention_layernorm.weight") ? &L->post_norm
                           : ends_with(d->name, "q_norm.weight")                   ? &L->q_norm
                                                                                   : &L->k_norm;
            st = put(m, host, rows, TDM_BE_F32, (void **)slot, err);
            break;
        }
        }
    }
    /* the lm_head in the panels the CPU's logits GEMM reads (the embedding table too when the
     * two are one tensor: the embedding reads its rows from the panels) */
    if (st == TDM_OK)
        st = tdm_be_lay_out_frozen(be, c->tie_word_embeddings ? &m->embed : &m->lm_head,
                                   TDM_BE_FROZEN_LM_HEAD, err);
    if (st == TDM_OK && c->tie_word_embeddings) m->lm_head = m->embed;
    if (st == TDM_OK) {
        tdm_rope_inv_freq(c, host);
        st = put(m, host, c->head_dim / 2, TDM_BE_F32, (void **)&m->inv_freq, err);
    }
    quant_staging_free(be, &qs);
    free(host);
    free(layout);
    tdm_weights_close(&w);
    if (st != TDM_OK) {
        tdm_model_free(m);
        return st;
    }
    m->load_times.total_s = seconds_since(&t_start);
    *out = m;
    return TDM_OK;
}

/* ---------------------------------------------------------------- adapters ---- */

tdm_status tdm_lora_create(tdm_lora **out, tdm_model *m, int64_t rank, float scale,
                           unsigned targets, tdm_error *err)
{
    *out = NULL;
    if (rank < 1 || rank > 65536)
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA rank %lld outside [1, 65536]", (long long)rank);
    if (targets == 0 || targets >= (1u << NT))
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA targets: none or unknown");
    int64_t L = m->cfg.num_layers;
    tdm_lora *a = calloc(1, sizeof *a);
    if (!a) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    a->model = m, a->rank = rank, a->scale = scale, a->targets = targets;
    a->a_off = malloc((size_t)(L * NT) * sizeof(int64_t));
    a->b_off = malloc((size_t)(L * NT) * sizeof(int64_t));
    if (!a->a_off || !a->b_off) {
        tdm_lora_free(a);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    int64_t n = 0;
    for (int64_t l = 0; l < L; l++)
        for (int t = 0; t < NT; t++) {
            a->a_off[l * NT + t] = a->b_off[l * NT + t] = -1;
            if (!(targets & TDM_LORA_BIT(t))) continue;
            int64_t in, o;
            tdm_model_target_shape(m, (tdm_lora_target)t, &in, &o);
            a->a_off[l * NT + t] = n;
            n += rank * in;
            a->b_off[l * NT + t] = n;
            n += o * rank;
        }
    a->n_params = n;
    tdm_status st = tdm_be_alloc(m->be, TDM_BE_F32, n, (void **)&a->params, err);
    if (st == TDM_OK) st = tdm_be_alloc(m->be, TDM_BE_F32, n, (void **)&a->grads, err);
    if (st == TDM_OK) st = tdm_be_alloc(m->be, TDM_BE_F32, n, (void **)&a->adam_m, err);
    if (st == TDM_OK) st = tdm_be_alloc(m->be, TDM_BE_F32, n, (void **)&a->adam_v, err);
    if (st != TDM_OK) {
        tdm_lora_free(a);
        return st;
    }
    *out = a;
    return TDM_OK;
}

uint64_t tdm_lora_dropout_seed(uint64_t seed, int64_t step, int64_t micro)
{
    /* a tag keeps this stream apart from other uses of the same user seed */
    uint64_t k = tdm_dropout_derive(seed, 0x4c6f524144726f70ull /* "LoRADrop" */);
    return tdm_dropout_derive(tdm_dropout_derive(k, (uint64_t)step), (uint64_t)micro);
}

uint64_t tdm_lora_dropout_module_seed(uint64_t step_seed, int layer, tdm_lora_target t)
{
    return tdm_dropout_derive(tdm_dropout_derive(step_seed, (uint64_t)layer), (uint64_t)t);
}

void tdm_lora_free(tdm_lora *a)
{
    if (!a) return;
    tdm_backend *be = a->model->be;
    tdm_be_free(be, a->params);
    tdm_be_free(be, a->grads);
    tdm_be_free(be, a->adam_m);
    tdm_be_free(be, a->adam_v);
    free(a->a_off);
    free(a->b_off);
    free(a);
}

static tdm_status lora_module(tdm_lora *a, int layer, tdm_lora_target t, int64_t *na, int64_t *nb,
                              int64_t *ao, int64_t *bo, tdm_error *err)
{
    *na = *nb = 0, *ao = *bo = -1; /* set on every path (-O3 -Wmaybe-uninitialized) */
    if (layer < 0 || layer >= a->model->cfg.num_layers || t >= NT)
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA module layer %d target %d out of range", layer,
                        (int)t);
    if (!(a->targets & TDM_LORA_BIT(t)))
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "the adapter does not target %s",
                        tdm_lora_target_name(t));
    int64_t in, o;
    tdm_model_target_shape(a->model, t, &in, &o);
    *na = a->rank * in, *nb = o * a->rank;
    *ao = a->a_off[layer * NT + t], *bo = a->b_off[layer * NT + t];
    return TDM_OK;
}

tdm_status tdm_lora_set(tdm_lora *a, int layer, tdm_lora_target t, const float *A, const float *B,
                        tdm_error *err)
{
    int64_t na, nb, ao, bo;
    TDM_TRY(lora_module(a, layer, t, &na, &nb, &ao, &bo, err));
    tdm_backend *be = a->model->be;
    if (A) TDM_TRY(tdm_be_upload_f32(be, a->params + ao, TDM_BE_F32, A, na, err));
    if (B) TDM_TRY(tdm_be_upload_f32(be, a->params + bo, TDM_BE_F32, B, nb, err));
    return TDM_OK;
}

static tdm_status lora_download(tdm_lora *a, const float *vec, int layer, tdm_lora_target t,
                                float *A, float *B, tdm_error *err)
{
    int64_t na, nb, ao, bo;
    TDM_TRY(lora_module(a, layer, t, &na, &nb, &ao, &bo, err));
    tdm_backend *be = a->model->be;
    if (A) TDM_TRY(tdm_be_download_f32(be, A, vec + ao, TDM_BE_F32, na, err));
    if (B) TDM_TRY(tdm_be_download_f32(be, B, vec + bo, TDM_BE_F32, nb, err));
    return TDM_OK;
}

tdm_status tdm_lora_get(tdm_lora *a, int layer, tdm_lora_target t, float *A, float *B,
                        tdm_error *err)
{
    return lora_download(a, a->params, layer, t, A, B, err);
}

tdm_status tdm_lora_get_grad(tdm_lora *a, int layer, tdm_lora_target t, float *dA, float *dB,
                             tdm_error *err)
{
    return lora_download(a, a->grads, layer, t, dA, dB, err);
}

tdm_status tdm_lora_zero_grad(tdm_lora *a, tdm_error *err)
{
    return tdm_be_fill(a->model->be, a->grads, TDM_BE_F32, a->n_params, 0.0f, err);
}

/* -------------------------------------------------------------- workspace ---- */

/* Rows of logits per cross-entropy chunk: at most 256 MiB of logits at a time. On a bf16 (GPU)
 * backend a chunk of ~110 rows of a 152K vocabulary left the device mostly idle (a skinny GEMM
 * and one block per row: 29 ms of a 116 ms qwen2.5-0.5b step on the H200, 2026-12-01 profile);
 * on the CPU every chunk streams the whole lm_head through the caches twice (logits, then dH),
 * so 4x fewer chunks are 4x less of that traffic. act: the backend's activation dtype (unused:
 * the same rows on both). */
static int64_t ce_chunk_rows(const tdm_model_config *c, tdm_be_dtype act)
{
    (void)act;
    int64_t chunk = ((int64_t)1 << 26) / c->vocab_size;
    return chunk < 1 ? 1 : chunk;
}

typedef struct carver {
    char *base;
    uint64_t off;
} carver;

static void *carve(carver *c, int64_t n, tdm_be_dtype dt)
{
    uint64_t bytes = (uint64_t)n * tdm_be_dtype_size(dt);
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 255) / 256 * 256;
    return p;
}

/* Carves into *A the tensors of groups `groups` (KEEP_*); g and u get gu_rows rows (a kept set
 * M, the shared copy one MLP block). */
static void carve_acts(const tdm_model_config *cf, tdm_be_dtype a, const workspace *w,
                       unsigned groups, int64_t gu_rows, acts *A, carver *c)
{
    int64_t M = w->m, H = cf->hidden_size, I = cf->intermediate_size;
    int64_t Q = cf->num_heads * cf->head_dim, K = cf->num_kv_heads * cf->head_dim;
    tdm_be_dtype f = TDM_BE_F32;
    if (groups & KEEP_SMALL) {
        A->rstd1 = carve(c, M, f);
        A->rstd2 = carve(c, M, f);
    }
    if (groups & KEEP_ATTN) A->lse = carve(c, M * cf->num_heads, f);
    if (groups & KEEP_XN1) A->xn1 = carve(c, M * H, a);
    if (groups & KEEP_QKV) {
        if (cf->qk_norm) {
            A->rstd_q = carve(c, M * cf->num_heads, f);
            A->rstd_k = carve(c, M * cf->num_kv_heads, f);
            A->q_pre = carve(c, M * Q, a);
            A->k_pre = carve(c, M * K, a);
        }
        A->q = carve(c, M * Q, a);
        A->k = carve(c, M * K, a);
        A->v = carve(c, M * K, a);
    }
    if (groups & KEEP_ATTN) A->attn = carve(c, M * Q, a);
    if (groups & KEEP_XMID) A->x_mid = carve(c, M * H, a);
    if (groups & KEEP_XN2) A->xn2 = carve(c, M * H, a);
    if (groups & KEEP_GU) {
        A->g = carve(c, gu_rows * I, a);
        A->u = carve(c, gu_rows * I, a);
    }
    if (groups & KEEP_SMALL)
        for (int t = 0; t < NT; t++)
            if (w->tmask & TDM_LORA_BIT(t)) A->U[t] = carve(c, M * w->u_ld, f);
}

/* Copies into *A the pointers of *from for the groups `groups`. */
static void share_acts(const acts *from, unsigned groups, acts *A)
{
    if (groups & KEEP_SMALL) {
        A->rstd1 = from->rstd1, A->rstd2 = from->rstd2;
        memcpy(A->U, from->U, sizeof A->U);
    }
    if (groups & KEEP_XN1) A->xn1 = from->xn1;
    if (groups & KEEP_QKV) {
        A->rstd_q = from->rstd_q, A->rstd_k = from->rstd_k;
        A->q_pre = from->q_pre, A->k_pre = from->k_pre;
        A->q = from->q, A->k = from->k, A->v = from->v;
    }
    if (groups & KEEP_ATTN) A->attn = from->attn, A->lse = from->lse;
    if (groups & KEEP_XMID) A->x_mid = from->x_mid;
    if (groups & KEEP_XN2) A->xn2 = from->xn2;
    if (groups & KEEP_GU) A->g = from->g, A->u = from->u;
}

/* Lays out (or, with c->base NULL, only measures) the workspace: each layer's input, the groups
 * every layer keeps (w->keep), one shared copy of the others, then the
 * backward's scratch. */
static void ws_layout(const tdm_model_config *cf, tdm_be_dtype a, workspace *w, carver *c)
{
    int64_t M = w->m, H = cf->hidden_size, I = cf->intermediate_size;
    int64_t Q = cf->num_heads * cf->head_dim, K = cf->num_kv_heads * cf->head_dim;
    tdm_be_dtype f = TDM_BE_F32;
    void *slot[2] = {NULL, NULL};
    for (int64_t l = 0; l <= cf->num_layers; l++) {
        void *p = w->offload && l >= 2 ? slot[l % 2] : carve(c, M * H, a);
        if (l < 2) slot[l] = p;
        if (w->x) w->x[l] = p;
    }
    unsigned kept = w->keep & KEEP_ALL;
    acts shared = {0};
    carve_acts(cf, a, w, KEEP_ALL & ~kept, w->mlp_rows, &shared, c);
    for (int s = 0; s < w->n_sets; s++) {
        acts A = {0};
        carve_acts(cf, a, w, kept, M, &A, c);
        share_acts(&shared, KEEP_ALL & ~kept, &A);
        if (w->sets) w->sets[s] = A;
    }
    w->dres = carve(c, M * H, a);
    w->dxn = carve(c, M * H, a);
    w->hf = carve(c, M * H, a);
    w->d1 = carve(c, w->mlp_rows * I, a);
    w->d2 = carve(c, w->mlp_rows * I, a);
    w->hre = carve(c, w->mlp_rows * I, a);
    w->dattn = carve(c, M * Q, a);
    w->dq = carve(c, M * Q, a);
    w->dk = carve(c, M * K, a);
    w->dv = carve(c, M * K, a);
    w->rstd_f = carve(c, M, f);
    w->loss = carve(c, M, f);
    w->lw = carve(c, M, f);
    w->tokens = carve(c, M, TDM_BE_I32);
    w->labels = carve(c, M, TDM_BE_I32);
    w->pos = carve(c, M, TDM_BE_I32);
    w->cu = carve(c, w->cu_cap, TDM_BE_I32);
}

/* Host bytes of the offloaded layer inputs x[0..L-2] of a workspace (0 without offload or for
 * a forward-only shape: nothing outlives its layer there). */
static uint64_t ws_host_bytes(const tdm_model_config *cf, tdm_be_dtype a, const workspace *w)
{
    if (!w->offload || w->n_sets < 2 || cf->num_layers < 2) return 0;
    return (uint64_t)(cf->num_layers - 1) * (uint64_t)(w->m * cf->hidden_size) *
           tdm_be_dtype_size(a);
}

static void ws_free(tdm_model *m)
{
    workspace *w = &m->ws;
    tdm_be_free(m->be, w->base);
    tdm_be_host_free(m->be, w->host);
    free(w->x);
    free(w->sets);
    memset(w, 0, sizeof *w);
}

/* Makes the workspace cover `want` (its shape fields m, cu_cap, u_ld, tmask, n_sets, keep,
 * mlp_rows, offload): kept
 * when it already does, otherwise allocated again for exactly that shape. */
static tdm_status ws_ensure(tdm_model *m, const workspace *want, tdm_error *err)
{
    workspace *w = &m->ws;
    if (w->base && w->m >= want->m && w->cu_cap >= want->cu_cap && w->u_ld >= want->u_ld &&
        (w->tmask & want->tmask) == want->tmask && w->n_sets >= want->n_sets &&
        (w->keep & want->keep) == want->keep && w->mlp_rows >= want->mlp_rows &&
        w->offload == want->offload)
        return TDM_OK;
    ws_free(m);
    w->m = want->m, w->cu_cap = want->cu_cap, w->u_ld = want->u_ld, w->tmask = want->tmask;
    w->n_sets = want->n_sets, w->keep = want->keep, w->mlp_rows = want->mlp_rows;
    w->offload = want->offload;
    w->x = calloc((size_t)m->cfg.num_layers + 1, sizeof *w->x);
    w->sets = calloc((size_t)w->n_sets, sizeof *w->sets);
    if (!w->x || !w->sets) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    carver c = {NULL, 0};
    ws_layout(&m->cfg, m->act, w, &c);
    w->bytes = c.off;
    tdm_status st = tdm_be_alloc(m->be, TDM_BE_U8, (int64_t)c.off, &w->base, err);
    if (st != TDM_OK) {
        tdm_error_prefix(err, "activations for %lld rows (%.1f MiB)", (long long)w->m,
                         (double)c.off / (1 << 20));
        w->m = 0;
        return st;
    }
    c = (carver){w->base, 0};
    ws_layout(&m->cfg, m->act, w, &c);
    w->host_bytes = ws_host_bytes(&m->cfg, m->act, w);
    if (w->host_bytes > 0) {
        st = tdm_be_host_alloc(m->be, w->host_bytes, &w->host, err);
        if (st != TDM_OK) {
            tdm_error_prefix(err, "offloaded activations for %lld rows", (long long)w->m);
            ws_free(m);
            return st;
        }
    }
    return TDM_OK;
}

/* The host copy of layer input x[l] (l <= L - 2) in an offloading workspace. */
static void *ws_host_x(const tdm_model *m, int64_t l)
{
    const workspace *w = &m->ws;
    return (char *)w->host +
           (size_t)l * (size_t)(w->m * m->cfg.hidden_size) * tdm_be_dtype_size(m->act);
}

/* ------------------------------------------------------------------- a step ---- */

typedef struct step {
    tdm_model *m;
    tdm_lora *const *adapters;
    const tdm_batch *b;
    int64_t M, u_ld;
    int64_t mlp_rows;   /* rows of one MLP block (<= M) */
    tdm_lora_seg *segs; /* scratch: one table of n_segs entries */
    bool train;         /* a training step: the adapters' dropout applies */
    struct kv_step *kv; /* generation with a KV cache (tdm_model_decode), else NULL */
} step;

/* ----------------------------------------------------------- KV cache ---- */

struct tdm_kv_cache {
    tdm_model *m;
    int64_t n_slots, cap, kv_dim;
    void *base;   /* one allocation: for each layer K then V, (n_slots * cap, kv_dim) act */
    int64_t *len; /* (n_slots) host: positions cached */
};

/* What a decode step's layers need of the cache. */
typedef struct kv_step {
    tdm_kv_cache *kv;
    tdm_be_kv_seq *seqs; /* (n_seqs) host: rows, slot and start of each fed sequence */
    bool prefill;        /* every slot was empty: the training attention, then copy k, v */
} kv_step;

static void *kv_layer(tdm_kv_cache *kv, int l, int which)
{
    size_t es = tdm_be_dtype_size(kv->m->act);
    size_t per = (size_t)(kv->n_slots * kv->cap * kv->kv_dim) * es;
    return (char *)kv->base + ((size_t)l * 2 + (size_t)which) * per;
}

uint64_t tdm_kv_cache_bytes(const tdm_model_config *c, tdm_be_dtype act, int64_t n_slots,
                            int64_t cap)
{
    return 2ull * (uint64_t)c->num_layers * (uint64_t)n_slots * (uint64_t)cap *
           (uint64_t)(c->num_kv_heads * c->head_dim) * tdm_be_dtype_size(act);
}

tdm_status tdm_kv_cache_create(tdm_kv_cache **out, tdm_model *m, int64_t n_slots, int64_t cap,
                               tdm_error *err)
{
    *out = NULL;
    if (n_slots < 1 || cap < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "KV cache: %lld slots of %lld positions",
                        (long long)n_slots, (long long)cap);
    tdm_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv || !(kv->len = calloc((size_t)n_slots, sizeof *kv->len))) {
        free(kv);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    kv->m = m, kv->n_slots = n_slots, kv->cap = cap;
    kv->kv_dim = m->cfg.num_kv_heads * m->cfg.head_dim;
    uint64_t bytes = tdm_kv_cache_bytes(&m->cfg, m->act, n_slots, cap);
    tdm_status st = tdm_be_alloc(m->be, TDM_BE_U8, (int64_t)bytes, &kv->base, err);
    if (st != TDM_OK) {
        tdm_error_prefix(err, "KV cache of %lld x %lld positions (%.1f MiB)", (long long)n_slots,
                         (long long)cap, (double)bytes / (1 << 20));
        tdm_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return TDM_OK;
}

void tdm_kv_cache_free(tdm_kv_cache *kv)
{
    if (!kv) return;
    tdm_be_free(kv->m->be, kv->base);
    free(kv->len);
    free(kv);
}

void tdm_kv_cache_reset(tdm_kv_cache *kv)
{
    memset(kv->len, 0, (size_t)kv->n_slots * sizeof *kv->len);
}

int64_t tdm_kv_cache_len(const tdm_kv_cache *kv, int64_t slot)
{
    return slot >= 0 && slot < kv->n_slots ? kv->len[slot] : 0;
}

static tdm_be_seqs seqs_of(step *s);

/* Attention of layer l: the training forward over the packed sequences (and, when prefilling a
 * cache, their keys and values copied into it), or the cached decode. */
static tdm_status layer_attention(step *s, int l, acts *A, tdm_error *err)
{
    tdm_model *m = s->m;
    const tdm_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    float scale = (float)(1.0 / sqrt((double)hd));
    kv_step *ks = s->kv;
    if (ks && !ks->prefill) {
        tdm_kv_cache *kv = ks->kv;
        return tdm_be_attention_kv(m->be, ks->seqs, s->b->n_seqs, s->M, A->q, A->k, A->v,
                                   kv_layer(kv, l, 0), kv_layer(kv, l, 1), kv->n_slots, kv->cap, nh,
                                   nkv, hd, scale, A->attn, err);
    }
    tdm_be_seqs sq = seqs_of(s);
    TDM_TRY(tdm_be_attention_fwd(m->be, &sq, A->q, A->k, A->v, nh, nkv, hd, scale, A->attn, A->lse,
                                 err));
    if (!ks) return TDM_OK;
    tdm_kv_cache *kv = ks->kv;
    size_t row = (size_t)kv->kv_dim * tdm_be_dtype_size(m->act);
    for (int64_t i = 0; i < s->b->n_seqs; i++) {
        const tdm_be_kv_seq *q = &ks->seqs[i];
        size_t dst = (size_t)(q->slot * kv->cap + q->start) * row, src = (size_t)q->row_begin * row;
        size_t bytes = (size_t)q->n_new * row;
        TDM_TRY(tdm_be_copy(m->be, (char *)kv_layer(kv, l, 0) + dst, (const char *)A->k + src,
                            bytes, err));
        TDM_TRY(tdm_be_copy(m->be, (char *)kv_layer(kv, l, 1) + dst, (const char *)A->v + src,
                            bytes, err));
    }
    return TDM_OK;
}

/* The segment table of (layer, target) for the rows [r0, r0 + n) of the batch, counted from r0
 * (a block of the MLP; r0 = 0, n = M: the whole batch). A segment cut by the block keeps its
 * dropout mask: the piece's seed is the segment's seed advanced to the piece's first row.
 * Fills s->segs and *n_out; returns how many segments carry LoRA (0: skip). */
static int64_t build_segs_rows(step *s, int l, int t, int64_t r0, int64_t n, int64_t *n_out)
{
    int64_t with = 0, k = 0;
    for (int64_t i = 0; i < s->b->n_segs; i++) {
        const tdm_batch_seg *bs = &s->b->segs[i];
        int64_t lo = bs->row_begin > r0 ? bs->row_begin : r0;
        int64_t hi = bs->row_end < r0 + n ? bs->row_end : r0 + n;
        if (lo >= hi) continue;
        tdm_lora *a = s->adapters[bs->adapter];
        tdm_lora_seg *g = &s->segs[k++];
        memset(g, 0, sizeof *g);
        g->row_begin = lo - r0, g->row_end = hi - r0;
        if (!a || !(a->targets & TDM_LORA_BIT(t))) continue;
        g->rank = a->rank, g->scale = a->scale;
        g->a = a->params + a->a_off[l * NT + t];
        g->b = a->params + a->b_off[l * NT + t];
        g->da = a->grads + a->a_off[l * NT + t];
        g->db = a->grads + a->b_off[l * NT + t];
        if (s->train && a->dropout > 0) {
            g->dropout = a->dropout;
            uint64_t seed =
                tdm_lora_dropout_module_seed(a->dropout_seed, l, (tdm_lora_target)t);
            g->mask_seed = tdm_dropout_skip_rows(seed, (uint64_t)(lo - bs->row_begin));
        }
        with++;
    }
    *n_out = k;
    return with;
}

/* Row r of a (rows, width) activation tensor (the backend's act dtype). */
static void *act_row(const step *s, const void *p, int64_t r, int64_t width)
{
    return (char *)p + (size_t)(r * width) * tdm_be_dtype_size(s->m->act);
}

/* Row r of U (rows, u_ld) f32; NULL stays NULL (the module is not targeted). */
static float *u_row(const step *s, const float *U, int64_t r)
{
    return U ? (float *)U + r * s->u_ld : NULL;
}

/* What follows the frozen product y = x W^T of a projection: the bias, and the LoRA (keeping
 * U), for the n rows from batch row r0. */
static tdm_status proj_fwd_extras(step *s, int l, int t, int64_t r0, int64_t n, const void *x,
                                  void *y, float *U, tdm_error *err)
{
    tdm_model *m = s->m;
    layer_weights *L = &m->layers[l];
    int64_t in, out, n_segs;
    tdm_model_target_shape(m, (tdm_lora_target)t, &in, &out);
    if (L->bias[t]) TDM_TRY(tdm_be_add_bias(m->be, y, L->bias[t], n, out, err));
    if (U && build_segs_rows(s, l, t, r0, n, &n_segs) > 0)
        TDM_TRY(tdm_be_lora_fwd(m->be, s->segs, n_segs, x, n, in, out, U, s->u_ld, y, err));
    return TDM_OK;
}

/* y = x W^T (+ bias) (+ LoRA, keeping U) for the n rows from batch row r0: x, y and U point at
 * row r0 of their tensors. */
static tdm_status proj_fwd_rows(step *s, int l, int t, int64_t r0, int64_t n, const void *x,
                                void *y, float *U, tdm_error *err)
{
    TDM_TRY(tdm_be_linear_fwd(s->m->be, &s->m->layers[l].w[t], x, n, y, 0.0f, err));
    return proj_fwd_extras(s, l, t, r0, n, x, y, U, err);
}

/* proj_fwd_rows of n projections ts[] of the same input x (q, k, v; gate, up): their frozen
 * products in one tdm_be_linear_fwd_shared (a backend may prepare x once), then each one's
 * bias and LoRA. The same bits as one proj_fwd_rows each. */
static tdm_status proj_fwd_shared_rows(step *s, int l, const int *ts, int n, int64_t r0,
                                       int64_t rows, const void *x, void *const *ys,
                                       float *const *Us, tdm_error *err)
{
    const tdm_be_weight *ws[TDM_BE_SHARED_MAX] = {0}; /* {0}: GCC 12 -O1 cannot see n <= max */
    for (int i = 0; i < n; i++)
        ws[i] = &s->m->layers[l].w[ts[i]];
    TDM_TRY(tdm_be_linear_fwd_shared(s->m->be, ws, n, x, rows, ys, err));
    for (int i = 0; i < n; i++)
        TDM_TRY(proj_fwd_extras(s, l, ts[i], r0, rows, x, ys[i], Us[i], err));
    return TDM_OK;
}

static tdm_status proj_fwd(step *s, int l, int t, const void *x, void *y, float *U, tdm_error *err)
{
    return proj_fwd_rows(s, l, t, 0, s->M, x, y, U, err);
}

/* dx = beta dx + dy W (+ the LoRA terms, accumulating dA and dB) for the n rows from batch row
 * r0 (x, U, dy, dx at row r0). */
static tdm_status proj_bwd_rows(step *s, int l, int t, int64_t r0, int64_t n, const void *x,
                                const float *U, const void *dy, void *dx, float beta,
                                tdm_error *err)
{
    tdm_model *m = s->m;
    int64_t in, out, n_segs;
    tdm_model_target_shape(m, (tdm_lora_target)t, &in, &out);
    TDM_TRY(tdm_be_linear_bwd(m->be, &m->layers[l].w[t], dy, n, dx, beta, err));
    if (U && build_segs_rows(s, l, t, r0, n, &n_segs) > 0)
        TDM_TRY(
            tdm_be_lora_bwd(m->be, s->segs, n_segs, x, U, s->u_ld, dy, n, in, out, dx, err));
    return TDM_OK;
}

static tdm_status proj_bwd(step *s, int l, int t, const void *x, const float *U, const void *dy,
                           void *dx, float beta, tdm_error *err)
{
    return proj_bwd_rows(s, l, t, 0, s->M, x, U, dy, dx, beta, err);
}

static tdm_be_seqs seqs_of(step *s)
{
    int64_t maxlen = 0;
    for (int64_t i = 0; i < s->b->n_seqs; i++) {
        int64_t len = s->b->cu_seqlens[i + 1] - s->b->cu_seqlens[i];
        if (len > maxlen) maxlen = len;
    }
    return (tdm_be_seqs){s->m->ws.cu, s->b->n_seqs, maxlen, s->M};
}

/* One block of the MLP's rows, [r0, r0 + n), and its views of a layer's tensors: xn2 and the U
 * of gate/up/down at its rows; g and u at its rows when the set keeps them (gu_kept, M rows),
 * else the shared one-block copy. */
typedef struct mlp_block {
    int64_t r0, n;
    void *xn2, *g, *u;
    float *Ug, *Uu, *Ud;
} mlp_block;

static mlp_block mlp_block_at(const step *s, const acts *A, bool gu_kept, int64_t r0)
{
    int64_t H = s->m->cfg.hidden_size, I = s->m->cfg.intermediate_size;
    return (mlp_block){.r0 = r0,
                       .n = s->M - r0 < s->mlp_rows ? s->M - r0 : s->mlp_rows,
                       .xn2 = act_row(s, A->xn2, r0, H),
                       .g = gu_kept ? act_row(s, A->g, r0, I) : A->g,
                       .u = gu_kept ? act_row(s, A->u, r0, I) : A->u,
                       .Ug = u_row(s, A->U[TDM_LORA_GATE], r0),
                       .Uu = u_row(s, A->U[TDM_LORA_UP], r0),
                       .Ud = u_row(s, A->U[TDM_LORA_DOWN], r0)};
}

/* g = gate(xn2), u = up(xn2) of a block (+ LoRA, keeping U): mlp_fwd's, and mlp_bwd's again
 * when the layer did not keep them, by this one function so the two are the same bits. */
static tdm_status mlp_gate_up(step *s, int l, const mlp_block *b, tdm_error *err)
{
    const int ts[2] = {TDM_LORA_GATE, TDM_LORA_UP};
    void *const ys[2] = {b->g, b->u};
    float *const Us[2] = {b->Ug, b->Uu};
    return proj_fwd_shared_rows(s, l, ts, 2, b->r0, b->n, b->xn2, ys, Us, err);
}

/* q, k, v = the projections of xn1 (+ bias, + LoRA): layer_fwd's, and recompute_layer's again,
 * by this one function so the two are the same bits. */
static tdm_status qkv_fwd(step *s, int l, acts *A, tdm_error *err)
{
    bool qk_norm = s->m->cfg.qk_norm;
    const int ts[3] = {TDM_LORA_Q, TDM_LORA_K, TDM_LORA_V};
    void *const ys[3] = {qk_norm ? A->q_pre : A->q, qk_norm ? A->k_pre : A->k, A->v};
    float *const Us[3] = {A->U[TDM_LORA_Q], A->U[TDM_LORA_K], A->U[TDM_LORA_V]};
    return proj_fwd_shared_rows(s, l, ts, 3, 0, s->M, A->xn1, ys, Us, err);
}

/* The MLP's forward, x_out = x_mid + down(swiglu(gate(xn2), up(xn2))), in blocks of
 * s->mlp_rows rows. */
static tdm_status mlp_fwd(step *s, int l, acts *A, bool gu_kept, void *x_out, tdm_error *err)
{
    tdm_model *m = s->m;
    int64_t M = s->M, H = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    for (int64_t r0 = 0; r0 < M; r0 += s->mlp_rows) {
        mlp_block b = mlp_block_at(s, A, gu_kept, r0);
        TDM_TRY(mlp_gate_up(s, l, &b, err));
        TDM_TRY(tdm_be_swiglu_fwd(m->be, b.g, b.u, b.n, I, m->ws.hre, err));
        TDM_TRY(proj_fwd_rows(s, l, TDM_LORA_DOWN, r0, b.n, m->ws.hre, act_row(s, x_out, r0, H),
                              b.Ud, err));
    }
    return tdm_be_axpy(m->be, x_out, A->x_mid, m->act, M * H, 1.0f, err);
}

/* One decoder layer: x (M, H) -> x_out (M, H), keeping its activations in A (gu_kept: A keeps
 * g and u for all M rows). With need_out false (recomputation for the backward) it stops at
 * the MLP's input xn2: the backward forms the MLP block by block (mlp_bwd). */
static tdm_status layer_fwd(step *s, int l, const void *x, acts *A, bool gu_kept, void *x_out,
                            bool need_out, tdm_error *err)
{
    tdm_model *m = s->m;
    tdm_backend *be = m->be;
    const tdm_model_config *c = &m->cfg;
    layer_weights *L = &m->layers[l];
    int64_t M = s->M, H = c->hidden_size, hd = c->head_dim;
    int64_t nh = c->num_heads, nkv = c->num_kv_heads, Q = nh * hd, K = nkv * hd;
    float eps = (float)c->rms_norm_eps;
    TDM_TRY(tdm_be_rmsnorm_fwd(be, x, L->in_norm, M, H, eps, A->xn1, A->rstd1, err));
    TDM_TRY(qkv_fwd(s, l, A, err));
    if (c->qk_norm) {
        TDM_TRY(tdm_be_rmsnorm_fwd(be, A->q_pre, L->q_norm, M * nh, hd, eps, A->q, A->rstd_q, err));
        TDM_TRY(
            tdm_be_rmsnorm_fwd(be, A->k_pre, L->k_norm, M * nkv, hd, eps, A->k, A->rstd_k, err));
    }
    TDM_TRY(tdm_be_rope(be, A->q, M, nh, hd, Q, m->ws.pos, m->inv_freq, false, err));
    TDM_TRY(tdm_be_rope(be, A->k, M, nkv, hd, K, m->ws.pos, m->inv_freq, false, err));
    TDM_TRY(layer_attention(s, l, A, err));
    TDM_TRY(proj_fwd(s, l, TDM_LORA_O, A->attn, A->x_mid, A->U[TDM_LORA_O], err));
    TDM_TRY(tdm_be_axpy(be, A->x_mid, x, m->act, M * H, 1.0f, err));
    TDM_TRY(tdm_be_rmsnorm_fwd(be, A->x_mid, L->post_norm, M, H, eps, A->xn2, A->rstd2, err));
    return need_out ? mlp_fwd(s, l, A, gu_kept, x_out, err) : TDM_OK;
}

/* Recomputes what layer l did not keep (keep: the KEEP_* groups it kept) from what it kept, up
 * to the MLP's input xn2, exactly as layer_fwd formed it (the same ops on the same inputs:
 * bit-identical); the MLP's gate/up outputs, when not kept, are formed again block by block by
 * mlp_bwd. With nothing kept the attention half runs again. */
static tdm_status recompute_layer(step *s, int l, const void *x, acts *A, unsigned keep,
                                  tdm_error *err)
{
    if (!(keep & KEEP_SMALL)) return layer_fwd(s, l, x, A, false, NULL, false, err);
    tdm_model *m = s->m;
    tdm_backend *be = m->be;
    const tdm_model_config *c = &m->cfg;
    layer_weights *L = &m->layers[l];
    int64_t M = s->M, H = c->hidden_size, hd = c->head_dim;
    int64_t nh = c->num_heads, nkv = c->num_kv_heads, Q = nh * hd, K = nkv * hd;
    float eps = (float)c->rms_norm_eps;
    bool qkv = !(keep & KEEP_QKV), attn = !(keep & KEEP_ATTN), xmid = !(keep & KEEP_XMID);
    if (!(keep & KEEP_XN1))
        TDM_TRY(tdm_be_rmsnorm_fwd(be, x, L->in_norm, M, H, eps, A->xn1, A->rstd1, err));
    if (qkv) {
        TDM_TRY(qkv_fwd(s, l, A, err));
        if (c->qk_norm) {
            TDM_TRY(
                tdm_be_rmsnorm_fwd(be, A->q_pre, L->q_norm, M * nh, hd, eps, A->q, A->rstd_q, err));
            TDM_TRY(tdm_be_rmsnorm_fwd(be, A->k_pre, L->k_norm, M * nkv, hd, eps, A->k, A->rstd_k,
                                       err));
        }
        TDM_TRY(tdm_be_rope(be, A->q, M, nh, hd, Q, m->ws.pos, m->inv_freq, false, err));
        TDM_TRY(tdm_be_rope(be, A->k, M, nkv, hd, K, m->ws.pos, m->inv_freq, false, err));
    }
    if (attn) TDM_TRY(layer_attention(s, l, A, err));
    if (xmid) {
        TDM_TRY(proj_fwd(s, l, TDM_LORA_O, A->attn, A->x_mid, A->U[TDM_LORA_O], err));
        TDM_TRY(tdm_be_axpy(be, A->x_mid, x, m->act, M * H, 1.0f, err));
    }
    if (!(keep & KEEP_XN2))
        TDM_TRY(tdm_be_rmsnorm_fwd(be, A->x_mid, L->post_norm, M, H, eps, A->xn2, A->rstd2, err));
    return TDM_OK;
}

/* The MLP's backward in blocks of s->mlp_rows rows: dxn (M, H) = dL/d(xn2) from dres =
 * dL/d(x_out). A block's g and u are formed again first when the layer did not keep them, and
 * the U of down_proj when it kept nothing small (the same ops on the same rows as mlp_fwd:
 * bit-identical). LoRA dA and dB accumulate over the blocks. */
static tdm_status mlp_bwd(step *s, int l, acts *A, unsigned keep, tdm_error *err)
{
    tdm_model *m = s->m;
    tdm_backend *be = m->be;
    workspace *w = &m->ws;
    int64_t M = s->M, H = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    bool gu_kept = keep & KEEP_GU;
    for (int64_t r0 = 0; r0 < M; r0 += s->mlp_rows) {
        mlp_block b = mlp_block_at(s, A, gu_kept, r0);
        int64_t n = b.n, n_segs;
        void *dres = act_row(s, w->dres, r0, H), *dxn = act_row(s, w->dxn, r0, H);
        if (!gu_kept) TDM_TRY(mlp_gate_up(s, l, &b, err));
        if (b.Ud) { /* down's input, for its LoRA terms */
            TDM_TRY(tdm_be_swiglu_fwd(be, b.g, b.u, n, I, w->hre, err));
            /* U = h A^T formed by lora_fwd into a throw-away output (hf is free in backward) */
            if (!(keep & KEEP_SMALL) && build_segs_rows(s, l, TDM_LORA_DOWN, r0, n, &n_segs) > 0)
                TDM_TRY(tdm_be_lora_fwd(be, s->segs, n_segs, w->hre, n, I, H, b.Ud, s->u_ld,
                                        act_row(s, w->hf, r0, H), err));
        }
        TDM_TRY(proj_bwd_rows(s, l, TDM_LORA_DOWN, r0, n, w->hre, b.Ud, dres, w->d1, 0.0f, err));
        TDM_TRY(tdm_be_swiglu_bwd(be, b.g, b.u, w->d1, n, I, w->d1, w->d2, err)); /* dg, du */
        TDM_TRY(proj_bwd_rows(s, l, TDM_LORA_GATE, r0, n, b.xn2, b.Ug, w->d1, dxn, 0.0f, err));
        TDM_TRY(proj_bwd_rows(s, l, TDM_LORA_UP, r0, n, b.xn2, b.Uu, w->d2, dxn, 1.0f, err));
    }
    return TDM_OK;
}

/* Backward of one layer: dres (M, H) holds dL/d(x_out) on entry and dL/d(x) on return. keep:
 * the KEEP_* groups the layer kept (recompute_layer has rebuilt the others up to xn2). */
static tdm_status layer_bwd(step *s, int l, const void *x, acts *A, unsigned keep,
                            tdm_error *err)
{
    tdm_model *m = s->m;
    tdm_backend *be = m->be;
    workspace *w = &m->ws;
    const tdm_model_config *c = &m->cfg;
    layer_weights *L = &m->layers[l];
    int64_t M = s->M, H = c->hidden_size, hd = c->head_dim;
    int64_t nh = c->num_heads, nkv = c->num_kv_heads, Q = nh * hd, K = nkv * hd;
    /* MLP: x_out = x_mid + down(swiglu(gate(xn2), up(xn2))) */
    TDM_TRY(mlp_bwd(s, l, A, keep, err));
    TDM_TRY(
        tdm_be_rmsnorm_bwd(be, w->dxn, A->x_mid, L->post_norm, A->rstd2, M, H, w->dres, 1.0f, err));
    /* attention: x_mid = x + o(attn) */
    TDM_TRY(proj_bwd(s, l, TDM_LORA_O, A->attn, A->U[TDM_LORA_O], w->dres, w->dattn, 0.0f, err));
    tdm_be_seqs sq = seqs_of(s);
    float scale = (float)(1.0 / sqrt((double)hd));
    TDM_TRY(tdm_be_attention_bwd(be, &sq, A->q, A->k, A->v, A->attn, A->lse, w->dattn, nh, nkv, hd,
                                 scale, w->dq, w->dk, w->dv, err));
    TDM_TRY(tdm_be_rope(be, w->dq, M, nh, hd, Q, w->pos, m->inv_freq, true, err));
    TDM_TRY(tdm_be_rope(be, w->dk, M, nkv, hd, K, w->pos, m->inv_freq, true, err));
    if (c->qk_norm) {
        TDM_TRY(tdm_be_rmsnorm_bwd(be, w->dq, A->q_pre, L->q_norm, A->rstd_q, M * nh, hd, w->dq,
                                   0.0f, err));
        TDM_TRY(tdm_be_rmsnorm_bwd(be, w->dk, A->k_pre, L->k_norm, A->rstd_k, M * nkv, hd, w->dk,
                                   0.0f, err));
    }
    TDM_TRY(proj_bwd(s, l, TDM_LORA_Q, A->xn1, A->U[TDM_LORA_Q], w->dq, w->dxn, 0.0f, err));
    TDM_TRY(proj_bwd(s, l, TDM_LORA_K, A->xn1, A->U[TDM_LORA_K], w->dk, w->dxn, 1.0f, err));
    TDM_TRY(proj_bwd(s, l, TDM_LORA_V, A->xn1, A->U[TDM_LORA_V], w->dv, w->dxn, 1.0f, err));
    return tdm_be_rmsnorm_bwd(be, w->dxn, x, L->in_norm, A->rstd1, M, H, w->dres, 1.0f, err);
}

static tdm_status check_batch(const tdm_model *m, int n_adapters, const tdm_batch *b,
                              tdm_error *err)
{
    if (b->m < 1 || !b->tokens || !b->labels || !b->cu_seqlens || b->n_seqs < 1 || !b->segs ||
        b->n_segs < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "batch: empty or missing arrays");
    const int32_t *cu = b->cu_seqlens;
    if (cu[0] != 0 || cu[b->n_seqs] != b->m)
        return tdm_fail(err, TDM_ERR_INVALID, "batch: cu_seqlens must run from 0 to m = %lld",
                        (long long)b->m);
    for (int64_t i = 0; i < b->n_seqs; i++)
        if (cu[i + 1] <= cu[i])
            return tdm_fail(err, TDM_ERR_INVALID, "batch: sequence %lld is empty or reversed",
                            (long long)i);
    int64_t seq = 0, prev = 0;
    for (int64_t i = 0; i < b->n_segs; i++) {
        const tdm_batch_seg *g = &b->segs[i];
        if (g->adapter < 0 || g->adapter >= n_adapters)
            return tdm_fail(err, TDM_ERR_INVALID, "batch: segment %lld adapter %d outside [0, %d)",
                            (long long)i, g->adapter, n_adapters);
        if (g->row_begin != prev || g->row_end <= g->row_begin)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "batch: segments must tile [0, m) in order (segment %lld)",
                            (long long)i);
        while (seq < b->n_seqs && cu[seq] < g->row_end)
            seq++;
        if (cu[seq] != g->row_end)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "batch: segment %lld ends at row %lld, inside a sequence", (long long)i,
                            (long long)g->row_end);
        prev = g->row_end;
    }
    if (prev != b->m) return tdm_fail(err, TDM_ERR_INVALID, "batch: segments do not cover m rows");
    for (int64_t i = 0; i < b->m; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab_size)
            return tdm_fail(err, TDM_ERR_INVALID, "batch: token %d at row %lld outside [0, %lld)",
                            b->tokens[i], (long long)i, (long long)m->cfg.vocab_size);
    return TDM_OK;
}

tdm_status tdm_model_step(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                          const tdm_batch *b, bool backward, const double *loss_weight,
                          double *loss_sum_out, int64_t *tokens_out, tdm_error *err)
{
    if (n_adapters < 1 || !adapters)
        return tdm_fail(err, TDM_ERR_INVALID, "step: no adapter slots");
    TDM_TRY(check_batch(m, n_adapters, b, err));
    const tdm_model_config *c = &m->cfg;
    tdm_backend *be = m->be;
    int64_t M = b->m, L = c->num_layers, H = c->hidden_size;
    int64_t u_ld = 1;
    unsigned tmask = 0;
    for (int i = 0; i < n_adapters; i++) {
        if (!adapters[i]) continue;
        if (adapters[i]->model != m)
            return tdm_fail(err, TDM_ERR_INVALID, "step: adapter %d belongs to another model", i);
        tmask |= adapters[i]->targets;
        if (adapters[i]->rank > u_ld) u_ld = adapters[i]->rank;
    }
    unsigned keep = backward ? keep_of(&m->opts) : 0;
    workspace want = {.m = M,
                      .cu_cap = b->n_seqs + 1,
                      .u_ld = u_ld,
                      .tmask = tmask,
                      .n_sets = backward ? (int)L : 1,
                      .keep = keep,
                      .mlp_rows = mlp_rows_of(&m->opts, M),
                      .offload = m->opts.offload_activations};
    TDM_TRY(ws_ensure(m, &want, err));
    workspace *w = &m->ws;

    /* host side: positions, shifted labels, per-row loss weights, counted tokens */
    int32_t *pos = malloc((size_t)M * sizeof(int32_t));
    int32_t *lab = malloc((size_t)M * sizeof(int32_t));
    float *lw = malloc((size_t)M * sizeof(float));
    float *loss = malloc((size_t)M * sizeof(float));
    int64_t *count = calloc((size_t)n_adapters, sizeof(int64_t));
    tdm_lora_seg *segs = malloc((size_t)b->n_segs * sizeof *segs);
    tdm_status st = TDM_OK;
    if (!pos || !lab || !lw || !loss || !count || !segs) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t sq = 0; sq < b->n_seqs; sq++)
        for (int64_t i = b->cu_seqlens[sq]; i < b->cu_seqlens[sq + 1]; i++) {
            pos[i] = (int32_t)(i - b->cu_seqlens[sq]);
            lab[i] = i + 1 < b->cu_seqlens[sq + 1] ? b->labels[i + 1] : -100;
            if (lab[i] != -100 && (lab[i] < 0 || lab[i] >= c->vocab_size)) {
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "batch: label %d at row %lld outside [0, %lld) and not -100", lab[i],
                              (long long)i + 1, (long long)c->vocab_size);
                goto done;
            }
        }
    for (int64_t g = 0; g < b->n_segs; g++)
        for (int64_t i = b->segs[g].row_begin; i < b->segs[g].row_end; i++)
            count[b->segs[g].adapter] += lab[i] != -100;
    for (int64_t g = 0; g < b->n_segs; g++) {
        int a = b->segs[g].adapter;
        double wa = loss_weight ? loss_weight[a] : count[a] > 0 ? 1.0 / (double)count[a] : 0.0;
        for (int64_t i = b->segs[g].row_begin; i < b->segs[g].row_end; i++)
            lw[i] = lab[i] != -100 ? (float)wa : 0.0f;
    }
    st = tdm_be_upload(be, w->tokens, b->tokens, (size_t)M * sizeof(int32_t), err);
    if (st == TDM_OK) st = tdm_be_upload(be, w->labels, lab, (size_t)M * sizeof(int32_t), err);
    if (st == TDM_OK) st = tdm_be_upload(be, w->pos, pos, (size_t)M * sizeof(int32_t), err);
    if (st == TDM_OK)
        st =
            tdm_be_upload(be, w->cu, b->cu_seqlens, (size_t)(b->n_seqs + 1) * sizeof(int32_t), err);
    if (st == TDM_OK) st = tdm_be_upload_f32(be, w->lw, TDM_BE_F32, lw, M, err);
    if (st != TDM_OK) goto done;

    step s = {m, adapters, b, M, w->u_ld, want.mlp_rows, segs, backward, NULL};
    /* With offload the layer inputs x[l] alternate between two device slots: x[l] goes to host
     * memory while layer l computes (and is joined before layer l + 1 overwrites its slot),
     * x[L - 1] and x[L] stay; the backward fetches x[l - 1] while layer l runs backward. */
    bool offload = backward && w->host_bytes > 0;
    size_t x_bytes = (size_t)(M * H) * tdm_be_dtype_size(m->act);
    /* forward */
    st = tdm_be_embedding(be, &m->embed, w->tokens, M, w->x[0], err);
    if (st == TDM_OK && offload) st = tdm_be_copy_behind(be, ws_host_x(m, 0), w->x[0], x_bytes, err);
    for (int64_t l = 0; st == TDM_OK && l < L; l++) {
        st = layer_fwd(&s, (int)l, w->x[l], &w->sets[backward ? l : 0], keep & KEEP_GU,
                       w->x[l + 1], true, err);
        if (st == TDM_OK && offload) st = tdm_be_copies_join(be, err);
        if (st == TDM_OK && offload && l + 1 <= L - 2)
            st = tdm_be_copy_behind(be, ws_host_x(m, l + 1), w->x[l + 1], x_bytes, err);
    }
    if (st == TDM_OK)
        st = tdm_be_rmsnorm_fwd(be, w->x[L], m->final_norm, M, H, (float)c->rms_norm_eps, w->hf,
                                w->rstd_f, err);
    int64_t chunk = ce_chunk_rows(c, tdm_be_act_dtype(be));
    if (st == TDM_OK)
        st = tdm_be_cross_entropy(be, w->hf, &m->lm_head, w->labels, w->lw, M, chunk, w->loss,
                                  backward ? w->dxn : NULL, err);
    if (st == TDM_OK) st = tdm_be_download_f32(be, loss, w->loss, TDM_BE_F32, M, err);
    if (st != TDM_OK) goto done;
    if (loss_sum_out)
        for (int a = 0; a < n_adapters; a++)
            loss_sum_out[a] = 0;
    for (int64_t g = 0; g < b->n_segs; g++)
        for (int64_t i = b->segs[g].row_begin; i < b->segs[g].row_end; i++)
            if (lab[i] != -100 && loss_sum_out) loss_sum_out[b->segs[g].adapter] += loss[i];
    if (tokens_out)
        for (int a = 0; a < n_adapters; a++)
            tokens_out[a] = count[a];

    /* backward */
    if (backward) {
        st = tdm_be_rmsnorm_bwd(be, w->dxn, w->x[L], m->final_norm, w->rstd_f, M, H, w->dres, 0.0f,
                                err);
        for (int64_t l = L - 1; st == TDM_OK && l >= 0; l--) {
            acts *A = &w->sets[l];
            if (offload && l >= 1) /* into the slot of x[l + 1], whose layer is done */
                st = tdm_be_copy_behind(be, w->x[l - 1], ws_host_x(m, l - 1), x_bytes, err);
            if (st == TDM_OK && keep != KEEP_ALL)
                st = recompute_layer(&s, (int)l, w->x[l], A, keep, err);
            if (st == TDM_OK) st = layer_bwd(&s, (int)l, w->x[l], A, keep, err);
            if (st == TDM_OK && offload) st = tdm_be_copies_join(be, err);
        }
    }
done:
    free(pos), free(lab), free(lw), free(loss), free(count), free(segs);
    return st;
}

/* logits (S, V) f32 = h (S, H) act · lm_head^T. With bf16 activations the product's f32
 * accumulators are kept rather than rounded to bf16 (8 bits of mantissa: at logits of 4 a step
 * of 0.03, enough to tie or swap two candidates that f32 tells apart); the cross-entropy kernels
 * of training keep them in f32 likewise. */
static tdm_status lm_head_f32(tdm_model *m, const void *h, int64_t S, void *logits, tdm_error *err)
{
    const tdm_be_weight *w = &m->lm_head;
    if (m->act == TDM_BE_F32) return tdm_be_linear_fwd(m->be, w, h, S, logits, 0.0f, err);
    if (w->format != TDM_BE_W_BF16 && w->format != TDM_BE_W_F32) /* put_weight keeps it dense */
        return tdm_fail(err, TDM_ERR_INVALID, "logits: the lm_head is not a dense weight");
    tdm_gemm_args g = {.trans_b = true,
                       .m = S,
                       .n = w->rows,
                       .k = w->cols,
                       .alpha = 1.0f,
                       .a = h,
                       .a_dtype = m->act,
                       .lda = w->cols,
                       .b = w->data,
                       .b_dtype = w->format == TDM_BE_W_BF16 ? TDM_BE_BF16 : TDM_BE_F32,
                       .ldb = w->cols,
                       .c = logits,
                       .c_dtype = TDM_BE_F32,
                       .ldc = w->rows};
    return tdm_be_gemm(m->be, &g, err);
}

/* The forward of b without labels (from the slots' positions when kv is given, else from 0) and
 * the logits of each sequence's last row into logits (host, (n_seqs, V)). */
static tdm_status forward_logits(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                                 const tdm_batch *b, tdm_kv_cache *kv, const int64_t *slots,
                                 float *logits, tdm_error *err)
{
    if (n_adapters < 1 || !adapters)
        return tdm_fail(err, TDM_ERR_INVALID, "logits: no adapter slots");
    tdm_batch checked = *b;
    if (!checked.labels) checked.labels = b->tokens; /* check_batch wants the array; unused here */
    TDM_TRY(check_batch(m, n_adapters, &checked, err));
    const tdm_model_config *c = &m->cfg;
    tdm_backend *be = m->be;
    int64_t M = b->m, L = c->num_layers, H = c->hidden_size, V = c->vocab_size, S = b->n_seqs;
    int64_t u_ld = 1;
    unsigned tmask = 0;
    for (int i = 0; i < n_adapters; i++) {
        if (!adapters[i]) continue;
        if (adapters[i]->model != m)
            return tdm_fail(err, TDM_ERR_INVALID, "logits: adapter %d belongs to another model", i);
        tmask |= adapters[i]->targets;
        if (adapters[i]->rank > u_ld) u_ld = adapters[i]->rank;
    }
    kv_step ks = {.kv = kv, .prefill = true};
    if (kv) {
        if (kv->m != m)
            return tdm_fail(err, TDM_ERR_INVALID, "decode: the cache is another model's");
        if (!(ks.seqs = malloc((size_t)S * sizeof *ks.seqs)))
            return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        for (int64_t sq = 0; sq < S; sq++) {
            int64_t slot = slots[sq], n = b->cu_seqlens[sq + 1] - b->cu_seqlens[sq];
            bool dup = false;
            for (int64_t o = 0; o < sq; o++)
                dup |= slots[o] == slot;
            if (slot < 0 || slot >= kv->n_slots || dup || kv->len[slot] + n > kv->cap) {
                free(ks.seqs);
                return tdm_fail(err, TDM_ERR_INVALID,
                                "decode: sequence %lld: slot %lld %s (cache: %lld slots of %lld "
                                "positions)",
                                (long long)sq, (long long)slot,
                                dup ? "fed twice" : "out of range or full", (long long)kv->n_slots,
                                (long long)kv->cap);
            }
            ks.seqs[sq] = (tdm_be_kv_seq){b->cu_seqlens[sq], n, slot, kv->len[slot]};
            if (kv->len[slot] > 0) ks.prefill = false;
        }
    }
    workspace want = {.m = M,
                      .cu_cap = S + 1,
                      .u_ld = u_ld,
                      .tmask = tmask,
                      .n_sets = 1,
                      .mlp_rows = mlp_rows_of(&m->opts, M),
                      .offload = m->opts.offload_activations};
    tdm_status st = ws_ensure(m, &want, err);
    if (st != TDM_OK) {
        free(ks.seqs);
        return st;
    }
    workspace *w = &m->ws;
    int32_t *pos = malloc((size_t)M * sizeof(int32_t));
    tdm_lora_seg *segs = malloc((size_t)b->n_segs * sizeof *segs);
    void *out_logits = NULL; /* (S, V) f32: h W^T of the last rows */
    if (!pos || !segs) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    bool last_rows_packed = true; /* every sequence one row: the last rows are rows 0..S */
    for (int64_t sq = 0; sq < S; sq++) {
        int64_t start = kv ? ks.seqs[sq].start : 0;
        for (int64_t i = b->cu_seqlens[sq]; i < b->cu_seqlens[sq + 1]; i++)
            pos[i] = (int32_t)(start + i - b->cu_seqlens[sq]);
        last_rows_packed &= b->cu_seqlens[sq + 1] == sq + 1;
    }
    st = tdm_be_upload(be, w->tokens, b->tokens, (size_t)M * sizeof(int32_t), err);
    if (st == TDM_OK) st = tdm_be_upload(be, w->pos, pos, (size_t)M * sizeof(int32_t), err);
    if (st == TDM_OK)
        st = tdm_be_upload(be, w->cu, b->cu_seqlens, (size_t)(S + 1) * sizeof(int32_t), err);
    if (st == TDM_OK) st = tdm_be_alloc(be, TDM_BE_F32, S * V, &out_logits, err);
    if (st != TDM_OK) goto done;
    step s = {m, adapters, &checked, M, w->u_ld, want.mlp_rows, segs, false, kv ? &ks : NULL};
    st = tdm_be_embedding(be, &m->embed, w->tokens, M, w->x[0], err);
    for (int64_t l = 0; st == TDM_OK && l < L; l++)
        st = layer_fwd(&s, (int)l, w->x[l], &w->sets[0], false, w->x[l + 1], true, err);
    if (st == TDM_OK)
        st = tdm_be_rmsnorm_fwd(be, w->x[L], m->final_norm, M, H, (float)c->rms_norm_eps, w->hf,
                                NULL, err);
    /* the last row of each sequence, gathered into dxn (unused by a forward) unless packed */
    size_t row_bytes = (size_t)H * tdm_be_dtype_size(m->act);
    const void *h_last = w->hf;
    if (!last_rows_packed) {
        for (int64_t sq = 0; st == TDM_OK && sq < S; sq++)
            st = tdm_be_copy(be, (char *)w->dxn + (size_t)sq * row_bytes,
                             (const char *)w->hf + (size_t)(b->cu_seqlens[sq + 1] - 1) * row_bytes,
                             row_bytes, err);
        h_last = w->dxn;
    }
    if (st == TDM_OK) st = lm_head_f32(m, h_last, S, out_logits, err);
    if (st == TDM_OK) st = tdm_be_download_f32(be, logits, out_logits, TDM_BE_F32, S * V, err);
    if (st == TDM_OK && kv)
        for (int64_t sq = 0; sq < S; sq++)
            kv->len[ks.seqs[sq].slot] += ks.seqs[sq].n_new;
done:
    tdm_be_free(be, out_logits);
    free(pos), free(segs), free(ks.seqs);
    return st;
}

tdm_status tdm_model_last_logits(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                                 const tdm_batch *b, float *logits, tdm_error *err)
{
    return forward_logits(m, adapters, n_adapters, b, NULL, NULL, logits, err);
}

tdm_status tdm_model_decode(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                            const tdm_batch *b, tdm_kv_cache *kv, const int64_t *slots,
                            float *logits, tdm_error *err)
{
    if (!kv || !slots) return tdm_fail(err, TDM_ERR_INVALID, "decode: no cache");
    return forward_logits(m, adapters, n_adapters, b, kv, slots, logits, err);
}

/* ------------------------------------------------------- memory estimate ---- */

/* Device bytes of one frozen weight as put_weight stores it. */
static uint64_t weight_bytes(int64_t numel, bool quantize, bool double_quant, tdm_be_dtype dense)
{
    if (!quantize) return (uint64_t)numel * tdm_be_dtype_size(dense);
    uint64_t nblocks = (uint64_t)(numel + TDM_NF4_BLOCK - 1) / TDM_NF4_BLOCK;
    uint64_t bytes = (uint64_t)(numel + 1) / 2; /* two 4-bit codes per byte */
    if (double_quant)
        bytes += nblocks + (nblocks + TDM_NF4_DQ_BLOCK - 1) / TDM_NF4_DQ_BLOCK * 4;
    else
        bytes += nblocks * 4;
    return bytes;
}

/* What the plan's largest step asks of the backend's own scratch. */
static tdm_be_step_shape scratch_shape(const tdm_model_config *c, const tdm_model_opts *o,
                                       tdm_be_dtype act, const tdm_model_mem_plan *p)
{
    return (tdm_be_step_shape){.m = p->rows,
                               .max_seq = p->max_seq,
                               .hidden = c->hidden_size,
                               .inter = c->intermediate_size,
                               .q_dim = c->num_heads * c->head_dim,
                               .kv_dim = c->num_kv_heads * c->head_dim,
                               .heads = c->num_heads,
                               .kv_heads = c->num_kv_heads,
                               .head_dim = c->head_dim,
                               .vocab = c->vocab_size,
                               .ce_chunk = ce_chunk_rows(c, act),
                               .max_rank = p->max_rank,
                               .nf4 = o->nf4,
                               .lm_head_bf16 = embed_dtype(c, o, act) != act,
                               .base_fp8 = o->nf4 && o->base_fp8,
                               .backward = p->backward,
                               .lora_params = p->lora_params,
                               .lora_module_params = p->lora_module_params};
}

/* The workspace parameters of the plan's largest step, as tdm_model_step would ask for them. */
static void plan_workspace(const tdm_model_config *c, const tdm_model_opts *o,
                           const tdm_model_mem_plan *p, workspace *w)
{
    w->m = p->rows;
    w->cu_cap = p->n_seqs + 1;
    w->u_ld = p->max_rank > 0 ? p->max_rank : 1;
    w->tmask = p->targets;
    w->n_sets = p->backward ? (int)c->num_layers : 1;
    w->keep = p->backward ? keep_of(o) : 0;
    w->mlp_rows = mlp_rows_of(o, p->rows);
    w->offload = o->offload_activations;
}

tdm_status tdm_model_reserve(tdm_model *m, const tdm_model_mem_plan *p, tdm_error *err)
{
    if (p->rows <= 0) return TDM_OK;
    if (tdm_fault("model.reserve")) /* test seam: the allocation below running out of memory */
        return tdm_fail(err, TDM_ERR_NOMEM, "injected out of memory (model.reserve)");
    workspace want = {0};
    plan_workspace(&m->cfg, &m->opts, p, &want);
    TDM_TRY(ws_ensure(m, &want, err));
    tdm_be_step_shape sh = scratch_shape(&m->cfg, &m->opts, m->act, p);
    return tdm_be_reserve_scratch(m->be, &sh, err);
}

void tdm_model_set_recompute(tdm_model *m, bool grad_checkpoint, tdm_recompute recompute)
{
    tdm_model_set_grad_checkpoint(m, grad_checkpoint, recompute);
    ws_free(m);
}

void tdm_model_set_offload_activations(tdm_model *m, bool on)
{
    m->opts.offload_activations = on;
    ws_free(m);
}

tdm_status tdm_model_fit(tdm_model *m, const tdm_model_mem_plan *p, tdm_error *err)
{
    workspace want = {0};
    carver c = {NULL, 0};
    if (p->rows > 0) {
        plan_workspace(&m->cfg, &m->opts, p, &want);
        ws_layout(&m->cfg, m->act, &want, &c);
    }
    workspace *w = &m->ws;
    if (!w->base || c.off >= w->bytes) return TDM_OK; /* nothing to give back */
    ws_free(m);
    return p->rows > 0 ? ws_ensure(m, &want, err) : TDM_OK;
}

void tdm_model_set_grad_checkpoint(tdm_model *m, bool on, tdm_recompute recompute)
{
    m->opts.grad_checkpoint = on, m->opts.recompute = recompute;
}

tdm_recompute tdm_model_recompute(const tdm_model *m)
{
    return m->opts.recompute;
}

bool tdm_model_grad_checkpoint(const tdm_model *m)
{
    return m->opts.grad_checkpoint;
}

tdm_status tdm_model_memory_estimate(const tdm_model_config *c, const tdm_model_opts *o,
                                     tdm_be_dtype act, const tdm_model_mem_plan *p,
                                     tdm_model_mem *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    tdm_tensor_desc *layout = NULL;
    size_t n = 0;
    TDM_TRY(tdm_model_layout(c, &layout, &n, err));
    /* weights: exactly what tdm_model_load allocates (the dense dtype is the activation dtype) */
    for (size_t i = 0; i < n; i++) {
        const tdm_tensor_desc *d = &layout[i];
        int64_t numel = d->shape[0] * (d->rank == 2 ? d->shape[1] : 1);
        if (d->role == TDM_ROLE_LM_HEAD && c->tie_word_embeddings) continue;
        if (d->role == TDM_ROLE_EMBED || d->role == TDM_ROLE_LM_HEAD)
            out->weights += weight_bytes(numel, false, false, embed_dtype(c, o, act));
        else if (d->role == TDM_ROLE_LINEAR)
            out->weights += weight_bytes(numel, o->nf4, o->double_quant, act);
        else
            out->weights += (uint64_t)numel * 4; /* norms and biases: f32 */
    }
    free(layout);
    out->weights += (uint64_t)(c->head_dim / 2) * 4; /* RoPE inverse frequencies */
    /* activations: the workspace of the largest step, laid out as ws_ensure lays it out */
    workspace w = {0};
    plan_workspace(c, o, p, &w);
    carver cv = {NULL, 0};
    ws_layout(c, act, &w, &cv);
    out->activations = cv.off;
    out->host_activations = ws_host_bytes(c, act, &w);
    out->adapters = (uint64_t)p->lora_params * 4 * 4; /* params, grads, AdamW m and v: f32 */
    tdm_be_step_shape sh = scratch_shape(c, o, act, p);
    /* f32 activations are the CPU backend's, bf16 the CUDA backend's */
    out->backend_scratch =
        act == TDM_BE_F32 ? tdm_cpu_scratch_bytes(&sh) : tdm_cuda_scratch_bytes(&sh);
    return TDM_OK;
}
