#!/bin/bash
# Part of make run (scripts/demo.sh): several `tandem gpu run` jobs share one simulated 24 GB GPU. Jobs that fit run side by
# side; the rest wait in arrival order and start the moment memory frees. `tandem gpu status` is
# shown as they go. Nothing touches a real GPU: TANDEM_FAKE_GPUS simulates one.
set -eu
TANDEM=${1:-build/tandem}
demo=$(mktemp -d /tmp/tandem-demo-XXXXXX)
trap 'rm -rf "$demo"' EXIT
export TANDEM_LEDGER_DIR="$demo/ledger"
export TANDEM_FAKE_GPUS="uuid=GPU-sim-4090,name=RTX 4090 (simulated),total_mb=24564,memory=discrete"

job() { # job NAME GB SECONDS
    "$TANDEM" gpu run --vram "$2" --task "$1" -- sh -c "sleep $3" 2>&1 | sed -u "s/^/  [$1] /" &
}
echo "== One simulated 24 GB GPU; tandem may reserve 85% of it (20879 MiB)."
echo "== Launching: qlora-7b 10 GB, qlora-3b 8 GB, qlora-14b 12 GB (must wait), eval 2 GB."
echo "== eval would fit at once, but it arrived after qlora-14b: it waits its turn (no starvation)."
job qlora-7b 10 4;  sleep 0.3
job qlora-3b 8 2;   sleep 0.3
job qlora-14b 12 2; sleep 0.3
job eval 2 1;       sleep 0.3
for t in 1 2 3 4 5; do
    echo; echo "== tandem gpu status (t = ${t}s)"
    "$TANDEM" gpu status | sed 's/^/  /'
    sleep 1
done
wait
echo; echo "== All jobs done; the ledger is empty again:"
"$TANDEM" gpu status | sed 's/^/  /'
