#!/bin/bash
# Model load time (read the safetensors, convert, quantize to NF4, place on the CPU backend) of
# two builds side by side, alternating runs on the same model so that both see the same machine:
#
#     bench/model_load_bench.sh BASELINE_BUILD_DIR BUILD_DIR MODEL_DIR [REPS]   (REPS default 3)
#
# Each run is `bench_cpu_train MODEL_DIR 1 --steps 1 --warmup 0 --seq 16 --batch 1 --threads T`
# (qlora: NF4 with double quantization, as `tandem finetune` loads it); its "load X s" is the
# figure, the one 16-token step after it is not counted. Env: THREADS (1; 0 = OpenMP default).
# Prints one line per run and the median load time of each build. Record results in
# docs/benchmarks.md with date, machine and command.
set -eu
BASE=${1:?usage: model_load_bench.sh BASELINE_BUILD_DIR BUILD_DIR MODEL_DIR [REPS]}
NEW=${2:?usage}
MODEL=${3:?usage}
REPS=${4:-3}
THREADS=${THREADS:-1}
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), threads $THREADS, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# model $MODEL: $(du -sh "$MODEL" | cut -f1)"
declare -A times
for r in $(seq "$REPS"); do
    for which in baseline new; do
        b=$BASE
        [ $which = new ] && b=$NEW
        line=$("$b/bench_cpu_train" "$MODEL" 1 --steps 1 --warmup 0 --seq 16 --batch 1 \
            --threads "$THREADS" 2>&1 | grep -o 'load [0-9.]* s')
        echo "run $r $which: $line"
        times[$which]="${times[$which]:-} $(echo "$line" | awk '{print $2}')"
    done
done
for which in baseline new; do
    echo "$which: median load $(echo ${times[$which]} | tr ' ' '\n' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}') s over $REPS runs"
done
