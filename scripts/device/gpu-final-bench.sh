#!/bin/bash
# On the GPU machine, in one call: the CUDA op tests (test_backend_cuda: every op against the CPU
# backend, LoRA dropout, a training step with and without dropout), then the issue-6 benchmark
# against transformers + PEFT for the configurations the targets name, and one combined table.
# Carry .device-pack (scripts/device/pack.sh). Budget: about 7 minutes on an H200.
#   usage: scripts/device/gpu-final-bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-final-out}
mkdir -p "$OUT"
rm -rf .device && mkdir -p .device && tar xzf .device-pack/device.tgz -C .device
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.device/tandem
RES=/tmp/gpu-final-res
rm -rf "$RES"
mkdir -p "$RES"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
.device/bin/test_backend_cuda >"$RES/test_backend_cuda.log" 2>&1
echo "test_backend_cuda exit $?: $(grep -cE '^\[       OK \]' "$RES/test_backend_cuda.log") ok," \
    "$(grep -cE '^\[  FAILED  \]' "$RES/test_backend_cuda.log") failed"
grep -E 'dropout|model .* loss gpu|FAILED' "$RES/test_backend_cuda.log" | head -20
bench() { bash bench/gpu_vs_peft.sh "$B" --out "$RES" "$@" 2>&1 | grep -E '^== |tokens/s|exit' | sed 's/: .*finetune.*//'; }
bench --models 0.5b --configs 1x8,3x4,peft1x8
bench --models 1.5b --configs 1x4,3x4,peft1x4,peft3x4 --skip-matmul
bench --models 7b --configs 1x4,1x4gc,peft1x4 --skip-matmul
bash bench/gpu_vs_peft.sh --combine "$RES"/rows-*.tsv | tee "$RES/combined.md"
tar czf "$OUT/gpu-final.tgz" -C /tmp gpu-final-res
cp "$RES/combined.md" "$OUT/"
