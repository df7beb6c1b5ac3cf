#!/bin/bash
# On the GPU machine (issue 19 item 4): --base-compute fp8, checked, timed and gated in one call.
# Over the binaries scripts/device/pack.sh made on the build machine (.device-pack carried):
#  1. test_backend_cuda: every CUDA op against the CPU backend, and the FP8 linear layers against
#     a host emulation of E4M3 rounding (test_linear_fp8).
#  2. Speed: a random qwen2.5-7b (tandem init-model), QLoRA r16 q,v, batch 4 x 512 tokens
#     (bench_train --len 512), one load each for --base-compute bf16 and fp8, then the same at
#     --grad-checkpoint --recompute layer: tok/s, MFU (against the bf16 matmul rate of the same
#     process), peak memory against the estimate.
#  3. The quality gate: a random qwen2.5-0.5b, 2,528 samples of 128 token ids from a Zipf law
#     (5 % held out), r16 on all seven projections, lr 1e-3, batch 8, one epoch (300
#     steps), evaluation every 50 steps, `tandem finetune` with bf16 and with fp8 (same data order
#     and initial adapter): the largest relative gap between the two training-loss curves (each
#     logged step, every 10) and between the final evaluation losses. The gate: curve within 1 %,
#     evaluation loss within 0.5 % (docs/cuda-backend.md, "FP8 base compute").
#  4. With --peft: issue 19's benchmark, bench/gpu_vs_peft.sh on a random 7B, batch 4 x 512:
#     transformers + PEFT, tandem bf16 and tandem --base-compute fp8, one table each.
# Writes $OUT/*.log and prints a short table last.
#   usage: scripts/device/fp8-check.sh [--no-test] [--no-speed] [--no-gate] [--peft]
#   GATE_LR=X   the gate's learning rate (1e-3)
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/fp8-check-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/fp8-check.log") 2>&1
T0=$SECONDS
R=$PWD
TEST=1 SPEED=1 GATE=1 PEFT=0
for a in "$@"; do
    case "$a" in
    --peft) PEFT=1 ;;
    --no-test) TEST=0 ;;
    --no-speed) SPEED=0 ;;
    --no-gate) GATE=0 ;;
    *) echo "unknown option $a"; exit 2 ;;
    esac
done
[ -f .device-pack/device.tgz ] || { echo "fp8-check: carry .device-pack (scripts/device/pack.sh)"; exit 2; }
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD
T=$R/.device/tandem BENCH=$R/.device/bin/bench_train
gpu_line
TRC=- ; FP8_LINES=
if [ $TEST = 1 ]; then
    echo "== 1. test_backend_cuda ($((SECONDS - T0)) s)"
    timeout 200 .device/bin/test_backend_cuda >"$OUT/test_backend_cuda.log" 2>&1
    TRC=$?
    grep -E '^\[  (PASSED|FAILED) \]|fp8|FAIL' "$OUT/test_backend_cuda.log"
    echo "test_backend_cuda exit $TRC"
fi

SPEED_ROWS=
if [ $SPEED = 1 ]; then
    echo "== 2. 7B, batch 4 x 512: bf16 against fp8 ($((SECONDS - T0)) s)"
    M=/tmp/fp8-7b
    init_model_once $M qwen2.5-7b "$OUT/init-model.log" || exit 1
    for bc in bf16 fp8; do
        $BENCH $M --device cuda --batch 4 --len 512 --warmup 3 --steps "${STEPS:-15}" \
            --modes none,layer --matmul 8192 --base-compute $bc | tee "$OUT/bench-7b-$bc.txt"
        echo "bench_train $bc exit ${PIPESTATUS[0]} ($((SECONDS - T0)) s)"
        SPEED_ROWS+=$(awk -v bc=$bc '!/^#/ && NF > 5 && $1 != "mode" {print bc " " $0}' "$OUT/bench-7b-$bc.txt")$'\n'
    done
fi

