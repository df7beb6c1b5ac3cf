#include "model/presets.h"

#include <stdio.h>
#include <string.h>

typedef struct preset {
    tdm_preset_info info;
    tdm_arch arch;
    int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double eps, theta;
    int tie;
    int llama3; /* llama3 RoPE scaling with factor 32, 1, 4, 8192 (scaled down for tiny) */
    int64_t llama3_orig;
} preset;

static const preset presets[] = {
    {{"tiny", "Qwen2-shaped, ~3M parameters: trains in seconds on a CPU"},
     TDM_ARCH_QWEN2, 256, 688, 4, 4, 2, 64, 320, 2048, 1e-6, 1e6, 1, 0, 0},
    {{"tiny-llama", "Llama-shaped with llama3 RoPE scaling, untied lm_head, ~3M parameters"},
     TDM_ARCH_LLAMA, 256, 688, 4, 4, 2, 64, 320, 2048, 1e-5, 500000.0, 0, 1, 256},
    {{"tiny-qwen3", "Qwen3-shaped (q/k norms), ~3M parameters"},
     TDM_ARCH_QWEN3, 256, 688, 4, 4, 2, 64, 320, 2048, 1e-6, 1e6, 1, 0, 0},
    {{"tiny-mistral", "Mistral-shaped, ~3M parameters"},
     TDM_ARCH_MISTRAL, 256, 688, 4, 4, 2, 64, 320, 2048, 1e-5, 1e6, 0, 0, 0},
    {{"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B shapes (494M parameters)"},
     TDM_ARCH_QWEN2, 896, 4864, 24, 14, 2, 64, 151936, 32768, 1e-6, 1e6, 1, 0, 0},
    {{"qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B shapes (1.54B parameters)"},
     TDM_ARCH_QWEN2, 1536, 8960, 28, 12, 2, 128, 151936, 131072, 1e-6, 1e6, 1, 0, 0},
    {{"qwen2.5-7b", "Qwen/Qwen2.5-7B shapes (7.6B parameters, ~15 GB in bf16)"},
     TDM_ARCH_QWEN2, 3584, 18944, 28, 28, 4, 128, 152064, 131072, 1e-6, 1e6, 0, 0, 0},
    {{"qwen3-0.6b", "Qwen/Qwen3-0.6B shapes (596M parameters)"},
     TDM_ARCH_QWEN3, 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e-6, 1e6, 1, 0, 0},
    {{"llama3.2-1b", "meta-llama/Llama-3.2-1B shapes (1.24B parameters, llama3 RoPE)"},
     TDM_ARCH_LLAMA, 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1e-5, 500000.0, 1, 1, 8192},
};

#define N_PRESETS (sizeof presets / sizeof *presets)

const tdm_preset_info *tdm_presets(size_t *n)
{
    static tdm_preset_info infos[N_PRESETS];
    for (size_t i = 0; i < N_PRESETS; i++)
        infos[i] = presets[i].info;
    *n = N_PRESETS;
    return infos;
}

tdm_status tdm_preset_config(const char *name, tdm_model_config *c, tdm_error *err)
{
    const preset *p = NULL;
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].info.name, name))
            p = &presets[i];
    if (!p) {
        char names[512] = "";
        for (size_t i = 0; i < N_PRESETS; i++) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                     presets[i].info.name);
        }
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "unknown preset \"%s\" (known: %s)", name, names);
    }
    static const char *archs[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                  "Qwen3ForCausalLM"};
    static const char *types[] = {"llama", "mistral", "qwen2", "qwen3"};
    memset(c, 0, sizeof *c);
    c->arch = p->arch;
    snprintf(c->architecture, sizeof c->architecture, "%s", archs[p->arch]);
    snprintf(c->model_type, sizeof c->model_type, "%s", types[p->arch]);
    c->hidden_size = p->hidden;
    c->intermediate_size = p->intermediate;
    c->num_layers = p->layers;
    c->num_heads = p->heads;
    c->num_kv_heads = p->kv_heads;
    c->head_dim = p->head_dim;
    c->vocab_size = p->vocab;
    c->max_position_embeddings = p->max_pos;
    c->rms_norm_eps = p->eps;
    c->tie_word_embeddings = p->tie;
    c->qkv_bias = p->arch == TDM_ARCH_QWEN2;
    c->qk_norm = p->arch == TDM_ARCH_QWEN3;
    c->rope.type = p->llama3 ? TDM_ROPE_LLAMA3 : TDM_ROPE_DEFAULT;
    c->rope.theta = p->theta;
    c->rope.factor = p->llama3 ? 32.0 : 1.0;
    if (p->llama3) {
        c->rope.low_freq_factor = 1.0;
        c->rope.high_freq_factor = 4.0;
        c->rope.original_max_position_embeddings = p->llama3_orig;
    }
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
    c->bos_token_id = -1;
    c->eos_token_id = -1;
    return TDM_OK;
}
