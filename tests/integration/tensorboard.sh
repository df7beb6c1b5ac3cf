# TensorBoard event files (docs/tensorboard.md), read back by an independent reader
# (tests/lib/tfevents_read.py: its own CRC-32C and protobuf decoder, standard library only):
#  - a fresh run of two adapters writes OUT_DIR/runs/events.out.tfevents.<time>.<host> with the
#    same steps and values (as float32) as metrics.jsonl, CRCs and framing intact;
#  - a crash after a checkpoint (later checkpoints removed, as if they had never been written)
#    and --resume: a second file whose SessionLog START makes the orphaned points of the first
#    drop out, so the events again equal the (cut back and continued) metrics.jsonl;
#  - a full disk (fault point tfevents.enospc) stops the run naming the event file and ENOSPC.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
READ="$TANDEM_SOURCE_DIR/tests/lib/tfevents_read.py"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
COMMON=(--batch-size 2 --epochs 2 --val-split 0.25 --log-every 1 --eval-every 2 --save-every 3
        --max-seq-len 48 --seed 7 --device cpu --no-join)
ADS=(--adapter data/reverse.jsonl:o/rev --adapter data/add.jsonl:o/add)

expect_exit 0 "$TANDEM" finetune "$M" "${ADS[@]}" "${COMMON[@]}"
for a in rev add; do
    n=$(ls o/$a/runs | wc -l)
    [ "$n" -eq 1 ] || fail "$a: $n event files, want 1: $(ls o/$a/runs)"
    ls o/$a/runs | grep -qx "events\.out\.tfevents\.[0-9]*\.$(hostname)" ||
        fail "$a: event file name: $(ls o/$a/runs)"
    python3 "$READ" --compare o/$a || fail "$a: events differ from metrics.jsonl"
done
python3 "$READ" o/add/runs | jq -e '.scalars | has("train/loss") and has("eval/loss") and
    has("train/learning_rate") and has("train/grad_norm") and has("train/tokens_per_sec") and
    has("train/tokens_seen")' >/dev/null || fail "a tag is missing: $(python3 "$READ" o/add/runs)"
cp -r o ref

# the reader is not blind: a flipped byte fails its CRC check
f=$(ls ref/add/runs/*)
printf 'X' | dd of="$f" bs=1 seek=40 conv=notrunc 2>/dev/null
python3 "$READ" ref/add/runs >/dev/null 2>&1 && fail "a damaged event file passed the reader"

# crash after checkpoint-3: the later checkpoints go, the records of steps 4.. stay behind
for a in rev add; do
    for c in o/$a/checkpoint-*; do [ "${c##*-}" -gt 3 ] && rm -rf "$c"; done
done
# the first file holds points past the checkpoint: the purge below is what removes them
mkdir first && cp o/add/runs/* first/
python3 "$READ" first | jq -e '[.scalars[][][0]] | max > 3' >/dev/null || fail "no orphans to purge"
sleep 1 # a new second: the resumed run's file sorts after the first, as TensorBoard reads them
expect_exit 0 "$TANDEM" finetune "$M" "${ADS[@]}" "${COMMON[@]}" --resume
for a in rev add; do
    n=$(ls o/$a/runs | wc -l)
    [ "$n" -eq 2 ] || fail "$a: resumed: $n event files, want 2"
    python3 "$READ" --compare o/$a || fail "$a: resumed: events differ from metrics.jsonl"
    diff <(jq -c '[.step, .loss, .val_loss]' ref/$a/metrics.jsonl) \
         <(jq -c '[.step, .loss, .val_loss]' o/$a/metrics.jsonl) >/dev/null ||
        fail "$a: resumed run logged other losses than the uninterrupted one"
done

# a full disk in the middle of an event record: the run stops with the file and the reason
TANDEM_FAULT_INJECT=tfevents.enospc expect_exit 1 "$TANDEM" finetune "$M" \
    --adapter data/add.jsonl:o/full "${COMMON[@]}"
grep -q "cannot append to o/full/runs/events\.out\.tfevents\.[^:]*: No space left on device" \
    last.err || fail "ENOSPC: $(cat last.err)"
finish
