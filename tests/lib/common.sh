# Shared helpers for integration tests (sourced, not run). Each test gets a private scratch
# directory in $WORK and a private ledger in $TANDEM_LEDGER_DIR, removed at exit.
WORK=$(mktemp -d /tmp/tandem-it-XXXXXX)
export TANDEM_LEDGER_DIR="$WORK/ledger"
FAILURES=0
cleanup_work() { rm -rf "$WORK"; }
trap cleanup_work EXIT

fail() { echo "FAIL: $*" >&2; FAILURES=$((FAILURES + 1)); }

# expect_exit CODE CMD...: runs CMD with output to $WORK/last.out/.err and checks its exit code.
expect_exit() {
    local want=$1; shift
    "$@" >"$WORK/last.out" 2>"$WORK/last.err"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        fail "expected exit $want, got $got: $*"
        sed 's/^/  stderr: /' "$WORK/last.err" >&2
    fi
}

finish() {
    if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES failure(s)" >&2; exit 1; fi
    echo "ok"; exit 0
}
