/* fuzz_tokenizer_json.c — libFuzzer target: any bytes as a tokenizer.json. Loading must either
 * fail cleanly or give a tokenizer that encodes a fixed text and decodes it back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static int fuzz_tokenizer_json_one(const uint8_t *data, size_t size)
{
    tdm_tokenizer tok;
    tdm_error err = {0};
    if (tdm_tokenizer_load_json(&tok, (const char *)data, size, "fuzz.json", &err) != TDM_OK)
        return 0;
    static const char text[] = "Hi <|im_end|> 12345 caf\xc3\xa9 \xf0\x9f\x98\x80\n\n  x";
    tdm_token_ids ids = {0};
    if (tdm_tokenizer_encode(&tok, text, sizeof text - 1, true, &ids, &err) == TDM_OK) {
        char *out = NULL;
        size_t len = 0, cap = 0;
        (void)tdm_tokenizer_decode(&tok, ids.ids, ids.len, false, &out, &len, &cap, &err);
        free(out);
    }
    tdm_token_ids_free(&ids);
    tdm_tokenizer_free(&tok);
    return 0;
}

#ifndef TANDEM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_tokenizer_json_one(data, size);
}
#endif
