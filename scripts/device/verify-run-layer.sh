#!/bin/bash
# On the GPU machine (issue 14): finetune and eval both go through the run layer's device open.
# Trains two adapters of the qwen2.5-0.5b shapes on CUDA, then evaluates one with `eval --device
# cuda` and `eval --device cpu` (same adapter, same data) and prints both losses and their relative
# difference; `gpu status` is read while the CUDA eval holds its reservation. Carry .device-pack.
set -u
OUT=${OUT:-/tmp/tandem-run-layer-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run-layer.log") 2>&1
source scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-rl
gpu_line
echo "== test_backend_cuda"
.device/bin/test_backend_cuda 2>&1 | grep -E "PASSED|FAILED|ERROR" | head -5
W=/tmp/rl; rm -rf $W; mkdir -p $W; R=$PWD; cd $W
"$T" init-model m --preset qwen2.5-0.5b >/dev/null && echo "qwen2.5-0.5b written"
"$R/scripts/make-demo-data.sh" data 256 >/dev/null
echo "== finetune --device cuda"
"$T" finetune m --adapter data/reverse.jsonl:out/r --adapter data/add.jsonl:out/a --device cuda \
    --epochs 1 --max-seq-len 128 --batch-size 4 --log-every 20 --save-every 0 2>&1 | tail -n 6
echo "finetune exit ${PIPESTATUS[0]}"
echo "== eval (first 64 samples)"; head -n 64 data/reverse.jsonl > data/eval64.jsonl
for dev in cuda cpu; do
    s0=$SECONDS; "$T" eval m --data data/eval64.jsonl --adapter out/r \
        --device $dev --json > eval-$dev.json 2> eval-$dev.err & p=$!
    [ $dev = cuda ] && { sleep 3; "$T" gpu status | grep -iE "eval|MiB" | head -4; }
    wait $p; echo "$dev eval exit $? ($((SECONDS - s0)) s)"; cat eval-$dev.json; tail -n 2 eval-$dev.err
done
python3 - <<'PY'
import json
a = json.load(open("eval-cuda.json")); b = json.load(open("eval-cpu.json"))
rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
print(f"| eval loss cuda {a['loss']:.6f} | cpu {b['loss']:.6f} | rel diff {rel:.2e} | tokens {a['tokens']} vs {b['tokens']} |")
PY
