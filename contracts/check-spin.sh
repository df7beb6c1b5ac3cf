#!/usr/bin/env bash
# check-spin.sh — model-checks the GPU ledger protocol (contracts/ledger.pml) with SPIN.
#
# Exit 0 only when
#   - the real protocol (flock on the separate gpu-ledger.lock) verifies with "errors: 0" over the
#     full state space (no depth truncation),
#   - the flawed variant (flock on the data file, -DLOCK_DATA_FILE) yields a counterexample, both
#     for the properties together (a lost update) and for FITS alone (real over-commitment),
#   - each vacuity check (-DVACUITY=1..5) yields a counterexample (the model can reach the
#     situations the properties talk about, including re-admission after pruning a crashed holder
#     and an expired lease).
# Exit 1 otherwise; exit 77 when spin or a C compiler is missing.
# Environment: SPIN_KEEP=DIR keeps every run's output and counterexample trail (spin -t -p) in DIR.
set -u
here=$(cd "$(dirname "$0")" && pwd)
model="$here/ledger.pml"
command -v spin >/dev/null 2>&1 || { echo "skip: spin not installed"; exit 77; }
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { echo "skip: no C compiler ($CC)"; exit 77; }

work=$(mktemp -d /tmp/tandem-spin-XXXXXX)
trap 'rm -rf "$work"' EXIT
keep=${SPIN_KEEP:-}
[ -n "$keep" ] && mkdir -p "$keep"
failures=0

# run NAME EXPECT(pass|fail) SEARCH(dfs|bfs) SPIN_DEFINES...
run() {
    local name=$1 expect=$2 search=$3; shift 3
    local dir="$work/$name"
    mkdir -p "$dir" && cp "$model" "$dir/ledger.pml"
    # The full search is worth optimizing; the runs that stop at a short counterexample are not.
    local cflags="-DSAFETY -DMEMLIM=2048"
    if [ "$search" = bfs ]; then cflags="-O0 $cflags -DBFS"; else cflags="-O1 $cflags -DCOLLAPSE"; fi
    local t0=$SECONDS
    if ! (cd "$dir" && spin "$@" -a ledger.pml >spin.log 2>&1); then
        echo "FAIL $name: spin -a failed"; sed 's/^/  /' "$dir/spin.log"; failures=$((failures + 1)); return
    fi
    # shellcheck disable=SC2086
    if ! (cd "$dir" && $CC $cflags -o pan pan.c >cc.log 2>&1); then
        echo "FAIL $name: compiling pan failed"; sed 's/^/  /' "$dir/cc.log"; failures=$((failures + 1)); return
    fi
    (cd "$dir" && ./pan -m200000 >pan.out 2>&1)
    local errors
    errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$dir/pan.out" | head -1)
    local secs=$((SECONDS - t0))
    if [ -z "$errors" ]; then
        echo "FAIL $name: no verdict from pan"; tail -20 "$dir/pan.out" | sed 's/^/  /'
        failures=$((failures + 1)); return
    fi
    if grep -q 'max search depth too small\|out of memory' "$dir/pan.out"; then
        echo "FAIL $name: search incomplete (depth or memory limit)"; failures=$((failures + 1)); return
    fi
    local states
    states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$dir/pan.out" | head -1)
    if [ "$expect" = pass ]; then
        if [ "$errors" = 0 ]; then
            echo "ok   $name: verified, errors: 0 ($states states, ${secs}s)"
        else
            echo "FAIL $name: expected no errors, got $errors"
            grep 'violated' "$dir/pan.out" | sed 's/^/  /'
            (cd "$dir" && spin "$@" -t -p ledger.pml 2>&1 | tail -40 | sed 's/^/  /')
            failures=$((failures + 1))
        fi
    else
        if [ "$errors" != 0 ]; then
            # Replay the trail to learn which assert (a line of ledger.pml) failed.
            local line what
            line=$(cd "$dir" && spin "$@" -t ledger.pml 2>&1 |
                sed -n 's/.*ledger\.pml:\([0-9]*\),* Error: assertion violated.*/\1/p' | head -1)
            what=$(sed -n "${line:-0}p" "$dir/ledger.pml" | sed 's/^ *//')
            local depth
            depth=$(grep -m1 -o 'at depth [0-9]*' "$dir/pan.out")
            echo "ok   $name: counterexample as expected, ${what:-?} fails ($depth, ${secs}s)"
        else
            echo "FAIL $name: expected a counterexample, SPIN found none ($states states)"
            failures=$((failures + 1))
        fi
    fi
    if [ -n "$keep" ]; then
        cp "$dir/pan.out" "$keep/$name.pan.out"
        if [ -f "$dir/ledger.pml.trail" ]; then
            (cd "$dir" && spin "$@" -t -p -g ledger.pml >"$keep/$name.trail.txt" 2>&1)
        fi
    fi
}

run correct            pass dfs
run flawed-lock-data   fail bfs -DLOCK_DATA_FILE
run flawed-overcommit  fail bfs -DLOCK_DATA_FILE -DONLY_FITS
run vacuity-1          fail bfs -DVACUITY=1
run vacuity-2          fail bfs -DVACUITY=2
run vacuity-3          fail bfs -DVACUITY=3
run vacuity-4          fail bfs -DVACUITY=4
run vacuity-5          fail bfs -DVACUITY=5

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all SPIN checks passed"
