#!/bin/bash
# On the GPU machine (issue 19 item 3, long context): how long a sequence 7B QLoRA trains under
# --grad-checkpoint (--recompute layer), at what tok/s and in how much memory.
#   A random qwen2.5-7b (tandem init-model), r16 q,v, one sequence per step of LEN tokens, for each
#   LEN in LENS (default 32768 65536 131072): bench_train --batch 1 --len LEN --modes layer
#   (one warm-up step, STEPS timed steps; bench/train_bench.c), one process per length, each
#   killed past PER_LEN_S seconds. Per length: tok/s, MFU (the first length also measures the
#   bf16 matmul rate), the backend's peak against the estimate, and the estimate plus the CUDA
#   context against the 24 GB card's ledger capacity (20.4 GiB, the figure issue 19 sets) and
#   against 80 GB.
#   MODES (default layer) is bench_train's --modes: e.g. "layer,layer+offload" trains each length
#   also with --offload-activations (the loss must be the same bits: the "same" column); a
#   length of its own modes as LEN:MODES in LENS (e.g. "65536:layer,layer+offload
#   262144:layer+offload").
#   LAYERS=N writes the 7B with its first N of 28 layers (`tandem init-model --layers N`: the
#   same tensors) and prints, beside each mode's line, the estimate for all 28 layers
#   (bench_train --plan-layers 28): a step too long for one call with 28 layers (350,000
#   tokens: ~9.3 minutes on an H100) runs in about N/28 of its time, and its peak, against the
#   estimate for N layers, checks the per-layer working set the 28-layer estimate is built from.
# Carry .device-pack (scripts/device/pack.sh, a CUDA build: tandem and bench_train).
# Writes $OUT/long-context.log and $OUT/bench-LEN.txt; prints the table last.
#   env: LENS, MODES, STEPS (default 1), WARMUP (default 1), PER_LEN_S (default 240), LAYERS
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/long-context-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/long-context.log") 2>&1
T0=$SECONDS
LENS=${LENS:-32768 65536 131072}
STEPS=${STEPS:-1}
WARMUP=${WARMUP:-1}
MODES=${MODES:-layer}
PER_LEN_S=${PER_LEN_S:-240}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
[ -f .device-pack/device.tgz ] || { echo "carry .device-pack (scripts/device/pack.sh)"; exit 2; }
source scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD
TANDEM=.device/tandem BENCH=.device/bin/bench_train
[ -x $BENCH ] || { echo "the pack has no bench_train"; exit 2; }
M=/tmp/long-context-7b LAYER_ARGS=() PLAN_ARGS=()
if [ -n "${LAYERS:-}" ]; then
    M=/tmp/long-context-7b-$LAYERS LAYER_ARGS=(--layers "$LAYERS") PLAN_ARGS=(--plan-layers 28)
fi
[ -f $M/.complete ] || { rm -rf $M && $TANDEM init-model $M --preset qwen2.5-7b "${LAYER_ARGS[@]}" \
    >"$OUT/init-model.log" 2>&1 && touch $M/.complete; } || { tail "$OUT/init-model.log"; exit 1; }
echo "init-model done ($((SECONDS - T0)) s)"
MATMUL=8192
for LM in $LENS; do
    L=${LM%%:*} LMODES=$MODES
    [ "$LM" != "$L" ] && LMODES=${LM#*:}
    echo "== $L tokens, modes $LMODES ($((SECONDS - T0)) s)"
    timeout "$PER_LEN_S" $BENCH $M --device cuda --batch 1 --len "$L" --warmup "$WARMUP" \
        --steps "$STEPS" --modes "$LMODES" --matmul $MATMUL "${PLAN_ARGS[@]}" >"$OUT/bench-$L.txt" 2>&1
    echo "exit $? ($((SECONDS - T0)) s)"
    cat "$OUT/bench-$L.txt"
    MATMUL=0
done
echo
echo "================ long-context ($((SECONDS - T0)) s) ================"
echo "tokens | bench_train's line (mode tok/s ratio MFU step-ms act-MiB est-act-MiB peak-MiB est-MiB loss same)"
for LM in $LENS; do
    L=${LM%%:*}
    grep -E '^(none|layer|mlp|attn)' "$OUT/bench-$L.txt" | sed "s/^/$L | /"
    grep -E '^# .*(host memory|layers: est-MiB)' "$OUT/bench-$L.txt" | sed "s/^/$L | /"
    grep -m1 -iE 'error|out of memory' "$OUT/bench-$L.txt" | sed "s/^/$L | /"
done
echo "the 24 GB card's ledger capacity: 20.4 GiB = 20890 MiB for est-MiB + the CUDA context (~680 MiB)"
