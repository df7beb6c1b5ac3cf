#!/bin/bash
# Release-to-start latency: a holder's job ends (its last act is to log the time), a queued waiter's
# job starts (its first act is to log the time); latency = start - end. Measured with inotify (the
# default) and with the fallback poll alone (TANDEM_NO_INOTIFY=1, poll every TANDEM_POLL_MS).
set -eu
TANDEM=${1:-build/tandem}
work=$(mktemp -d /tmp/tandem-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_FAKE_GPUS="uuid=GPU-bench,name=bench,total_mb=10000,memory=discrete"
ROUNDS=${ROUNDS:-15}

measure() { # measure LABEL [ENV=VALUE...]
    local label=$1; shift
    local lat=()
    for r in $(seq 1 "$ROUNDS"); do
        export TANDEM_LEDGER_DIR="$work/$label-$r"
        env "$@" "$TANDEM" gpu run --vram 6 -- sh -c "sleep 0.4; date +%s%N > '$work/end'" 2>/dev/null &
        local h=$!
        sleep 0.1
        env "$@" "$TANDEM" gpu run --vram 6 -- sh -c "date +%s%N > '$work/start'" 2>/dev/null
        wait $h
        lat+=($(( ($(cat "$work/start") - $(cat "$work/end")) / 1000 )))
    done
    printf '%s\n' "${lat[@]}" | sort -n | awk -v l="$label" '{a[NR]=$1} END {
        printf "%-28s median %7.1f ms   p90 %7.1f ms   (n=%d)\n", l, a[int((NR+1)/2)]/1000, a[int(NR*0.9+0.5)]/1000, NR }'
}
echo "release-to-start latency of a queued job (includes fork/exec of sh and date)"
measure "inotify (default)"
measure "poll only, 500 ms" TANDEM_NO_INOTIFY=1 TANDEM_POLL_MS=500
