#!/bin/bash
# tandem init-model: every tiny preset is written and inspects cleanly; the same seed gives the
# same bytes, another seed other bytes; f32 doubles the data; usage errors exit 2; a failed
# write leaves the previous model intact and no temp file behind.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

for p in tiny tiny-llama tiny-qwen3 tiny-mistral; do
    expect_exit 0 "$TANDEM" init-model "$WORK/$p" --preset "$p" --seed 3
    grep -q "preset $p" "$WORK/last.out" || fail "$p: no summary line"
    for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
        [ -s "$WORK/$p/$f" ] || fail "$p: $f missing"
    done
    expect_exit 0 "$TANDEM" inspect "$WORK/$p"
done
grep -q '"LlamaForCausalLM"' "$WORK/tiny-llama/config.json" || fail "tiny-llama architecture"
grep -q '"llama3"' "$WORK/tiny-llama/config.json" || fail "tiny-llama rope scaling"

expect_exit 0 "$TANDEM" init-model "$WORK/again" --preset tiny --seed 3
cmp -s "$WORK/tiny/model.safetensors" "$WORK/again/model.safetensors" || fail "same seed, other bytes"
expect_exit 0 "$TANDEM" init-model "$WORK/other" --preset tiny --seed 4
cmp -s "$WORK/tiny/model.safetensors" "$WORK/other/model.safetensors" && fail "other seed, same bytes"
expect_exit 0 "$TANDEM" init-model "$WORK/f32" --preset tiny --dtype f32
s16=$(stat -c %s "$WORK/tiny/model.safetensors"); s32=$(stat -c %s "$WORK/f32/model.safetensors")
[ $((s32 - 2 * s16)) -lt 10000 ] && [ $((2 * s16 - s32)) -lt 10000 ] || fail "f32 size $s32 vs bf16 $s16"
grep -q '"float32"' "$WORK/f32/config.json" || fail "f32 config dtype"

# --init-std: the matrices' spread (f32, so the bytes are the draws): 5x the default's, within 2%.
std_of() { python3 - "$1" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
t = h["model.embed_tokens.weight"]; f.seek(8 + n + t["data_offsets"][0])
k = (t["data_offsets"][1] - t["data_offsets"][0]) // 4; v = struct.unpack("<%df" % k, f.read(4 * k))
print("%.5f" % (sum(x * x for x in v) / k) ** 0.5)
PY
}
expect_exit 0 "$TANDEM" init-model "$WORK/std" --preset tiny --dtype f32 --init-std 0.1
s_default=$(std_of "$WORK/f32/model.safetensors"); s_wide=$(std_of "$WORK/std/model.safetensors")
awk -v a="$s_default" -v b="$s_wide" 'BEGIN { exit !(a > 0.0196 && a < 0.0204 && b > 0.098 && b < 0.102) }' ||
    fail "--init-std 0.1: embedding std $s_wide (default $s_default)"
expect_exit 2 "$TANDEM" init-model "$WORK/bad" --preset tiny --init-std 0
expect_exit 2 "$TANDEM" init-model "$WORK/bad" --preset tiny --init-std 2
# --layers N: the preset's first N layers, a model tandem loads (inspect) with that many
expect_exit 0 "$TANDEM" init-model "$WORK/one-layer" --preset tiny --layers 1
grep -q ", 1 layers," "$WORK/last.out" || fail "--layers 1: $(cat "$WORK/last.out")"
[ "$(jq .num_hidden_layers "$WORK/one-layer/config.json")" = 1 ] || fail "--layers 1: config.json"
expect_exit 0 "$TANDEM" inspect "$WORK/one-layer"
grep -q "layers 1," "$WORK/last.out" || fail "--layers 1: inspect says $(grep sizes "$WORK/last.out")"
expect_exit 2 "$TANDEM" init-model "$WORK/bad" --preset tiny --layers 0
expect_exit 2 "$TANDEM" init-model "$WORK/bad" --preset tiny --layers 1025

# --tokenizer: a directory or a tokenizer.json.
expect_exit 0 "$TANDEM" init-model "$WORK/tok" --preset tiny-llama --tokenizer "$WORK/tiny"
cmp -s "$WORK/tiny/tokenizer.json" "$WORK/tok/tokenizer.json" || fail "tokenizer not copied"
expect_exit 0 "$TANDEM" init-model "$WORK/tok2" --preset tiny --tokenizer "$WORK/tiny/tokenizer.json"
expect_exit 1 "$TANDEM" init-model "$WORK/tok3" --preset tiny --tokenizer "$WORK/nowhere"

# Usage errors.
expect_exit 2 "$TANDEM" init-model "$WORK/x"
expect_exit 2 "$TANDEM" init-model --preset tiny
expect_exit 2 "$TANDEM" init-model "$WORK/x" --preset nope
grep -q "known: tiny" "$WORK/last.err" || fail "unknown preset message lists presets"
expect_exit 2 "$TANDEM" init-model "$WORK/x" --preset tiny --dtype f16
expect_exit 2 "$TANDEM" init-model "$WORK/x" --preset tiny --seed -1
expect_exit 2 "$TANDEM" init-model "$WORK/x" --preset tiny --bogus
expect_exit 0 "$TANDEM" init-model --help
grep -q "qwen2.5-7b" "$WORK/last.out" || fail "help lists presets"
expect_exit 1 "$TANDEM" init-model "$WORK/no/such/parent" --preset tiny

# Atomicity: a failed rename keeps the old weights and leaves no temp file.
cp "$WORK/tiny/model.safetensors" "$WORK/before.safetensors"
TANDEM_FAULT_INJECT=safetensors.rename expect_exit 1 "$TANDEM" init-model "$WORK/tiny" --preset tiny --seed 9
cmp -s "$WORK/before.safetensors" "$WORK/tiny/model.safetensors" || fail "old weights damaged"
ls -a "$WORK/tiny" | grep -q 'tmp-' && fail "temp file left behind"
finish
