#!/bin/bash
# On the GPU machine: `tandem finetune --device cuda --vram auto` on random qwen2.5 models with 1
# and 3 adapters; prints the reservation (the estimate) against the backend's peak, and shows that
# the reservation exists before the process holds any device memory. Carry .device-pack.
set -u
OUT=${OUT:-/tmp/tandem-vram-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/vram-estimate.log") 2>&1
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-vram
R=$PWD
W=/tmp/vram; rm -rf $W; mkdir -p $W; cd $W
"$R/scripts/make-demo-data.sh" data 64
printf "%-14s %-9s %-10s %12s %12s %8s\n" model adapters method reserved_MiB peak_MiB ratio > table.txt
for preset in qwen2.5-0.5b qwen2.5-1.5b; do
    "$T" init-model $preset --preset $preset >/dev/null || continue
    for n in 1 3; do
        for method in qlora lora; do
            args="--adapter data/reverse.jsonl:o/$preset-$n-$method-r"
            [ $n = 3 ] && args="$args --adapter data/upper.jsonl:o/$preset-$n-$method-u --adapter data/add.jsonl:o/$preset-$n-$method-a"
            "$T" finetune $preset $args --device cuda --method $method --epochs 1 --max-seq-len 512 \
                --batch-size 4 --rank 16 --save-every 0 --log-every 1000 > log.txt 2> err.txt &
            pid=$!
            first=""
            for i in $(seq 1 40); do
                sleep 0.25
                s=$("$T" gpu status --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); g=d["gpus"][0]; print(len(g["reservations"]), sum((p["gpu_memory_usage"] or 0) for p in g["processes"]))' 2>/dev/null)
                [ -n "$s" ] && [ -z "$first" ] && [ "${s%% *}" = 1 ] && first="reservation seen while the process held ${s#* } MiB"
                kill -0 $pid 2>/dev/null || break
            done
            wait $pid; rc=$?
            line=$(grep "device memory:" err.txt)
            res=$(echo "$line" | sed -E 's/.*reserved ([0-9]+) MiB.*/\1/'); peak=$(echo "$line" | sed -E 's/.*peak ([0-9]+) MiB.*/\1/')
            printf "%-14s %-9s %-10s %12s %12s %8s  exit %s; %s\n" $preset $n $method "$res" "$peak" \
                "$(awk -v r="$res" -v p="$peak" 'BEGIN { if (p > 0) printf "%.2f", r / p }')" $rc "$first" >> table.txt
            [ $rc = 0 ] || tail -n 5 err.txt
        done
    done
done
cat table.txt
