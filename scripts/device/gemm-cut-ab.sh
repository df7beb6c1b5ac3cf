#!/bin/bash
# On the GPU machine (issue 19 items 1 and 5): what the frozen GEMMs lose to cuBLASLt's first
# heuristic choice and to the NF4 tile cut, in one call over the binaries scripts/device/pack.sh
# made (.device-pack carried). The two benchmark knobs it sets are documented in
# docs/cuda-backend.md: TANDEM_CUDA_GEMM_TUNE=N (a new GEMM plan times N algorithms and keeps the
# fastest) and TANDEM_CUDA_DEQUANT_TILE_MI=M (NF4 weights dequantized in pieces of at most M Mi
# elements; 68 takes a 7B MLP weight whole, the default 32 cuts it in thirds).
#  1. dev/cuda/gemm_algos: per shape of the 0.5B / 1.5B / 7B steps, the heuristic's first
#     algorithm against the fastest of 16 (and whether they give the same bits), the 7B cut
#     against whole weights, the NF4 dequantization against a copy of the same bytes.
#  2. test_backend_cuda with both knobs on (every op still within its tolerance of the CPU).
#  3. scripts/device/fp8-ab.sh --no-test on a random 7B, bf16 base compute, QLoRA B4 x 512:
#     default, tile68, tune8 and both, ROUNDS rounds (default 2) alternating.
#  4. Unless SKIP_15B=1: bench/gpu_vs_peft.sh on the 1.5B, three fused adapters (qlora and lora),
#     default against both knobs (PEFT=1 adds the three PEFT processes: ~2 more minutes).
# Budget: ~8 minutes with step 4, ~5 without. Logs under $OUT; a summary table last.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gemm-cut-ab-out}
mkdir -p "$OUT"
T0=$SECONDS
[ -f .device-pack/device.tgz ] || { echo "gemm-cut-ab: carry .device-pack (scripts/device/pack.sh)"; exit 2; }
. scripts/device/device-env.sh
KNOBS=(TANDEM_CUDA_GEMM_TUNE=8 TANDEM_CUDA_DEQUANT_TILE_MI=68)

echo "== dev/cuda/gemm_algos ($((SECONDS - T0)) s)"
LD_LIBRARY_PATH=$DEVICE_LD timeout 240 .device/bin/gemm_algos >"$OUT/gemm_algos.log" 2>&1
GRC=$?
grep -E '^(CUT|SUM|RESULT)' "$OUT/gemm_algos.log"

echo "== test_backend_cuda with ${KNOBS[*]} ($((SECONDS - T0)) s)"
env "${KNOBS[@]}" LD_LIBRARY_PATH="$DEVICE_LD" timeout 240 .device/bin/test_backend_cuda \
    >"$OUT/test_backend_cuda-knobs.log" 2>&1
TRC=$?
grep -E '^\[  (PASSED|FAILED) \]|FAIL' "$OUT/test_backend_cuda-knobs.log"

echo "== 7B bf16 A/B ($((SECONDS - T0)) s)"
OUT=$OUT/7b ROUNDS=${ROUNDS:-2} bash scripts/device/fp8-ab.sh --no-test default=bf16 \
    tile68=bf16,TANDEM_CUDA_DEQUANT_TILE_MI=68 tune8=bf16,TANDEM_CUDA_GEMM_TUNE=8 \
    both=bf16,TANDEM_CUDA_DEQUANT_TILE_MI=68,TANDEM_CUDA_GEMM_TUNE=8 >"$OUT/7b-ab.log" 2>&1
sed -n '/fp8-ab summary/,$p' "$OUT/7b-ab.log"

if [ "${SKIP_15B:-0}" != 1 ]; then
    echo "== 1.5B three fused A/B ($((SECONDS - T0)) s)"
    PEFT_CFG=
    [ "${PEFT:-0}" = 1 ] && PEFT_CFG=,peft3x4
    LD_LIBRARY_PATH=$DEVICE_LD bash bench/gpu_vs_peft.sh .device/tandem --models 1.5b \
        --configs "3x4,3x4-lora$PEFT_CFG" --skip-matmul --work /tmp/gemm-cut-ab \
        --out "$OUT/15b-default" >"$OUT/15b-default.log" 2>&1
    env "${KNOBS[@]}" LD_LIBRARY_PATH="$DEVICE_LD" bash bench/gpu_vs_peft.sh .device/tandem \
        --models 1.5b --configs 3x4,3x4-lora --skip-matmul --skip-peft --work /tmp/gemm-cut-ab \
        --out "$OUT/15b-knobs" >"$OUT/15b-knobs.log" 2>&1
fi

echo
echo "================ gemm-cut-ab summary ($((SECONDS - T0)) s) ================"
gpu_line
echo "gemm_algos exit: $GRC   test_backend_cuda (knobs on) exit: $TRC"
echo "-- per shape: first heuristic algorithm against the fastest of those timed"
grep '^ALGO' "$OUT/gemm_algos.log" | awk '{ printf "%-34s first %s TF/s  best %s TF/s  %s  same_bits %s\n", $2, $12, $17, $22, $24 }'
grep -E '^SUM' "$OUT/gemm_algos.log"
echo "-- 7B bf16, B4 x 512 (bench_train)"
sed -n '/^label/,$p' "$OUT/7b-ab.log"
if [ "${SKIP_15B:-0}" != 1 ]; then
    echo "-- 1.5B three fused (gpu_vs_peft.sh): default, then both knobs"
    cat "$OUT"/15b-default/table-*.md "$OUT"/15b-knobs/table-*.md 2>/dev/null | grep -E '^\| 1\.5'
fi
