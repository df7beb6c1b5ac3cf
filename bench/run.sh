#!/bin/bash
# make bench: benchmarks of the sharing layer (and later the engine). Prints a table; record the
# figures in docs/benchmarks.md with date, machine and command.
set -eu
TANDEM=${1:-build/tandem}
here=$(cd "$(dirname "$0")" && pwd)
"$here/gpu_wait_latency.sh" "$TANDEM"
BIN=$(dirname "$TANDEM")
work=$(mktemp -d /tmp/tandem-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_FAKE_GPUS="uuid=GPU-bench,name=bench,total_mb=100000,memory=discrete"
for procs in 1 16; do
    TANDEM_LEDGER_DIR="$work/l$procs" "$BIN/bench_ledger_contention" "$procs" 200
done
# Training engine on the CPU, tiny preset (bench/cpu_train_bench.sh BIN qwen2.5-0.5b for the big one).
"$here/cpu_train_bench.sh" "$BIN" tiny
