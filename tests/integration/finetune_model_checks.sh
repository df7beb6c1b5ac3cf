# What finetune, eval and data check do with a model directory and data that are wrong or
# unusual (issue 13, items 12-14), on the tiny model of `init-model` (CPU, no download):
#  - config.json errors (num_key_value_heads not dividing the heads, odd head_dim, model_type not
#    matching the architecture) and an empty data file exit 1 (runtime), not 2 (usage);
#  - a missing tensor and a tensor of a non-float dtype: exit 1, the message names the file;
#  - a config with fewer layers than the weights, and max_position_embeddings below --max-seq-len:
#    training runs, with a warning on stderr for each;
#  - `tokens` data: ids are bounded by config.json's vocab_size (320), not the tokenizer's size
#    (259), and a model directory without tokenizer.json trains and evaluates on it; data that
#    needs a tokenizer then fails naming the missing tokenizer.json;
#  - `data check` with no flags prints the train/validation sizes finetune reports (same seed,
#    max-seq-len and val-split defaults).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cd "$WORK" || exit 1
QUICK=(--device cpu --epochs 1 --batch-size 2 --max-seq-len 32 --save-every 0 --log-every 1)

# model_copy NAME: a copy of the tiny model to break
model_copy() { rm -rf "$WORK/$1"; cp -r "$M" "$WORK/$1"; echo "$WORK/$1"; }
# set_config DIR KEY VALUE: config.json's KEY set to VALUE (a JSON value)
set_config() { jq ".$2 = $3" "$1/config.json" >"$1/config.tmp" && mv "$1/config.tmp" "$1/config.json"; }

for i in $(seq 1 12); do echo "{\"prompt\": \"p$i\", \"completion\": \"c$i\"}"; done >small.jsonl

# 1. config.json errors and an empty data file: exit 1 with the file in the message
D=$(model_copy kv); set_config "$D" num_key_value_heads 3
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/kv "${QUICK[@]}"
grep -q "$D/config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3" \
    "$WORK/last.err" || fail "kv heads message: $(cat "$WORK/last.err")"
D=$(model_copy odd); set_config "$D" head_dim 63
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/odd "${QUICK[@]}"
grep -q "$D/config.json: head_dim 63 is odd" "$WORK/last.err" || fail "odd head_dim message"
D=$(model_copy mt); set_config "$D" model_type '"llama"'
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/mt "${QUICK[@]}"
grep -q "model_type \"llama\" does not match" "$WORK/last.err" || fail "model_type message"
expect_exit 1 "$TANDEM" eval "$D" --data small.jsonl
: >empty.jsonl
expect_exit 1 "$TANDEM" finetune "$M" --adapter empty.jsonl:out/empty "${QUICK[@]}"
grep -q "empty.jsonl: no training sample" "$WORK/last.err" || fail "empty data message"
[ -e out/empty ] && fail "empty data: out/empty written"
# finetune words "no training sample" as data check does (data_check.sh has every cause): which
# option to change
echo '{"text": "hello"}' >val.jsonl
expect_exit 1 "$TANDEM" finetune "$M" --adapter val.jsonl:out/val "${QUICK[@]}" --no-join --val-split 0.99
grep -q "val.jsonl: no training sample (1 samples, 1 for validation): all 1 sample(s) went to validation (--val-split 0.99): lower --val-split$" \
    "$WORK/last.err" || fail "all-validation message: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" finetune "$M" --adapter small.jsonl:out/cut "${QUICK[@]}" --no-join --max-seq-len 2
grep -q "small.jsonl: no training sample (0 samples, 0 for validation): [0-9]* sample(s) lost every token counted in the loss (their completion) when cut to --max-seq-len 2 tokens: raise --max-seq-len" \
    "$WORK/last.err" || fail "cut-completion message: $(cat "$WORK/last.err")"
[ -e out/val ] || [ -e out/cut ] && fail "no training sample: an OUT_DIR was written"

# 2. a missing tensor (config asks for a 5th layer) and an integer tensor: exit 1, file named
D=$(model_copy missing); set_config "$D" num_hidden_layers 5
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/missing "${QUICK[@]}"
grep -q "$D/model.safetensors: tensor \"model.layers.4.input_layernorm.weight\" \[256\] is missing" \
    "$WORK/last.err" || fail "missing tensor message: $(cat "$WORK/last.err")"
D=$(model_copy int)
# same header length: "dtype":"BF16" -> "dtype": "I16" (a 2-byte integer type, same data size)
perl -0777 -pi -e 's/"model.norm.weight":\{"dtype":"BF16"/"model.norm.weight":{"dtype": "I16"/' \
    "$D/model.safetensors"
