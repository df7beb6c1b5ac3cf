# Co-training on a GPU (issue 15; docs/co-training.md, "Memory admission"): real `tandem
# finetune --device cuda` processes on two simulated GPUs, computing on the CPU backend through
# the TANDEM_SIM_GPU_COMPUTE=cpu seam (docs/gpu-inventory.md) while their reservations are real
# ledger entries:
#  - a second finetune joins the first on its GPU; the host's reservation grows by the memory
#    plan difference, to exactly what one finetune of both adapters reserves, and shrinks back
#    when the joiner's adapter finishes; the ledger holds one reservation meanwhile;
#  - a join that does not fit waits in FIFO order behind an earlier waiter (its growth ticket
#    queues after it, and it is not admitted while that one waits although it would fit); the
#    joiner shows `waiting:`; --no-wait-gpu gets exit 75;
#  - a finetune limited to the other GPU does not join: it hosts there;
#  - the seam is refused without TANDEM_FAKE_GPUS, and with another value.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim A,total_mb=10000;uuid=GPU-sim-1,name=Sim B,total_mb=10000"
export TANDEM_SIM_GPU_COMPUTE=cpu
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
head -4 data/add.jsonl >add4.jsonl
COMMON=(--batch-size 2 --val-split 0 --log-every 1 --lr-schedule constant --max-seq-len 64
        --seed 7 --device cuda)

# the ledger's figures (gpu status --json)
status() { "$TANDEM" gpu status --json; }
budget_of() { status | jq -r --argjson p "$1" '[.gpus[].reservations[] | select(.pids[0] == $p) | .budget_mb][0] // empty'; }
n_res() { status | jq '[.gpus[].reservations[]] | length'; }
budget_is() { [ "$(budget_of "$1")" = "$2" ]; }

# the seam cannot be switched on by accident: only with a simulated inventory, only "cpu"
expect_exit 2 env -u TANDEM_FAKE_GPUS "$TANDEM" finetune "$M" --adapter add4.jsonl:x/a "${COMMON[@]}" --no-join
grep -q "TANDEM_SIM_GPU_COMPUTE=cpu is a test seam for simulated GPUs and needs TANDEM_FAKE_GPUS" last.err ||
    fail "no refusal of the seam without TANDEM_FAKE_GPUS: $(cat last.err)"
expect_exit 2 env TANDEM_SIM_GPU_COMPUTE=gpu "$TANDEM" finetune "$M" --adapter add4.jsonl:x/b "${COMMON[@]}" --no-join
grep -q "the only value is 'cpu'" last.err || fail "no refusal of TANDEM_SIM_GPU_COMPUTE=gpu"

# the reference plan: one finetune of both adapters reserves P2
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:ref/r --adapter add4.jsonl:ref/a \
    "${COMMON[@]}" --epochs 1 --no-join
P2=$(sed -n 's/^tandem: reserved \([0-9]*\) MiB on .*/\1/p' last.err)
[ -n "$P2" ] || fail "no reservation line in the reference run"

# the host: a long run (stopped with SIGTERM at the end)
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:co/host "${COMMON[@]}" --epochs 400 \
    >host.out 2>host.err &
host=$!
wait_until 20 grep -q "reserved .* MiB on GPU-sim-0" host.err
wait_until 20 sh -c "ls '$TANDEM_LEDGER_DIR'/cotrain-$host.json"
P1=$(budget_of $host)
[ -n "$P1" ] && [ "$P1" -lt "$P2" ] || fail "host reservation $P1 not below the fused plan $P2"

