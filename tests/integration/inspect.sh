#!/bin/bash
# tandem inspect: a model directory and a single file, text and --json; shards; and the errors
# (missing path, hostile header, truncated file, shape mismatch, missing tensor) exit 1 with the
# reason, usage errors exit 2.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

M="$WORK/m"
expect_exit 0 "$TANDEM" init-model "$M" --preset tiny-llama --seed 1
expect_exit 0 "$TANDEM" inspect "$M"
for want in "LlamaForCausalLM" "hidden 256" "kv heads 2" "llama3" "factor 32" "parameters:" \
    "nf4 base:" "lm_head.weight" "model.layers.3.mlp.down_proj.weight"; do
    grep -q -- "$want" "$WORK/last.out" || fail "inspect text lacks '$want'"
done

expect_exit 0 "$TANDEM" inspect "$M" --json
jq -e '.config.architecture == "LlamaForCausalLM" and .config.rope.type == "llama3"
       and .config.num_kv_heads == 2 and .parameters == .config.param_count
       and (.tensors | length) == 39 and .quantized_tensors == 28
       and ([.tensors[] | select(.quantized)] | length) == 28
       and .nf4_bytes < .nf4_bytes_no_double_quant and .nf4_bytes < .data_bytes' \
    "$WORK/last.out" >/dev/null || fail "inspect --json content"

# A single file: tensors only.
expect_exit 0 "$TANDEM" inspect "$M/model.safetensors" --json
jq -e '.config == null and (.tensors | length) == 39' "$WORK/last.out" >/dev/null ||
    fail "single-file json"

# Errors exit 1 with the reason.
expect_exit 1 "$TANDEM" inspect "$WORK/nowhere"
grep -q "nowhere" "$WORK/last.err" || fail "missing path not named"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$WORK/hostile.safetensors"
expect_exit 1 "$TANDEM" inspect "$WORK/hostile.safetensors"
grep -q "header length" "$WORK/last.err" || fail "hostile header reason"
head -c 100000 "$M/model.safetensors" >"$WORK/trunc.safetensors"
expect_exit 1 "$TANDEM" inspect "$WORK/trunc.safetensors"
grep -q "truncated" "$WORK/last.err" || fail "truncation reason"

cp -r "$M" "$WORK/bad"
sed -i 's/"intermediate_size": 688/"intermediate_size": 700/' "$WORK/bad/config.json"
expect_exit 1 "$TANDEM" inspect "$WORK/bad"
grep -q "has shape \[688, 256\] but config.json implies \[700, 256\]" "$WORK/last.err" ||
    fail "shape mismatch reason: $(cat "$WORK/last.err")"
sed -i 's/"intermediate_size": 700/"intermediate_size": 688/; s/"num_hidden_layers": 4/"num_hidden_layers": 5/' \
    "$WORK/bad/config.json"
expect_exit 1 "$TANDEM" inspect "$WORK/bad"
grep -q "model.layers.4.* is missing" "$WORK/last.err" || fail "missing tensor reason"
sed -i 's/"LlamaForCausalLM"/"GPT2LMHeadModel"/' "$WORK/bad/config.json"
expect_exit 1 "$TANDEM" inspect "$WORK/bad"
grep -q "GPT2LMHeadModel" "$WORK/last.err" || fail "unsupported architecture not named"
mkdir "$WORK/empty"
expect_exit 1 "$TANDEM" inspect "$WORK/empty"

# (Sharded models are covered by tests/unit/test_safetensors.c.) Usage errors:
expect_exit 2 "$TANDEM" inspect
expect_exit 2 "$TANDEM" inspect "$M" --bogus
expect_exit 2 "$TANDEM" inspect "$M" "$M"
expect_exit 0 "$TANDEM" inspect --help
finish
