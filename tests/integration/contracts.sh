#!/bin/bash
# The contract checker accepts the real contracts and rejects each kind of broken one.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
CHECK="$TANDEM_BINARY_DIR/contract_check"
R="$TANDEM_SOURCE_DIR"
expect_exit 0 "$CHECK" --root "$R" "$R"/contracts/*.yaml

base="$R/contracts/vram-ledger-v1.yaml"
broken() { # broken NAME SED-EXPRESSION EXPECTED-MESSAGE
    sed "$2" "$base" > "$WORK/$1.yaml"
    cmp -s "$base" "$WORK/$1.yaml" && { fail "$1: the edit changed nothing"; return; }
    expect_exit 1 "$CHECK" --root "$R" "$WORK/$1.yaml"
    grep -q "$3" "$WORK/last.err" || fail "$1: expected '$3' in: $(cat "$WORK/last.err")"
    grep -qE "$1\.yaml:[0-9]+:[0-9]+: " "$WORK/last.err" || fail "$1: no FILE:LINE:COLUMN"
}
broken no-falsifier 's/    falsified_by: \[F-LEDGER-CONTENTION, F-LEDGER-SPIN\]/    falsified_by: []/' '"falsified_by" must be a non-empty list'
broken unknown-falsifier 's/F-LEDGER-CONTENTION, F-LEDGER-SPIN/F-NOPE, F-LEDGER-SPIN/' 'unknown falsification test F-NOPE'
broken missing-file 's|  - src/gpu/ledger.c|  - src/gpu/no_such_file.c|' 'affected file src/gpu/no_such_file.c does not exist'
broken missing-test 's|"integration.spin_ledger"|"integration.no_such_test"|' 'does not exist'
broken missing-case 's|unit.ledger:test_prune|unit.ledger:test_no_such_case|' 'is not registered'
broken bad-kind 's/    kind: bound/    kind: hope/' 'kind must be invariant, bound or ordering'
broken no-prediction '0,/    prediction:/s//    guess:/' '"prediction" must be a non-empty string'
broken bad-yaml 's/^summary: >/summary: [unclosed/' 'YAML error'

# With results: a cited test that failed, or did not run, or a case that did not pass.
cat > "$WORK/junit.xml" <<'XML'
<testsuite>
<testcase name="unit.ledger" status="run"><system-out>[       OK ] test_prune
</system-out></testcase>
<testcase name="integration.spin_ledger" status="run"><failure message="Failed"/></testcase>
</testsuite>
XML
expect_exit 1 "$CHECK" --root "$R" --junit "$WORK/junit.xml" "$base"
grep -q 'test "integration.spin_ledger" did not pass' "$WORK/last.err" || fail "failed test not reported"
grep -q 'test "integration.gpu_kill9" did not run' "$WORK/last.err" || fail "missing test not reported"
grep -q 'test_no_lost_updates_under_contention" of unit.ledger did not pass' "$WORK/last.err" || fail "case not reported"
grep -q 'test_prune" of unit.ledger did not pass' "$WORK/last.err" && fail "a passing case was reported"
finish
