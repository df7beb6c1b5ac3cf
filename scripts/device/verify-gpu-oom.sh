#!/bin/bash
# verify-gpu-oom.sh — on the GPU machine: another process taking the GPU's memory, for real (no
# fault injection).
#
# Since 2026-12-02 tandem holds the activations and scratch of its largest step from the start
# (tdm_model_reserve), so another program can no longer take what a later, longer batch needs.
# Data: 600 samples of 24 tokens, then 24 of 512 (tokens format, random ids < 256), --no-shuffle,
# two adapters on the same file, batch 4: steps 1-150 run 192 rows, steps 151-156 4096 rows.
#   A. A second process (PyTorch, already initialized) waits until adapter a has logged 5 steps,
#      takes all free device memory but 96 MiB, and holds it until tandem exits. Expected: tandem
#      still finishes (exit 0; before 2026-12-02 it ran out of memory at step 151, when the first
#      long batch grew the workspace), its adapters equal an uninterrupted run's byte for byte,
#      and NVML's figure for the process after the run equals the reservation within 2 %.
#   B. The same holder takes the memory first, leaving ~2 GiB: with --vram 1 the guard admits
#      the run, the weights load, and the largest step's memory does not fit. Expected: exit 1
#      before step 1 with "the largest step (4096 rows) does not fit", the CUDA error named, and
#      no adapter written.
# The out-of-memory path during training (checkpoint of every adapter, --resume) is covered by
# fault injection in CI (integration.finetune_oom) and was verified on the H200 with a real
# out-of-memory on 2026-12-01, when the workspace still grew lazily (docs/verification.md).
# Carry .device-pack (scripts/device/pack.sh). Budget: about 1 minute.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-oom-out}
mkdir -p "$OUT"
. scripts/device/device-env.sh
tandem() { LD_LIBRARY_PATH=$DEVICE_LD "$PWD/.device/tandem" "$@"; }
W=/tmp/gpu-oom
rm -rf "$W" && mkdir -p "$W"
LOG=$OUT/gpu-oom.log
exec > >(tee "$LOG") 2>&1
gpu_line
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

tandem init-model "$W/m" --preset qwen2.5-0.5b >/dev/null || fail "init-model"
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for n in [24] * 600 + [512] * 24:
        f.write(json.dumps({"input_ids": [r.randrange(256) for _ in range(n)]}) + "\n")
PY
run() { # run OUTDIR [flags...]
    local o=$1; shift
    tandem finetune "$W/m" --adapter "$W/data.jsonl:$o/a" --adapter "$W/data.jsonl:$o/b" \
        --device cuda --method qlora --epochs 1 --batch-size 4 --max-seq-len 512 --no-shuffle \
        --val-split 0 --save-every 0 --log-every 1 --seed 7 --rank 16 --targets q_proj,v_proj "$@"
}
echo "== uninterrupted run"
run "$W/whole" >"$W/whole.log" 2>&1 || fail "uninterrupted run: exit $? ($(tail -3 "$W/whole.log"))"
grep -E 'device memory' "$W/whole.log"

# holder METRICS_FILE|- LEAVE_MIB: takes all free memory but LEAVE_MIB once METRICS_FILE has 5
# lines (- : at once), holds it until $W/hog.release exists
holder() {
    rm -f "$W/hog.ready" "$W/hog.release"
    python3 - "$1" "$2" "$W/hog.ready" "$W/hog.release" <<'PY' &
import os, sys, time, torch
metrics, leave, ready, release = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.empty(1, device="cuda")  # context first, so the grab itself is quick
n = 0
while metrics != "-" and n < 5:
    try:
        with open(metrics) as f:
            n = sum(1 for _ in f)
    except FileNotFoundError:
        pass
    time.sleep(0.002)
free, total = torch.cuda.mem_get_info()
x = torch.empty(free - (leave << 20), dtype=torch.uint8, device="cuda")
print(f"holder: took {x.numel() >> 20} MiB of {free >> 20} MiB free after {n} metrics lines", flush=True)
open(ready, "w").close()
while not os.path.exists(release):
    time.sleep(0.05)
PY
    HOG=$!
}

echo "== A: another process takes the GPU's memory after step 5"
holder "$W/held/a/metrics.jsonl" 96
run "$W/held" >"$W/held.log" 2>&1
rc=$?
touch "$W/hog.release"
wait $HOG
echo "exit $rc"
grep -E 'device memory|out of device memory|cudaMalloc' "$W/held.log" | head -3
[ $rc = 0 ] || fail "A: exit $rc, expected 0 ($(tail -3 "$W/held.log"))"
[ -e "$W/hog.ready" ] || fail "A: the holder never took the memory (the run ended before step 5?)"
for a in a b; do
    cmp -s "$W/whole/$a/adapter_model.safetensors" "$W/held/$a/adapter_model.safetensors" ||
        fail "A: $a differs from the uninterrupted run"
done
awk '/device memory: reserved/ { r = $5; p = $(NF - 2) } END {
    if (r == "" || p == "") { print "A: no device memory line"; exit 1 }
    d = (p - r) / r; printf "A: reserved %d MiB, process %d MiB (NVML): %+.1f%%\n", r, p, 100 * d
    exit (d < -0.02 || d > 0.02) }' "$W/held.log" || fail "A: the process memory is not the reservation within 2 %"

echo "== B: the memory is taken first; the largest step does not fit"
holder - 2048
for _ in $(seq 600); do [ -e "$W/hog.ready" ] && break; sleep 0.1; done
run "$W/nofit" --vram 1 >"$W/nofit.log" 2>&1
rc=$?
touch "$W/hog.release"
wait $HOG
echo "exit $rc"
grep -E 'does not fit' "$W/nofit.log" | head -2
[ $rc = 1 ] || fail "B: exit $rc, expected 1"
grep -q 'the largest step (4096 rows) does not fit' "$W/nofit.log" || fail "B: no message naming the largest step"
grep -q 'cudaErrorMemoryAllocation' "$W/nofit.log" || fail "B: the message does not name the CUDA error"
[ -s "$W/nofit/a/metrics.jsonl" ] && fail "B: a step was logged"
for a in a b; do
    [ -e "$W/nofit/$a/adapter_model.safetensors" ] && fail "B: $a: an adapter was written"
done
cp "$W"/*.log "$OUT/" 2>/dev/null
echo "gpu-oom: $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)")"
exit $fails
