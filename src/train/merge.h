/* merge.h — merge LoRA adapters into their base model and write a Hugging Face model directory
 * (`tandem merge`, docs/merge.md).
 *
 * For every decoder projection W (out, in) that an adapter targets:
 *     W' = W + sum_i weight_i * scale_i * B_i A_i      scale_i = alpha_i / r_i  (alpha_i /
 * sqrt(r_i) with use_rslora) computed in f32: per row o, delta = sum_i sum_k (c_i * B_i[o,k]) *
 * A_i[k,:] with c_i = (float)(weight_i * scale_i), adapters in the order given and k ascending,
 * accumulated in one f32 row; then W'[o,:] = W[o,:] + delta, rounded to the output dtype.
 *
 * The base W is either the weights as stored (TDM_MERGE_BASE_ORIGINAL) or, for an adapter trained
 * with QLoRA, what the adapter saw: every decoder projection (targeted or not) quantized to NF4
 * and dequantized again exactly as training held it (model/nf4.h, blocks of 64, the run's double
 * quantization setting; TDM_MERGE_BASE_DEQUANTIZED). TDM_MERGE_BASE_AUTO picks from the adapters'
 * run records (train/run_records.h, "method"): dequantized when every adapter was trained with
 * qlora, original when none was (--method lora, or made elsewhere such as by PEFT), an error when
 * they differ.
 *
 * Output directory (built as a temporary sibling, then renamed into place, util/atomic_dir.h):
 *     model-00001-of-0000N.safetensors ...   every tensor of the base, in name order, cut into
 *                                            shards of at most max_shard_bytes (a tensor larger
 *                                            than that gets a shard of its own),
 *                                            __metadata__ {"format": "pt"}
 *     model.safetensors.index.json           {"metadata": {"total_size": BYTES}, "weight_map":
 *                                            {"<tensor>": "<shard>"}}  (keys sorted, indent 2)
 *     config.json                            the base's, with "dtype" (transformers >= 5)
 *                                            and/or "torch_dtype" (older; written when neither
 *                                            is present) set to the output dtype
 *     tokenizer and generation files         copied as they are (TDM_MERGE_COPIED_FILES)
 *     tandem_merge.json                      what was merged: base mode, adapters, weights, scales
 * Float tensors (F32, F16, BF16) are written in the output dtype (each keeps its own when none is
 * given); other dtypes are copied bit for bit. A tensor the merge does not change and whose dtype
 * stays is copied bit for bit too.
 *
 * Memory: the base is memory-mapped; one tensor in f32, its NF4 form while dequantizing, one
 * tensor in the output dtype, the adapters (f32) and one delta row per thread.
 */
#ifndef TANDEM_TRAIN_MERGE_H
#define TANDEM_TRAIN_MERGE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"
#include "util/error.h"

#define TDM_MERGE_RECORD_FILE "tandem_merge.json"
#define TDM_MERGE_DEFAULT_SHARD_BYTES 5000000000ull /* transformers' save_pretrained "5GB" */

/* The files copied from MODEL_DIR when present (NULL-terminated). */
extern const char *const TDM_MERGE_COPIED_FILES[];

typedef enum tdm_merge_base {
    TDM_MERGE_BASE_AUTO,
    TDM_MERGE_BASE_ORIGINAL,    /* the weights as stored */
    TDM_MERGE_BASE_DEQUANTIZED, /* NF4 round trip of every projection, as QLoRA training saw it */
} tdm_merge_base;

const char *tdm_merge_base_name(tdm_merge_base b); /* "auto", "original", "dequantized" */

typedef struct tdm_merge_adapter {
    const char *dir; /* PEFT directory (adapter_config.json + adapter_model.safetensors) */
    double weight;   /* finite; 1 for a plain merge */
} tdm_merge_adapter;

typedef struct tdm_merge_opts {
    const char *model_dir;
    const tdm_merge_adapter *adapters;
    size_t n_adapters; /* >= 1 */
    const char *out_dir;
    tdm_merge_base base;
    /* Double quantization for the dequantized base when no adapter records it (adapters made
     * elsewhere merged with --base dequantized): true is training's default. double_quant_given:
     * the user chose it, and an adapter recording the other setting is refused. */
    bool double_quant, double_quant_given;
    bool has_dtype;           /* false: every float tensor keeps its stored dtype */
    tdm_dtype dtype;          /* F32, F16 or BF16 when has_dtype */
    uint64_t max_shard_bytes; /* 0: TDM_MERGE_DEFAULT_SHARD_BYTES */
    bool force;               /* replace a non-empty out_dir (atomically) instead of refusing */
    void (*note)(const char *line, void *user); /* progress and notes, may be NULL */
    void *note_user;
} tdm_merge_opts;

typedef struct tdm_merge_result {
    tdm_merge_base base; /* the one used (never AUTO) */
    bool double_quant;   /* with DEQUANTIZED */
    size_t n_tensors;    /* tensors written */
    size_t n_merged;     /* of them, projections that received a delta */
    size_t n_shards;
    uint64_t total_size; /* tensor bytes over all shards (index metadata.total_size) */
} tdm_merge_result;

/* Merges o->adapters into o->model_dir and writes o->out_dir (see above). Refuses, before writing
 * anything: an out_dir that is or holds the model, or that is, holds or lies inside one of the
 * adapters or any adapter directory or training OUT_DIR (tdm_is_adapter_or_run_dir), with or
 * without force; a non-empty out_dir without force, a file at out_dir (TDM_ERR_INVALID); an
 * adapter whose run record names another base model, adapters whose methods or
 * double-quantization settings disagree under AUTO, a recorded NF4 block size other than 64
 * (TDM_ERR_UNSUPPORTED); an adapter whose tensors do not fit the model (shape, layer count: the
 * message names the adapter and tensor). On any failure out_dir keeps what it had and no
 * temporary directory is left. res may be NULL. */
tdm_status tdm_merge(const tdm_merge_opts *o, tdm_merge_result *res, tdm_error *err);

#endif
