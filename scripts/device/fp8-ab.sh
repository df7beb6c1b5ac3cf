#!/bin/bash
# On the GPU machine (issue 19 items 1 and 4): the FP8 and bf16 base paths' variants side by
# side in one call, over the binaries scripts/device/pack.sh made (.device-pack carried).
#  1. test_backend_cuda (every CUDA op against the CPU backend; the FP8 linears against a host
#     emulation of E4M3) and dev/cuda/fp8 (the E4M3 kernels validated and timed on 7B shapes).
#  2. A random qwen2.5-7b (tandem init-model), QLoRA r16 q,v, batch 4 x 512, bench_train without
#     checkpointing, once per configuration; a configuration is LABEL=BASE[,ENV=VALUE...], BASE
#     bf16 or fp8, the assignments the environment of that run (an experiment's knob), except
#     BENCH=PATH: another bench_train binary (a baseline build carried beside the pack, e.g.
#     .device-pack/bench_train_base). The rounds alternate over the configurations ROUNDS times
#     (default 1), so drift of the machine shows as a difference between rounds.
# Writes $OUT/*.log and prints a table last (label, round, tok/s, step ms, peak MiB, loss).
#   usage: scripts/device/fp8-ab.sh [--no-test] CONFIG...
#   STEPS=N (15)  ROUNDS=N (1)  BENCH_FLAGS="--profile" (more bench_train options)
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/fp8-ab-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/fp8-ab.log") 2>&1
T0=$SECONDS
TEST=1
[ "${1:-}" = --no-test ] && { TEST=0; shift; }
[ $# -gt 0 ] || { echo "usage: fp8-ab.sh [--no-test] LABEL=BASE[,ENV=VALUE...]..."; exit 2; }
[ -f .device-pack/device.tgz ] || { echo "fp8-ab: carry .device-pack (scripts/device/pack.sh)"; exit 2; }
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD
BENCH=$PWD/.device/bin/bench_train
gpu_line
TRC=- KRC=-
if [ $TEST = 1 ]; then
    echo "== test_backend_cuda ($((SECONDS - T0)) s)"
    timeout 200 .device/bin/test_backend_cuda >"$OUT/test_backend_cuda.log" 2>&1
    TRC=$?
    grep -E '^\[  (PASSED|FAILED) \]|fp8 linear|FAIL' "$OUT/test_backend_cuda.log"
    echo "== dev/cuda/fp8 ($((SECONDS - T0)) s)"
    timeout 120 .device/bin/fp8 --quick >"$OUT/dev-fp8.log" 2>&1
    KRC=$?
    cat "$OUT/dev-fp8.log"
fi
M=/tmp/fp8-7b
echo "== init-model 7B ($((SECONDS - T0)) s)"
init_model_once $M qwen2.5-7b "$OUT/init-model.log" || exit 1
ROWS=
for round in $(seq 1 "${ROUNDS:-1}"); do
    for cfg in "$@"; do
        label=${cfg%%=*} rest=${cfg#*=}
        IFS=, read -r -a parts <<<"$rest"
        base=${parts[0]}
        envs=() bin=$BENCH
        for kv in "${parts[@]:1}"; do
            case "$kv" in BENCH=*) bin=$PWD/${kv#BENCH=} ;; *) envs+=("$kv") ;; esac
        done
        echo "== $label round $round: --base-compute $base ${envs[*]} $bin ($((SECONDS - T0)) s)"
        env "${envs[@]}" "$bin" $M --device cuda --batch 4 --len 512 --warmup 3 --steps "${STEPS:-15}" \
            --modes none --base-compute "$base" ${BENCH_FLAGS:-} >"$OUT/bench-$label-$round.txt" 2>&1
        rc=$?
        cat "$OUT/bench-$label-$round.txt"
        ROWS+=$(awk -v l="$label" -v r="$round" -v rc=$rc '!/^#/ && NF > 5 && $1 != "mode" {
            printf "%-14s %s  %9s  %8s  %9s  %s  rc %s\n", l, r, $2, $5, $8, $10, rc }' \
            "$OUT/bench-$label-$round.txt")$'\n'
    done
done
echo
echo "================ fp8-ab summary ($((SECONDS - T0)) s) ================"
gpu_line
echo "test_backend_cuda exit: $TRC   dev/cuda/fp8 exit: $KRC"
grep -E '^RESULT|FAIL' "$OUT/dev-fp8.log" 2>/dev/null | head -20
echo "label          round  tok/s  step-ms  peak-MiB  loss"
printf '%s' "$ROWS"
