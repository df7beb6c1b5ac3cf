#!/bin/bash
# On the GPU machine (issue 15, the 24 GB card; docs/co-training.md "Memory admission"): a
# PyTorch holder process takes all but 24 GiB of the H200 (outside the ledger, as
# scripts/device/memplan-fit.sh does), then three random Qwen2.5-7B-shaped QLoRA finetunes with
# the defaults (B4, max-seq-len 512, r16 q,v) are launched 5 s apart:
#   co:     default flags: the second and third join the first; the host re-plans at a step
#           boundary (the third makes it switch to gradient checkpointing: 2 as asked 20,578 MiB,
#           3 as asked 27,648 MiB > 24 GiB, 3 with checkpointing 9,626 MiB);
#   nojoin: --no-join: each reserves 13.5 GB, so the ledger runs them one after another.
# Reports whether they co-trained (joined, re-plan lines), the wall time from the first launch
# to the last exit, aggregate tok/s (every job trains N samples of exactly 512 tokens), the peak
# GPU memory above the holder's (nvidia-smi, sampled every 0.5 s) and the host's reservation
# over time, and how long after the last launch the host admitted the last join; a short table
# last. FREE_GIB=0 runs the same without a holder: the whole GPU (the issue's first H200 case,
# target >= 1.1x the aggregate tok/s at <= 0.7x the memory of --no-join). Binary: .device-pack/device.tgz when carried
# (scripts/device/pack.sh), else built now (cmake with CUDA, build-device/). Writes
# $OUT/cotrain-24gb.log and the runs' stderr. Budget: under 5 minutes (build ~2 min, 7B init
# ~40 s, the two modes ~2 min); N (default 96 samples: 24 steps a job; 480 with FREE_GIB=0)
# sets the length; CO_ONLY=1
# runs the co-training mode alone (no --no-join comparison: when device time is short).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cotrain-24gb-out}
mkdir -p "$OUT"
FREE_GIB=${FREE_GIB:-24}
LOG=cotrain-24gb; [ "$FREE_GIB" = 0 ] && LOG=cotrain-7b-h200
exec > >(tee "$OUT/$LOG.log") 2>&1
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
fi
echo "built/unpacked in $((SECONDS - T0)) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
W=/tmp/$LOG
rm -rf "$W"
mkdir -p "$W"
cd "$W" || exit 1
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1; }
t=$SECONDS
"$T" init-model m --preset qwen2.5-7b >/dev/null || { echo "init-model failed"; exit 1; }
echo "init-model qwen2.5-7b: $((SECONDS - t)) s"
# The whole GPU compares memory with three --no-join jobs that run at once: they must overlap
# for most of their run (a 7B base loads in ~4 s), so each trains longer there.
if [ "$FREE_GIB" = 0 ]; then N=${N:-480}; else N=${N:-96}; fi
for j in 0 1 2; do
    awk -v n="$N" -v seed=$((300 + j)) 'BEGIN { srand(seed)
        for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
            for (k = 0; k < 512; k++) printf "%s%d", (k ? "," : ""), int(rand() * 256); print "]}" } }' \
        >"d$j.jsonl"
done
TOK=$((3 * N * 512))