grep -q '"dtype": "I16"' "$D/model.safetensors" || fail "could not patch the dtype"
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/int "${QUICK[@]}"
grep -q "$D/model.safetensors: tensor \"model.norm.weight\" is stored as I16" "$WORK/last.err" ||
    fail "dtype message: $(cat "$WORK/last.err")"

# 3. fewer layers in config.json than in the weights, and max_position_embeddings 16 below
#    --max-seq-len 32: training runs (exit 0) and each is warned about
D=$(model_copy short); set_config "$D" num_hidden_layers 3; set_config "$D" max_position_embeddings 16
expect_exit 0 "$TANDEM" finetune "$D" --adapter small.jsonl:out/short "${QUICK[@]}"
grep -q "warning: $D/model.safetensors holds 4 layers but config.json has num_hidden_layers 3" \
    "$WORK/last.err" || fail "no warning for unused layers: $(cat "$WORK/last.err")"
grep -q "warning: adapter 0 (small.jsonl): max_seq_len 32 is above $D/config.json's max_position_embeddings 16" \
    "$WORK/last.err" || fail "no warning for max_position_embeddings: $(cat "$WORK/last.err")"
[ -s out/short/adapter_model.safetensors ] || fail "out/short not trained"

# 4. tokens data: ids up to config.json's vocab_size - 1 (319), above the tokenizer's 259 ids;
#    a model directory without tokenizer.json reads it (finetune, eval, data check)
for i in $(seq 1 12); do
    echo "{\"input_ids\": [1, $((250 + i)), 300, 319], \"labels\": [-100, $((250 + i)), 300, 319]}"
done >pretok.jsonl
expect_exit 0 "$TANDEM" finetune "$M" --adapter pretok.jsonl:out/pretok "${QUICK[@]}"
D=$(model_copy notok); rm "$D/tokenizer.json"
expect_exit 0 "$TANDEM" finetune "$D" --adapter pretok.jsonl:out/notok "${QUICK[@]}"
expect_exit 0 "$TANDEM" eval "$D" --data pretok.jsonl --adapter out/notok
expect_exit 0 "$TANDEM" data check pretok.jsonl --model "$D"
echo '{"input_ids": [1, 320], "labels": [-100, 320]}' >toobig.jsonl
expect_exit 1 "$TANDEM" data check toobig.jsonl --model "$D"
grep -q "toobig.jsonl:1" "$WORK/last.err" || fail "id 320 not refused: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" finetune "$D" --adapter small.jsonl:out/needtok "${QUICK[@]}"
grep -q "small.jsonl: line 1: a completion sample needs a tokenizer, and $D/tokenizer.json does not exist" \
    "$WORK/last.err" || fail "missing tokenizer message: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" eval "$D" --data small.jsonl
grep -q "$D/tokenizer.json does not exist" "$WORK/last.err" || fail "eval: missing tokenizer"

# 5. data check's defaults are finetune's: 60 samples, 3 of them 600 tokens long with the answer
#    at the end (dropped at max-seq-len 512, kept at 2048); the split depends on the seed
{
    for i in $(seq 1 57); do echo "{\"prompt\": \"question $i\", \"completion\": \"answer $i\"}"; done
    long=$(printf 'x%.0s' $(seq 1 600))
    for i in 1 2 3; do echo "{\"prompt\": \"$long$i\", \"completion\": \"end\"}"; done
} >split.jsonl
expect_exit 0 "$TANDEM" data check split.jsonl --model "$M"
read -r ctrain cval < <(sed -n 's/^split (val_split 0.05, seed 42): train \([0-9]*\) samples.*validation \([0-9]*\) samples.*/\1 \2/p' "$WORK/last.out")
[ -n "$ctrain" ] || fail "data check split line: $(cat "$WORK/last.out")"
grep -q "dropped: 3 samples" "$WORK/last.out" || fail "data check did not truncate at 512"
expect_exit 0 "$TANDEM" finetune "$M" --adapter split.jsonl:out/split --device cpu --epochs 1 \
    --save-every 0 --log-every 100
read -r ftrain fval < <(sed -n 's/^adapter 0: .*: \([0-9]*\) train \/ \([0-9]*\) validation samples.*/\1 \2/p' "$WORK/last.out")
[ "$ctrain $cval" = "$ftrain $fval" ] ||
    fail "data check says train/validation $ctrain/$cval, finetune $ftrain/$fval"
finish
