# A full disk while a finetune saves (tiny random model, CPU): the run fails (exit 1) naming the
# file and "No space left on device", says what to do (free space, the same command with
# --resume), and once space is freed --resume ends with the uninterrupted run's adapter bytes.
# The OUT_DIRs live on a small tmpfs, grown (remount) to free space; skipped where mounting is
# not permitted (an unprivileged container).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
mkdir small
if ! mount -t tmpfs -o size=2m tmpfs small 2>/dev/null; then
    echo "skipped: cannot mount a tmpfs here (needs root outside a restricted container)"
    exit 0
fi
trap 'umount "$WORK/small" 2>/dev/null; cleanup_work' EXIT
COMMON=(--batch-size 4 --epochs 4 --val-split 0 --log-every 1 --save-every 2 --max-seq-len 64
        --seed 7 --device cpu --threads 1 --no-join)

"$TANDEM" finetune "$M" --adapter data/add.jsonl:ref "${COMMON[@]}" >ref.out 2>ref.err ||
    fail "reference run: $(cat ref.err)"
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/add.jsonl:small/add "${COMMON[@]}"
grep -q "small/add/.*No space left on device" last.err || fail "no ENOSPC message: $(cat last.err)"
grep -q "Free space on that file system, then run the same command with --resume" last.err ||
    fail "no advice after ENOSPC: $(cat last.err)"
ls small/add | grep -q '^checkpoint-' || fail "no complete checkpoint before the disk filled"
mount -o remount,size=64m small || fail "cannot grow the tmpfs"
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:small/add "${COMMON[@]}" --resume
cmp -s ref/adapter_model.safetensors small/add/adapter_model.safetensors ||
    fail "the resumed adapter differs from the uninterrupted run's"
finish
