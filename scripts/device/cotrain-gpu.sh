#!/bin/bash
# On the GPU machine (issue 15, docs/co-training.md): co-training with real `tandem finetune
# --device cuda` processes.
#  1. Two finetunes of a random qwen2.5-0.5b started 2 s apart: the second joins the first (one
#     process on the GPU in nvidia-smi, one reservation in `gpu status --json`, grown by the plan
#     difference), then shrinks back when the joiner's adapter ends. Reservation vs NVML, sampled.
#  2. The issue's benchmark: three 1.5B finetunes (batch 8, variable-length data, 64..512 tokens)
#     launched 5 s apart, co-training (default flags) vs --no-join: aggregate tok/s (all tokens
#     trained / first launch to last exit) and peak GPU memory (nvidia-smi memory.used above the
#     idle figure), side by side; and the bound co-training can reach: the same three adapters in
#     one process from the start (`fused`), and one adapter alone (`alone`, its tok/s).
#  3. A takeover on the real GPU: two qwen2.5-0.5b finetunes joined; kill -9 of the host once
#     the joiner's adapter has a checkpoint; the joiner takes over (reserves anew, resumes) and
#     finishes; its reservation is the only one, none is left at the end.
# Binary: .device-pack/device.tgz when carried (scripts/device/pack.sh after a CUDA build here),
# else built now with CUDA (cmake, build-device/). Writes $OUT/cotrain-gpu.log, $OUT/*.json.
# Budget: under 5 minutes on an H200 (part 2 is skipped when part 1 left less than 150 s).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cotrain-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/cotrain-gpu.log") 2>&1
T0=$SECONDS
R=$PWD
if [ -f .device-pack/device.tgz ]; then
    . scripts/device/device-env.sh
    export LD_LIBRARY_PATH=$DEVICE_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    T=$R/.device/tandem
else
    echo "== building with CUDA (build-device/)"
    cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90-real >"$OUT/cmake.log" 2>&1 &&
        cmake --build build-device -j 16 --target tandem >>"$OUT/cmake.log" 2>&1 ||
        { tail -n 30 "$OUT/cmake.log"; exit 1; }
    T=$R/build-device/tandem
    gpu_line() { nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader; }
fi
"$T" --version | head -n 2
gpu_line
W=/tmp/cotrain-gpu
rm -rf "$W"
mkdir -p "$W"
cd "$W" || exit 1
export TANDEM_LEDGER_DIR=$W/ledger
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1; }
apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr -d ' ' | paste -sd ';'; }
reservations() {
    "$T" gpu status --json | python3 -c 'import json,sys
d = json.load(sys.stdin)
print(";".join("pids=%s budget=%s actual=%s" % (r["pids"], r["budget_mb"], r["actual_mb"])
               for g in d["gpus"] for r in g["reservations"]))'
}

# ---- 1. two finetunes 2 s apart --------------------------------------------------------------
echo "== 1. two finetunes of qwen2.5-0.5b, 2 s apart ($((SECONDS - T0)) s)"
"$T" init-model m05 --preset qwen2.5-0.5b >/dev/null || exit 1
"$R/scripts/make-demo-data.sh" data 512 >/dev/null
F=(--device cuda --max-seq-len 128 --batch-size 4 --log-every 20 --save-every 0 --val-split 0)
"$T" finetune m05 --adapter data/reverse.jsonl:o1/reverse "${F[@]}" --epochs 2 >host.out 2>host.err &
host=$!
sleep 2
"$T" finetune m05 --adapter data/add.jsonl:o1/add "${F[@]}" --epochs 1 >join.out 2>join.err &
joiner=$!
: >samples.txt
while kill -0 $host 2>/dev/null; do
    echo "t=$((SECONDS - T0)) ledger=$(reservations) nvml_apps=$(apps)" >>samples.txt
    sleep 1
