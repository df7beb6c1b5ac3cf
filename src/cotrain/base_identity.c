/* base_identity.c — hash of a model directory's content and the run settings that decide whether
 * two jobs can share a forward pass (contract in base_identity.h). */
#include "cotrain/base_identity.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/base_identity.h"
#include "util/atomic_file.h"

/* Field: 8-byte little-endian length, then the bytes. */
static void put_field(tdm_sha256 *h, const void *data, size_t len)
{
    uint8_t n[8];
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)((uint64_t)len >> (8 * i));
    tdm_sha256_update(h, n, 8);
    tdm_sha256_update(h, data, len);
}

static void put_str(tdm_sha256 *h, const char *s)
{
    put_field(h, s, strlen(s));
}

/* Hashes "name", then "present" + bytes or "absent". */
static tdm_status put_file(tdm_sha256 *h, const char *dir, const char *name, bool required,
                           tdm_error *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s/%s", dir, name);
    put_str(h, name);
    char *text = NULL;
    size_t len = 0;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st == TDM_ERR_NOT_FOUND && !required) {
        put_str(h, "absent");
        return TDM_OK;
    }
    if (st != TDM_OK) return st;
    put_str(h, "present");
    put_field(h, text, len);
    free(text);
    return TDM_OK;
}

void tdm_base_identity_seal(tdm_base_identity *out)
{
    tdm_sha256 h;
    tdm_sha256_init(&h);
    put_str(&h, "tandem-base-identity-v1");
    put_str(&h, out->model);
    put_str(&h, out->method);
    put_str(&h, out->double_quant ? "double-quant" : "single-quant");
    put_str(&h, out->compute_dtype);
    put_str(&h, out->device);
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&h, d);
    tdm_sha256_tagged(d, out->id);
}

tdm_status tdm_base_identity_compute(const char *model_dir, bool nf4, bool double_quant,
                                     const char *compute_dtype, const char *device,
                                     tdm_base_identity *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!compute_dtype || !*compute_dtype || strlen(compute_dtype) >= sizeof out->compute_dtype)
        return tdm_fail(err, TDM_ERR_INVALID, "base identity: compute dtype must be f32 or bf16");
    if (!device || !*device || strlen(device) >= sizeof out->device)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "base identity: device must be \"cpu\" or a GPU UUID of at most %d bytes",
                        TDM_BASE_DEVICE_MAX - 1);
    /* The weights part is the one base identity of the project (src/model/base_identity.c, the
     * one metadata.json records and eval checks); the tokenizer files are added on top because
     * the host tokenizes the joiner's data with its own tokenizer and chat template. */
    char weights[TDM_BASE_IDENTITY_LEN];
    tdm_status st = tdm_base_model_identity(model_dir, weights, err);
    if (st != TDM_OK) return st;
    tdm_sha256 h;
    tdm_sha256_init(&h);
    put_str(&h, "tandem-cotrain-model-v2");
    put_str(&h, weights);
    st = put_file(&h, model_dir, "tokenizer.json", false, err);
    if (st == TDM_OK) st = put_file(&h, model_dir, "tokenizer_config.json", false, err);
    if (st != TDM_OK) return st;
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&h, d);
    tdm_sha256_tagged(d, out->model);
    snprintf(out->method, sizeof out->method, "%s", nf4 ? "qlora" : "lora");
    out->double_quant = nf4 && double_quant;
    snprintf(out->compute_dtype, sizeof out->compute_dtype, "%s", compute_dtype);
    snprintf(out->device, sizeof out->device, "%s", device);
    tdm_base_identity_seal(out);
    return TDM_OK;
}

const char *tdm_base_identity_mismatch(const tdm_base_identity *a, const tdm_base_identity *b)
{
    if (strcmp(a->model, b->model) != 0) return "model";
    if (strcmp(a->method, b->method) != 0) return "method";
    if (a->double_quant != b->double_quant) return "double quantization";
    if (strcmp(a->compute_dtype, b->compute_dtype) != 0) return "compute dtype";
    if (strcmp(a->device, b->device) != 0) return "device";
    return strcmp(a->id, b->id) != 0 ? "identity" : "";
}
