# What `tandem finetune --resume` checks of the checkpoints it resumes from, on the tiny random
# model (CPU; docs/finetune.md, "Resume"; docs/checkpoints.md):
#  - a checkpoint records the data and base it trained on, and a resume with other data of the
#    same size, another --method or double quantization is refused (exit 2) naming both, before
#    anything is written; a checkpoint without the record (an older tandem's) still resumes;
#  - another --targets is refused naming both target lists and ranks;
#  - a damaged latest checkpoint is skipped with one warning naming it and the reason, left in
#    place, and the run resumes from the one before, ending as the uninterrupted run.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
# one epoch: reverse finishes at global step 3 (its final checkpoint-3), add saves checkpoint-5
# and its final checkpoint-6
COMMON=(--batch-size 4 --epochs 1 --val-split 0.1 --log-every 1 --eval-every 3 --save-every 5
        --lr-schedule constant --max-seq-len 64 --seed 7 --device cpu --no-join)
ads() { # ads PREFIX: the --adapter flags of a run into PREFIX/
    echo --adapter data/reverse.jsonl:$1/reverse --adapter data/add.jsonl:$1/add
}

# the uninterrupted reference
expect_exit 0 "$TANDEM" finetune "$M" $(ads ref) "${COMMON[@]}"
[ -d ref/add/checkpoint-5 ] && [ -d ref/add/checkpoint-6 ] || fail "reference: no add/checkpoint-5, -6"

# part: stopped at global step 5 (add at its checkpoint-5, reverse finished)
cp -r ref part
rm -rf part/add/checkpoint-6 part/add/adapter_model.safetensors
cp part/add/metrics.jsonl part-add-metrics.jsonl
jq -e '.trained_on == {"data_file": "data/add.jsonl", "data_hash": "\(.trained_on.data_hash)",
                       "method": "qlora", "double_quant": true}' part/add/checkpoint-5/tandem_state.json \
    >/dev/null || fail "checkpoint-5: trained_on: $(jq -c .trained_on part/add/checkpoint-5/tandem_state.json)"
jq -e --arg h "$(jq -r .data_hash part/add/metadata.json)" '.trained_on.data_hash == $h' \
    part/add/checkpoint-5/tandem_state.json >/dev/null || fail "checkpoint-5: data_hash is not metadata.json's"
# the same lines in another order: the same size, samples and steps, other data
mkdir other && tac data/add.jsonl >other/add.jsonl
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:part/reverse \
    --adapter other/add.jsonl:part/add "${COMMON[@]}" --resume
grep -q "^tandem: --resume part/add/checkpoint-5: trained on data/add.jsonl (sha256:[0-9a-f]*); this run's data other/add.jsonl is sha256:[0-9a-f]* (resume with the same data, or train into a new OUT_DIR)$" last.err ||
    fail "other data on resume: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --resume --method lora
grep -q "^tandem: --resume part/reverse/checkpoint-3: trained with --method qlora; this run has --method lora (resume with --method qlora, or train into a new OUT_DIR)$" last.err ||
    fail "--method lora on resume: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --resume --no-double-quant
grep -q "trained with --method qlora; this run has --method qlora --no-double-quant (resume with --method qlora," last.err ||
    fail "--no-double-quant on resume: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --resume --targets q_proj,k_proj
grep -q "^tandem: --resume part/reverse/checkpoint-3: trained with --rank 16 --targets q_proj,v_proj; this run has --rank 16 --targets q_proj,k_proj (resume with the same --rank and --targets, or train into a new OUT_DIR)$" last.err ||
    fail "--targets on resume: $(cat last.err)"
cmp -s part/add/metrics.jsonl part-add-metrics.jsonl || fail "a refused resume changed metrics.jsonl"
# checkpoints of a tandem that did not record trained_on resume as before
for c in part/add/checkpoint-5 part/reverse/checkpoint-3; do
    jq 'del(.trained_on)' $c/tandem_state.json >state.json && mv state.json $c/tandem_state.json
done
expect_exit 0 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --resume
same_run ref part "resumed from checkpoints without trained_on differs from the uninterrupted run" reverse add

# a damaged latest checkpoint: skipped with a warning naming it and why, once; left in place until
# the resumed run saves that step again
cp -r ref dmg
rm dmg/add/adapter_model.safetensors # reverse had finished at step 3: it is not trained again
truncate -s 1000 dmg/add/checkpoint-6/optimizer.safetensors
expect_exit 0 "$TANDEM" finetune "$M" $(ads dmg) "${COMMON[@]}" --resume
n=$(grep -c "^tandem: warning: skipping damaged checkpoint dmg/add/checkpoint-6: .*optimizer.safetensors" last.err)
[ "$n" = 1 ] || fail "damaged checkpoint: $n warnings naming it, want 1: $(cat last.err)"
grep -q "^\[add\] resuming from dmg/add/checkpoint-5 " last.out || fail "damaged checkpoint: resume point: $(cat last.out)"
same_run ref dmg "resumed past a damaged checkpoint differs from the uninterrupted run" reverse add
cmp -s ref/add/checkpoint-6/optimizer.safetensors dmg/add/checkpoint-6/optimizer.safetensors ||
    fail "the damaged checkpoint-6 was not replaced by the resumed run's"

finish
