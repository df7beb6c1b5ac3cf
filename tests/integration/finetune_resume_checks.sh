# What `tandem finetune --resume` checks of the checkpoints it resumes from, on the tiny random
# model (CPU; docs/finetune.md, "Resume"; docs/checkpoints.md):
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