# the holder: all but 24 GiB of the GPU, outside the ledger
cat >holder.py <<'PY'
import subprocess, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
free = int(subprocess.check_output(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"]).split()[0])
take = free - int(__import__("os").environ["FREE_GIB"]) * 1024
blocks = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(take >> 10)]
if take & 1023: blocks.append(torch.empty((take & 1023) << 20, dtype=torch.uint8, device="cuda"))
print(f"holder: took {take} MiB", flush=True)
open("holder.ready", "w").close()
time.sleep(3600)
PY
if [ "$FREE_GIB" != 0 ]; then
    FREE_GIB=$FREE_GIB python3 holder.py &
    HOLDER=$!
    trap 'kill $HOLDER 2>/dev/null' EXIT
    for _ in $(seq 120); do [ -f holder.ready ] && break; sleep 0.5; done
    [ -f holder.ready ] || { echo "holder did not start"; exit 1; }
    sleep 1
fi
BASE=$(gpu_used)
echo "GPU used before the jobs: $BASE MiB (FREE_GIB=$FREE_GIB; 0: no holder)"

F=(--device cuda --epochs 1 --val-split 0 --save-every 0 --log-every 8)
# run_mode NAME FLAGS...: three jobs 5 s apart; prints "seconds peak_mib_above_holder"
run_mode() {
    local name=$1; shift
    export TANDEM_LEDGER_DIR=$W/ledger-$name
    local pids=() t0 t1 rc=0
    : >"peak-$name"
    ( peak=0; while :; do u=$(gpu_used); [ "$u" -gt "$peak" ] && peak=$u && echo "$peak" >"peak-$name"
        "$T" gpu status --json 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin); print(int(__import__("time").time()), ";".join("pid=%s budget=%s" % (r["pids"][0], r["budget_mb"]) for g in d["gpus"] for r in g["reservations"]))' >>"res-$name" 2>/dev/null
        sleep 0.5; done ) &
    local sampler=$!
    t0=$(date +%s.%N)
    for j in 0 1 2; do
        "$T" finetune m --adapter "d$j.jsonl:o-$name/a$j" "${F[@]}" "$@" >"$name-$j.out" 2>"$name-$j.err" &
        pids+=($!)
        [ $j -lt 2 ] && sleep 5
    done
    local tl
    tl=$(date +%s.%N)
    # co-training: seconds from the last launch to the host's admission of its second join
    ( while ! grep -q "joined: adapter 2" "$name-0.err" 2>/dev/null; do
          kill -0 "${pids[0]}" 2>/dev/null || exit 0; sleep 0.2; done
      awk -v a="$tl" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f\n", b-a}' >"last-join-$name" ) &
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    t1=$(date +%s.%N)
    kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
    echo "$name: exit $rc, $(grep -l 'joined the finetune' "$name"-*.err 2>/dev/null | wc -l) joined, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s" >&2
    awk -v a="$t0" -v b="$t1" -v p="$(cat "peak-$name")" -v z="$BASE" 'BEGIN { printf "%.1f %d\n", b - a, p - z }'
}
echo "== co-training (default flags), 3 x 7B 5 s apart ($((SECONDS - T0)) s)"
read -r S_CO M_CO < <(run_mode co)
grep -hE "base loaded|vram auto|reserved|co-training|joined:|device memory" co-0.err | head -n 15
grep -hE "joined the finetune|waiting|refused" co-1.err co-2.err | head -n 4
JOINED=$(grep -l 'joined the finetune' co-1.err co-2.err 2>/dev/null | wc -l)
REPLAN=$(sed -n 's/.*co-training: with .* using \(.*\), [0-9]* MiB$/\1/p' co-0.err | head -n 1)
echo "-- host reservation over time (unix s, ledger):"
awk '!seen[$2]++' res-co | head -n 12
S_NJ=0 M_NJ=0
if [ "${CO_ONLY:-0}" != 1 ]; then
    echo "== --no-join, 3 x 7B 5 s apart ($((SECONDS - T0)) s)"
    read -r S_NJ M_NJ < <(run_mode nojoin --no-join)
    grep -hE "reserved|waiting for" nojoin-1.err | head -n 3
fi
cp co-*.err nojoin-*.err res-co res-nojoin "$OUT/" 2>/dev/null
echo
echo "| 7B x3 QLoRA B4 x 512, $FREE_GIB GiB free (0: whole GPU), 5 s apart | wall s | aggregate tok/s | peak GPU MiB (above holder) |"
echo "| --- | --- | --- | --- |"
awk -v t="$TOK" -v s="$S_CO" -v m="$M_CO" -v j="$JOINED" 'BEGIN { printf "| co-training (default; %d of 2 joined) | %s | %.0f | %s |\n", j, s, t / s, m }'
awk -v t="$TOK" -v s="$S_NJ" -v m="$M_NJ" 'BEGIN { printf "| --no-join | %s | %.0f | %s |\n", s, t / s, m }'
[ "$S_NJ" != 0 ] && awk -v a="$S_CO" -v b="$S_NJ" 'BEGIN { printf "| co-training wall / --no-join wall | %.2fx (target <= 1.1x) | %.2fx tok/s | |\n", a / b, b / a }'
echo "| host re-plan | ${REPLAN:-none} | | |"
echo "| host base load | $(sed -n "s/.*base loaded in \([0-9.]*\) s (\(.*\))/\1 s (\2)/p" co-0.err | head -n 1) | | |"
echo "| last join admitted after the last launch | $(cat last-join-co 2>/dev/null || echo never) s (target <= 10 s) | | |"
awk -v a="$M_CO" -v b="$M_NJ" 'BEGIN { if (b > 0) printf "| peak memory co / --no-join | %.2fx | | |\n", a / b }'
echo "total $((SECONDS - T0)) s"
