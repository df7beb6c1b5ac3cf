# `eval`, `generate` and `merge` given --adapter OUT_DIR of an unfinished run (checkpoint-N/
# there, no adapter_config.json yet: the final adapter is written at the end) say so, name the
# latest checkpoint to pass instead and `finetune ... --resume` (one message, train/peft_io.c);
# the checkpoint they name loads. A directory with neither keeps the plain "not a PEFT adapter
# directory". On the tiny random model (CPU).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:run/add --device cpu --no-join \
    --batch-size 4 --epochs 1 --val-split 0.1 --save-every 2 --max-seq-len 64
steps=$(ls -d run/add/checkpoint-* | sed 's/.*checkpoint-//' | sort -n)
latest=$(echo "$steps" | tail -1)
[ "$(echo "$steps" | wc -l)" -ge 2 ] || fail "wanted two checkpoints or more: $(ls run/add)"
# the OUT_DIR as a run stopped after its latest checkpoint leaves it: checkpoints, no final adapter
cp -r run/add part
rm -f part/adapter_config.json part/adapter_model.safetensors

want="part has no adapter_config.json: not a PEFT adapter directory; it is the OUT_DIR of an unfinished run: pass its latest checkpoint, part/checkpoint-$latest, or finish the run with \`tandem finetune ... --resume\`"
expect_exit 1 "$TANDEM" eval "$M" --adapter part --data data/add.jsonl --device cpu
grep -qF "$want" last.err || fail "eval: $(cat last.err)"
expect_exit 1 "$TANDEM" generate "$M" --adapter part --prompt hi --device cpu
grep -qF "$want" last.err || fail "generate: $(cat last.err)"
expect_exit 1 "$TANDEM" merge "$M" --adapter part --out merged
grep -qF "tandem: merge: $want" last.err || fail "merge: $(cat last.err)"
[ -e merged ] && fail "merge wrote merged/"
# a trailing slash is not doubled in the checkpoint's path
expect_exit 1 "$TANDEM" eval "$M" --adapter part/ --data data/add.jsonl --device cpu
grep -qF "pass its latest checkpoint, part/checkpoint-$latest," last.err || fail "eval part/: $(cat last.err)"
# the checkpoint it names is an adapter
expect_exit 0 "$TANDEM" eval "$M" --adapter part/checkpoint-$latest --data data/add.jsonl --device cpu

# no checkpoint: the plain message
mkdir empty
expect_exit 1 "$TANDEM" eval "$M" --adapter empty --data data/add.jsonl --device cpu
grep -q "empty has no adapter_config.json: not a PEFT adapter directory$" last.err || fail "empty: $(cat last.err)"
finish
