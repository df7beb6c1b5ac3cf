# Co-training's memory plans (issue 15, behaviour 8; docs/co-training.md, "Memory admission"):
# real `tandem finetune --device cuda` processes on a simulated 1500 MiB GPU (1275 MiB reservable),
# computing on the CPU backend (TANDEM_SIM_GPU_COMPUTE=cpu) while their reservations are real
# ledger entries:
#  - a join that does not fit at the host's plan (as asked: no checkpointing) but fits with
#    gradient checkpointing is admitted: the host re-plans at a step boundary, its reservation
#    grows to exactly what one --no-join finetune of both adapters with --grad-checkpoint
#    reserves (the growth the plan says), and the joined adapter ends equal to its --no-join run
#    (trained as asked) within the fused == alone bound;
#  - when the joined adapter has finished, the host goes back to its plan as asked (checkpointing
#    off) within the reservation it holds, says so, and releases only what that plan does not
#    need (the ledger's figure is that plan's MiB); its own adapter, trained as asked, then with
#    checkpointing, then as asked again, equals training it alone (--no-join) at the same step;
#  - a join whose smallest plan exceeds the GPU's reservable capacity is refused at once
#    (never-fits, exit 1, naming the MiB it needs) while the host trains on.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim 1500,total_mb=1500,memory=discrete"
export TANDEM_SIM_GPU_COMPUTE=cpu
cap=1275 # 1500 MiB x the 0.85 reserve factor
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
# the joiner's data: 16 samples of ~250 tokens, batches of 8 x 256: activations dominate its plan
# (as asked about 60 MiB, with checkpointing about half); huge: one sample of ~10k tokens
word_samples long.jsonl 16 60
word_samples huge.jsonl 2 2000 2
COMMON=(--val-split 0 --log-every 1 --lr-schedule constant --seed 7 --device cuda)
HOST=(--batch-size 2 --max-seq-len 64)
JOIN=(--batch-size 8 --max-seq-len 256 --epochs 2)

status() { "$TANDEM" gpu status --json; }
budget_of() { status | jq -r --argjson p "$1" '[.gpus[].reservations[] | select(.pids[0] == $p) | .budget_mb][0] // empty'; }
budget_is() { [ "$(budget_of "$1")" = "$2" ]; }
reserved_of() { sed -n 's/^tandem: reserved \([0-9]*\) MiB on .*/\1/p' "$1"; }

# references (--no-join): the joiner's adapter alone, as asked; and what one finetune of both
# adapters reserves as asked (P2) and with --grad-checkpoint (P2gc)
expect_exit 0 "$TANDEM" finetune "$M" --adapter long.jsonl:ref/j "${JOIN[@]}" "${COMMON[@]}" --no-join
cat >both.toml <<EOF
[[adapter]]
data = "data/reverse.jsonl"
output = "ref/both-h"
batch_size = 2
max_seq_len = 64
[[adapter]]
data = "long.jsonl"
output = "ref/both-j"
batch_size = 8
max_seq_len = 256
EOF
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config both.toml "${COMMON[@]}" --epochs 1 --no-join
P2=$(reserved_of last.err)
rm -rf ref/both-h ref/both-j
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config both.toml "${COMMON[@]}" --epochs 1 --no-join \
    --grad-checkpoint
P2gc=$(reserved_of last.err)
[ -n "$P2" ] && [ -n "$P2gc" ] && [ $((P2gc + 2)) -lt "$P2" ] ||
    fail "the fused plans: as asked '$P2', checkpointing '$P2gc' MiB: no room between them"

# the host: as asked (its plan fits), a long run stopped with SIGTERM at the end
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:co/host "${HOST[@]}" "${COMMON[@]}" --epochs 1500 \
    >host.out 2>host.err &
host=$!
wait_until 20 grep -q "reserved .* MiB on GPU-sim-0" host.err
wait_until 20 sh -c "ls '$TANDEM_LEDGER_DIR'/cotrain-$host.json"
P1=$(budget_of $host)
[ -n "$P1" ] && [ "$P1" -lt "$P2gc" ] || fail "host reservation '$P1' not below the fused plan $P2gc"
grep -q "using gradient checkpointing" host.err && fail "the host alone did not train as asked"

# never fits: the smallest plan with a 10k-token sample exceeds the 1275 MiB reservable
expect_exit 1 "$TANDEM" finetune "$M" --adapter huge.jsonl:co/huge --batch-size 1 --max-seq-len 16384 \
    "${COMMON[@]}"
grep -q "refused the adapters: with these adapters the finetune of pid $host needs at least [0-9]* MiB on GPU-sim-0 (its smallest plan: .*), more than tandem may reserve there ($cap MiB)" last.err ||
    fail "no never-fits refusal: $(cat last.err)"
[ -e co/huge/adapter_model.safetensors ] && fail "the refused joiner wrote an adapter"
kill -0 $host 2>/dev/null || fail "the host ended after the refusal"