done
wait $joiner; jrc=$?
wait $host; hrc=$?
echo "host exit $hrc, joiner exit $jrc"
grep -E "reserved|--vram auto|co-training|joined" host.err | head -n 8
grep -E "joined|waiting|reserved" join.err | head -n 4
echo "-- samples (ledger reservations vs NVML compute apps):"
awk 'NR % 3 == 1' samples.txt | head -n 25
cp samples.txt "$OUT/part1-samples.txt"
cp host.err "$OUT/part1-host.err"; cp join.err "$OUT/part1-join.err"
JOINED=$(grep -c "joined the finetune of pid $host " join.err)
NPROC=$(sed -n 's/.*nvml_apps=//p' samples.txt | awk -F';' '{ if (NF > m) m = NF } END { print m + 0 }')
GROWN=$(sed -n 's/.*reservation grown by \([0-9]*\) MiB to \([0-9]*\) MiB.*/\1 -> \2/p' host.err | head -n 1)

# ---- 2. three 1.5B finetunes 5 s apart: co-training vs --no-join ------------------------------
if [ $((SECONDS - T0)) -gt 150 ]; then
    echo "== 2. skipped: $((SECONDS - T0)) s used"
    printf '| part 1: joined | %s | processes on the GPU (max) | %s | growth | %s |\n' "$JOINED" "$NPROC" "$GROWN"
    exit 0
fi
echo "== 2. three qwen2.5-1.5b finetunes, batch 8, 5 s apart ($((SECONDS - T0)) s)"
"$T" init-model m15 --preset qwen2.5-1.5b >/dev/null || exit 1
N=${N:-1200} # samples per job: 150 steps of batch 8
for j in 0 1 2; do
    "$R/scripts/device/varlen-data.sh" "$N" $((200 + j)) "v$j.jsonl"
done
TOK=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["input_ids"]) for f in sys.argv[1:] for l in open(f)))' v0.jsonl v1.jsonl v2.jsonl)
B=(--device cuda --max-seq-len 512 --batch-size 8 --epochs 1 --log-every 50 --save-every 0 --val-split 0)
run_mode() { # run_mode NAME FLAGS...: three jobs 5 s apart; prints "seconds peak_mib"
    local name=$1; shift
    export TANDEM_LEDGER_DIR=$W/ledger-$name
    local base t0 pids=() peak=0 u
    base=$(gpu_used)
    t0=$(date +%s.%N)
    for j in 0 1 2; do
        awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}' >"$name-$j.launch"
        "$T" finetune m15 --adapter "v$j.jsonl:o-$name/a$j" "${B[@]}" "$@" >"$name-$j.out" 2>"$name-$j.err" &
        pids+=($!)
        [ $j -lt 2 ] && for _ in 1 2 3 4 5 6 7 8 9 10; do
            u=$(gpu_used); [ "$u" -gt "$peak" ] && peak=$u; sleep 0.5; done
    done
    while kill -0 "${pids[@]}" 2>/dev/null; do
        u=$(gpu_used); [ "$u" -gt "$peak" ] && peak=$u; sleep 0.5
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    local t1
    t1=$(date +%s.%N)
    echo "$name: exit $rc, $(grep -l 'joined the finetune' "$name"-*.err 2>/dev/null | wc -l) joined" >&2
    awk -v a="$t0" -v b="$t1" -v p="$peak" -v z="$base" 'BEGIN { printf "%.1f %d\n", b - a, p - z }'
}
read -r S_CO M_CO < <(run_mode co)
read -r S_NJ M_NJ < <(run_mode nojoin --no-join)
# one process training the three adapters from the start: what co-training would reach if the
# later jobs had joined at once; and one adapter alone: the single-job rate
export TANDEM_LEDGER_DIR=$W/ledger-fused
t0=$(date +%s.%N)
"$T" finetune m15 --adapter v0.jsonl:o-fused/a0 --adapter v1.jsonl:o-fused/a1 \
    --adapter v2.jsonl:o-fused/a2 "${B[@]}" >fused.out 2>fused.err || echo "fused: exit $?"
