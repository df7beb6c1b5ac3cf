/* op_profile.c — per-op counts and times of a backend; see op_profile.h. */
#include "engine/op_profile.h"

#include <stdlib.h>
#include <string.h>

#include "engine/backend_impl.h"
#include "util/timeutil.h"

static const char *const op_names[TDM_OP_COUNT] = {
    [TDM_OP_UPLOAD] = "upload",
    [TDM_OP_DOWNLOAD] = "download",
    [TDM_OP_COPY] = "copy",
    [TDM_OP_SYNCHRONIZE] = "synchronize",
    [TDM_OP_FILL] = "fill",
    [TDM_OP_AXPY] = "axpy",
    [TDM_OP_SCALE] = "scale",
    [TDM_OP_ADD_BIAS] = "add_bias",
    [TDM_OP_GEMM] = "gemm",
    [TDM_OP_WEIGHT_ROWS] = "weight_rows",
    [TDM_OP_LINEAR_FWD] = "linear_fwd",
    [TDM_OP_LINEAR_BWD] = "linear_bwd",
    [TDM_OP_EMBEDDING] = "embedding",
    [TDM_OP_RMSNORM_FWD] = "rmsnorm_fwd",
    [TDM_OP_RMSNORM_BWD] = "rmsnorm_bwd",
    [TDM_OP_ROPE] = "rope",
    [TDM_OP_ATTENTION_FWD] = "attention_fwd",
    [TDM_OP_ATTENTION_BWD] = "attention_bwd",
    [TDM_OP_SWIGLU_FWD] = "swiglu_fwd",
    [TDM_OP_SWIGLU_BWD] = "swiglu_bwd",
    [TDM_OP_CROSS_ENTROPY] = "cross_entropy",
    [TDM_OP_LORA_FWD] = "lora_fwd",
    [TDM_OP_LORA_BWD] = "lora_bwd",
    [TDM_OP_SUMSQ] = "sumsq",
    [TDM_OP_CLIP_COEF] = "clip_coef",
    [TDM_OP_ADAMW] = "adamw",
    [TDM_OP_ATTENTION_KV] = "attention_kv",
    [TDM_OP_SUB_MATMUL] = "cuBLASLt matmul",
    [TDM_OP_SUB_NF4_DEQUANT] = "NF4 dequantize",
    [TDM_OP_SUB_CONVERT] = "dtype convert",
    [TDM_OP_SUB_CE_LOGITS] = "CE logits GEMM",
    [TDM_OP_SUB_CE_SOFTMAX] = "CE softmax",
    [TDM_OP_SUB_CE_DH] = "CE dH GEMM",
};

const char *tdm_op_name(tdm_op_id id)
{
    return id >= 0 && id < TDM_OP_COUNT && op_names[id] ? op_names[id] : "?";
}

tdm_status tdm_be_profile_enable(tdm_backend *be, bool on, tdm_error *err)
{
    if (be->prof) {
        if (be->vt->prof_reset) be->vt->prof_reset(be);
        free(be->prof);
        be->prof = NULL;
    }
    if (!on) return TDM_OK;
    be->prof = calloc(1, sizeof *be->prof);
    if (!be->prof) return tdm_fail(err, TDM_ERR_NOMEM, "op profile: out of memory");
    return TDM_OK;
}

int tdm_op_profile_begin(tdm_backend *be, int64_t *host_t0_ns)
{
    tdm_op_profile *p = be->prof;
    *host_t0_ns = 0;
    if (!p) return -1;
    p->depth++;
    /* the device mark first: when its slots run out it waits for the device, which is not this
     * op's host time */
    int token = be->vt->prof_begin ? be->vt->prof_begin(be) : -1;
    *host_t0_ns = tdm_now_mono_ns();
    return token;
}

void tdm_op_profile_end(tdm_backend *be, tdm_op_id id, int token, int64_t host_t0_ns)
{
    tdm_op_profile *p = be->prof;
    if (!p) return;
    if (token >= 0 && be->vt->prof_end) be->vt->prof_end(be, token, (int)id);
    double ms = (double)(tdm_now_mono_ns() - host_t0_ns) / 1e6;
    p->op[id].calls++;
    p->op[id].host_ms += ms;
    if (!be->vt->prof_begin) { /* synchronous backend: the host time is the op's time */
        p->op[id].device_ms += ms;
        if (p->depth == 1) p->window_ms += ms;
    }
    p->depth--;
}

/* ops by device time, largest first (a handful of entries: insertion sort) */
static void sort_ops(int *idx, int n, const tdm_op_stats *s)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[idx[j]].device_ms > s[idx[j - 1]].device_ms; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
}

static void print_row(FILE *out, const tdm_op_profile *p, int id, const char *indent, double win)
{
    const tdm_op_stats *s = &p->op[id];
    char name[64];
    snprintf(name, sizeof name, "%s%s", indent, tdm_op_name((tdm_op_id)id));
    fprintf(out, "  %-22s %9llu %11.2f %11.2f %6.1f%% %9.1f\n", name, (unsigned long long)s->calls,
            s->host_ms, s->device_ms, win > 0 ? 100.0 * s->device_ms / win : 0.0,
            s->calls ? 1000.0 * s->device_ms / (double)s->calls : 0.0);
}

void tdm_be_profile_report(tdm_backend *be, FILE *out)
{
    tdm_op_profile *p = be->prof;
    if (!p) return;
    if (be->vt->prof_collect) be->vt->prof_collect(be);
    int top[TDM_OP_N_TOP], sub[TDM_OP_COUNT - TDM_OP_N_TOP], nt = 0, ns = 0;
    double busy = 0, host = 0;
    for (int i = 0; i < TDM_OP_N_TOP; i++) {
        busy += p->op[i].device_ms;
        host += p->op[i].host_ms;
        if (p->op[i].calls) top[nt++] = i;
    }
    for (int i = TDM_OP_N_TOP; i < TDM_OP_COUNT; i++)
        if (p->op[i].calls) sub[ns++] = i;
    sort_ops(top, nt, p->op);
    sort_ops(sub, ns, p->op);
    double win = p->window_ms > busy ? p->window_ms : busy;
    fprintf(out,
            "op profile (backend %s): device window %.1f ms, ops busy %.1f ms, idle %.1f ms "
            "(%.1f%%); host time in ops %.1f ms\n",
            be->name, win, busy, win - busy, win > 0 ? 100.0 * (win - busy) / win : 0.0, host);
    fprintf(out, "  %-22s %9s %11s %11s %7s %9s\n", "op", "calls", "host ms", "device ms", "window",
            "us/call");
    for (int i = 0; i < nt; i++)
        print_row(out, p, top[i], "", win);
    if (ns) fprintf(out, "  parts of the ops above:\n");
    for (int i = 0; i < ns; i++)
        print_row(out, p, sub[i], "  ", win);
}
