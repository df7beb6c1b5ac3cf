#!/bin/bash
# A corrupt ledger must not let jobs over-commit. When it is moved aside, live holders (separate
# gpu run processes) re-register at once, woken through inotify, not at their next renewal (300 s
# here); a job arriving meanwhile is not admitted beyond capacity; and while the ledger recovers,
# admission also counts the memory the GPU reports in use by processes. A busy ledger does not
# starve the holders' measuring.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
mkdir -p "$TANDEM_LEDGER_DIR"
ledger="$TANDEM_LEDGER_DIR/gpu-ledger.json"
gpus="$WORK/gpus"
export TANDEM_FAKE_GPUS="@$gpus"
export TANDEM_RENEW_SEC=300
gpu_line="uuid=GPU-sim-0,name=Sim 10G,total_mb=10000,memory=discrete" # capacity 8500 MiB
echo "$gpu_line" > "$gpus"

# Two holders, 4096 + 3072 MiB reserved; their programs use 4000 and 3000 MiB (what the simulated
# GPU reports), which leaves 1332 MiB of capacity and 3000 MiB free.
"$TANDEM" gpu run --vram 4 --task hold-a -- sh -c "echo \$\$ > $WORK/a.pid; exec sleep 60" \
    >"$WORK/a.out" 2>"$WORK/a.err" &
holder_a=$!
"$TANDEM" gpu run --vram 3 --task hold-c -- sh -c "echo \$\$ > $WORK/c.pid; exec sleep 60" \
    >"$WORK/c.out" 2>"$WORK/c.err" &
holder_c=$!
wait_until 10 test -s "$WORK/a.pid"
wait_until 10 test -s "$WORK/c.pid"
printf '%s\npid=%s,gpu=GPU-sim-0,used_mb=4000\npid=%s,gpu=GPU-sim-0,used_mb=3000\n' \
    "$gpu_line" "$(cat "$WORK/a.pid")" "$(cat "$WORK/c.pid")" > "$gpus"
# The holders record their measured use (so they have nothing left to write on their own).
wait_until 10 sh -c "jq -e '[.reservations[].actual_mb] | sort == [3000, 4000]' '$ledger'"
ids=$(jq -c '[.reservations[].id] | sort' "$ledger")

# Corrupt the ledger; a 2 GiB job arrives at once: its transaction moves the ledger aside, and it
# must not be admitted (4096 + 3072 + 2048 = 9216 > 8500 MiB of capacity).
printf '{"version": 1, "reservations": [ {"id": ' > "$ledger"
expect_exit 1 "$TANDEM" gpu run --vram 2 --no-wait-gpu -- true
grep -q "moved aside" "$WORK/last.err" || fail "no moved-aside warning: $(cat "$WORK/last.err")"
grep -q "not available now" "$WORK/last.err" || fail "first job after corruption: $(cat "$WORK/last.err")"
# Both holders are back promptly (they would otherwise wait for their renewal, 300 s away).
wait_until 5 sh -c "jq -e '[.reservations[].id] | sort == $ids' '$ledger'"
grep -q "re-registered" "$WORK/a.err" || fail "holder a did not say it re-registered: $(cat "$WORK/a.err")"
expect_exit 1 "$TANDEM" gpu run --vram 2 --no-wait-gpu -- true

# The same through `gpu status`, which also moves a corrupt ledger aside.
printf 'garbage' > "$ledger"
expect_exit 0 "$TANDEM" gpu status
wait_until 5 sh -c "jq -e '[.reservations[].id] | sort == $ids' '$ledger'"
jq -e '.recovering_until' "$ledger" >/dev/null || fail "the fresh ledger carries no recovery mark"
kill $holder_a $holder_c; wait $holder_a $holder_c 2>/dev/null

# Memory held by a program that is in no reservation (a holder that never came back, or a program
# that never asked the ledger): 6000 MiB used, 4000 MiB free. Normally the ledger allows a 3 GiB
# job (reality allows it too: 4000 >= 3072) ...
sleep 60 & user_prog=$!
printf '%s\npid=%s,gpu=GPU-sim-0,used_mb=6000\n' "$gpu_line" $user_prog > "$gpus"
rm -f "$ledger"
expect_exit 0 "$TANDEM" gpu run --vram 3 --no-wait-gpu -- true
# ... but while the ledger is recovering, used memory counts as committed: 6000 + 3072 > 8500.
printf 'garbage' > "$ledger"
expect_exit 0 "$TANDEM" gpu status
sleep 2.5 # past the re-registration grace, still recovering
expect_exit 1 "$TANDEM" gpu run --vram 3 --no-wait-gpu -- true
grep -q "not available now" "$WORK/last.err" || fail "recovering ledger: $(cat "$WORK/last.err")"
expect_exit 0 "$TANDEM" gpu run --vram 2 --no-wait-gpu -- true # 6000 + 2048 <= 8500
kill $user_prog; wait $user_prog 2>/dev/null

# Holders watch the directory, so every ledger write wakes them: a busy ledger (two streams of short
# jobs) must not postpone their measuring (and renewing) forever. The holder measures every second.
rm -f "$ledger" "$WORK/h.pid"
echo "$gpu_line" > "$gpus"
TANDEM_MONITOR_MS=1000 "$TANDEM" gpu run --vram 4 --task busy -- sh -c "echo \$\$ > $WORK/h.pid; exec sleep 60" \
    >"$WORK/h.out" 2>&1 &
holder=$!
wait_until 10 test -s "$WORK/h.pid"
stream() { while [ ! -e "$WORK/stop" ]; do "$TANDEM" gpu run --vram 0.1 -- true >/dev/null 2>&1; done; }
stream & s1=$!
stream & s2=$!
sleep 1
printf '%s\npid=%s,gpu=GPU-sim-0,used_mb=3500\n' "$gpu_line" "$(cat "$WORK/h.pid")" > "$gpus"
wait_until 8 sh -c "jq -e '.reservations[] | select(.task == \"busy\") | .actual_mb == 3500' '$ledger'"
touch "$WORK/stop"; wait $s1 $s2
kill $holder; wait $holder 2>/dev/null
finish
