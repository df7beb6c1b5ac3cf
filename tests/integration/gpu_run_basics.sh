#!/bin/bash
# tandem gpu run / gpu status on one simulated GPU: environment, exit codes, usage errors,
# never-fits, no-wait, timeout, signal forwarding, over-budget warning, status output.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

# The child sees the chosen GPU and its reservation id; the child's exit code comes back.
expect_exit 7 "$TANDEM" gpu run --vram 1 -- sh -c 'echo "$CUDA_VISIBLE_DEVICES $TANDEM_RESERVATION_ID" > '"$WORK"'/env; exit 7'
grep -q '^GPU-sim-0 r-' "$WORK/env" || fail "child environment: $(cat "$WORK/env")"
expect_exit 0 "$TANDEM" gpu run --vram 0.5 --task named --gpu 0 -- true
expect_exit 0 "$TANDEM" gpu run --vram 0.5 --gpu GPU-sim -- true
expect_exit 127 "$TANDEM" gpu run --vram 1 -- /nonexistent/program
grep -q "cannot run /nonexistent/program" "$WORK/last.err" || fail "exec failure not reported"
[ "$(ledger_count)" = 0 ] || fail "reservations left behind: $(ledger_count)"

# Usage errors: exit 2.
expect_exit 2 "$TANDEM" gpu run -- true
expect_exit 2 "$TANDEM" gpu run --vram 1
expect_exit 2 "$TANDEM" gpu run --vram -3 -- true
expect_exit 2 "$TANDEM" gpu run --vram lots -- true
# strtod's other forms are not GiB: hex ("0x10" was taken as 16), inf, nan; 1e1 is decimal
for v in 0x10 0X1p4 infinity nan; do
    expect_exit 2 "$TANDEM" gpu run --vram $v -- true
    grep -qx "tandem: --vram needs a positive number of GiB, not '$v'" "$WORK/last.err" || fail "--vram $v: $(cat "$WORK/last.err")"
done
expect_exit 0 "$TANDEM" gpu run --vram 1e-1 -- true
# a number too large is called that, not "needs a positive number"
expect_exit 2 "$TANDEM" gpu run --vram 99999999999999999999 -- true
grep -qx "tandem: --vram: '99999999999999999999' GiB is too large: at most 1000000 GiB (more than any GPU has)" "$WORK/last.err" ||
    fail "--vram 99999999999999999999: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" gpu run --vram 1 --bogus -- true
expect_exit 0 "$TANDEM" gpu run --help
expect_exit 0 "$TANDEM" gpu --help
expect_exit 0 "$TANDEM" gpu status --help
expect_exit 2 "$TANDEM" gpu status --bogus
expect_exit 2 "$TANDEM" gpu frobnicate

# No such GPU; a budget that can never fit (capacity floor(10000*0.85) = 8500 MiB) fails at once.
expect_exit 1 "$TANDEM" gpu run --vram 1 --gpu GPU-nope -- true
grep -q "no GPU matches" "$WORK/last.err" || fail "unknown GPU message"
start=$(date +%s)
expect_exit 1 "$TANDEM" gpu run --vram 9 --timeout 30 -- true
grep -q "can never fit" "$WORK/last.err" || fail "never-fits message: $(cat "$WORK/last.err")"
[ $(( $(date +%s) - start )) -lt 5 ] || fail "never-fits waited"

# A holder of 6 GiB; meanwhile a 4 GiB job cannot fit: --no-wait-gpu fails, --timeout gives 75.
"$TANDEM" gpu run --vram 6 --task holder -- sleep 30 >"$WORK/holder.out" 2>&1 &
holder=$!
wait_until 10 sh -c "\"$TANDEM\" gpu status --json | jq -e '.gpus[0].reservations[0].task == \"holder\"'"
expect_exit 1 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true
grep -q "not available now" "$WORK/last.err" || fail "no-wait message: $(cat "$WORK/last.err")"
expect_exit 75 "$TANDEM" gpu run --vram 4 --timeout 1 -- true
grep -q "timed out after 1 s waiting for 4096 MiB" "$WORK/last.err" || fail "timeout message: $(cat "$WORK/last.err")"
grep -q "2356 MiB available" "$WORK/last.err" || fail "timeout message lacks what was available"
grep -q "position 1 in the queue" "$WORK/last.err" || fail "no waiting status line"
[ "$(ledger_count)" = 1 ] || fail "the timed-out waiter left a ticket behind"

