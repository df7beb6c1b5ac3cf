# tandem merge end to end (CPU): the merged model's eval loss (tandem eval OUT --method lora)
# equals base + adapter within 1e-4 relative, for a QLoRA adapter tandem trained (default: the
# dequantized NF4 base; compared with eval --method qlora --adapter), the same adapter with
# --base original (compared with eval --method lora --adapter), and a PEFT-made rsLoRA fixture
# adapter (made elsewhere: original by default); the index agrees with the shards (names, sizes,
# total_size); --dtype is honoured (every tensor, config.json) and the default keeps the stored
# dtype; usage errors (a weight that is no finite number included) and an adapter of another
# shape exit 2, conflicting adapters and a missing one exit 1; a non-empty OUT_DIR is refused
# unless --force, and an adapter directory or training OUT_DIR (or one inside or holding one)
# even with it; a failure while writing leaves no OUT_DIR and no temporary directory.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
G="$TANDEM_SOURCE_DIR/tests/fixtures/train/golden"
"$TANDEM" init-model tiny --preset tiny --init-std 0.1 --dtype f32 >/dev/null || { echo "init-model failed"; exit 1; }
for i in $(seq 1 16); do echo "{\"instruction\": \"w$i\", \"response\": \"hi there $i!\"}"; done >d.jsonl
expect_exit 0 "$TANDEM" finetune tiny --adapter d.jsonl:out/q --device cpu --epochs 2 --batch-size 8 \
    --lr 3e-2 --rank 4 --targets q_proj,v_proj,down_proj --chat-template none --save-every 0 --val-split 0
jq -e '.method == "qlora" and .double_quant == true and .nf4_block_size == 64' out/q/metadata.json >/dev/null ||
    fail "metadata.json does not record the method: $(cat out/q/metadata.json)"

ev() { "$TANDEM" eval "$@" --device cpu --chat-template none --json; }
# loss_of ARGS...: eval's loss
loss_of() { expect_exit 0 ev "$@"; jq -r .loss "$WORK/last.out"; }
# close WHAT A B: |A - B| <= 1e-4 |B|
close() {
    awk -v a="$2" -v b="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; s = b < 0 ? -b : b; exit !(a != "" && d <= 1e-4 * s) }' ||
        fail "$1: merged loss $2, base + adapter $3"
    echo "$1: merged $2, base + adapter $3"
}

# 1. QLoRA adapter: dequantized base by default
expect_exit 0 "$TANDEM" merge tiny --adapter out/q --out m_q --dtype f32
grep -q "base: dequantized (NF4, blocks of 64, double quantization)" "$WORK/last.err" || fail "no base note: $(cat "$WORK/last.err")"
jq -e '.base == "dequantized" and .double_quant == true and .adapters[0].method == "qlora"' m_q/tandem_merge.json >/dev/null ||
    fail "tandem_merge.json: $(cat m_q/tandem_merge.json)"
q_merged=$(loss_of m_q --method lora --data d.jsonl)
q_ref=$(loss_of tiny --adapter out/q --data d.jsonl)
close "qlora, dequantized base" "$q_merged" "$q_ref"
# 2. the same adapter into the original weights
expect_exit 0 "$TANDEM" merge tiny --adapter out/q --out m_o --base original --dtype f32
grep -q "trained with QLoRA; merging into the original weights" "$WORK/last.err" || fail "no QLoRA note: $(cat "$WORK/last.err")"
close "qlora adapter, --base original" "$(loss_of m_o --method lora --data d.jsonl)" \
    "$(loss_of tiny --adapter out/q --method lora --data d.jsonl)"
[ "$q_merged" != "$(loss_of m_o --method lora --data d.jsonl)" ] || fail "the two bases give the same model"
# 3. a PEFT adapter (rsLoRA, no run record) on the golden Qwen2 model: original by default
jq -c '.sequences[] | {input_ids, labels}' "$G/data.json" >tok.jsonl
expect_exit 0 "$TANDEM" merge "$G/qwen2" --adapter "$G/qwen2_qv_r4_rslora/adapter" --out m_p
jq -e '.base == "original" and .adapters[0].use_rslora == true and .adapters[0].method == null' m_p/tandem_merge.json >/dev/null ||
    fail "PEFT adapter: $(cat m_p/tandem_merge.json)"
