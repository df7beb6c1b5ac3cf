#!/bin/bash
# `scheduler: slurm` against a real Slurm (issue 17, part 2): munged, slurmctld and two slurmd
# daemons started here (tests/lib/slurm.sh), each node with two fake GPU GRES. Three adapters with
# max_adapters 1 become three jobs whose scripts differ only by index: one job array of three tasks
# that ask for --gres=gpu:1 (device: cpu, so the tiny model trains on the CPU while Slurm schedules
# the GPUs; `array: false` makes them three sbatch calls); status, logs, watch's leaderboard and
# pull --best work per task, from the shared workdir; a job told to stop by USR1 (what --signal=B:USR1@N sends before a time
# limit) checkpoints, requeues itself and ends with adapters equal to an uninterrupted run;
# `cluster cancel` of one array task checkpoints and stops it without requeueing, the other
# tasks untouched; a job of two GPUs runs `finetune
# --gpus all`, one process per GPU; a malformed slurm block fails with
# FILE:LINE:COLUMN; a missing sbatch is named. Skips (77) when Slurm is not installed or not root.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/slurm.sh"
export XDG_STATE_HOME="$WORK/state"
unset TANDEM_FAKE_GPUS
slurm_start 2 2
SHARED="$WORK/shared"
mkdir -p "$SHARED"
slurm_cluster_yaml "$WORK/cluster.yaml"
three_adapters 16
FLAGS=(--rank 4 --val-split 0.25 --save-every 2)
slurm_wait_idle 30

# --dry-run: one array script for the three jobs, nothing written, nothing submitted.
expect_exit 0 "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/adapters.toml" "${FLAGS[@]}" --dry-run
[ "$(grep -c '^#SBATCH --gres=gpu:1$' "$WORK/last.out")" = 1 ] || fail "dry run: one array script: $(cat "$WORK/last.out")"
grep -q '^#SBATCH --array=0-2$' "$WORK/last.out" || fail "dry run: --array=0-2: $(cat "$WORK/last.out")"
grep -q '^#SBATCH --output=.*_%a/log$' "$WORK/last.out" || fail "dry run: one log per task"
grep -q "^job_dir='.*'_\"\$SLURM_ARRAY_TASK_ID\"$" "$WORK/last.out" || fail "dry run: the task's directory"
grep -q '^#SBATCH --signal=B:USR1@30$' "$WORK/last.out" || fail "dry run: --signal"
grep -q -- "finetune .*--device cpu --no-join --resume '--rank' '4'" "$WORK/last.out" || fail "dry run: the finetune line: $(grep finetune "$WORK/last.out")"
# array: false: three scripts, three sbatch calls
slurm_cluster_yaml "$WORK/noarray.yaml" array=false
expect_exit 0 "$TANDEM" submit --cluster "$WORK/noarray.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/adapters.toml" "${FLAGS[@]}" --dry-run
[ "$(grep -c '^#SBATCH --gres=gpu:1$' "$WORK/last.out")" = 3 ] || fail "array: false: three scripts: $(cat "$WORK/last.out")"
grep -q -- '--array' "$WORK/last.out" && fail "array: false still made an array"
[ -z "$(ls -A "$SHARED")" ] || fail "dry run wrote into the workdir: $(ls -A "$SHARED")"
[ -z "$(squeue -h)" ] || fail "dry run submitted: $(squeue -h)"

# Three adapters, one array of three tasks, all finish; status, logs, the leaderboard, pull --best.
expect_exit 0 "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/adapters.toml" "${FLAGS[@]}"
[ "$(grep -c 'one sbatch --array=0-2' "$WORK/last.out")" = 1 ] || fail "one sbatch --array: $(cat "$WORK/last.out" "$WORK/last.err")"
arr=$(sed -n 's/.* one sbatch --array=0-2: Slurm job array \([0-9]*\) .*/\1/p' "$WORK/last.out")
for i in 0 1 2; do
    grep -q "^slurm: submitted job .*_$i as Slurm job ${arr}_$i " "$WORK/last.out" || fail "task $i: $(cat "$WORK/last.out")"
done
expect_exit 0 timeout 300 "$TANDEM" cluster watch --interval 1 --until-done
expect_exit 0 "$TANDEM" cluster watch --once --json
cp "$WORK/last.out" "$WORK/board.json"
[ "$(jq --arg a "$arr" '[.jobs[] | select(.state == "finished" and .slurm_state == "COMPLETED" and (.slurm_job_id | test("^" + $a + "_[0-2]$")))] | length' "$WORK/board.json")" = 3 ] \
    || fail "three completed array tasks: $(jq -c '[.jobs[] | {slurm_job_id, state, slurm_state, why}]' "$WORK/board.json")"