# a joiner: the reservation grows by the plan difference, to P2, then shrinks back to P1. The
# test sees P2 by polling `gpu status` while the joined adapter trains, so that phase must last
# several polls even on a loaded 2-core CI machine (there a poll takes ~1 s): 60 epochs of 2
# steps, ~5 s on an idle one (6 epochs, ~0.45 s, were missed under load).
"$TANDEM" finetune "$M" --adapter add4.jsonl:co/join "${COMMON[@]}" --epochs 60 >join.out 2>join.err &
joiner=$!
wait_until 60 budget_is $host "$P2"
[ "$(n_res)" = 1 ] || fail "a joined finetune holds a reservation of its own: $(status | jq -c '.gpus[].reservations')"
wait $joiner || fail "joiner exited $?"
grep -q "joined the finetune of pid $host (same base model on GPU-sim-0)" join.err ||
    fail "the joiner did not join the host on GPU-sim-0: $(cat join.err)"
grep -q "reserved" join.err && fail "the joiner reserved memory of its own"
grep -q "co-training: reservation grown by $((P2 - P1)) MiB to $P2 MiB" host.err ||
    fail "the host did not grow by P2 - P1 = $((P2 - P1)) MiB: $(grep co-training host.err)"
wait_until 60 budget_is $host "$P1"
grep -q '^\[add4\] done: ' join.out || fail "the joiner did not show its adapter's end"

# FIFO: a holder leaves 100 MiB; an earlier waiter needs 512; the join's growth (fits in 100)
# must queue behind it
cap=8500 # 10000 MiB x the 0.85 reserve factor
hold_mb=$((cap - P1 - 100))
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk "BEGIN{printf \"%.6f\", $hold_mb/1024}")" \
    --task holder -- sleep 60 >holder.out 2>&1 &
holder=$!
wait_until 20 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[0].reservations[]] | length')\" = 2 ]"
"$TANDEM" gpu run --gpu GPU-sim-0 --vram 0.5 --task early -- true >early.out 2>&1 &
early=$!
wait_until 20 sh -c "'$TANDEM' gpu status --json | jq -e '.gpus[0].queue | length == 1'"
# --no-wait-gpu: rejected busy, exit 75
expect_exit 75 "$TANDEM" finetune "$M" --adapter add4.jsonl:co/nowait "${COMMON[@]}" --no-wait-gpu
grep -q "refused the adapters: .*--no-wait-gpu" last.err || fail "no busy refusal: $(cat last.err)"
"$TANDEM" finetune "$M" --adapter add4.jsonl:co/late "${COMMON[@]}" --epochs 2 >late.out 2>late.err &
late=$!
wait_until 30 grep -q "^tandem: waiting: the finetune of pid $host needs" late.err
wait_until 20 sh -c "'$TANDEM' gpu status --json | jq -e '.gpus[0].queue | length == 2'"
status | jq -e '.gpus[0].queue | sort_by(.ticket) | .[0].task == "early" and (.[1].task | test("growth"))' >/dev/null ||
    fail "the growth ticket is not queued behind the earlier waiter: $(status | jq -c .gpus[0].queue)"
sleep 2 # the growth would fit the 100 MiB: FIFO alone keeps it waiting
grep -q "joined the finetune" late.err && fail "the join was admitted ahead of the earlier waiter"
[ "$(budget_of $host)" = "$P1" ] || fail "the host grew while an earlier waiter waited"
kill $holder
wait $holder
wait $early || fail "the earlier waiter exited $?"
wait $late || fail "the late joiner exited $?: $(cat late.err)"
grep -q "joined the finetune of pid $host " late.err || fail "the late joiner did not join"

# another GPU: no join, a host of its own there
CUDA_VISIBLE_DEVICES=GPU-sim-1 expect_exit 0 "$TANDEM" finetune "$M" --adapter add4.jsonl:co/other \
    "${COMMON[@]}" --epochs 1
grep -q "reserved .* MiB on GPU-sim-1" last.err || fail "the GPU-sim-1 run did not reserve there"
grep -q "joined" last.err && fail "a finetune on GPU-sim-1 joined the host on GPU-sim-0"

kill -TERM $host
wait $host
rc=$?
[ $rc -eq 143 ] || fail "host exited $rc after SIGTERM"
wait_until 10 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 0 ]"
finish