# Status shows the reservation, in text and JSON (gpustat's shape).
expect_exit 0 "$TANDEM" gpu status
grep -q "budget   6144 MiB" "$WORK/last.out" || fail "status text lacks the reservation: $(cat "$WORK/last.out")"
grep -q "capacity 8500 MiB  reserved 6144 MiB  available 2356 MiB" "$WORK/last.out" || fail "status ledger line"
"$TANDEM" gpu status --json > "$WORK/status.json" || fail "status --json failed"
jq -e '.hostname and .query_time and (.gpus | length == 1) and .gpus[0].index == 0
       and .gpus[0].uuid == "GPU-sim-0" and .gpus[0]["memory.total"] == 10000
       and .gpus[0]["memory.used"] == 0 and .gpus[0].reserve_factor == 0.85
       and .gpus[0].ledger.capacity_mb == 8500 and (.gpus[0].reservations[0].pids | length == 2)
       and .gpus[0].reservations[0].budget_mb == 6144 and .gpus[0].reservations[0].actual_mb == null' \
    "$WORK/status.json" >/dev/null || fail "status JSON: $(cat "$WORK/status.json")"

# SIGTERM to the wrapper reaches the child; the wrapper exits 128+15 and releases.
kill -TERM $holder
wait $holder; code=$?
[ $code = 143 ] || fail "wrapper exit after SIGTERM: $code"
[ "$(ledger_count)" = 0 ] || fail "reservation not released after SIGTERM"

# A waiter interrupted by SIGINT leaves no ticket.
"$TANDEM" gpu run --vram 8 --task blocker -- sleep 30 >/dev/null 2>&1 &
blocker=$!
wait_until 10 sh -c "[ \$(\"$TANDEM\" gpu status --json | jq '.gpus[0].reservations | length') = 1 ]"
"$TANDEM" gpu run --vram 2 --task waiter -- true >/dev/null 2>&1 &
waiter=$!
wait_until 10 sh -c "[ \$(\"$TANDEM\" gpu status --json | jq '.gpus[0].queue | length') = 1 ]"
kill -INT $waiter; wait $waiter; code=$?
[ $code = 130 ] || fail "interrupted waiter exit: $code"
[ "$(ledger_count)" = 1 ] || fail "interrupted waiter left its ticket"
kill -TERM $blocker; wait $blocker

# Over budget: the child reports (through the simulated GPU's process list) 2000 MiB against a
# 1024 MiB budget: one warning, and the actual usage shows in gpu status. The child runs until
# the checks are done (greedy.release), however slowly this machine runs them.
spec="$WORK/gpus.spec"
echo "uuid=GPU-sim-0,name=Sim 10G,total_mb=10000,memory=discrete" > "$spec"
TANDEM_FAKE_GPUS="@$spec" "$TANDEM" gpu run --vram 1 --task greedy -- sh -c \
  "printf 'uuid=GPU-sim-0,name=Sim 10G,total_mb=10000,memory=discrete,used_mb=2000\npid=%s,gpu=GPU-sim-0,used_mb=2000\n' \$\$ > '$spec'; sleep 2; while [ ! -e '$WORK/greedy.release' ]; do sleep 0.1; done" \
  > "$WORK/greedy.out" 2> "$WORK/greedy.err" &
greedy=$!
wait_until 10 sh -c "TANDEM_FAKE_GPUS=@$spec \"$TANDEM\" gpu status --json | jq -e '.gpus[0].reservations[0].actual_mb == 2000'"
TANDEM_FAKE_GPUS="@$spec" "$TANDEM" gpu status > "$WORK/greedy.status"
touch "$WORK/greedy.release"
grep -q "actual   2000 MiB" "$WORK/greedy.status" || fail "actual not shown: $(cat "$WORK/greedy.status")"
wait $greedy
[ "$(grep -c 'more than 20% over its budget' "$WORK/greedy.err")" = 1 ] || fail "over-budget warning: $(cat "$WORK/greedy.err")"

# No GPU at all: one clear line, empty list in JSON, exit 0.
TANDEM_FAKE_GPUS="" expect_exit 0 "$TANDEM" gpu status
grep -q "^No GPU found" "$WORK/last.out" || fail "no-GPU text: $(cat "$WORK/last.out")"
TANDEM_FAKE_GPUS="" expect_exit 0 "$TANDEM" gpu status --json
jq -e '.gpus == []' "$WORK/last.out" >/dev/null || fail "no-GPU JSON"
TANDEM_FAKE_GPUS="" expect_exit 1 "$TANDEM" gpu run --vram 1 -- true
finish
