# The training life cycle of `tandem finetune` (issue 13, items 2, 16, 17; item 15, the
# graceful stop, is finetune_stop.sh), on the tiny random model (CPU):
#  - --resume of a finished run says there is nothing to do (exit 0); a resumed run names the
#    checkpoint it starts from; another --lr on resume is refused, another --schedule warned;
#  - priority-val-loss: elapsed_ms counts from the run's start, and an adapter that did not
#    train is not validated again;
#  - two OUT_DIRs naming one directory (./, trailing /, .., symbolic link) are refused, from
#    --adapter and from adapters.toml;
#  - eval --adapter refuses an adapter trained on another base model.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
COMMON=(--batch-size 4 --epochs 2 --val-split 0.1 --log-every 1 --eval-every 3 --save-every 5
        --lr-schedule constant --max-seq-len 64 --seed 7 --device cpu)
ads() { # ads PREFIX: the --adapter flags of a run into PREFIX/
    echo --adapter data/reverse.jsonl:$1/reverse --adapter data/add.jsonl:$1/add
}

# the uninterrupted reference
expect_exit 0 "$TANDEM" finetune "$M" $(ads ref) "${COMMON[@]}"

# --resume of a finished run: nothing to do
expect_exit 0 "$TANDEM" finetune "$M" $(ads ref) "${COMMON[@]}" --resume
grep -q "^nothing to do" last.out || fail "finished --resume: $(cat last.out)"
grep -q "^\[reverse\] already finished (6 steps): ref/reverse/checkpoint-6" last.out ||
    fail "finished --resume: no checkpoint named: $(cat last.out)"
# a resumed run names its checkpoint; another --lr is refused, another --schedule warned
expect_exit 0 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --epochs 1
grep -q "^\[add\] resuming" last.out && fail "a fresh run says it resumes"
rm -rf part/add/checkpoint-6 # back to global step 5 (reverse finished at 3)
expect_exit 2 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --epochs 1 --resume --lr 1e-3
grep -q "trained with --lr 0.0002.*this run has --lr 0.001" last.err || fail "--lr on resume: $(cat last.err)"
expect_exit 0 "$TANDEM" finetune "$M" $(ads part) "${COMMON[@]}" --epochs 1 --resume --schedule round-robin
grep -q "resumes under round-robin" last.err || fail "--schedule on resume not warned: $(cat last.err)"
grep -q "^\[add\] resuming from part/add/checkpoint-5 (step 5/6" last.out || fail "resume point: $(cat last.out)"

# priority-val-loss: elapsed_ms from the start of the run, no validation of an unchanged adapter
t0=$(date +%s%N)
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:prio/reverse \
    --adapter data/add.jsonl:prio/add --adapter data/upper.jsonl:prio/upper "${COMMON[@]}" \
    --schedule priority-val-loss --eval-every 1
wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
for a in reverse add upper; do
    first=$(head -1 prio/$a/metrics.jsonl | jq .elapsed_ms)
    awk -v e="$first" -v w="$wall_ms" 'BEGIN { exit !(e >= 0 && e <= w) }' ||
        fail "prio/$a: first elapsed_ms $first, but the run took $wall_ms ms"
    jq -e -s '[.[] | select(.val_loss) | .step] | length == (unique | length)' prio/$a/metrics.jsonl \
        >/dev/null || fail "prio/$a: validated twice at one step: $(jq -c -s '[.[] | select(.val_loss) | .step]' prio/$a/metrics.jsonl)"
done

# one OUT_DIR written by two adapters, however spelled (link -> same; same/a does not exist yet)
mkdir same && ln -s same link
for other in ./same/a same/a/ same//a same/x/../a link/a; do
    expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:same/a --adapter data/reverse.jsonl:$other
    grep -q "adapter #1 (data/add.jsonl:same/a) and --adapter #2 (data/reverse.jsonl:$other) write the same OUT_DIR" last.err ||
        fail "same OUT_DIR $other: $(cat last.err)"
done
mkdir -p exists/a && ln -sfn exists/a alias
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:exists/a --adapter data/reverse.jsonl:alias
[ -e same/a ] && fail "a refused run created its OUT_DIR"
mkdir -p cfg
cat >cfg/two.toml <<'EOF'
[[adapter]]
data = "../data/add.jsonl"
output = "out/a"
[[adapter]]
data = "../data/reverse.jsonl"
output = "sub/../out/a"
EOF
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config cfg/two.toml
grep -q "cfg/two.toml:6: \[\[adapter\]\] #2 writes to output 'sub/../out/a', the same directory as \[\[adapter\]\] #1" last.err ||
    fail "adapters.toml same output: $(cat last.err)"

# eval --adapter: the base recorded at training, not the path, decides
jq -e '.base_model_identity | startswith("sha256:")' ref/add/metadata.json >/dev/null ||
    fail "metadata.json without base_model_identity"
"$TANDEM" init-model other --preset tiny --seed 99 >/dev/null || fail "init-model other"
cp -r "$M" moved
expect_exit 0 "$TANDEM" eval moved --data data/add.jsonl --adapter ref/add
for a in ref/add ref/add/best ref/add/checkpoint-12; do
    expect_exit 1 "$TANDEM" eval other --data data/add.jsonl --adapter $a
    grep -q "trained on another base model" last.err || fail "eval $a on another base: $(cat last.err)"
done

finish
