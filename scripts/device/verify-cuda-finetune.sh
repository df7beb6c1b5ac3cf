#!/bin/bash
# On the GPU machine: the CUDA op/model test alone, then a longer `tandem finetune --device cuda`
# whose reservation is read from the ledger while it runs (gpu status), plus --vram auto's
# estimate against the measured usage. Carry .device-pack (see docs/verification.md).
set -u
OUT=${OUT:-/tmp/tandem-cuda-ft-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/cuda-finetune.log") 2>&1
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-cft
echo "== test_backend_cuda"
.device/cuda/bin/test_backend_cuda 2>&1 | grep -E "gemm|FAIL|PASSED|ERROR|model " | head -30
echo "== finetune --device cuda with the ledger"
W=/tmp/cft; rm -rf $W; mkdir -p $W; cd $W
"$T" init-model m --preset qwen2.5-0.5b >/dev/null && echo "qwen2.5-0.5b written"
"$OLDPWD/scripts/make-demo-data.sh" data 256
( "$T" finetune m --adapter data/reverse.jsonl:out/r --adapter data/add.jsonl:out/a --device cuda \
    --epochs 1 --max-seq-len 128 --batch-size 4 --log-every 10 --save-every 0 > ft.log 2>&1; echo "exit $?" >> ft.log ) &
pid=$!
for i in 1 2 3 4 5 6; do sleep 5; "$T" gpu status | grep -E "ledger|budget|pid" ; done
wait $pid
tail -n 12 ft.log
grep -iE "vram|reserv|MiB" ft.log | head
echo done
