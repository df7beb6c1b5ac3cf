#!/bin/bash
# Real-GPU verification of the sharing layer (issues "GPU sharing safety net" and "MPS, profiler,
# traces"), plus fixture generation that needs Hugging Face libraries. Runs on the GPU machine from
# the repository root, with a tandem binary built here and its shared libraries carried in .device/
# (see docs/verification.md for how it was invoked). Writes a log and tarballs under $OUT.
set -u
OUT=${OUT:-/tmp/tandem-verify-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/verify.log") 2>&1
export LD_LIBRARY_PATH=$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger
export TANDEM_MONITOR_MS=500
rm -rf "$TANDEM_LEDGER_DIR"
section() { echo; echo "=================== $* ($(date -u +%T))"; }

section "machine"
nvidia-smi --query-gpu=uuid,name,memory.total,memory.used,memory.free,compute_mode,driver_version --format=csv
uname -a; "$T" --version

section "inventory: tandem gpu status vs nvidia-smi"
"$T" gpu status
"$T" gpu status --json > /tmp/status.json && cat /tmp/status.json
smi_uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1)
smi_total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n1)
t_uuid=$(python3 -c 'import json;print(json.load(open("/tmp/status.json"))["gpus"][0]["uuid"])')
t_total=$(python3 -c 'import json;print(json.load(open("/tmp/status.json"))["gpus"][0]["memory.total"])')
echo "CHECK uuid: nvidia-smi $smi_uuid tandem $t_uuid -> $([ "$smi_uuid" = "$t_uuid" ] && echo PASS || echo FAIL)"
echo "CHECK total MiB: nvidia-smi $smi_total tandem $t_total -> $([ "$smi_total" = "$t_total" ] && echo PASS || echo FAIL)"
.device/test_inventory_nvml && echo "CHECK test_inventory_nvml PASS" || echo "CHECK test_inventory_nvml FAIL"

section "build the CUDA test program"
nvcc -O2 -o /tmp/gpu_hog tests/gpu/gpu_hog.cu || { echo "nvcc failed"; exit 1; }

section "two jobs that do not fit together run one after the other; a small third runs beside the first"
# capacity = floor(total * 0.85); big1 + big2 > capacity, big1 + small <= capacity.
cap=$(( t_total * 85 / 100 ))
big=$(( cap * 6 / 10 / 1024 ))      # GiB: two of these exceed the capacity
small=$(( cap * 2 / 10 / 1024 ))    # GiB: fits beside one big job
echo "capacity ${cap} MiB; big jobs ${big} GiB, small job ${small} GiB"
log=/tmp/jobs.log; : > $log
"$T" gpu run --vram $big --task big-1 -- /tmp/gpu_hog $(( big * 1024 - 1024 )) 8 $log &
p1=$!; sleep 3
"$T" gpu run --vram $small --task small -- /tmp/gpu_hog $(( small * 1024 - 1024 )) 4 $log &
p3=$!; sleep 1
"$T" gpu run --vram $big --task big-2 -- /tmp/gpu_hog $(( big * 1024 - 1024 )) 3 $log &
p2=$!; sleep 2
"$T" gpu status
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
wait $p1 $p2 $p3
cat $log
python3 - "$log" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows[len(rows)] = (int(f[2]), int(f[4]), int(f[6]))
ivals = sorted(rows.values())
b1, s, b2 = ivals[0], ivals[1], ivals[2]
print("CHECK small ran beside big-1:", "PASS" if s[0] < b1[1] else "FAIL")
print("CHECK big-2 started after big-1 ended:", "PASS" if b2[0] >= b1[1] else "FAIL",
      "(gap %.0f ms)" % ((b2[0] - b1[1]) / 1e6))
PY

section "a job over its budget: warning and actual usage in gpu status"
"$T" gpu run --vram 2 --task greedy -- /tmp/gpu_hog 4096 6 2> /tmp/greedy.err &
pg=$!; sleep 4
"$T" gpu status
"$T" gpu status --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print("reservations:", [(r["task"], r["budget_mb"], r["actual_mb"]) for g in d["gpus"] for r in g["reservations"]])'
wait $pg; cat /tmp/greedy.err
grep -q "more than 20% over its budget" /tmp/greedy.err && echo "CHECK over-budget warning PASS" || echo "CHECK over-budget warning FAIL"

section "--profile and --trace on the real GPU"
"$T" gpu run --vram 1 --profile --trace /tmp/trace.json -- /tmp/gpu_hog 512 1
python3 -c 'import json; d=json.load(open("/tmp/trace.json")); print("trace spans:", sorted({e["name"] for e in d["traceEvents"]}))'

section "MPS: private daemon, --gpu-share 50, a hard memory limit"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/tandem-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/tandem-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
"$T" gpu run --vram 1 --experimental-mps -- true; echo "without a daemon: exit $?"
if command -v nvidia-cuda-mps-control >/dev/null; then
    nvidia-cuda-mps-control -d && sleep 1
    /tmp/gpu_hog 16 0 | sed 's/^/full GPU: /'
    "$T" gpu run --vram 4 --experimental-mps --gpu-share 50 -- /tmp/gpu_hog 1024 0 | sed 's/^/share 50: /'
    "$T" gpu run --vram 4 --experimental-mps --gpu-share 50 -- /tmp/gpu_hog 6144 0 | sed 's/^/over budget: /'
    echo "over-budget job exit code: ${PIPESTATUS[0]}"
    "$T" gpu run --vram 1 --experimental-mps --gpu-share 20 -- /tmp/gpu_hog 16 0
    echo quit | nvidia-cuda-mps-control; sleep 1
    tail -n 20 $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null
else
    echo "nvidia-cuda-mps-control not found on this machine"
fi
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

section "fixtures that need Hugging Face libraries"
python3 -c 'import tokenizers, transformers, safetensors, torch; print("tokenizers", tokenizers.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__, "torch", torch.__version__)'
mkdir -p /tmp/fx/tokenizer /tmp/fx/model
python3 tests/fixtures/tokenizer/gen_fixtures.py --out-dir /tmp/fx/tokenizer \
    qwen3=build/test-tokenizers/qwen3/tokenizer.json llama3=build/test-tokenizers/llama3/tokenizer.json && echo "tokenizer fixtures ok"
python3 tests/fixtures/model/gen_fixtures.py --out /tmp/fx/model && echo "model fixtures ok"
tar czf "$OUT/fixtures.tgz" -C /tmp/fx .
ls -la /tmp/fx/*

section "tokenizer encode speed: tandem vs Hugging Face tokenizers"
bench/tokenizer_bench.sh "$T" build/test-tokenizers/qwen3 20
bench/tokenizer_bench.sh "$T" build/test-tokenizers/llama3 20
echo "done"