close "PEFT rsLoRA adapter" "$(loss_of m_p --method lora --data tok.jsonl)" \
    "$(loss_of "$G/qwen2" --adapter "$G/qwen2_qv_r4_rslora/adapter" --method lora --data tok.jsonl)"
# the stored dtype is kept without --dtype (F32 here), config.json copied as it is
cmp -s "$G/qwen2/config.json" m_p/config.json || fail "config.json changed without --dtype"
cmp -s "$G/qwen2/generation_config.json" m_p/generation_config.json || fail "generation_config.json not copied"
expect_exit 0 "$TANDEM" inspect m_p
[ "$(grep -c ' F32 ' "$WORK/last.out")" = 26 ] || fail "not every tensor kept F32: $(cat "$WORK/last.out")"

# 4. shards and the index
expect_exit 0 "$TANDEM" merge tiny --adapter out/q --out m_s --max-shard-size 1MB --dtype bf16 --quiet
[ ! -s "$WORK/last.err" ] || fail "--quiet printed: $(cat "$WORK/last.err")"
n=$(ls m_s/*.safetensors | wc -l)
[ "$n" -gt 2 ] || fail "--max-shard-size 1MB gave $n shard(s)"
[ "$(jq -r '.weight_map[]' m_s/model.safetensors.index.json | sort -u | tr '\n' ' ')" = "$(cd m_s && ls model-*-of-*.safetensors | tr '\n' ' ')" ] ||
    fail "the index names other shards than the directory holds"
total=0
for f in m_s/model-*.safetensors; do
    hl=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
    [ "$(head -c $((8 + hl)) "$f" | tail -c "$hl" | jq -r '.__metadata__.format')" = pt ] || fail "$f: no format pt"
    total=$((total + $(stat -c %s "$f") - 8 - hl))
done
[ "$(jq .metadata.total_size m_s/model.safetensors.index.json)" = "$total" ] || fail "total_size is not the shards' tensor bytes ($total)"
[ "$(jq '.weight_map | length' m_s/model.safetensors.index.json)" = 50 ] || fail "the index does not list 50 tensors"
# --dtype bf16: every tensor, and config.json
expect_exit 0 "$TANDEM" inspect m_s
[ "$(grep -c ' BF16 ' "$WORK/last.out")" = 50 ] || fail "--dtype bf16: not every tensor is BF16: $(cat "$WORK/last.out")"
[ "$(jq -r .torch_dtype m_s/config.json)" = bfloat16 ] || fail "config.json torch_dtype: $(jq .torch_dtype m_s/config.json)"
cmp -s tiny/tokenizer.json m_s/tokenizer.json || fail "tokenizer.json not copied"
# bf16 rounding moves the loss a little, not much
bf=$(loss_of m_s --method lora --data d.jsonl)
awk -v a="$bf" -v b="$q_ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05 * b) }' || fail "bf16 merge: loss $bf vs $q_ref"

# 5. refusals
expect_exit 2 "$TANDEM" merge tiny --adapter out/q
grep -q -- "--out OUT_DIR is required" "$WORK/last.err" || fail "no --out: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --out x
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out x --dtype f8
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out x --base nf4
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out x --max-shard-size lots
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out m_q
grep -q "m_q exists and is not empty: .*--force" "$WORK/last.err" || fail "non-empty OUT_DIR: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out ./tiny/ --force
grep -q "is (or holds) the model tiny" "$WORK/last.err" || fail "OUT_DIR = MODEL_DIR: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out out --force
grep -q "is (or holds) the adapter out/q" "$WORK/last.err" || fail "OUT_DIR holding the adapter: $(cat "$WORK/last.err")"
# --force replaces (here m_o, whose loss changes to m_q's)
expect_exit 0 "$TANDEM" merge tiny --adapter out/q --out m_o --dtype f32 --force
close "--force replaced m_o" "$(loss_of m_o --method lora --data d.jsonl)" "$q_ref"
# an adapter of another model: the tensor and shapes named
expect_exit 2 "$TANDEM" merge tiny --adapter "$G/llama_all_r8/adapter" --out x
grep -q "does not fit tiny.*lora_A.weight" "$WORK/last.err" || fail "incompatible adapter: $(cat "$WORK/last.err")"
# trained on another base (same shapes, other weights)
"$TANDEM" init-model tiny2 --preset tiny --init-std 0.1 --dtype f32 --seed 9 >/dev/null
expect_exit 1 "$TANDEM" merge tiny2 --adapter out/q --out x
grep -q "was trained on another base model than tiny2" "$WORK/last.err" || fail "another base: $(cat "$WORK/last.err")"
# a QLoRA adapter beside one made elsewhere: the base must be chosen
mkdir -p peft_copy && cp out/q/adapter_config.json out/q/adapter_model.safetensors peft_copy/
expect_exit 1 "$TANDEM" merge tiny --adapter out/q:0.5 --adapter peft_copy:0.5 --out x
grep -q "pick the base with --base dequantized or --base original" "$WORK/last.err" || fail "mixed methods: $(cat "$WORK/last.err")"
# ... and with it chosen, the linear merge of two halves of one adapter is that adapter
expect_exit 0 "$TANDEM" merge tiny --adapter out/q:0.5 --adapter peft_copy:0.5 --base dequantized --out m_half --dtype f32
close "two halves of one adapter" "$(loss_of m_half --method lora --data d.jsonl)" "$q_ref"
jq -e '[.adapters[].weight] == [0.5, 0.5]' m_half/tandem_merge.json >/dev/null || fail "weights: $(cat m_half/tandem_merge.json)"
# --force never replaces an adapter directory or a training run's OUT_DIR, nor a directory inside
# or holding one (the repro: a run's OUT_DIR, the merged adapter's own best/); the run is left as
# it was. It still replaces an earlier merged model (m_o above).
find out/q -type f | sort | xargs sha256sum >run_before.txt
expect_exit 2 "$TANDEM" merge tiny --adapter peft_copy --out out/q --force
grep -q "out/q is an adapter directory or a training run's OUT_DIR (it has out/q/adapter_config.json), which even --force does not replace" "$WORK/last.err" ||
    fail "--out a run's OUT_DIR: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --adapter peft_copy --out out/q/checkpoint-4/ --force
grep -q "is an adapter directory or a training run's OUT_DIR (it has out/q/checkpoint-4/adapter_config.json)" "$WORK/last.err" ||
    fail "--out a checkpoint: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --adapter peft_copy --out out/q/runs --force
grep -q "out/q/runs lies inside .*/out/q, an adapter directory or a training run's OUT_DIR" "$WORK/last.err" ||
    fail "--out inside a run's OUT_DIR: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" merge tiny --adapter out/q --out out/q/best --force
grep -q "out/q/best lies inside the adapter out/q" "$WORK/last.err" || fail "--out inside the adapter: $(cat "$WORK/last.err")"
mkdir -p runs_above/early/checkpoint-7 # a run that has saved a checkpoint but no record yet
expect_exit 2 "$TANDEM" merge tiny --adapter peft_copy --out runs_above --force
grep -q "runs_above holds runs_above/early, an adapter directory or a training run's OUT_DIR (it has runs_above/early/checkpoint-7)" "$WORK/last.err" ||
    fail "--out holding a run: $(cat "$WORK/last.err")"
find out/q -type f | sort | xargs sha256sum | diff run_before.txt - >/dev/null || fail "a refused merge changed out/q"
[ -d runs_above/early/checkpoint-7 ] || fail "a refused merge removed runs_above/early"
# DIR[:WEIGHT]: a weight that is no finite number is a usage error saying so; a directory whose
# name has a ':' is still read whole; a missing adapter is said not to exist
for w in abc inf nan; do
    expect_exit 2 "$TANDEM" merge tiny --adapter "out/q:$w" --out x
    grep -q "adapter out/q:$w: the weight after ':' must be a finite number" "$WORK/last.err" ||
        fail "weight $w: $(cat "$WORK/last.err")"
done
cp -r peft_copy pe:ft
expect_exit 0 "$TANDEM" merge tiny --adapter pe:ft --out m_colon --quiet
expect_exit 1 "$TANDEM" merge tiny --adapter no_such_adapter --out x
grep -q "adapter no_such_adapter does not exist" "$WORK/last.err" || fail "missing adapter: $(cat "$WORK/last.err")"
[ ! -e x ] || fail "a refused merge left x"
# a failure while writing leaves neither OUT_DIR nor a temporary directory
expect_exit 1 env TANDEM_FAULT_INJECT=safetensors.rename "$TANDEM" merge tiny --adapter out/q --out m_fail
[ ! -e m_fail ] || fail "a failed merge left m_fail"
ls -a | grep -q '^\.m_fail' && fail "a failed merge left a temporary directory: $(ls -a)"
finish
