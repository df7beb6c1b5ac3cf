/* base_identity.h — what must be equal for two jobs' adapters to share one fused forward pass.
 *
 * A host advertises its identity; a joiner joins only a host with the same one. Two parts:
 *
 *   model    sha256 over the model directory's content, never its path (so two paths to one
 *            model, or two copies of it, match):
 *              config.json bytes (required);
 *              tokenizer.json and tokenizer_config.json bytes when present (the host tokenizes
 *              the joiner's data with its own tokenizer and chat template);
 *              model.safetensors.index.json bytes when present; then every weight file (the
 *              index's shards sorted by name, else model.safetensors): its file name, its size,
 *              its whole header (the 8-byte length and the JSON) and, for every tensor in name
 *              order, up to 64 bytes at the start, the middle and the end of its data. The samples
 *              tell apart two models with one shape (a base and a merged fine-tune of it, whose
 *              headers and sizes are equal) while reading ~200 bytes per tensor, not gigabytes.
 *   id       sha256 over "tandem-base-identity-v1", model, method ("qlora"/"lora"), double
 *            quantization (always false for lora), compute dtype ("f32" on the CPU backend,
 *            "bf16" on CUDA) and device (GPU UUID, or "cpu").
 *
 * Every field is length-prefixed in the hash, so no two different inputs concatenate alike.
 * max_seq_len, rank, targets and the other per-adapter options are not part of it: adapters with
 * different values share one pass (docs/co-training.md).
 */
#ifndef TANDEM_COTRAIN_BASE_IDENTITY_H
#define TANDEM_COTRAIN_BASE_IDENTITY_H
#include <stdbool.h>

#include "util/error.h"
#include "util/sha256.h"

#define TDM_BASE_DEVICE_MAX 128

typedef struct tdm_base_identity {
    char model[TDM_SHA256_TAGGED_LEN]; /* "sha256:<hex>" of the model directory's content */
    char method[8];                    /* "qlora" or "lora" */
    bool double_quant;                 /* false unless method is qlora */
    char compute_dtype[8];             /* "f32" or "bf16" */
    char device[TDM_BASE_DEVICE_MAX];  /* GPU UUID or "cpu" */
    char id[TDM_SHA256_TAGGED_LEN];    /* "sha256:<hex>" of everything above */
} tdm_base_identity;

/* Computes the identity of model_dir trained with method nf4 (qlora) or not (lora), double_quant,
 * compute_dtype ("f32"/"bf16") on device ("cpu" or a GPU UUID). Reads only config.json, the
 * tokenizer files, the safetensors headers and small samples. Errors name the file:
 * TDM_ERR_NOT_FOUND (no config.json or no weights), TDM_ERR_CORRUPT (a header that points outside
 * its file), TDM_ERR_IO, TDM_ERR_INVALID (an argument too long or empty). */
tdm_status tdm_base_identity_compute(const char *model_dir, bool nf4, bool double_quant,
                                     const char *compute_dtype, const char *device,
                                     tdm_base_identity *out, tdm_error *err);

/* Recomputes out->id from the other fields (after reading them from a sidecar, for instance). */
void tdm_base_identity_seal(tdm_base_identity *out);

/* "" when a and b are the same identity; otherwise the first part that differs ("model",
 * "method", "double quantization", "compute dtype", "device"), for a message saying why a host
 * was not joined. */
const char *tdm_base_identity_mismatch(const tdm_base_identity *a, const tdm_base_identity *b);

#endif
