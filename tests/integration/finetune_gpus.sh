# `tandem finetune --gpus` (issue 17 part 1; docs/finetune.md, "Several GPUs"): real finetune
# processes on three simulated GPUs (TANDEM_FAKE_GPUS), computing on the CPU backend through the
# TANDEM_SIM_GPU_COMPUTE=cpu seam while their reservations are real ledger entries:
#  - the plan: longest-processing-time first on estimated tokens (the 12-epoch adapter alone on
#    one GPU, the two 1-epoch ones on the other), a GPU too small for any group left unused;
#  - one ledger reservation per GPU, held by the children (not the parent), one per GPU;
#  - a child killed with SIGKILL: the other finishes, the run reports the failure and exits with
#    the killed child's status (137); --resume then finishes the killed child's adapter from its
#    checkpoint and leaves the finished ones as they are;
#  - SIGTERM to the parent is forwarded: every child stops gracefully, the run exits 143 and
#    tells the one command to resume; the parent killed -9: its children stop gracefully too;
#  - mistakes: a count above the GPUs, an unknown GPU, --device cpu, GPUs too small for any
#    adapter.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim A,total_mb=10000;uuid=GPU-sim-1,name=Sim B,total_mb=10000;uuid=GPU-sim-2,name=Sim Small,total_mb=1000"
export TANDEM_SIM_GPU_COMPUTE=cpu
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
head -4 data/add.jsonl >add4.jsonl
head -4 data/reverse.jsonl >rev4.jsonl
# toml PREFIX [EPOCHS]: PREFIX.toml, three adapters; "long" trains EPOCHS (12) epochs, far more
# work than each other one (one epoch, unless --epochs says more)
toml() {
    cat >"$1.toml" <<EOF
[[adapter]]
label = "long"
data = "rev4.jsonl"
output = "$1/long"
epochs = ${2:-12}

[[adapter]]
label = "s1"
data = "add4.jsonl"
output = "$1/s1"

[[adapter]]
label = "s2"
data = "add4.jsonl"
output = "$1/s2"
EOF
}
COMMON=(--batch-size 2 --val-split 0 --log-every 1 --lr-schedule constant --max-seq-len 64
        --seed 7 --save-every 1 --no-join)
status() { "$TANDEM" gpu status --json; }
# pid_on UUID < STATUS_JSON: the first pid of the reservation on that GPU
pid_on() { jq -r --arg g "$1" '[.gpus[] | select(.uuid == $g) | .reservations[].pids[0]][0] // empty'; }

# mistakes first (fast)
toml bad
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config bad.toml --gpus 4 "${COMMON[@]}"
grep -q -- "--gpus 4: this host has 3 GPU(s)" last.err || fail "no count message: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config bad.toml --gpus GPU-nope "${COMMON[@]}"
grep -q "no GPU 'GPU-nope' here" last.err || fail "no unknown-GPU message: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config bad.toml --gpus all --device cpu "${COMMON[@]}"
grep -q "leave out --device cpu" last.err || fail "no --device cpu message: $(cat last.err)"
expect_exit 1 "$TANDEM" finetune "$M" --adapters-config bad.toml --gpus GPU-sim-2 "${COMMON[@]}"
grep -q "adapter 1 (long) fits on no GPU of the list" last.err || fail "no fit message: $(cat last.err)"
[ -e bad ] && fail "a failed plan wrote outputs"

# the run: plan, one reservation per GPU, a child killed -9. s1 and s2 train 4 epochs (8 steps
# each): with 1 (2 steps) GPU-sim-1's child once ended between the two status reads below. long
# trains 24 epochs (48 steps): with 12, its child once finished the 22 steps after checkpoint-2
# before the kill below reached it (the full suite at -j2 on 2 cores).
toml run 24
RUN_EPOCHS=(--epochs 4)
"$TANDEM" finetune "$M" --adapters-config run.toml --gpus all "${COMMON[@]}" "${RUN_EPOCHS[@]}" >run.out 2>run.err &
parent=$!
wait_until 30 grep -q "^adapter 2:" run.out
grep -q "^adapter 0: rev4.jsonl -> long: gpu 0 GPU-sim-0 (4 samples, [0-9]* tokens)" run.out ||
    fail "long not alone on GPU-sim-0: $(cat run.out)"
