#!/bin/bash
# On the GPU machine (issue 19 item 5, issue 15's 1.5B target): where a small model's step goes.
# `tandem finetune --profile-ops` (docs/cuda-backend.md, "Per-op profile") on random Qwen2.5
# shapes, QLoRA r16 q,v, each run 50 steps:
#   a15  1.5B, one adapter, batch 8, variable-length data (64..512 tokens, as cotrain-gpu.sh)
#   f15  1.5B, three adapters fused in one process, the same data per adapter
#   a05  0.5B, one adapter, batch 8 x 512 fixed length (the gpu_vs_peft.sh case)
# then the same three without --profile-ops (tok/s from the run's own summary line), so the
# profile's shares can be read against unprofiled step times.
# Binary: .device-pack/device.tgz (scripts/device/pack.sh after a CUDA build here).
# A/B against an earlier build in the same call: carry .device-pack/baseline.tgz too (a tarball
# of that build's `tandem` alone: `tar czf .device-pack/baseline.tgz -C OLD_BUILD tandem`; it runs
# with this pack's libraries); its unprofiled runs follow, named base-<run>.
# PROFILES="1 0" (default) runs profiled then plain; PROFILES=0 only the plain runs.
# Writes $OUT/<run>.err (the profile tables) and $OUT/small-profile.log. Under 4 minutes (6 with
# a baseline).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/small-profile-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/small-profile.log") 2>&1
R=$PWD
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$R/.device/tandem
"$T" --version | head -n 1
gpu_line
W=/tmp/small-profile
rm -rf "$W"
mkdir -p "$W"
cd "$W" || exit 1
export TANDEM_LEDGER_DIR=$W/ledger
"$T" init-model m15 --preset qwen2.5-1.5b >/dev/null || exit 1
"$T" init-model m05 --preset qwen2.5-0.5b >/dev/null || exit 1
STEPS=${STEPS:-50}
N=$((STEPS * 8))
for j in 0 1 2; do
    "$R/scripts/device/varlen-data.sh" "$N" $((200 + j)) "v$j.jsonl"
done
awk -v n="$N" 'BEGIN { srand(7); for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
    for (k = 0; k < 512; k++) printf "%s%d", (k ? "," : ""), int(rand() * 256); print "]}" } }' >f512.jsonl
B=(--device cuda --max-seq-len 512 --batch-size 8 --epochs 1 --log-every 10 --save-every 0 --val-split 0 --no-join)
run() { # run NAME PROFILE(0|1) MODEL ADAPTER-ARGS...
    local name=$1 prof=$2 model=$3; shift 3
    local flags=()
    [ "$prof" = 1 ] && flags=(--profile-ops)
    local t0=$SECONDS
    "$T" finetune "$model" "$@" "${B[@]}" "${flags[@]}" >"$OUT/$name.out" 2>"$OUT/$name.err" || echo "$name: exit $?"
    echo "== $name ($((SECONDS - t0)) s): $(grep -hE 'tok/s' "$OUT/$name.out" "$OUT/$name.err" | tail -n 1)"
}
variant() { # variant TAG PROFILES: the three runs with binary $T, names prefixed TAG
    local tag=$1 p s
    for p in $2; do
        s=$tag$([ $p = 1 ] && echo prof || echo plain)
        run "a15-$s" $p m15 --adapter v0.jsonl:o-a15-$s/a0
        run "f15-$s" $p m15 --adapter v0.jsonl:o-f15-$s/a0 --adapter v1.jsonl:o-f15-$s/a1 --adapter v2.jsonl:o-f15-$s/a2
        run "a05-$s" $p m05 --adapter f512.jsonl:o-a05-$s/a0
    done
}
variant "" "${PROFILES:-1 0}"
if [ -f "$R/.device-pack/baseline.tgz" ]; then
    rm -rf "$R/.device-base" && mkdir -p "$R/.device-base" &&
        tar xzf "$R/.device-pack/baseline.tgz" -C "$R/.device-base" && T=$R/.device-base/tandem &&
        echo "== baseline: $("$T" --version | head -n 1)" && variant base- 0
fi
PROFILED=
[[ " ${PROFILES:-1 0} " == *" 1 "* ]] && PROFILED="a15 f15 a05"
for n in $PROFILED; do
    echo "---- $n profile (top 25 and the window)"
    grep -A 40 -iE 'op profile|device window' "$OUT/$n-prof.err" | head -n 45
done
