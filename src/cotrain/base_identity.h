/* base_identity.h — what must be equal for two jobs' adapters to share one fused forward pass.
 *
 * A host advertises its identity; a joiner joins only a host with the same one. Two parts:
 *
 *   model    sha256 over "tandem-cotrain-model-v2", the model's weights identity
 *            (tdm_base_identity of src/model/base_identity.h: config.json and every
 *            *.safetensors file's name, size, header and sampled data, never the path; the
 *            identity metadata.json records and `tandem eval --adapter` checks), then
 *            tokenizer.json and tokenizer_config.json bytes, or "absent" (the host tokenizes
 *            the joiner's data with its own tokenizer and chat template).
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
 * tokenizer files, the safetensors headers and sampled blocks. Errors name the file:
 * TDM_ERR_NOT_FOUND (no config.json or no .safetensors file), TDM_ERR_CORRUPT (a header length
 * beyond its file), TDM_ERR_IO, TDM_ERR_INVALID (an argument too long or empty). */
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
