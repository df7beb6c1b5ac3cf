/* model_targets.h — the bodies of the model parsers' fuzz targets, shared by the libFuzzer
 * programs (tests/fuzz/fuzz_*.c) and the corpus replay in the ordinary build
 * (tests/unit/test_model_fuzz_corpus.c). Each returns 0; crashes and sanitizer reports are the
 * findings. */
#ifndef TANDEM_TESTS_FUZZ_MODEL_TARGETS_H
#define TANDEM_TESTS_FUZZ_MODEL_TARGETS_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/layout.h"
#include "model/safetensors.h"

/* Parses a safetensors image; when accepted, reads every tensor byte and converts the float
 * ones (any out-of-bounds pointer shows up under ASan). */
static inline int fuzz_safetensors_one(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exact size: overreads are caught */
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    tdm_st_file f;
    tdm_error err = {0};
    if (tdm_st_parse(&f, copy, size, "fuzz", &err) == TDM_OK) {
        unsigned sum = 0;
        for (size_t i = 0; i < f.n_tensors; i++) {
            const tdm_st_tensor *t = &f.tensors[i];
            for (uint64_t b = 0; b < t->nbytes; b++)
                sum += ((const uint8_t *)t->data)[b];
            if ((t->dtype == TDM_DTYPE_F32 || t->dtype == TDM_DTYPE_F16 ||
                 t->dtype == TDM_DTYPE_BF16) &&
                t->numel > 0) {
                float *out = malloc((size_t)t->numel * sizeof *out);
                if (out)
                    tdm_st_tensor_to_f32(t, out, &err);
                free(out);
            }
            if (tdm_st_find(&f, t->name) == NULL)
                abort();
        }
        for (size_t i = 0; i < f.n_meta; i++)
            if (!tdm_st_metadata(&f, f.meta_keys[i]))
                abort();
        (void)sum;
        tdm_st_close(&f);
    } else if (!err.message[0]) {
        abort(); /* every refusal must say why */
    }
    free(copy);
    return 0;
}

/* Parses a config.json; when accepted, builds the layout, counts, and round-trips to JSON. */
static inline int fuzz_model_config_one(const uint8_t *data, size_t size)
{
    tdm_model_config c, back;
    tdm_error err = {0};
    if (tdm_model_config_parse(&c, (const char *)data, size, "config.json", &err) != TDM_OK) {
        if (!err.message[0])
            abort();
        return 0;
    }
    /* Skip layouts too large to allocate quickly (the sizes are capped at 2^40 each). */
    if (c.num_layers <= 4096) {
        tdm_tensor_desc *d;
        size_t n;
        if (tdm_model_layout(&c, &d, &n, &err) == TDM_OK)
            free(d);
    }
    (void)tdm_model_config_param_count(&c);
    char *json;
    if (tdm_model_config_to_json(&c, &json, &err) == TDM_OK) {
        if (tdm_model_config_parse(&back, json, strlen(json), "roundtrip", &err) != TDM_OK)
            abort(); /* what tandem writes, tandem must read */
        free(json);
    }
    return 0;
}

#endif
