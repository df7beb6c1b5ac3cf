#!/bin/bash
# cpu-kc-sweep.sh — on the GPU machine's host CPU (issue 20): one layer's 14 frozen products of
# Qwen2.5-0.5B (bench_cpu_linears, forward + backward, the weights laid out as the model lays
# them out) at THREADS threads and ROWS rows, for each K block in KCS (TANDEM_CPU_KC) and each
# walk of a K block (TANDEM_CPU_ROWS_OUTER: 0 panel by panel, a K block of W's panel in L1 while
# the row groups stream past; 1 row group by row group, a group's A in L1 while W's pieces
# stream), ROUNDS rounds with the variants alternating (the host's speed drifts). Neither
# setting changes a bit (tests/unit/test_cpu_panel_gemm.c runs under both here first).
# Prints each variant's ms per round and median, then `best: <env>` (the least median), then
# the default settings with f32 weights against NF4 ones (bench_cpu_linears --nf4), alternating.
# Built HERE first: make build && BUILD=build scripts/device/pack.sh; carry .device-pack.
#   THREADS (16), ROWS (1024), KCS ("128 192 256 384"), ROUNDS (2), REPS (10)
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDA_VISIBLE_DEVICES=
THREADS=${THREADS:-16} ROWS=${ROWS:-1024} KCS=${KCS:-128 192 256 384} ROUNDS=${ROUNDS:-2}
REPS=${REPS:-10}
for outer in 0 1; do
    echo "# test_cpu_panel_gemm, TANDEM_CPU_KC=128 TANDEM_CPU_ROWS_OUTER=$outer:" \
        "$(TANDEM_CPU_KC=128 TANDEM_CPU_ROWS_OUTER=$outer timeout 120 .device/bin/test_cpu_panel_gemm 2>&1 | tail -n 1)"
done
declare -A ms
variants=()
for kc in $KCS; do
    for outer in 0 1; do variants+=("TANDEM_CPU_KC=$kc TANDEM_CPU_ROWS_OUTER=$outer"); done
done
for r in $(seq "$ROUNDS"); do
    for v in "${variants[@]}"; do
        t=$(env $v timeout 60 .device/bin/bench_cpu_linears --threads "$THREADS" --rows "$ROWS" \
            --reps "$REPS" | sed -n 's/.*forward + backward: \([0-9.]*\) ms.*/\1/p')
        ms[$v]="${ms[$v]:-} ${t:-FAIL}"
        echo "round $r  $v  ${t:-FAIL} ms"
    done
done
best= bestm=
for v in "${variants[@]}"; do
    med=$(echo ${ms[$v]} | tr ' ' '\n' | grep -v FAIL | sort -g | awk '{a[NR] = $1} END {
        if (NR == 0) print "FAIL"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    echo "$v: rounds${ms[$v]} ms, median $med"
    if [ "$med" != FAIL ] && { [ -z "$bestm" ] || awk -v a="$med" -v b="$bestm" 'BEGIN { exit !(a < b) }'; }; then
        best=$v bestm=$med
    fi
done
echo "best: $best"
# the same products with NF4 weights (--method qlora: tiles of W's rows dequantized per
# product), the default settings, against f32 laid out, alternating
for r in $(seq "$ROUNDS"); do
    for mode in "" --nf4; do
        t=$(timeout 60 .device/bin/bench_cpu_linears --threads "$THREADS" --rows "$ROWS" \
            --reps "$REPS" $mode | sed -n 's/.*forward + backward: \([0-9.]*\) ms.*/\1/p')
        echo "round $r  weights $([ -n "$mode" ] && echo NF4 || echo "f32 laid out")  ${t:-FAIL} ms"
    done
done
