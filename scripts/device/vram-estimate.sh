#!/bin/bash
# On the GPU machine: `tandem finetune --device cuda --vram auto` over random qwen2.5 models,
# adapter counts, methods, batch shapes and --grad-checkpoint; prints the reservation (the
# estimate) against the process's memory as NVML reports it at the end (the backend never
# shrinks, so that is its peak) and the backend's own peak. The issue's target: reserved within
# 15 % of the measured peak. Carry .device-pack (see docs/verification.md).
#   usage: scripts/device/vram-estimate.sh [PRESET...]   (default qwen2.5-0.5b qwen2.5-1.5b)
set -u
OUT=${OUT:-/tmp/tandem-vram-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/vram-estimate.log") 2>&1
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$PWD/.device/tandem
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-vram
presets=${*:-qwen2.5-0.5b qwen2.5-1.5b}
W=/tmp/vram; rm -rf $W; mkdir -p $W/data; cd $W
# 24 samples per adapter of ~1500 bytes of text (the byte-level tokenizer: > 1024 tokens), so
# every batch is full length whatever --max-seq-len
python3 - <<'PY'
import json, random
for name in ("a", "b", "c"):
    r = random.Random(name)
    with open(f"data/{name}.jsonl", "w") as f:
        for _ in range(24):
            words = " ".join("".join(r.choice("abcdefghij") for _ in range(r.randint(2, 8))) for _ in range(300))
            f.write(json.dumps({"text": words[:1500]}) + "\n")
PY
printf "%-13s %-3s %-6s %-5s %-5s %-5s %10s %10s %10s %7s\n" model n method batch seq ckpt \
    reserved_MiB process_MiB backend_MiB ratio > table.txt
run() { # preset n method batch seq ckpt(0/1)
    local p=$1 n=$2 method=$3 b=$4 s=$5 ck=$6 tag="$1-$2-$3-$4-$5-$6"
    local args="--adapter data/a.jsonl:o/$tag-a"
    [ "$n" = 3 ] && args="$args --adapter data/b.jsonl:o/$tag-b --adapter data/c.jsonl:o/$tag-c"
    [ "$ck" = 1 ] && args="$args --grad-checkpoint"
    "$T" finetune "$p" $args --device cuda --method $method --epochs 1 --max-seq-len $s \
        --batch-size $b --rank 16 --val-split 0.1 --save-every 0 --log-every 1000 > log.txt 2> err.txt
    local rc=$?
    grep -- "--vram auto" err.txt
    local line res proc peak
    line=$(grep "device memory:" err.txt)
    res=$(echo "$line" | sed -E 's/.*reserved ([0-9]+) MiB.*/\1/')
    peak=$(echo "$line" | sed -E 's/.*peak ([0-9]+) MiB.*/\1/')
    proc=$(echo "$line" | sed -E 's/.*process (-?[0-9]+) MiB.*/\1/')
    printf "%-13s %-3s %-6s %-5s %-5s %-5s %10s %10s %10s %7s  exit %s\n" "$p" $n $method $b $s $ck \
        "$res" "$proc" "$peak" "$(awk -v r="$res" -v p="$proc" 'BEGIN { if (p > 0) printf "%.3f", r / p }')" \
        $rc >> table.txt
    [ $rc = 0 ] || tail -n 5 err.txt
}
for preset in $presets; do
    t0=$(date +%s)
    "$T" init-model $preset --preset $preset >/dev/null || continue
    echo "init-model $preset: $(( $(date +%s) - t0 )) s"
    run $preset 1 qlora 4 512 0
    run $preset 3 qlora 4 512 0
    run $preset 1 lora 4 512 0
    run $preset 3 lora 2 1024 0
    run $preset 1 qlora 8 256 0
    run $preset 1 qlora 4 512 1
    run $preset 3 qlora 4 1024 1
    rm -rf "$preset" o
done
echo
cat table.txt
awk 'NR > 1 && $10 != "" { n++; d = $10 - 1; if (d < 0) d = -d; if (d > w) w = d }
     END { printf "runs %d, worst |reserved / process - 1| = %.3f (target <= 0.15)\n", n, w }' table.txt