GATE_ROWS=
if [ $GATE = 1 ]; then
    echo "== 3. quality gate: 0.5B, 300 steps, bf16 against fp8 ($((SECONDS - T0)) s)"
    W=/tmp/fp8-gate
    rm -rf $W && mkdir -p $W && cd $W || exit 1
    export TANDEM_LEDGER_DIR=$W/ledger
    "$T" init-model m05 --preset qwen2.5-0.5b >/dev/null || exit 1
    # 128 token ids a sample drawn from a Zipf law (p(k) ~ 1/k) over 2,000 ids: the model learns
    # the distribution smoothly down to its entropy (5.6 nats), so the two curves can be compared
    # at every step; a task learned in one sudden drop (reverse a word: docs/cuda-backend.md)
    # makes them differ by when the drop comes, not by how well each computes
    mkdir -p data
    awk 'BEGIN { srand(11); N = 2000; for (k = 1; k <= N; k++) { s += 1 / k; c[k] = s }
        for (i = 0; i < 2528; i++) { printf "{\"input_ids\": ["
            for (j = 0; j < 128; j++) { u = rand() * s; lo = 1; hi = N
                while (lo < hi) { mid = int((lo + hi) / 2); if (c[mid] < u) lo = mid + 1; else hi = mid }
                printf "%s%d", (j ? "," : ""), 1000 + lo }
            print "]}" } }' >data/zipf.jsonl
    F=(--device cuda --no-join --max-seq-len 128 --batch-size 8 --epochs 1 --lr "${GATE_LR:-1e-3}" --log-every 10
       --eval-every 50 --save-every 0 --val-split 0.05 --seed 7
       --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
    for bc in bf16 fp8; do
        "$T" finetune m05 --adapter data/zipf.jsonl:out-$bc/zipf "${F[@]}" --base-compute $bc \
            >"$OUT/gate-$bc.out" 2>"$OUT/gate-$bc.err"
        echo "finetune $bc exit $? ($((SECONDS - T0)) s)"
        tail -n 3 "$OUT/gate-$bc.err"
        cp out-$bc/zipf/metrics.jsonl "$OUT/gate-$bc-metrics.jsonl" 2>/dev/null
    done
    GATE_ROWS=$(python3 - "$OUT/gate-bf16-metrics.jsonl" "$OUT/gate-fp8-metrics.jsonl" <<'EOF'
import json, sys
def load(p):
    tr, ev = {}, {}
    for line in open(p):
        d = json.loads(line)
        if "loss" in d: tr[d["step"]] = d["loss"]
        if "val_loss" in d: ev[d["step"]] = d["val_loss"]
    return tr, ev
(t16, e16), (t8, e8) = load(sys.argv[1]), load(sys.argv[2])
steps = sorted(set(t16) & set(t8))
gaps = [abs(t8[s] - t16[s]) / t16[s] for s in steps]
last = max(set(e16) & set(e8))
eg = abs(e8[last] - e16[last]) / e16[last]
print("steps compared %d (up to step %d); loss bf16 %.4f -> %.4f, fp8 %.4f -> %.4f" % (
    len(steps), steps[-1], t16[steps[0]], t16[steps[-1]], t8[steps[0]], t8[steps[-1]]))
print("curve: largest gap %.3f %% (step %d), mean %.3f %% -> %s (gate 1 %%)" % (
    100 * max(gaps), steps[gaps.index(max(gaps))], 100 * sum(gaps) / len(gaps),
    "PASS" if max(gaps) <= 0.01 else "FAIL"))
print("eval loss at step %d: bf16 %.5f fp8 %.5f, gap %.3f %% -> %s (gate 0.5 %%)" % (
    last, e16[last], e8[last], 100 * eg, "PASS" if eg <= 0.005 else "FAIL"))
for s in sorted(set(e16) & set(e8)):
    print("  eval step %d: bf16 %.5f fp8 %.5f" % (s, e16[s], e8[s]))
EOF
)
    cd "$R" || exit 1
fi

if [ $PEFT = 1 ]; then
    echo "== 4. 7B b4x512 against transformers + PEFT ($((SECONDS - T0)) s)"
    for bc in bf16 fp8; do
        args=(--models 7b --configs 1x4 --out "$OUT/peft-$bc" --work /tmp/fp8-peft)
        if [ $bc = bf16 ]; then args+=(--configs 1x4,peft1x4); else
            args+=(--skip-peft --skip-matmul --tandem-flags "--base-compute fp8"); fi
        bash bench/gpu_vs_peft.sh "$T" "${args[@]}" >"$OUT/peft-$bc.log" 2>&1
        echo "gpu_vs_peft $bc exit $? ($((SECONDS - T0)) s)"
    done
fi

echo
echo "================ fp8-check summary ($((SECONDS - T0)) s) ================"
gpu_line
echo "test_backend_cuda exit: $TRC"
grep -E 'fp8 linear|against the exact' "$OUT/test_backend_cuda.log" 2>/dev/null
echo "bench_train 7B b4x512 (base mode tok/s ratio MFU step-ms act est-act peak est loss same):"
printf '%s' "$SPEED_ROWS"
echo "quality gate:"
printf '%s\n' "$GATE_ROWS"
for bc in bf16 fp8; do
    [ -d "$OUT/peft-$bc" ] || continue
    echo "gpu_vs_peft, tandem $bc:"
    cat "$OUT/peft-$bc"/table-*.md 2>/dev/null | grep -E '^\|' | head -8
done