S_FU=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
TOK0=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["input_ids"]) for l in open(sys.argv[1])))' v0.jsonl)
t0=$(date +%s.%N)
"$T" finetune m15 --adapter v0.jsonl:o-alone/a0 "${B[@]}" >alone.out 2>alone.err || echo "alone: exit $?"
S_AL=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
grep -hE "reservation grown|released|joined" co-0.err | head -n 6
cp co-*.err nojoin-*.err "$OUT/" 2>/dev/null
echo
echo "| 1.5B x3, b8, 5 s apart | wall s | aggregate tok/s | peak GPU MiB |"
echo "| --- | --- | --- | --- |"
awk -v t="$TOK" -v s="$S_CO" -v m="$M_CO" 'BEGIN { printf "| co-training (default) | %s | %.0f | %s |\n", s, t / s, m }'
awk -v t="$TOK" -v s="$S_NJ" -v m="$M_NJ" 'BEGIN { printf "| --no-join | %s | %.0f | %s |\n", s, t / s, m }'
awk -v a="$S_CO" -v b="$S_NJ" -v c="$M_CO" -v d="$M_NJ" 'BEGIN {
    printf "| ratio | | %.2fx (target >= 1.4x) | %.2fx |\n", b / a, (d > 0 ? c / d : 0) }'
awk -v t="$TOK" -v s="$S_FU" -v b="$S_NJ" 'BEGIN { printf "| fused from the start (one process, 3 adapters) | %s | %.0f (%.2fx --no-join) | |\n", s, t / s, b / s }'
awk -v t="$TOK0" -v s="$S_AL" 'BEGIN { printf "| one adapter alone | %s | %.0f | |\n", s, t / s }'
# What any co-training can reach here: the last job's steps run one after another, each a pass
# at least as long as that job's pass alone, so it cannot finish before its launch plus the
# alone run's wall less that run's base load (a joiner loads nothing). The ratio to --no-join
# is bounded by --no-join's wall over that (docs/co-training.md, "What the 1.5B target allows").
LAUNCH3=$(cat co-2.launch)
LOAD_AL=$(sed -n 's/.*base loaded in \([0-9.]*\) s.*/\1/p' alone.err | head -n 1)
awk -v l="$LAUNCH3" -v s="$S_AL" -v z="${LOAD_AL:-0}" -v b="$S_NJ" 'BEGIN {
    w = l + s - z
    printf "| bound: the last job (launched at %.1f s) alone from its launch, without its %.1f s load | %.1f | max %.2fx --no-join | |\n", l, z, w, b / w }'
printf '| part 1: joined | %s | processes on the GPU (max) | %s | growth | %s |\n' "$JOINED" "$NPROC" "$GROWN"

# ---- 3. takeover on the real GPU ---------------------------------------------------------------
echo "== 3. kill -9 of a host on the GPU; the joiner takes over ($((SECONDS - T0)) s)"
export TANDEM_LEDGER_DIR=$W/ledger-takeover
F3=(--device cuda --max-seq-len 128 --batch-size 4 --log-every 20 --val-split 0 --save-every 10)
"$T" finetune m05 --adapter data/reverse.jsonl:o3/host "${F3[@]}" --epochs 6 >t-host.out 2>t-host.err &
th=$!
sleep 2
"$T" finetune m05 --adapter data/add.jsonl:o3/join "${F3[@]}" --epochs 2 >t-join.out 2>t-join.err &
tj=$!
for _ in $(seq 120); do [ -d o3/join/checkpoint-10 ] && break; sleep 0.25; done
JOINED3=$(grep -c "joined the finetune of pid $th " t-join.err)
kill -9 $th; wait $th 2>/dev/null
sleep 3
RES3=$(reservations)
NAPPS3=$(apps | awk -F';' '{print NF}')
wait $tj; TRC=$?
TOOK=$(grep -c "taking over: .* on GPU" t-join.err)
RESUMED=$(grep -c "resuming from .*o3/join/checkpoint-" t-join.out)
LEFT=$(reservations)
grep -E "died|taking over|reserved|resuming" t-join.err t-join.out | head -n 6
cp t-host.err t-join.err t-join.out "$OUT/" 2>/dev/null
printf '| part 3: joined %s | orphan exit %s | took over %s | resumed %s | reservation after the kill: %s (%s GPU processes) | left at the end: %s |\n' \
    "$JOINED3" "$TRC" "$TOOK" "$RESUMED" "$RES3" "${NAPPS3:-0}" "${LEFT:-none}"
echo "total $((SECONDS - T0)) s"