grep -q "^adapter 1: add4.jsonl -> s1: gpu 1 GPU-sim-1" run.out || fail "s1 not on GPU-sim-1"
grep -q "^adapter 2: add4.jsonl -> s2: gpu 1 GPU-sim-1" run.out || fail "s2 not on GPU-sim-1"
grep -q "^  gpu 2 GPU-sim-2 (Sim Small): no adapter" run.out || fail "the small GPU was used"
# both pids from one snapshot of the ledger, the one that showed two reservations
two_reservations() { status >res.json && [ "$(jq '[.gpus[].reservations[]] | length' res.json)" = 2 ]; }
wait_until 30 two_reservations
p0=$(pid_on GPU-sim-0 <res.json)
p1=$(pid_on GPU-sim-1 <res.json)
[ -n "$p0" ] && [ -n "$p1" ] && [ "$p0" != "$p1" ] || fail "not one reservation per GPU: $(jq -c '[.gpus[].reservations]' res.json)"
[ "$p0" != "$parent" ] && [ "$p1" != "$parent" ] || fail "the parent holds a reservation"
[ "$(status | jq '[.gpus[] | select(.uuid == "GPU-sim-2") | .reservations[]] | length')" = 0 ] ||
    fail "a reservation on the unused GPU"
wait_until 60 test -e run/long/checkpoint-2
kill -9 "$p0"
wait $parent
rc=$?
[ $rc -eq 137 ] || fail "a child killed -9: the run exited $rc, want 137"
grep -q "^tandem: --gpus: gpu 0 GPU-sim-0 (adapters long): killed by signal 9" run.err ||
    fail "no report of the killed child: $(cat run.err)"
grep -q "^tandem: --gpus: gpu 1 GPU-sim-1 (adapters s1 s2): finished" run.err ||
    fail "the other child did not finish: $(cat run.err)"
grep -q "1 of 2 GPU process(es) did not finish" run.err || fail "no failure summary"
grep -q -- "--gpus all .*--resume$" run.err || fail "no resume command: $(cat run.err)"
for a in s1 s2; do [ -e run/$a/adapter_model.safetensors ] || fail "$a not finished"; done
[ -e run/long/adapter_model.safetensors ] && fail "the killed adapter has a final adapter"
wait_until 10 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 0 ]"

# --resume: every child resumes; the killed one's adapter continues from its checkpoint
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config run.toml --gpus all "${COMMON[@]}" "${RUN_EPOCHS[@]}" --resume
grep -q "^\[gpu 0\] \[long\] resuming from run/long/checkpoint-[0-9]* (step [1-9]" last.out ||
    fail "long did not resume: $(cat last.out)"
grep -q "^\[gpu 1\] \[s1\] already finished" last.out || fail "s1 trained again: $(cat last.out)"
[ -e run/long/adapter_model.safetensors ] || fail "long not finished after --resume"
[ "$(jq -s 'map(select(.step)) | last | .step' run/long/metrics.jsonl)" = 48 ] ||
    fail "long did not reach step 48: $(tail -2 run/long/metrics.jsonl)"

# SIGTERM to the parent: forwarded, every child checkpoints, exit 143 (runs of 80+ steps each,
# far from their end when the signal comes)
toml term 40
"$TANDEM" finetune "$M" --adapters-config term.toml --gpus 2 "${COMMON[@]}" --epochs 40 >term.out 2>term.err &
parent=$!
wait_until 60 sh -c "[ \$(grep -c '^\[gpu [01]\] adapter 0:' term.out) = 2 ]"
kill -TERM $parent
wait $parent
rc=$?
[ $rc -eq 143 ] || fail "SIGTERM: the run exited $rc, want 143: $(cat term.err)"
[ "$(grep -c '^\[gpu [01]\] tandem: SIGTERM: stopped' term.err)" = 2 ] ||
    fail "not every child stopped gracefully: $(cat term.err)"
grep -q "^tandem: to continue exactly where it stopped, run:" term.err || fail "no resume hint"
grep -q "adapter-subset" term.err && fail "a child's own resume command was shown"

# the parent killed -9: each child gets SIGTERM (its parent-death signal) and stops gracefully;
# with --save-every 0 the checkpoints on disk are the stop's
toml orphan 40
"$TANDEM" finetune "$M" --adapters-config orphan.toml --gpus 2 "${COMMON[@]}" --epochs 40 \
    --save-every 0 >orphan.out 2>orphan.err &
parent=$!
# every adapter past its first step (a logged line: --log-every 1), not only started: a stop
# before an adapter's first step has nothing to checkpoint, and on a loaded machine (the ASan
# suite at -j2 beside a build) the kill came that early once
wait_until 60 sh -c "[ -s orphan/long/metrics.jsonl ] && [ -s orphan/s1/metrics.jsonl ] &&
    [ -s orphan/s2/metrics.jsonl ]"
kill -9 $parent
wait $parent 2>/dev/null
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 0 ]"
for a in long s1 s2; do
    ls -d orphan/$a/checkpoint-* >/dev/null 2>&1 || fail "$a: no checkpoint after its parent was killed"
    [ -e orphan/$a/adapter_model.safetensors ] && fail "$a: trained on to its end without its parent"
done
finish