[ "$(jq -r '.leaderboard[0].label' "$WORK/board.json")" = c ] || fail "c should win: $(jq -c '.leaderboard' "$WORK/board.json")"
for log in "$SHARED"/jobs/*/log; do
    grep -Eq 'CUDA_VISIBLE_DEVICES=[0-9]' "$log" || fail "$log: --gres=gpu:1 gave no CUDA_VISIBLE_DEVICES"
done
[ "$(ls "$SHARED"/jobs/*/log | wc -l)" = 3 ] || fail "one log per task: $(ls "$SHARED"/jobs/*)"
task2=$(jq -r --arg s "${arr}_2" '.jobs[] | select(.slurm_job_id == $s) | .id' "$WORK/board.json")
expect_exit 0 "$TANDEM" cluster logs "$task2"
grep -q "slurm job ${arr}_2 on " "$WORK/last.out" || fail "cluster logs of task 2: $(cat "$WORK/last.out" "$WORK/last.err")"
expect_exit 0 timeout 60 "$TANDEM" cluster pull --best "$WORK/best"
cmp -s "$WORK/best/c/adapter_model.safetensors" "$SHARED/out/c/adapter_model.safetensors" \
    || fail "pull --best: c's adapter: $(cat "$WORK/last.out" "$WORK/last.err")"

# The uninterrupted reference of a longer run of c, trained here alone.
cat >"$WORK/long.toml" <<'T'
epochs = 12
max_seq_len = 32
batch_size = 4
[[adapter]]
data = "data/c.jsonl"
output = "long/c"
label = "c"
learning_rate = 1e-2
T
sed "s#long/c#$WORK/ref/c#; s#data/c#$WORK/data/c#" "$WORK/long.toml" >"$WORK/ref.toml"
expect_exit 0 "$TANDEM" finetune "$WORK/model" --adapters-config "$WORK/ref.toml" --device cpu --no-join "${FLAGS[@]}"

# USR1 (what Slurm sends signal_grace seconds before the time limit): checkpoint, requeue, resume.
expect_exit 0 "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/long.toml" "${FLAGS[@]}"
sid=$(sed -n 's/.* as Slurm job \([0-9]*\) .*/\1/p' "$WORK/last.out")
wait_until 120 test -d "$SHARED/long/c/checkpoint-2"
scancel --signal=USR1 --batch "$sid" || fail "scancel --signal=USR1"
expect_exit 0 timeout 300 "$TANDEM" cluster watch --interval 1 --until-done
jdir=$(ls -d "$SHARED"/jobs/* | while read -r d; do grep -q "long.toml\|long/c" "$d/adapters.toml" 2>/dev/null && echo "$d"; done | head -1)
grep -q 'requeueing job' "$jdir/log" || fail "USR1 did not requeue: $(tail -5 "$jdir/log")"
grep -q 'restart 1' "$jdir/log" || fail "no second run after the requeue: $(tail -5 "$jdir/log")"
cmp -s "$WORK/ref/c/adapter_model.safetensors" "$SHARED/long/c/adapter_model.safetensors" \
    || fail "requeued run differs from the uninterrupted one"

# cluster cancel of one task of a job array: scancel of ARRAYID_1 only. Task 1 (b) checkpoints and
# ends (exit 143, no requeue, `cancelled` in watch); tasks 0 and 2 go on running and complete once.
# b has 160 steps (~16 a second on 2 cores): enough that neither its cancel nor the USR1 of its
# resubmission below can come after its last step (with 48 its first run once reached step 12
# before the cancel took effect, and the resubmission finished before its USR1).
sed -e 's#out/#arr/#' -e 's/^epochs = 2/epochs = 30/' -e 's#^output = "arr/b"#&\nepochs = 40#' \
    "$WORK/adapters.toml" >"$WORK/arr.toml"
expect_exit 0 "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/arr.toml" "${FLAGS[@]}"
arr=$(sed -n 's/.* one sbatch --array=0-2: Slurm job array \([0-9]*\) .*/\1/p' "$WORK/last.out")
job=$(sed -n "s/^slurm: submitted job \([^ ]*_1\) as Slurm job ${arr}_1 .*/\1/p" "$WORK/last.out")
[ -n "$arr" ] && [ -n "$job" ] || fail "cancel: no array task 1: $(cat "$WORK/last.out" "$WORK/last.err")"
wait_until 120 test -d "$SHARED/arr/b/checkpoint-2"
expect_exit 0 timeout 120 "$TANDEM" cluster cancel "$job"
grep -q "USR1 sent to Slurm job ${arr}_1;" "$WORK/last.out" || fail "cancel: not ${arr}_1: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q "ended (failed" "$WORK/last.out" || fail "cancel: $(cat "$WORK/last.out" "$WORK/last.err")"
for i in 0 2; do
    [ "$(slurm_job_state "${arr}_$i")" = RUNNING ] || fail "cancel of task 1 stopped task $i: $(slurm_job_state "${arr}_$i")"
done
expect_exit 1 timeout 300 "$TANDEM" cluster watch --interval 1 --until-done # 1: a failed job
grep -Eq "^$job +slurm +failed +1 +cancelled by .tandem cluster cancel." "$WORK/last.out" ||
    fail "watch: task 1 not shown cancelled: $(cat "$WORK/last.out")"
expect_exit 1 "$TANDEM" cluster watch --once --json
jq -e --arg j "$job" '[.jobs[] | select(.id == $j and .state == "failed" and .exit_code == 143 and .cancelled == true)] | length == 1' \
    "$WORK/last.out" >/dev/null || fail "task 1 cancelled: $(jq -c '[.jobs[] | {id, state, exit_code, cancelled, why}]' "$WORK/last.out")"
[ "$(cat "$SHARED/jobs/$job/exit_code")" = 143 ] || fail "cancel: exit_code $(cat "$SHARED/jobs/$job/exit_code" 2>&1)"
grep -q 'requeueing' "$SHARED/jobs/$job/log" && fail "a cancelled task requeued itself"
ls -d "$SHARED"/arr/b/checkpoint-* >/dev/null 2>&1 || fail "cancel left no checkpoint"
[ -s "$SHARED/arr/b/adapter_model.safetensors" ] && fail "the cancelled task trained to the end"
for i in 0 2; do
    t=${job%_1}_$i
    jq -e --arg s "${arr}_$i" '[.jobs[] | select(.slurm_job_id == $s and .state == "finished" and .slurm_state == "COMPLETED" and .slurm_restarts == 0 and (.cancelled | not))] | length == 1' \
        "$WORK/last.out" >/dev/null || fail "task $i did not complete on its own: $(jq -c '[.jobs[] | {slurm_job_id, state, slurm_state, slurm_restarts, why}]' "$WORK/last.out")"
    [ "$(grep -c '^== .* slurm job [0-9]*_'$i' on ' "$SHARED/jobs/$t/log")" = 1 ] && ! grep -q 'USR1' "$SHARED/jobs/$t/log" ||
        fail "task $i was signalled or ran again: $(cat "$SHARED/jobs/$t/log")"
done
for a in a c; do [ -s "$SHARED/arr/$a/adapter_model.safetensors" ] || fail "task of $a: not trained"; done
# Resumed by hand (sbatch --array=1 job.sh): a new Slurm id, so the old cancel marker does not
# stop it: Slurm's USR1 requeues it, and it completes from the checkpoints.
# USR1 once the resubmission has saved a checkpoint of its own (a step past the cancelled run's
# last): the job is then running, with its handler set, and has steps left.
b_last_step() { ls -d "$SHARED"/arr/b/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -n 1; }
cancelled_at=$(b_last_step)
expect_exit 0 sbatch --parsable --array=1 --chdir="$SHARED" "$SHARED/jobs/${job%_1}/job.sh"
again=$(cut -d';' -f1 "$WORK/last.out")_1
b_saved_again() { [ "$(b_last_step)" -gt "$cancelled_at" ]; }
wait_until 120 b_saved_again
scancel --signal=USR1 --batch "$again" || fail "scancel --signal=USR1 $again"
again_ended() { case $(slurm_job_state "$again") in COMPLETED | FAILED | CANCELLED | TIMEOUT) ;; *) false ;; esac; }
wait_until 120 again_ended
grep -q "checkpointed after USR1; requeueing job $again\$" "$SHARED/jobs/$job/log" &&
    grep -q "slurm job $again on .*restart 1," "$SHARED/jobs/$job/log" ||
    fail "the resubmitted task did not requeue on USR1: $(tail -5 "$SHARED/jobs/$job/log")"
[ "$(slurm_job_state "$again")" = COMPLETED ] && [ "$(cat "$SHARED/jobs/$job/exit_code")" = 0 ] &&
    [ -s "$SHARED/arr/b/adapter_model.safetensors" ] ||
    fail "the resubmitted task did not complete: $(slurm_job_state "$again"): $(tail -5 "$SHARED/jobs/$job/log")"

# A job of two GPUs (gpus_per_job 2): --gres=gpu:2, and its `finetune --gpus all` runs one
# process per GPU Slurm gave it (simulated GPUs at the GRES indices, computing on the CPU).
slurm_cluster_yaml "$WORK/two.yaml" gpus_per_job=2 device= max_adapters=2 env.TANDEM_SIM_GPU_COMPUTE=cpu \
    env.TANDEM_FAKE_GPUS='"uuid=GPU-slurm-0,name=Sim,total_mb=24000;uuid=GPU-slurm-1,name=Sim,total_mb=24000"'
sed -e 's#out/#two/#' -e 's/^epochs = 2/epochs = 1/' "$WORK/adapters.toml" | awk '/^\[\[adapter\]\]/ {n++} n < 3' >"$WORK/two.toml"
expect_exit 0 "$TANDEM" submit --cluster "$WORK/two.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/two.toml" "${FLAGS[@]}"
job=$(sed -n 's/^slurm: submitted job \([^ ]*\) .*/\1/p' "$WORK/last.out")
[ "$(echo "$job" | wc -w)" = 1 ] || fail "two adapters, two GPUs: one job expected: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q '^#SBATCH --gres=gpu:2$' "$SHARED/jobs/$job/job.sh" || fail "no --gres=gpu:2 in $(cat "$SHARED/jobs/$job/job.sh")"
expect_exit 0 timeout 300 "$TANDEM" cluster watch --interval 1 --until-done
grep -q -- '--gpus: 2 adapter(s) on 2 of 2 GPU(s)' "$SHARED/jobs/$job/log" || fail "not split over the job's GPUs: $(cat "$SHARED/jobs/$job/log")"
grep -q '^\[gpu 0\] .*reserved .* MiB on GPU-slurm-0' "$SHARED/jobs/$job/log" || fail "no process on GPU 0"
grep -q '^\[gpu 1\] .*reserved .* MiB on GPU-slurm-1' "$SHARED/jobs/$job/log" || fail "no process on GPU 1"
for a in a b; do [ -s "$SHARED/two/$a/adapter_model.safetensors" ] || fail "two-GPU job: $a not trained"; done
[ "$(cat "$SHARED/jobs/$job/exit_code")" = 0 ] || fail "two-GPU job: exit_code $(cat "$SHARED/jobs/$job/exit_code" 2>&1)"

# Mistakes: a malformed slurm block (FILE:LINE:COLUMN, exit 2), a partition sbatch refuses,
# sbatch missing from PATH.
printf 'scheduler: slurm\nslurm:\n  workdir: %s\n  gpu_vram_mb: 100\n  partiton: debug\n' "$SHARED" >"$WORK/bad.yaml"
expect_exit 2 "$TANDEM" cluster status --cluster "$WORK/bad.yaml"
grep -q "bad.yaml:5:3: .*partiton.*did you mean 'partition'" "$WORK/last.err" || fail "malformed block: $(cat "$WORK/last.err")"
printf 'scheduler: slurm\nslurm:\n  workdir: %s\n  time: soon\n  gpu_vram_mb: 100\n' "$SHARED" >"$WORK/bad.yaml"
expect_exit 2 "$TANDEM" cluster status --cluster "$WORK/bad.yaml"
grep -q "bad.yaml:4:9: slurm.time 'soon'" "$WORK/last.err" || fail "bad time: $(cat "$WORK/last.err")"
# a partition the cluster does not have: sbatch refuses, nothing is queued or left in jobs/, and
# the message points at the slurm: block of the file
slurm_cluster_yaml "$WORK/nopart.yaml" partition=nosuch
sed 's|"out/|"nopart/|' "$WORK/adapters.toml" >"$WORK/nopart.toml" # outputs not trained yet
ls "$SHARED/jobs" >"$WORK/jobs.before"
expect_exit 1 "$TANDEM" submit --cluster "$WORK/nopart.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/nopart.toml" "${FLAGS[@]}"
grep -q "sbatch refused .*invalid partition.*nothing was queued: check the slurm: block of .*nopart.yaml (line [0-9]" \
    "$WORK/last.err" || fail "unknown partition: $(cat "$WORK/last.err")"
ls "$SHARED/jobs" | diff "$WORK/jobs.before" - >/dev/null || fail "a refused sbatch left jobs: $(ls "$SHARED/jobs")"
mkdir -p "$WORK/nosbatch"
for f in /usr/bin/* /usr/sbin/*; do [ "${f##*/}" = sbatch ] || ln -sf "$f" "$WORK/nosbatch/"; done
expect_exit 1 env PATH="$WORK/nosbatch" "$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/adapters.toml" "${FLAGS[@]}"
grep -q "sbatch is not on PATH" "$WORK/last.err" || fail "missing sbatch: $(cat "$WORK/last.err")"
finish
