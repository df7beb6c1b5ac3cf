#!/bin/bash
# On the GPU machine, in one call: scripts/device/cuda-check.sh for the CUDA op tests
# (test_backend_cuda: every op against the CPU backend, LoRA dropout, a training step with and
# without dropout) and the NF4 dequantization and LoRA kernel programs (dev/cuda, validation +
# quick timing), then the issue-6 benchmark against
# transformers + PEFT for the configurations the targets name, one combined table, and
# `--profile-ops` runs of 0.5B 1x8 and 7B 1x4 (where the time goes).
# Carry .device-pack (scripts/device/pack.sh). Budget: about 8 minutes on an H200.
#   usage: scripts/device/gpu-final-bench.sh [--no-profile]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-final-out}
mkdir -p "$OUT"
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.device/tandem
RES=/tmp/gpu-final-res
rm -rf "$RES"
mkdir -p "$RES"
gpu_line
CC=$RES/cuda-check
OUT=$CC KERNELS="nf4_dequant lora" bash scripts/device/cuda-check.sh .device >"$RES/cuda-check.log" 2>&1
echo "cuda-check exit $?:"
grep -E '^\[  (PASSED|FAILED) \]|=[0-9?]+ |^overall' "$CC/summary.txt"
grep -E 'dropout|model .* loss gpu|FAILED' "$CC/test_backend_cuda.log" | head -20
for k in nf4_dequant lora; do
    echo "dev/cuda/$k: $(grep -c '^RESULT.* ok$' "$CC/$k.log") ok, $(grep -c '^RESULT.* FAIL$' "$CC/$k.log") FAIL"
done
# v4 against v5 on the 7B gate_proj tile, best block size of each
grep -E '^RESULT .*dq_18944x3584' "$CC/nf4_dequant.log" | sort -t= -k2 -g | awk '!seen[$3]++'
bench() { bash bench/gpu_vs_peft.sh "$B" --out "$RES" "$@" 2>&1 | grep -E '^== |tokens/s|exit' | sed 's/: .*finetune.*//'; }
bench --models 0.5b --configs 1x8,3x4,peft1x8
bench --models 1.5b --configs 1x4,3x4,peft1x4,peft3x4 --skip-matmul
bench --models 7b --configs 1x4,1x4gc,peft1x4 --skip-matmul
bash bench/gpu_vs_peft.sh --combine "$RES"/rows-*.tsv >"$RES/combined.md"
cp "$RES/combined.md" "$OUT/"   # first, so a call cut short in the profiles still returns it
if [ "${1:-}" != --no-profile ]; then
    PROF=$RES/profile
    mkdir -p "$PROF"
    bash bench/gpu_vs_peft.sh "$B" --out "$PROF" --models 0.5b --configs 1x8 --skip-peft --skip-matmul \
        --tandem-flags --profile-ops >/dev/null 2>&1
    bash bench/gpu_vs_peft.sh "$B" --out "$PROF" --models 7b --configs 1x4 --skip-peft --skip-matmul \
        --tandem-flags --profile-ops >/dev/null 2>&1
    for f in "$PROF"/tandem-*.log; do
        echo "## $(basename "$f" .log)"
        sed -n '/^op profile/,/NF4 dequantize/p' "$f"
    done >"$RES/op-profiles.txt"
    head -14 "$RES/op-profiles.txt"
fi
tar czf "$OUT/gpu-final.tgz" -C /tmp gpu-final-res
cp "$RES/combined.md" "$RES/op-profiles.txt" "$OUT/" 2>/dev/null
cat "$RES/combined.md"
