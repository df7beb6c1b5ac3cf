#!/bin/bash
# Each anomaly gets a clear outcome: a recycled PID and an expired lease are pruned (the job is
# admitted), a corrupt ledger is moved aside with a warning naming it, a failing write stops the
# job before it starts with a message naming the ledger, and a read-only ledger directory does too.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
mkdir -p "$TANDEM_LEDGER_DIR"
ledger="$TANDEM_LEDGER_DIR/gpu-ledger.json"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
later=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
before=$(date -u -d '-1 hour' +%Y-%m-%dT%H:%M:%SZ)
host=$(hostname)
my_start=$(awk '{ sub(/.*\) /, ""); split($0, f, " "); print f[20] }' /proc/$$/stat)

write_ledger() { # write_ledger PID START_TIME LEASE_EXPIRES: one 8 GiB reservation
    cat > "$ledger" <<JSON
{"version": 1, "next_ticket": 1, "queue": [], "reservations": [
  {"id": "r-crafted", "holders": [{"pid": $1, "start_time": $2}], "user": "x", "host": "$host",
   "gpu_uuid": "GPU-sim-0", "budget_mb": 8192, "actual_mb": null, "task": "crafted",
   "started": "$now", "lease_expires": "$3"}]}
JSON
}

# Sanity: a live holder with the right start time blocks a 4 GiB job.
write_ledger $$ "$my_start" "$later"
expect_exit 1 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true
grep -q "not available now" "$WORK/last.err" || fail "a live crafted holder did not block: $(cat "$WORK/last.err")"

# Recycled PID: our own pid, but another start time -> pruned, the job runs.
write_ledger $$ $((my_start + 1)) "$later"
expect_exit 0 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true

# Expired lease of a live process -> pruned.
write_ledger $$ "$my_start" "$before"
expect_exit 0 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true

# Another host's entry: its pids mean nothing here, only its lease counts.
write_ledger 999999 1 "$later"
sed -i "s/\"host\": \"$host\"/\"host\": \"elsewhere\"/" "$ledger"
expect_exit 1 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true
write_ledger 999999 1 "$before"
sed -i "s/\"host\": \"$host\"/\"host\": \"elsewhere\"/" "$ledger"
expect_exit 0 "$TANDEM" gpu run --vram 4 --no-wait-gpu -- true

# Corrupt ledger: moved aside (content kept), warned about by name, the job runs.
printf '{"version": 1, "reservations": [ {"id": ' > "$ledger"
expect_exit 0 "$TANDEM" gpu run --vram 1 -- true
aside=$(ls "$TANDEM_LEDGER_DIR"/gpu-ledger.json.corrupt-* 2>/dev/null | head -n 1)
[ -n "$aside" ] || fail "corrupt ledger not moved aside"
[ "$(cat "$aside")" = '{"version": 1, "reservations": [ {"id": ' ] || fail "moved-aside content changed"
grep -q "moved aside to $aside" "$WORK/last.err" || fail "warning does not name $aside: $(cat "$WORK/last.err")"
jq -e '.version == 1' "$ledger" >/dev/null || fail "no fresh ledger after corruption"

# Failing writes (fault injection at each step of the atomic write): exit 1, a message naming the
# ledger directory, the child never started, and the ledger unchanged.
cp "$ledger" "$WORK/ledger.before"
for point in atomic_write.open atomic_write.write atomic_write.fsync atomic_write.rename ledger.lock; do
    rm -f "$WORK/started"
    TANDEM_FAULT_INJECT=$point expect_exit 1 "$TANDEM" gpu run --vram 1 -- touch "$WORK/started"
    [ -e "$WORK/started" ] && fail "$point: the child ran although the reservation failed"
    grep -qE "GPU ledger|cannot lock" "$WORK/last.err" || fail "$point: unclear message: $(cat "$WORK/last.err")"
    cmp -s "$ledger" "$WORK/ledger.before" || fail "$point: the ledger changed"
done
ls "$TANDEM_LEDGER_DIR"/.gpu-ledger.json.tmp-* >/dev/null 2>&1 && fail "temp files left behind"

# Read-only ledger directory (as an unprivileged user; root ignores directory permissions).
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    ro="$WORK/ro"
    mkdir -p "$ro" && cp "$ledger" "$ro/" && touch "$ro/gpu-ledger.lock" && chmod 0755 "$WORK" "$ro"
    chmod 0644 "$ro/gpu-ledger.json" "$ro/gpu-ledger.lock"
    chmod 0555 "$ro"
    # The checkout may sit where the unprivileged user cannot enter (root's home, a 0700
    # `mktemp -d`): it runs a copy of the binary inside $WORK, which it can reach.
    mkdir -p "$WORK/bin" && cp "$TANDEM" "$WORK/bin/tandem" && chmod 0755 "$WORK/bin" "$WORK/bin/tandem"
    as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
    if ! as_nobody "$WORK/bin/tandem" --version >/dev/null 2>"$WORK/ro.err"; then
        echo "skip: read-only ledger case: uid 65534 cannot run $WORK/bin/tandem ($(head -n1 "$WORK/ro.err"))"
    else
        as_nobody env TANDEM_LEDGER_DIR="$ro" \
            "$WORK/bin/tandem" gpu run --vram 1 -- true >"$WORK/ro.out" 2>"$WORK/ro.err"
        code=$?
        [ $code = 1 ] || fail "read-only directory: exit $code"
        grep -q "$ro" "$WORK/ro.err" || fail "read-only directory: message does not name it: $(cat "$WORK/ro.err")"
    fi
    chmod 0755 "$ro"
elif [ "$(id -u)" != 0 ]; then
    ro="$WORK/ro"
    mkdir -p "$ro" && chmod 0555 "$ro"
    TANDEM_LEDGER_DIR="$ro" expect_exit 1 "$TANDEM" gpu run --vram 1 -- true
    grep -q "$ro" "$WORK/last.err" || fail "read-only directory: message does not name it"
    chmod 0755 "$ro"
fi
finish
