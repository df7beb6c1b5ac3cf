# One run writes an adapter's OUT_DIR at a time (src/run/output_claim.h, docs/finetune.md
# "Output directories"), on the tiny random model (CPU):
#  - a second finetune into the OUT_DIR a running one writes is refused (exit 2, naming the
#    running pid), whether it would join the running one (the default) or not (--no-join), and
#    the running one's adapter is the uninterrupted run's;
#  - OUT_DIRs inside or around a running one's are refused; so are nested OUT_DIRs of one
#    command (flags and adapters.toml), before anything is written;
#  - an OUT_DIR holding a finished adapter whose checkpoints were deleted is refused, fresh and
#    with --resume (training from step 0 would replace it);
#  - the claim is gone after a run (the ledger directory's outputs/), a refused run leaves no
#    directory, and a claim left by a killed run does not block the next.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
COMMON=(--batch-size 4 --epochs 3 --val-split 0.1 --log-every 1 --save-every 5 --max-seq-len 64
        --seed 7 --device cpu --threads 1)
claims() { ls "$TANDEM_LEDGER_DIR/outputs" 2>/dev/null | grep -c '\.claim$'; }

# the reference: the same adapter trained alone
"$TANDEM" finetune "$M" --adapter data/add.jsonl:ref "${COMMON[@]}" >ref.out 2>ref.err ||
    fail "reference run: $(cat ref.err)"
[ "$(claims)" = 0 ] || fail "the claim outlived the run: $(ls -a "$TANDEM_LEDGER_DIR/outputs")"

# a running finetune, held (SIGSTOP) once it has claimed its OUT_DIR, so the checks below run
# while it holds the lock whatever the machine's speed
"$TANDEM" finetune "$M" --adapter data/add.jsonl:run/a "${COMMON[@]}" >run.out 2>run.err &
pid=$!
wait_until 60 grep -q "^adapter 0:" run.out
kill -STOP $pid
[ "$(cat "$TANDEM_LEDGER_DIR"/outputs/*.claim | cut -f1)" = "$pid" ] ||
    fail "the claim does not name the running pid $pid: $(cat "$TANDEM_LEDGER_DIR"/outputs/*.claim)"
[ -e run/a/.tandem-lock ] || ls -A run/a | grep -q lock && fail "a lock file in OUT_DIR"

expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:run/a "${COMMON[@]}"
grep -q "OUT_DIR run/a is being written by another tandem finetune (pid $pid)" last.err ||
    fail "same OUT_DIR, joining: $(cat last.err)"
grep -q "joined" last.err last.out && fail "the refused finetune joined the running one"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:./run/../run/a/ --no-join \
    "${COMMON[@]}"
grep -q "being written by another tandem finetune (pid $pid)" last.err ||
    fail "same OUT_DIR spelled otherwise, --no-join: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:run/a/best --no-join \
    "${COMMON[@]}"
grep -q "lies inside .*run/a, the OUT_DIR of a running tandem finetune (pid $pid)" last.err ||
    fail "OUT_DIR inside a running one's: $(cat last.err)"
[ -e run/a/best ] && fail "the refused run created run/a/best"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:run --no-join "${COMMON[@]}"
grep -q "OUT_DIR run holds .*run/a, the OUT_DIR of a running tandem finetune (pid $pid)" \
    last.err || fail "OUT_DIR around a running one's: $(cat last.err)"
[ "$(claims)" = 1 ] || fail "refused runs left claims: $(ls "$TANDEM_LEDGER_DIR/outputs")"
kill -CONT $pid
wait $pid || fail "the running finetune: exit $?: $(cat run.err)"
cmp -s ref/adapter_model.safetensors run/a/adapter_model.safetensors ||
    fail "the running finetune's adapter differs from the uninterrupted run's"
[ "$(claims)" = 0 ] || fail "the claim outlived the run"
grep -c '"step"' run/a/metrics.jsonl | grep -qx "$(grep -c '"step"' ref/metrics.jsonl)" ||
    fail "run/a/metrics.jsonl has other lines than the reference's"

# a claim left by a killed run (SIGKILL: no release) holds nothing
kill9_when kill/a/checkpoint-5 "$TANDEM" finetune "$M" --adapter data/add.jsonl:kill/a "${COMMON[@]}"
[ "$(claims)" = 1 ] || fail "SIGKILL: want the claim left behind, have $(claims)"
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:kill/a --resume "${COMMON[@]}"
cmp -s ref/adapter_model.safetensors kill/a/adapter_model.safetensors ||
    fail "the resumed run after SIGKILL differs from the uninterrupted one"
[ "$(claims)" = 0 ] || fail "the killed run's claim was not removed by the next one"

# nested OUT_DIRs of one command: refused before anything is written
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:nest/a \
    --adapter data/reverse.jsonl:nest/a/best --no-join "${COMMON[@]}"
grep -q "adapter #2's OUT_DIR nest/a/best lies inside adapter #1's OUT_DIR nest/a" last.err ||
    fail "nested OUT_DIRs (flags): $(cat last.err)"
[ -e nest ] && fail "the refused command created nest/"
cat >nest.toml <<EOF
[[adapter]]
data = "data/add.jsonl"
output = "nest/a/b/../inner"
[[adapter]]
data = "data/reverse.jsonl"
output = "nest/a"
EOF
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config nest.toml --no-join "${COMMON[@]}"
grep -q "lies inside adapter #2's OUT_DIR" last.err || fail "nested OUT_DIRs (toml): $(cat last.err)"
[ -e nest ] && fail "the refused adapters.toml command created nest/"

# a finished adapter without its checkpoints is not trained over, fresh or with --resume
rm -rf ref/checkpoint-*
sum=$(sha256sum <ref/adapter_model.safetensors)
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:ref --no-join "${COMMON[@]}"
grep -q "ref holds the adapter of an earlier run (adapter_model.safetensors) and no checkpoint" \
    last.err || fail "finished adapter, fresh run: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:ref --resume --no-join "${COMMON[@]}"
grep -q "holds the adapter of an earlier run" last.err ||
    fail "finished adapter, --resume: $(cat last.err)"
[ "$(sha256sum <ref/adapter_model.safetensors)" = "$sum" ] || fail "the finished adapter changed"
finish
