#!/bin/bash
# Hostile or damaged ledger directories, through the CLI: temp files planted or left by kill -9,
# crafted numbers (huge budgets, far-future foreign leases, an exhausted ticket counter), and
# --timeout values at the edges (1e10 s must not overflow into an instant timeout; 0.5 s is
# reported as 0.5 s).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
mkdir -p "$TANDEM_LEDGER_DIR"
ledger="$TANDEM_LEDGER_DIR/gpu-ledger.json"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
later=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
host=$(hostname)
my_start=$(awk '{ sub(/.*\) /, ""); split($0, f, " "); print f[20] }' /proc/$$/stat)

# --- temp files -----------------------------------------------------------------------------------
# A hard link planted at the temp name the next writer will use (its pid is known: the shell execs
# tandem) must not be truncated or rewritten through.
echo "precious" > "$WORK/victim"
chmod 0644 "$WORK/victim"
sh -c 'ln "$1" "$2/.gpu-ledger.json.tmp-$$" && exec "$3" gpu run --vram 1 -- true' sh \
    "$WORK/victim" "$TANDEM_LEDGER_DIR" "$TANDEM" >"$WORK/planted.out" 2>"$WORK/planted.err"
[ "$(cat "$WORK/victim")" = "precious" ] || fail "a planted hard link was written through: $(head -c 200 "$WORK/victim")"
[ "$(stat -c %a "$WORK/victim")" = 644 ] || fail "a planted hard link's mode was changed"
[ "$(stat -c %h "$WORK/victim")" -le 2 ] || fail "link count grew"

# Leftovers of writers killed by kill -9 (dead pids; and a live pid whose process started after
# the file was written, i.e. a recycled pid) are removed by the next transaction; a file of a live
# writer's pid written after it started stays.
sleep 0 & dead=$!; wait $dead
printf 'half' > "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$dead"
printf 'old' > "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-1"
touch -d '2001-01-01' "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-1"
printf 'live' > "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$$"
expect_exit 0 "$TANDEM" gpu run --vram 1 -- true
[ -e "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$dead" ] && fail "a dead writer's temp file was left"
[ -e "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-1" ] && fail "a recycled pid's temp file was left"
[ -e "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$$" ] || fail "a live writer's temp file was removed"
rm -f "$TANDEM_LEDGER_DIR"/.gpu-ledger.json.tmp-*

# A real kill -9 while writing: fault injection cannot stop a write half way, so stop the writer
# for good with SIGKILL while it waits for the lock we hold, then leave a temp file of its pid.
# The next transaction (any tandem) cleans it up.
exec 9>"$TANDEM_LEDGER_DIR/gpu-ledger.lock"
flock 9
"$TANDEM" gpu run --vram 1 -- true >/dev/null 2>&1 &
victim=$!
sleep 0.3
printf '{"version": 1, "next' > "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$victim"
kill -9 $victim; wait $victim 2>/dev/null
flock -u 9; exec 9>&-
expect_exit 0 "$TANDEM" gpu run --vram 1 -- true
[ -e "$TANDEM_LEDGER_DIR/.gpu-ledger.json.tmp-$victim" ] && fail "a kill -9'd writer's temp file was left"

# --- crafted numbers ------------------------------------------------------------------------------
# reservation ID BUDGET HOST LEASE [ACTUAL]: one reservation held by this shell (live here).
reservation() {
    cat <<JSON
  {"id": "$1", "holders": [{"pid": $$, "start_time": $my_start}], "user": "x", "host": "$3",
   "gpu_uuid": "GPU-sim-0", "budget_mb": $2, "actual_mb": ${5:-null}, "task": "$1",
   "started": "$now", "lease_expires": "$4"}
JSON
}
# Two budgets of 2^62 (fully allocated, so nothing is pending) used to sum to a negative total and
# admit anything.
big=4611686018427387904
{ echo '{"version": 1, "next_ticket": 1, "queue": [], "reservations": ['
  reservation r-big1 $big "$host" "$later" $big; echo ','
  reservation r-big2 $big "$host" "$later" $big
  echo ']}'; } > "$ledger"
expect_exit 1 "$TANDEM" gpu run --vram 1 --no-wait-gpu -- true
grep -q "not available now" "$WORK/last.err" || fail "huge budgets admitted a job: $(cat "$WORK/last.err")"
ls "$TANDEM_LEDGER_DIR"/gpu-ledger.json.corrupt-* >/dev/null 2>&1 && fail "huge budgets: ledger moved aside"
expect_exit 0 "$TANDEM" gpu status --json
[ "$(jq '.gpus[0].ledger.available_mb' "$WORK/last.out")" = 0 ] || fail "huge budgets: status $(cat "$WORK/last.out")"

# Another host's lease ending in year 9999 must not hold the GPU forever; one ending in an hour does.
{ echo '{"version": 1, "next_ticket": 1, "queue": [], "reservations": ['
  reservation r-far 8000 elsewhere "9999-12-31T23:59:59Z"; echo ']}'; } > "$ledger"
expect_exit 0 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true
{ echo '{"version": 1, "next_ticket": 1, "queue": [], "reservations": ['
  reservation r-near 8000 elsewhere "$later"; echo ']}'; } > "$ledger"
expect_exit 1 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true

# next_ticket 2^63-1: a waiter used to write a ticket the parser then rejected (ledger moved aside,
# reservations forgotten). Now the limit is 2^53: a waiter takes a ticket, the ledger still parses,
# and the reservation of this shell is kept.
{ echo '{"version": 1, "next_ticket": 9007199254740991, "queue": [], "reservations": ['
  reservation r-keep 8000 "$host" "$later"; echo ']}'; } > "$ledger"
expect_exit 75 "$TANDEM" gpu run --vram 4 --timeout 0.5 -- true
grep -q "timed out after 0.5 s" "$WORK/last.err" || fail "--timeout 0.5 reported as: $(cat "$WORK/last.err")"
ls "$TANDEM_LEDGER_DIR"/gpu-ledger.json.corrupt-* >/dev/null 2>&1 && fail "ticket limit: ledger moved aside"
jq -e '.reservations[0].id == "r-keep"' "$ledger" >/dev/null || fail "ticket limit: reservation lost: $(cat "$ledger")"
jq -e '.next_ticket <= 9007199254740992' "$ledger" >/dev/null || fail "ticket limit: next_ticket $(jq .next_ticket "$ledger")"
# Beyond the limit the ledger is refused as corrupt (moved aside, named), not trusted.
sed -i 's/"next_ticket": [0-9]*/"next_ticket": 9223372036854775807/' "$ledger"
expect_exit 0 "$TANDEM" gpu status
grep -q "next_ticket" "$WORK/last.err" || fail "next_ticket 2^63-1 accepted: $(cat "$WORK/last.err")"
rm -f "$ledger" "$TANDEM_LEDGER_DIR"/gpu-ledger.json.corrupt-*

# --- --timeout at the edges -----------------------------------------------------------------------
# 1e10 s (1e19 ns, beyond int64) must wait, not time out at once.
{ echo '{"version": 1, "next_ticket": 1, "queue": [], "reservations": ['
  reservation r-block 8000 "$host" "$later"; echo ']}'; } > "$ledger"
"$TANDEM" gpu run --vram 4 --timeout 1e10 -- true >"$WORK/long.out" 2>"$WORK/long.err" &
long=$!
sleep 2
if kill -0 $long 2>/dev/null; then
    kill -INT $long; wait $long 2>/dev/null
else
    wait $long; fail "--timeout 1e10 gave up at once (exit $?): $(cat "$WORK/long.err")"
fi
finish