# a holder reservation leaves the host room to grow to P2gc + 2 only: the join fits with
# gradient checkpointing, not as asked
hold_mb=$((cap - P2gc - 2))
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk "BEGIN{printf \"%.6f\", $hold_mb/1024}")" \
    --task holder -- sleep 120 >holder.out 2>&1 &
holder=$!
wait_until 20 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[0].reservations[]] | length')\" = 2 ]"
grow_to=$((cap - $(budget_of $holder))) # --vram GB rounds up to whole MiB
[ "$grow_to" -ge "$P2gc" ] && [ "$grow_to" -lt "$P2" ] || fail "the holder leaves $grow_to MiB"
"$TANDEM" finetune "$M" --adapter long.jsonl:co/j "${JOIN[@]}" "${COMMON[@]}" >join.out 2>join.err &
joiner=$!
wait_until 30 budget_is $host "$P2gc"
# gpu status shows the plan the host re-planned to (the host's status: checkpointing, split 1)
plan_is() { "$TANDEM" gpu status --json | jq -e ".cotrain_hosts[0].status.plan | $1" >/dev/null; }
wait_until 20 plan_is '.grad_checkpoint == true and (.recompute | type) == "string" and .split == 1' ||
    fail "gpu status does not show the re-plan: $("$TANDEM" gpu status --json | jq -c '.cotrain_hosts[0].status.plan')"
wait $joiner || fail "joiner exited $?: $(cat join.err)"
grep -q "joined the finetune of pid $host (same base model on GPU-sim-0)" join.err ||
    fail "the joiner did not join the host: $(cat join.err)"
grep -q "co-training: with 1 adapter(s) of pid $joiner the plan as asked needs $P2 MiB, more than the $grow_to MiB this finetune's reservation can grow to on GPU-sim-0: using gradient checkpointing, $P2gc MiB" host.err ||
    fail "the host did not re-plan with checkpointing: $(grep co-training host.err)"
grep -q "co-training: reservation grown by $((P2gc - P1)) MiB to $P2gc MiB for 1 adapter(s) of pid $joiner" host.err ||
    fail "the host did not grow by P2gc - P1 = $((P2gc - P1)) MiB: $(grep co-training host.err)"
close_adapters co/j ref/j || fail "the joined adapter (checkpointing) differs from its --no-join run"
# the joiner's adapter left: within the P2gc MiB it holds, the host goes back to its plan as
# asked (checkpointing off), then releases only what that plan does not need: it holds that
# plan's MiB (its own P1, plus the backend scratch the fused steps grew, which is never given
# back), less than P2gc
back_re="co-training: 1 adapter(s) left, 1 training: the plan as asked fits the $P2gc MiB this finetune's reservation holds for its plan on GPU-sim-0: using it, [0-9]* MiB, instead of gradient checkpointing, [0-9]* MiB"
wait_until 30 grep -q "$back_re" host.err || fail "the host did not go back to the plan as asked: $(grep co-training host.err)"
back=$(grep "$back_re" host.err | sed -n 's/.*: using it, \([0-9]*\) MiB, instead .*/\1/p')
[ -n "$back" ] && [ "$back" -ge "$P1" ] && [ "$back" -lt "$P2gc" ] ||
    fail "the plan as asked of the host alone is '$back' MiB, not in [$P1, $P2gc)"
wait_until 20 grep -q "co-training: $((P2gc - back)) MiB released, reservation now $back MiB (1 adapter(s) training)" host.err ||
    fail "the host did not release P2gc - $back MiB: $(grep co-training host.err)"
wait_until 20 budget_is $host "$back" || fail "the ledger holds $(budget_of $host) MiB for the host, not $back"
wait_until 20 plan_is '. == {"grad_checkpoint": false, "recompute": null, "split": 1}' ||
    fail "gpu status does not show the plan as asked again: $("$TANDEM" gpu status --json | jq -c '.cotrain_hosts[0].status.plan')"
"$TANDEM" gpu status | grep -q "plan no checkpointing, split 1" || fail "gpu status text lacks the plan: $("$TANDEM" gpu status)"
# two more steps as asked, then SIGTERM: the host's checkpoint at its step N equals its adapter
# trained alone to step N (as asked, then checkpointing while the joiner trained, then as asked
# again: the same adapter within the fused == alone bound)
s0=$(last_step host.out)
wait_until 60 step_at_least host.out $((s0 + 2))
kill $holder
wait $holder

kill -TERM $host
wait $host
rc=$?
[ $rc -eq 143 ] || fail "host exited $rc after SIGTERM"
N=$(last_checkpoint co/host)
[ -n "$N" ] && [ "$N" -ge $((s0 + 2)) ] || fail "the host's last checkpoint is '$N', before step $((s0 + 2))"
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:ref/host "${HOST[@]}" "${COMMON[@]}" --epochs 1500 \
    --save-every "$N" --no-join --device cpu >ref-host.out 2>ref-host.err &
ref=$!
wait_until 120 test -d "ref/host/checkpoint-$N"
kill -TERM $ref
wait $ref
close_adapters "co/host/checkpoint-$N" "ref/host/checkpoint-$N" ||
    fail "the host's adapter at step $N (re-planned and back) differs from training it alone"
finish
