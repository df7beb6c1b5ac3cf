#!/bin/bash
# kill -9 of holders (wrappers and their children) and of waiters at random moments, while other
# jobs keep reserving. Afterwards: the ledger is readable, no reservation or ticket is left behind
# (no ghost), and every job that ran saw its own reservation in the ledger while running (no lost
# reservation).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
log="$WORK/jobs.log"
: > "$log"
RANDOM=4242
ROUNDS=${ROUNDS:-3}
PER_ROUND=8

for round in $(seq 1 "$ROUNDS"); do
    echo "$(date +%T.%N) round $round"
    pids=()
    for j in $(seq 1 $PER_ROUND); do
        gb=$((RANDOM % 4 + 2))
        id="$round-$j"
        "$TANDEM" gpu run --vram "$gb" --task "k$id" --timeout 60 -- sh -c "
            echo \"start \$(date +%s%N) $id $((gb * 1024))\" >> '$log'
            if \"$TANDEM\" gpu status --json | grep -q \"\$TANDEM_RESERVATION_ID\"; then echo \"seen $id\" >> '$log'; else echo \"missing $id\" >> '$log'; fi
            sleep 0.$((RANDOM % 5 + 3))
            echo \"end \$(date +%s%N) $id\" >> '$log'" >/dev/null 2>&1 &
        pids+=($!)
        sleep 0.0$((RANDOM % 9 + 1))
    done
    # Kill a few wrappers (waiting or holding) and a few children, at random moments.
    victims=" "
    for victim in $(seq 1 4); do
        sleep 0.$((RANDOM % 4 + 1))
        if [ $((victim % 2)) = 1 ]; then
            # A wrapper, whatever it is doing (waiting in the queue or supervising its child).
            w=${pids[$((RANDOM % PER_ROUND))]}
            kill -9 "$w" 2>/dev/null && victims+="$w "
        else
            # A running child (the job itself: the `sh` after exec), chosen among wrappers that
            # have one. Only `sh` is a fair victim: under ASan the wrapper's other child at exit is
            # LeakSanitizer's tracer, whose death hangs the wrapper forever.
            for w in $(printf '%s\n' "${pids[@]}" | shuf --random-source=<(yes)); do
                child=$(pgrep -x -P "$w" sh | head -n 1)
                if [ -n "$child" ]; then kill -9 "$child" 2>/dev/null && victims+="$w "; break; fi
            done
        fi
    done
    # Every job not hit must succeed: a dead waiter or holder never blocks the others for good.
    echo "$(date +%T.%N) round $round: victims$victims; waiting for the wrappers"
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null; code=$?
        case "$victims" in *" $p "*) ;; *) [ $code = 0 ] || fail "round $round: untouched job $p exited $code" ;; esac
    done
    # Children of killed wrappers run on as orphans holding their reservation; let them finish.
    logpat=$(printf '%s' "$log" | sed 's/\./[.]/g')
    echo "$(date +%T.%N) round $round: waiting for orphans"
    wait_until 30 sh -c "! pgrep -f '$logpat'"
done

"$TANDEM" gpu status --json > "$WORK/final.json" || fail "ledger unreadable after kill -9 storm"
jq -e '.gpus[0].reservations == [] and .gpus[0].queue == []' "$WORK/final.json" >/dev/null ||
    fail "ghost entries left: $(cat "$WORK/final.json")"
# One more transaction writes the pruned state: the file itself holds no ghost either.
"$TANDEM" gpu run --vram 1 -- true || fail "a job after the storm failed"
jq -e '.reservations == [] and .queue == []' "$TANDEM_LEDGER_DIR/gpu-ledger.json" >/dev/null ||
    fail "ghosts in the ledger file: $(cat "$TANDEM_LEDGER_DIR/gpu-ledger.json")"
ls "$TANDEM_LEDGER_DIR"/*.corrupt-* >/dev/null 2>&1 && fail "the ledger was corrupted"
grep -q '^missing' "$log" && fail "a running job was missing from the ledger: $(grep '^missing' "$log")"
started=$(grep -c '^start' "$log")
echo "$started jobs started, $(grep -c '^end' "$log") ended normally"
[ "$started" -gt 0 ] || fail "no job ran"
finish
