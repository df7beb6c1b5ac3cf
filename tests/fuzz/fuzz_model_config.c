/* libFuzzer target: the model_config parser (body in model_targets.h; corpus in corpus/model_config/). */
#include "model_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_model_config_one(data, size);
}
