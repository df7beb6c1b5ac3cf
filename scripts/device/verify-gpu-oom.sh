#!/bin/bash
# verify-gpu-oom.sh — on the GPU machine: an out-of-memory during training caused by another
# process, for real (no fault injection).
#
# Data: 600 samples of 24 tokens, then 24 of 512 (tokens format, random ids < 256), --no-shuffle,
# two adapters on the same file, batch 4: steps 1-150 run 192 rows, steps 151-156 4096 rows. The
# CUDA backend's scratch slots grow to the largest request, so the first long step allocates
# again. A second process (PyTorch, already initialized) waits until adapter a has logged 5
# steps, takes all free device memory but 96 MiB, and holds it until tandem exits. Expected:
# tandem exits 1 at global step 151 with the out-of-device-memory message and a checkpoint of
# both adapters at step 150 (no final adapter); after the holder quits, the same command with
# --resume finishes, and the adapters equal an uninterrupted run's (compared byte for byte, and
# by max |difference| if the bytes differ).
# Carry .device-pack (scripts/device/pack.sh). Budget: about 1 minute. (The call of 2026-12-01
# recorded in docs/verification.md ran an earlier version that also ran test_backend_cuda and a
# tandem-only benchmark; those are scripts/device/gpu-final-bench.sh's.)
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

echo "== run with another process taking the GPU's memory after step 5"
python3 - "$W/oom/a/metrics.jsonl" "$W/hog.ready" "$W/hog.release" <<'PY' &
import os, sys, time, torch
metrics, ready, release = sys.argv[1:4]
torch.empty(1, device="cuda")  # context first, so the grab itself is quick
open(ready, "w").close()
n = 0
while n < 5:
    try:
        with open(metrics) as f:
            n = sum(1 for _ in f)
    except FileNotFoundError:
        pass
    time.sleep(0.002)
free, total = torch.cuda.mem_get_info()
x = torch.empty(free - (96 << 20), dtype=torch.uint8, device="cuda")
print(f"holder: took {x.numel() >> 20} MiB of {free >> 20} MiB free after {n} metrics lines", flush=True)
while not os.path.exists(release):
    time.sleep(0.05)
PY
HOG=$!
for _ in $(seq 600); do [ -e "$W/hog.ready" ] && break; sleep 0.1; done
run "$W/oom" >"$W/oom.log" 2>&1
rc=$?
touch "$W/hog.release"
wait $HOG
echo "exit $rc"
grep -E 'out of device memory|cudaMalloc' "$W/oom.log" | head -3
[ $rc = 1 ] || fail "OOM run: exit $rc, expected 1"
grep -q 'out of device memory at global step 151' "$W/oom.log" || fail "no OOM message at step 151"
grep -q 'cudaErrorMemoryAllocation' "$W/oom.log" || fail "the message does not name the CUDA error"
for a in a b; do
    ls -d "$W/oom/$a"/checkpoint-* 2>/dev/null | sed 's/^/checkpoint: /'
    ls -d "$W/oom/$a"/checkpoint-* >/dev/null 2>&1 || fail "$a: no checkpoint"
    [ -e "$W/oom/$a/adapter_model.safetensors" ] && fail "$a: final adapter written by the failed run"
done
echo "== --resume with the memory free again"
run "$W/oom" --resume >"$W/resume.log" 2>&1 || fail "resume: exit $? ($(tail -3 "$W/resume.log"))"
for a in a b; do
    if cmp -s "$W/whole/$a/adapter_model.safetensors" "$W/oom/$a/adapter_model.safetensors"; then
        echo "$a: resumed adapter identical (bytes) to the uninterrupted run"
    else
        python3 - "$W/whole/$a/adapter_model.safetensors" "$W/oom/$a/adapter_model.safetensors" <<'PY'
import sys
from safetensors.torch import load_file
x, y = load_file(sys.argv[1]), load_file(sys.argv[2])
d = max(float((x[k].float() - y[k].float()).abs().max()) for k in x)
s = max(float(x[k].float().abs().max()) for k in x)
print(f"resumed adapter differs: max |diff| {d:.3e}, max |w| {s:.3e}, same keys {x.keys() == y.keys()}")
PY
        fail "$a: resumed adapter differs from the uninterrupted run"
    fi
done
tail -n 2 "$W/whole/a/metrics.jsonl" "$W/oom/a/metrics.jsonl"
cp "$W"/*.log "$OUT/" 2>/dev/null
echo "gpu-oom: $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)")"
exit $fails
