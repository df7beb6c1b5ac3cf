#!/bin/bash
# gpu run --profile / --trace, and the MPS flags' usage errors.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

# --profile: the phase table at exit, with the overhead line.
expect_exit 0 "$TANDEM" gpu run --vram 1 --profile -- sleep 0.3
for phase in lock_acq ledger_rd vram_qry ledger_wr lock_rel wait_poll; do
    grep -q "^$phase " "$WORK/last.err" || fail "--profile lacks $phase: $(cat "$WORK/last.err")"
done
grep -qE "sharing overhead: .* % of wall time" "$WORK/last.err" || fail "--profile lacks the overhead line"
# Without --profile, no table.
expect_exit 0 "$TANDEM" gpu run --vram 1 -- true
grep -q "lock_acq" "$WORK/last.err" && fail "profile printed without --profile"

# --trace while waiting: LedgerReserve (with budget, gpu, outcome), WaitPoll, VramQuery,
# LedgerCleanup, LedgerRelease; valid Chrome Trace Event JSON.
"$TANDEM" gpu run --vram 6 --task holder -- sleep 3 >/dev/null 2>&1 &
holder=$!
wait_until 10 sh -c "[ \"\$(\"$TANDEM\" gpu status --json | jq '.gpus[0].reservations | length')\" = 1 ]"
expect_exit 0 "$TANDEM" gpu run --vram 6 --task waiter --trace "$WORK/trace.json" -- true
wait $holder
jq -e '.traceEvents | type == "array"' "$WORK/trace.json" >/dev/null || fail "trace is not Chrome Trace JSON"
for span in LedgerReserve LedgerCleanup VramQuery WaitPoll LedgerRelease; do
    jq -e --arg n "$span" '[.traceEvents[] | select(.name == $n and .ph == "X")] | length > 0' \
        "$WORK/trace.json" >/dev/null || fail "trace lacks $span"
done
jq -e '[.traceEvents[] | select(.name == "LedgerReserve")][0].args
       | .budget_mb == 6144 and .gpu == "GPU-sim-0" and .outcome == "ok"' "$WORK/trace.json" >/dev/null ||
    fail "LedgerReserve args: $(jq -c '[.traceEvents[] | select(.name == "LedgerReserve")]' "$WORK/trace.json")"
jq -e '[.traceEvents[] | select(.ph == "X") | .dur >= 0 and .ts >= 0] | all' "$WORK/trace.json" >/dev/null ||
    fail "negative ts/dur in the trace"
expect_exit 1 "$TANDEM" gpu run --vram 1 --trace /nonexistent/dir/t.json -- true

# MPS flags: usage errors, and no daemon means exit 1 with how to start one.
expect_exit 2 "$TANDEM" gpu run --vram 1 --experimental-mps --gpu-share 0 -- true
expect_exit 2 "$TANDEM" gpu run --vram 1 --experimental-mps --gpu-share 101 -- true
expect_exit 2 "$TANDEM" gpu run --vram 1 --gpu-share 50 -- true
CUDA_MPS_PIPE_DIRECTORY="$WORK/no-mps" expect_exit 1 "$TANDEM" gpu run --vram 1 --experimental-mps -- true
grep -q "nvidia-cuda-mps-control -d" "$WORK/last.err" || fail "no-daemon message"
finish
