#!/bin/bash
# On the GPU machine: the CUDA backend's op checks and kernel sweeps (cuda-check.sh), then
# `tandem finetune` of three fused adapters on the GPU next to the same run on the CPU (losses
# compared), with the reservation visible in the ledger, and the PEFT load check of a tandem
# adapter. Carry .device (tandem + libs + cuda/). Writes logs under $OUT.
set -u
OUT=${OUT:-/tmp/tandem-train-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/train-gpu.log") 2>&1
export LD_LIBRARY_PATH=$PWD/.device/lib:$PWD/.device/cuda/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-train
section() { echo; echo "=================== $* ($(date -u +%T))"; }

section "CUDA backend checks"
OUT_SAVED=$OUT; OUT=$OUT/cuda; mkdir -p "$OUT"
timeout 420 scripts/device/cuda-check.sh .device/cuda 2>&1 | tail -n 60
OUT=$OUT_SAVED

section "finetune: three adapters fused, CUDA vs CPU"
W=/tmp/ft; rm -rf $W; mkdir -p $W; cd $W
"$T" init-model tiny --preset tiny >/dev/null
"$OLDPWD/scripts/make-demo-data.sh" data 32
cat > adapters.toml <<'TOML'
batch_size = 8
[[adapter]]
data = "data/reverse.jsonl"
output = "OUT/reverse"
rank = 8
learning_rate = 1e-2
[[adapter]]
data = "data/upper.jsonl"
output = "OUT/upper"
rank = 4
targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
learning_rate = 2e-3
[[adapter]]
data = "data/add.jsonl"
output = "OUT/add"
rank = 16
targets = "gate_proj,up_proj,down_proj"
learning_rate = 1e-2
TOML
for dev in cpu cuda; do
    sed "s/OUT/$dev/" adapters.toml > $dev.toml
    ( "$T" finetune tiny --adapters-config $dev.toml --device $dev --epochs 2 --max-seq-len 64 \
        --lr-schedule constant --log-every 2 --save-every 0 --val-split 0.1 --method lora \
        --max-grad-norm 0 --seed 3 > $dev.log 2>&1; echo "$dev exit $?" >> $dev.log ) &
    pid=$!
    if [ $dev = cuda ]; then sleep 4; "$T" gpu status; fi
    wait $pid
    tail -n 8 $dev.log
done
python3 - <<'PY'
import json
for a in ["reverse", "upper", "add"]:
    rows = {}
    for dev in ["cpu", "cuda"]:
        ls = [json.loads(l) for l in open(f"{dev}/{a}/metrics.jsonl")]
        rows[dev] = [r["loss"] for r in ls if "loss" in r]
    n = min(len(rows["cpu"]), len(rows["cuda"]))
    worst = max(abs(c - g) / abs(c) for c, g in zip(rows["cpu"][:n], rows["cuda"][:n]))
    print(f"CHECK {a}: {n} logged losses, cpu {rows['cpu'][0]:.4f}->{rows['cpu'][n-1]:.4f}, "
          f"cuda {rows['cuda'][0]:.4f}->{rows['cuda'][n-1]:.4f}, max rel diff {worst:.2e} ->",
          "PASS" if worst < 2e-2 else "FAIL")
PY

section "PEFT loads a tandem adapter"
python3 "$OLDPWD/tests/fixtures/train/check_peft_load.py" tiny cpu/reverse 2>&1 | grep -v Warning | tail -n 12
python3 "$OLDPWD/tests/fixtures/train/check_peft_load.py" tiny cuda/add 2>&1 | grep -v Warning | tail -n 5
echo done
