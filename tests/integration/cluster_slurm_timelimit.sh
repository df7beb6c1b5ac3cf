#!/bin/bash
# A Slurm time limit with Slurm's own signal (issue 17 part 2; docs/cluster.md, "Slurm"): a job
# array of two tasks under `time: "1"` (one minute, Slurm's smallest) and `signal_grace: 30`, so
# slurmctld itself sends --signal=B:USR1@30 (its time-limit check runs every 30 s and signals when
# at most grace + 30 s are left: here at the first check of each run, about 25 s in; a kill would
# come at least 30 s later). Task 1 (c) trains longer than one
# run: it checkpoints on Slurm's USR1, requeues itself as ARRAYID_1, resumes, and finishes with an
# adapter byte-identical to an uninterrupted run of it here; task 0 (a) is short and runs once
# (more only by requeues of its own).
# This test sends no signal itself. Its own test (about two minutes) so it runs beside the others.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/slurm.sh"
export XDG_STATE_HOME="$WORK/state"
unset TANDEM_FAKE_GPUS
slurm_start 1 2
SHARED="$WORK/shared"
mkdir -p "$SHARED"
slurm_cluster_yaml "$WORK/cluster.yaml" time='"1"'
three_adapters 16
# c must train longer than the 0-30 s a run has before its USR1 but finish in a few runs, on an
# idle or a loaded machine and under ASan (4-6x slower): so its length is measured, not fixed.
# A timed run of 20 epochs (60 steps, 3 per epoch) gives one core's step rate here; c gets about
# 80 s of it (40-160 s if the load halves or doubles: 1-6 requeues).
cal_start=$(date +%s%N)
OMP_NUM_THREADS=1 "$TANDEM" finetune "$WORK/model" --adapter "$WORK/data/c.jsonl:$WORK/cal" --device cpu \
    --no-join --epochs 20 --batch-size 4 --max-seq-len 32 --rank 4 --val-split 0.25 >"$WORK/cal.log" 2>&1 ||
    fail "the calibration run: $(tail -5 "$WORK/cal.log")"
cal_ms=$(( ($(date +%s%N) - cal_start) / 1000000 ))
EPOCHS=$(( 80 * 60 * 1000 / (cal_ms * 3) ))
[ "$EPOCHS" -ge 40 ] || EPOCHS=40
echo "calibration: 60 steps in $cal_ms ms; c trains $EPOCHS epochs ($((EPOCHS * 3)) steps)"
cat >"$WORK/tl.toml" <<T
max_seq_len = 32
batch_size = 4
[[adapter]]
data = "data/a.jsonl"
output = "tl/a"
label = "a"
epochs = 2
[[adapter]]
data = "data/c.jsonl"
output = "tl/c"
label = "c"
epochs = $EPOCHS
learning_rate = 1e-2
T
FLAGS=(--rank 4 --val-split 0.25 --save-every 300)
slurm_wait_idle 30
expect_exit 0 "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/tl.toml" "${FLAGS[@]}"
grep -q 'one sbatch --array=0-1' "$WORK/last.out" || fail "one array of two tasks: $(cat "$WORK/last.out" "$WORK/last.err")"
task=$(sed -n 's/^slurm: submitted job \([^ ]*_1\) as Slurm job \([0-9]*_1\) .*/\1 \2/p' "$WORK/last.out")
read -r job sid <<<"$task"
[ -n "${sid:-}" ] || fail "no array task 1: $(cat "$WORK/last.out")"
grep -q "learning_rate = 0.01\|label = \"c\"" "$SHARED/jobs/$job/adapters.toml" || fail "task 1 is not c: $(cat "$SHARED/jobs/$job/adapters.toml")"

# The uninterrupted reference of c, trained here while Slurm runs the array.
sed -e "s#tl/#$WORK/ref/#; s#data/#$WORK/data/#" "$WORK/tl.toml" | awk '/^\[\[adapter\]\]/ {n++} n != 1' >"$WORK/ref.toml"
OMP_NUM_THREADS=1 "$TANDEM" finetune "$WORK/model" --adapters-config "$WORK/ref.toml" --device cpu \
    --no-join "${FLAGS[@]}" >"$WORK/ref.log" 2>&1 &
ref=$!

expect_exit 0 timeout 500 "$TANDEM" cluster watch --interval 1 --until-done
wait "$ref" || fail "the reference run: $(tail -5 "$WORK/ref.log")"
expect_exit 0 "$TANDEM" cluster watch --once --json
jq -e --arg s "$sid" '[.jobs[] | select(.slurm_job_id == $s and .state == "finished" and .slurm_state == "COMPLETED" and .slurm_restarts >= 1)] | length == 1' \
    "$WORK/last.out" >/dev/null || fail "task $sid: COMPLETED after a requeue: $(jq -c '[.jobs[] | {slurm_job_id, state, slurm_state, slurm_restarts, why}]' "$WORK/last.out")"
log="$SHARED/jobs/$job/log"
grep -q "checkpointed after USR1; requeueing job $sid\$" "$log" || fail "Slurm's USR1 did not requeue $sid: $(cat "$log")"
grep -q "slurm job $sid on .*restart 1," "$log" || fail "no second run of $sid: $(cat "$log")"
grep -q 'DUE TO TIME LIMIT' "$log" && fail "$sid hit its time limit: $(cat "$log")"
cmp -s "$WORK/ref/c/adapter_model.safetensors" "$SHARED/tl/c/adapter_model.safetensors" ||
    fail "c after Slurm's time-limit requeue differs from the uninterrupted run"
# task 0: its own job (the requeue of task 1 did not requeue the array): it runs once, plus once
# per requeue of its own (short as it is, a slow machine, e.g. under ASan, can reach its USR1)
a_log="$SHARED/jobs/${job%_1}_0/log"
a_runs=$(grep -c '^== .* slurm job [0-9]*_0 on ' "$a_log")
a_own=$(grep -c 'checkpointed after USR1; requeueing job [0-9]*_0$' "$a_log")
[ "$a_runs" = $((a_own + 1)) ] || fail "task 0 ran $a_runs times with $a_own requeue(s) of its own: $(cat "$a_log")"
[ -s "$SHARED/tl/a/adapter_model.safetensors" ] || fail "task 0 (a) not trained"
echo "c: $(grep -c 'requeueing job' "$log") requeue(s) on Slurm's USR1"
finish
