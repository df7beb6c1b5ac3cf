/* libFuzzer target: the TANDEM_FAKE_GPUS parser must never crash, leak or accept an inconsistent
 * world. Run: build-fuzz/tests/fuzz/fuzz_fake_gpus tests/fuzz/corpus/fake_gpus */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/fake_gpus.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    tdm_gpu *gpus;
    size_t n;
    tdm_error err = {0};
    tdm_status st = tdm_fake_gpus_parse(text, "fuzz", &gpus, &n, &err);
    if (st == TDM_OK) {
        for (size_t i = 0; i < n; i++) {
            const tdm_gpu *g = &gpus[i];
            if (!g->uuid[0] || g->total_mb <= 0 || g->used_mb < 0 || g->used_mb > g->total_mb ||
                g->free_mb != g->total_mb - g->used_mb || g->index != (int)i)
                abort();
        }
    } else if (st != TDM_ERR_INVALID && st != TDM_ERR_NOMEM) {
        abort();
    } else if (gpus || n || !err.message[0]) {
        abort();
    }
    tdm_gpu_list_free(gpus, n);
    free(text);
    return 0;
}
