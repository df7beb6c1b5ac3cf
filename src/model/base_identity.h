/* base_identity.h — a short fingerprint of a base model's weights, independent of where the model
 * directory lies, so that an adapter can tell which base it was trained on (`tandem eval
 * --adapter` refuses another base) and trainers can tell whether two jobs share one base.
 *
 * identity = "sha256:" + SHA-256 over, in this order:
 *   "tandem-base-identity-v1\n"
 *   config.json's bytes (length-prefixed)
 *   for each *.safetensors file of the directory, by name (bytewise order):
 *     its file name, its size in bytes, its header (the 8-byte length and the JSON), and
 *     TDM_BASE_IDENTITY_SAMPLES blocks of TDM_BASE_IDENTITY_BLOCK bytes of its tensor data at
 *     evenly spaced offsets (first and last block included)
 * The sampled blocks tell apart two checkpoints of one architecture (a base and its instruct
 * tune have the same config and headers) while reading about 1 MiB per file instead of the
 * whole model (gigabytes). The path of the directory is not part of it: a copied or moved model
 * keeps its identity.
 */
#ifndef TANDEM_MODEL_BASE_IDENTITY_H
#define TANDEM_MODEL_BASE_IDENTITY_H
#include "util/error.h"
#include "util/sha256.h"

#define TDM_BASE_IDENTITY_SAMPLES 64
#define TDM_BASE_IDENTITY_BLOCK 16384
#define TDM_BASE_IDENTITY_LEN TDM_SHA256_TAGGED_LEN

/* Writes model_dir's identity ("sha256:<64 hex>") to out. TDM_ERR_NOT_FOUND when config.json or
 * every .safetensors file is missing; TDM_ERR_IO / TDM_ERR_CORRUPT (a header larger than the file)
 * with the file's path. */
tdm_status tdm_base_model_identity(const char *model_dir, char out[TDM_BASE_IDENTITY_LEN],
                                   tdm_error *err);

#endif
