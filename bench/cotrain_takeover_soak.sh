#!/bin/bash
# Soak of co-training's host-death takeover (docs/co-training.md, "Failure rules"): runs
# tests/integration/cotrain_takeover.sh ROUNDS times, each with new random kill moments (three
# kill -9 of the current host per run, then a SIGSTOPped host), and reports how many runs
# failed, keeping the log of each failure. Not part of `make test` (minutes).
#
#     bench/cotrain_takeover_soak.sh [BUILD_DIR] [ROUNDS]        (default: build 20)
#
# A failing run's output (its kill moments and the FAIL lines) is left in
# $TMPDIR/cotrain-takeover-soak-K.log.
set -u
BUILD=${1:-build}
ROUNDS=${2:-20}
SRC=$(cd "$(dirname "$0")/.." && pwd)
export TANDEM=$(cd "$BUILD" && pwd)/tandem TANDEM_SOURCE_DIR=$SRC
failed=0
t0=$(date +%s)
for k in $(seq 1 "$ROUNDS"); do
    log=${TMPDIR:-/tmp}/cotrain-takeover-soak-$k.log
    if bash "$SRC/tests/integration/cotrain_takeover.sh" >"$log" 2>&1; then
        rm -f "$log"
        echo "run $k: ok"
    else
        failed=$((failed + 1))
        echo "run $k: FAILED (log: $log)"
        grep -E '^(round|FAIL)' "$log" | sed 's/^/    /'
    fi
done
printf 'runs\tfailed\tkills\tseconds\n%d\t%d\t%d\t%d\n' "$ROUNDS" "$failed" $((3 * ROUNDS)) \
    $(($(date +%s) - t0))
[ "$failed" -eq 0 ]
