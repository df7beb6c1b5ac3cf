/* peft_io.h — read and write LoRA adapters in Hugging Face PEFT's directory format, so that
 * `PeftModel.from_pretrained(base, DIR)` loads what tandem trains and tandem can start from what
 * PEFT saved (`--init-adapter DIR`). Format details: docs/peft-adapters.md.
 *
 * DIR/adapter_model.safetensors
 *     "base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight"  (r, in)
 *     "base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_B.weight"   (out, r)
 *     ... one A and one B per targeted module; written F32 with __metadata__ {"format": "pt"};
 *     read as F32, F16 or BF16.
 * DIR/adapter_config.json  (keys sorted, as PEFT writes them)
 *     peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha, lora_dropout, target_modules (list,
 *     in q,k,v,o,gate,up,down order), use_rslora, bias "none", base_model_name_or_path, and
 *     PEFT's defaults for the rest (fan_in_fan_out false, use_dora false, init_lora_weights true,
 *     inference_mode true, rank_pattern {}, alpha_pattern {}, ...).
 */
#ifndef TANDEM_TRAIN_PEFT_IO_H
#define TANDEM_TRAIN_PEFT_IO_H
#include <stddef.h>

#include "model/config.h"
#include "train/lora.h"
#include "util/error.h"

#define TDM_PEFT_WEIGHTS_FILE "adapter_model.safetensors"
#define TDM_PEFT_CONFIG_FILE "adapter_config.json"

/* What adapter_config.json says beyond the shapes tdm_lora_params carries. */
typedef struct tdm_peft_meta {
    char base_model_name_or_path[1024]; /* "" writes/reads as "" (PEFT then needs the base given) */
    double lora_dropout;                /* 0 <= p < 1 */
} tdm_peft_meta;

/* The adapter_config.json text for l and meta (malloc'd, NUL-terminated). */
tdm_status tdm_peft_config_json(const tdm_lora_params *l, const tdm_peft_meta *meta, char **out,
                                tdm_error *err);

/* Writes adapter_model.safetensors and adapter_config.json into the existing directory dir, each
 * replaced atomically (temp file, fsync, rename); the pair is not atomic as a whole (use
 * tdm_peft_save for that). */
tdm_status tdm_peft_write_files(const char *dir, const tdm_lora_params *l, const tdm_peft_meta *meta,
                                tdm_error *err);

/* Creates or replaces the directory dir as a whole (util/atomic_dir.h): a reader sees the old
 * adapter or the new one, never a mix. */
tdm_status tdm_peft_save(const char *dir, const tdm_lora_params *l, const tdm_peft_meta *meta,
                         tdm_error *err);

/* Parses adapter_config.json text: rank, alpha, targets, rslora, dropout and base model. Refuses
 * (TDM_ERR_UNSUPPORTED, naming the key) what tandem cannot reproduce: another peft_type, DoRA,
 * bias other than "none", fan_in_fan_out, rank/alpha patterns, layers_to_transform,
 * layer_replication, modules_to_save, lora_bias, and target_modules given as a regex string or
 * naming modules other than the seven projections. TDM_ERR_PARSE names FILE:LINE:COL for bad
 * JSON and FILE: key for bad fields. */
tdm_status tdm_peft_config_parse(const char *text, size_t len, const char *name, int *rank,
                                 double *alpha, uint32_t *targets, bool *use_rslora,
                                 tdm_peft_meta *meta, tdm_error *err);

/* Loads the adapter in dir for a model with config cfg: reads the config, lays out *l
 * (tdm_lora_params_init), and fills every A and B from the safetensors file, converting F16/BF16 to
 * f32. Every module of every layer must be present with shape A (r, in), B (out, r); a tensor the
 * layout does not expect is an error naming it. meta may be NULL. On failure *l is zeroed. */
tdm_status tdm_peft_load(const char *dir, const tdm_model_config *cfg, tdm_lora_params *l,
                         tdm_peft_meta *meta, tdm_error *err);

#endif
