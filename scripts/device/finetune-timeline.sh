#!/bin/bash
# On the GPU machine: where the wall time of one short `tandem finetune --device cuda` goes
# (issue 15: a co-training run pays one process's fixed costs, three --no-join runs overlap
# theirs with each other's training, so those costs weigh on the 1.4x target).
# One job of the co-training benchmark (cotrain-gpu.sh part 2: random qwen2.5-1.5b, batch 8,
# variable-length data 64..512 tokens, N samples), every output line stamped with the seconds
# since the launch; then the phases: to the "base loaded" line, to the first step's log line, the
# steps, and from the last step's line to the exit; and the steps' own clock (metrics.jsonl's
# elapsed_ms at the first and last step).
# Carry .device-pack (scripts/device/pack.sh). Writes $OUT/finetune-timeline.log. ~30 s.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/finetune-timeline-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/finetune-timeline.log") 2>&1
R=$PWD
if [ -n "${TANDEM_BIN:-}" ]; then # a local smoke test: TANDEM_BIN=build/tandem DEVICE=cpu PRESET=tiny
    T=$(realpath "$TANDEM_BIN")
else
    . scripts/device/device-env.sh
    export LD_LIBRARY_PATH=$DEVICE_LD
    T=$R/.device/tandem
fi
DEVICE=${DEVICE:-cuda}
W=/tmp/finetune-timeline
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export TANDEM_LEDGER_DIR=$W/ledger
PRESET=${PRESET:-qwen2.5-1.5b}
N=${N:-400}
"$T" init-model m --preset "$PRESET" >/dev/null || exit 1
"$R/scripts/device/varlen-data.sh" "$N" 200 v0.jsonl
cat m/*.safetensors >/dev/null # the page cache warm, as for the benchmark's later jobs
stamp() { # prefixes each line with the seconds since $1 (a date +%s.%N)
    while IFS= read -r line; do
        printf '%s %s\n' "$(awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%7.2f", b - a }')" "$line"
    done
}
for run in 1 2; do
    t0=$(date +%s.%N)
    "$T" finetune m --adapter "v0.jsonl:o$run/a0" --device "$DEVICE" --max-seq-len 512 --batch-size 8 \
        --epochs 1 --log-every 5 --save-every 0 --val-split 0 2>&1 | stamp "$t0" >"run$run.txt"
    t1=$(date +%s.%N)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    echo "== run $run (wall $wall s)"
    head -n 12 "run$run.txt"
    tail -n 4 "run$run.txt"
    python3 - "o$run/a0/metrics.jsonl" "run$run.txt" "$wall" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "elapsed_ms" in r and "val_loss" not in r]  # the training steps' lines
lines = open(sys.argv[2]).read().splitlines()
def t_of(pat):
    for l in lines:
        if re.search(pat, l): return float(l.split()[0])
    return float("nan")
loaded = t_of("base loaded"); first = t_of(r"step \d+/"); last = float("nan")
for l in lines:
    if re.search(r"step \d+/", l): last = float(l.split()[0])
wall = float(sys.argv[3])
print("phases (s): launch -> base loaded %.2f | -> first step line %.2f | steps %.2f | last step line -> exit %.2f | wall %.2f"
      % (loaded, first - loaded, last - first, wall - last, wall))
if rows:
    print("metrics.jsonl: %d step rows, elapsed_ms first %.0f (step %s) last %.0f (step %s)"
          % (len(rows), rows[0]["elapsed_ms"], rows[0].get("step"), rows[-1]["elapsed_ms"], rows[-1].get("step")))
EOF
done
