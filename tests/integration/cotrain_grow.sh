# A host that started on a smaller plan grows to a faster one when memory is freed (issue 15,
# behaviour 8; docs/co-training.md, "Memory admission on a GPU", "Growing to go faster"): a real
# `tandem finetune --device cuda` on a simulated 1500 MiB GPU (1275 MiB reservable; compute on the
# CPU backend, reservations real ledger entries) starts while a process outside the ledger holds
# all but room for its gradient-checkpointing plan, so --vram auto trains with checkpointing
# (a ledger reservation would make it wait in the queue instead); when that process's memory is
# freed, the run grows its reservation through the ledger to exactly its plan as asked at a step
# boundary, says so, gpu status shows the plan without checkpointing, and the adapter
# (checkpointing, then as asked) at the step where it is stopped (SIGTERM, a checkpoint) equals
# training it as asked alone to that step within the fused == alone bound. The simulated
# inventory is a file (re-read at every query) listing the outside process with the memory it
# uses (a simulated run's own use is its reservation: it computes on the CPU and records none).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export TANDEM_SIM_GPU_COMPUTE=cpu
world() { # world LINES...: the simulated inventory (the GPU, then process entries), atomically
    printf '%s\n' "uuid=GPU-sim-0,name=Sim 1500,total_mb=1500,memory=discrete" "$@" >"$WORK/world.tmp" &&
        mv "$WORK/world.tmp" "$WORK/world.txt"
}
world
export TANDEM_FAKE_GPUS=@$WORK/world.txt
cap=1275 # 1500 MiB x the 0.85 reserve factor
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cd "$WORK" || exit 1
# 16 samples of ~250 tokens in batches of 8 x 256: activations dominate the plan (as asked about
# 60 MiB, with checkpointing about half)
word_samples long.jsonl 16 60
F=(--batch-size 8 --max-seq-len 256 --epochs 1000 --val-split 0 --log-every 1 --lr-schedule constant
    --seed 7 --device cuda)
reserved_of() { sed -n 's/^tandem: reserved \([0-9]*\) MiB on .*/\1/p' "$1"; }
budget_of() { "$TANDEM" gpu status --json | jq -r --argjson p "$1" '[.gpus[].reservations[] | select(.pids[0] == $p) | .budget_mb][0] // empty'; }
budget_is() { [ "$(budget_of "$1")" = "$2" ]; }
plan_is() { "$TANDEM" gpu status --json | jq -e ".cotrain_hosts[0].status.plan | $1" >/dev/null; }

# what the plan as asked and the checkpointing plan reserve (one-epoch --no-join runs)
expect_exit 0 "$TANDEM" finetune "$M" --adapter long.jsonl:ref/p "${F[@]}" --epochs 1 --no-join
P=$(reserved_of last.err)
expect_exit 0 "$TANDEM" finetune "$M" --adapter long.jsonl:ref/gc "${F[@]}" --epochs 1 --no-join \
    --grad-checkpoint
Pgc=$(reserved_of last.err)
[ -n "$P" ] && [ -n "$Pgc" ] && [ $((Pgc + 2)) -lt "$P" ] ||
    fail "the plans: as asked '$P', checkpointing '$Pgc' MiB: no room between them"

# a process outside the ledger uses all but Pgc + 1 MiB: the run starts with checkpointing
sleep 300 >/dev/null 2>&1 &
outsider=$!
outside_mb=$((1500 - Pgc - 1))
world "pid=$outsider,gpu=GPU-sim-0,used_mb=$outside_mb"
"$TANDEM" finetune "$M" --adapter long.jsonl:co/a "${F[@]}" >run.out 2>run.err &
run=$!
wait_until 30 grep -q "reserved .* MiB on GPU-sim-0" run.err
grep -q "the plan as asked needs $P MiB, more than the .*: using gradient checkpointing" run.err ||
    fail "the run did not start with checkpointing: $(cat run.err)"
wait_until 30 plan_is '.grad_checkpoint == true'
sleep 3 # more than GROW_CHECK_MS: no growth while the memory is held
grep -q "reservation grown" run.err && fail "the run grew while the memory was held: $(cat run.err)"
# the outside process ends: the run grows to its plan as asked (at most GROW_CHECK_MS later)
kill $outsider
world
grow_re="co-training: memory is free on GPU-sim-0: reservation grown by [0-9]* MiB to [0-9]* MiB for the plan as asked, [0-9]* MiB, instead of gradient checkpointing, [0-9]* MiB"
wait_until 30 grep -q "$grow_re" run.err || fail "the run did not grow to its plan as asked: $(cat run.err)"
to=$(grep "$grow_re" run.err | sed -n 's/.* to \([0-9]*\) MiB for .*/\1/p')
[ "$to" = "$P" ] || fail "the run grew to '$to' MiB, not the $P MiB of its plan as asked"
wait_until 10 budget_is $run "$P" || fail "the ledger holds $(budget_of $run) MiB, not $P"
wait_until 10 plan_is '. == {"grad_checkpoint": false, "recompute": null, "split": 1}' ||
    fail "gpu status does not show the plan as asked"
# two more steps as asked, then SIGTERM: its checkpoint at step N equals training as asked
# alone (--no-join) to step N
s0=$(last_step run.out)
wait_until 120 step_at_least run.out $((s0 + 2))
kill -TERM $run
wait $run
rc=$?
[ $rc -eq 143 ] || fail "the run exited $rc after SIGTERM: $(tail -3 run.err)"
N=$(last_checkpoint co/a)
[ -n "$N" ] && [ "$N" -ge $((s0 + 2)) ] || fail "the run's last checkpoint is '$N', before step $((s0 + 2))"
"$TANDEM" finetune "$M" --adapter long.jsonl:ref/a "${F[@]}" --save-every "$N" --no-join \
    --device cpu >ref.out 2>ref.err &
ref=$!
wait_until 300 test -d "ref/a/checkpoint-$N"
kill -TERM $ref
wait $ref
close_adapters "co/a/checkpoint-$N" "ref/a/checkpoint-$N" ||
    fail "the adapter grown to its plan as asked differs from training it as asked"
finish
