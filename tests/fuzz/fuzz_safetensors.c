/* libFuzzer target: the safetensors parser (body in model_targets.h; corpus in corpus/safetensors/). */
#include "model_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_safetensors_one(data, size);
}
