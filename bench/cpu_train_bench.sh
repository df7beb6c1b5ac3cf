#!/bin/bash
# CPU training throughput (tokens/s) of the engine: 1 and 3 fused adapters on the `tiny` and
# `qwen2.5-0.5b` presets (random weights from `tandem init-model`, bf16 on disk), seq 256,
# rank 16, q_proj,v_proj, batch 2 per adapter, both methods; bench/cpu_train.c does the timing.
#
#     bench/cpu_train_bench.sh [BUILD_DIR] [PRESETS...]      (default: build tiny qwen2.5-0.5b)
#
# Env: STEPS (3 timed steps), WARMUP (1), METHODS ("qlora lora"), THREADS (0 = OpenMP default),
# TANDEM_BENCH_MODELS (where the models are written; default a temp dir removed afterwards).
# Record results in docs/benchmarks.md with date, machine and command.
set -eu
BUILD=${1:-build}
shift || true
PRESETS=${*:-tiny qwen2.5-0.5b}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
METHODS=${METHODS:-qlora lora}
THREADS=${THREADS:-0}
if [ -n "${TANDEM_BENCH_MODELS:-}" ]; then
    work=$TANDEM_BENCH_MODELS
    mkdir -p "$work"
else
    work=$(mktemp -d /tmp/tandem-cpu-bench-XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for preset in $PRESETS; do
    dir="$work/$preset"
    [ -f "$dir/config.json" ] || "$BUILD/tandem" init-model "$dir" --preset "$preset" --dtype bf16 >/dev/null
    for method in $METHODS; do
        for n in 1 3; do
            "$BUILD/bench_cpu_train" "$dir" "$n" --seq 256 --rank 16 --batch 2 --steps "$STEPS" \
                --warmup "$WARMUP" --method "$method" --threads "$THREADS"
        done
    done
done
