#!/bin/bash
# Many real `tandem gpu run` processes against one simulated 10 000 MiB GPU (capacity 8500 MiB).
# Each job's child logs its own start and end (ns) and budget. From those timestamps we prove:
#   - capacity: at every start, the budgets of the jobs running then sum to <= 8500 MiB;
#   - liveness: every job ran exactly once and exited 0;
#   - order:    jobs were admitted in arrival order (arrival = the moment the job appeared in the ledger,
#               launches being serialised on that).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
JOBS=${GPU_CONTENTION_JOBS:-14} # not $JOBS: `make test JOBS=2` exports that
log="$WORK/jobs.log"
: > "$log"
budgets=(3 2 5 1 4 2 3 6 1 2 5 3 2 4 1 3)

pids=()
for i in $(seq 0 $((JOBS - 1))); do
    gb=${budgets[$((i % ${#budgets[@]}))]}
    "$TANDEM" gpu run --vram "$gb" --task "job-$i" --timeout 120 -- sh -c \
        "echo \"start \$(date +%s%N) $i $((gb * 1024)) \$((0x\${TANDEM_RESERVATION_ID##*-}))\" >> '$log'; sleep 1.$((RANDOM % 5)); echo \"end \$(date +%s%N) $i\" >> '$log'" \
        >"$WORK/job-$i.out" 2>&1 &
    pids+=($!)
    # Arrival: wait until the job holds a ticket or a reservation (or already ran).
    wait_until 30 sh -c "grep -q 'start [0-9]* $i ' '$log' || \"$TANDEM\" gpu status --json | grep -q '\"job-$i\"'"
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || fail "job $i exited $?: $(cat "$WORK/job-$i.out")"
done

[ "$(grep -c '^start' "$log")" = "$JOBS" ] || fail "not every job started once: $(grep -c '^start' "$log")"
[ "$(grep -c '^end' "$log")" = "$JOBS" ] || fail "not every job ended"
# Admission order (the admission time is the last field of the reservation id) must be arrival
# order 0, 1, 2, ...
order=$(grep '^start' "$log" | sort -k5,5n | awk '{printf "%s ", $3}')
expected=$(seq 0 $((JOBS - 1)) | tr '\n' ' ')
[ "$order" = "$expected" ] || fail "start order '$order' is not arrival order '$expected'"
# Capacity: sweep events in time order (ends before starts at equal times never happens in ns).
peak=$(awk 'NR==FNR { if ($1=="start") bud[$3]=$4; next }
            { if ($2=="+") { cur+=bud[$3]; if (cur>peak) peak=cur } else cur-=bud[$3] }
            END { print peak+0 }' "$log" \
       <(awk '$1=="start"{print $2, "+", $3} $1=="end"{print $2, "-", $3}' "$log" | sort -n))
echo "peak concurrent budget: $peak MiB of 8500"
[ "$peak" -le 8500 ] || fail "capacity exceeded: $peak MiB > 8500 MiB"
# Sharing happened at all (otherwise the test proves nothing about concurrency).
[ "$peak" -gt 6144 ] || fail "jobs never ran side by side (peak $peak MiB)"
[ "$(ledger_count)" = 0 ] || fail "ledger not empty at the end"
finish
