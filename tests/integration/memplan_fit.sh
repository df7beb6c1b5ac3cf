#!/bin/bash
# --vram auto chooses a plan that fits the budget a run can get (docs/finetune.md, "Plans that
# fit"), with real `tandem finetune` processes on a simulated GPU (TANDEM_FAKE_GPUS): another
# process outside the ledger holds all but B MiB, as on the issue's simulated 24 GB card. The
# plan as asked when it fits; checkpointing that recomputes only norms and q/k/v, then gradient
# checkpointing, when only that fits; then micro-batches
# (same optimizer batch); a run whose smallest plan exceeds the GPU's reservable capacity fails
# at once (exit 1) naming the budget it needs; an explicit --vram is reserved as given; under
# tandem gpu run its reservation is the budget. The
# reservation is real (the ledger in $WORK); CUDA then cannot open the simulated GPU, so the
# runs train on the CPU (--device auto). Needs a build with CUDA (a build without it never plans
# for a GPU): skipped otherwise.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

"$TANDEM" --version | grep -q '^features: cuda' || { echo "skipped: this tandem has no CUDA backend"; exit 77; }
"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
for i in 0 1 2 3 4 5 6 7; do
    printf '{"text": "'
    for k in $(seq 60); do printf 'sample %d word %d ' "$i" "$k"; done
    printf '"}\n'
done >"$WORK/d.jsonl"

# ft NAME TOTAL_MB OUTSIDE_MB [FLAGS...]: a finetune of one step on a GPU of TOTAL_MB of which a
# process outside the ledger holds OUTSIDE_MB.
ft() {
    local name=$1 total=$2 outside=$3; shift 3
    local spec="uuid=GPU-sim-0,name=Sim,total_mb=$total,memory=discrete"
    [ "$outside" -gt 0 ] && spec="$spec;pid=1,gpu=GPU-sim-0,used_mb=$outside"
    TANDEM_FAKE_GPUS="$spec" "$TANDEM" finetune "$WORK/model" --adapter "$WORK/d.jsonl:$WORK/$name" \
        --max-seq-len 256 --batch-size 8 --epochs 1 --no-join --no-wait-gpu "$@"
}
reserved() { sed -n 's/^tandem: reserved \([0-9]*\) MiB on GPU-sim-0$/\1/p' "$WORK/last.err"; }

# 1. room enough: the plan as asked, no choice line
expect_exit 0 ft asked 100000 0
grep -q 'the plan as asked needs' "$WORK/last.err" && fail "a plan that fits was changed: $(cat "$WORK/last.err")"
asked=$(reserved)
# --grad-checkpoint given: what checkpointing reserves
expect_exit 0 ft gc 100000 0 --grad-checkpoint
gc=$(reserved)
[ -n "$asked" ] && [ -n "$gc" ] && [ "$gc" -lt "$asked" ] || fail "asked $asked MiB, checkpointing $gc MiB"
# --grad-checkpoint --recompute attn: between the two
expect_exit 0 ft gcattn 100000 0 --grad-checkpoint --recompute attn
attn=$(reserved)
[ -n "$attn" ] && [ "$attn" -lt "$asked" ] && [ "$attn" -gt "$gc" ] || fail "asked $asked MiB, --recompute attn $attn MiB, checkpointing $gc MiB"
# --offload-activations: less reserved than checkpointing alone, the host memory said, and the
# same adapter bits (the layer inputs went to host memory and back)
expect_exit 0 ft gcoff 100000 0 --grad-checkpoint --offload-activations
gcoff=$(reserved)
[ -n "$gcoff" ] && [ "$gcoff" -lt "$gc" ] || fail "checkpointing $gc MiB, with offload $gcoff MiB"
grep -q '^tandem: --offload-activations: [0-9]* MiB of layer inputs in page-locked host memory$' "$WORK/last.err" ||
    fail "no host memory line: $(cat "$WORK/last.err")"
cmp -s "$WORK/gc/adapter_model.safetensors" "$WORK/gcoff/adapter_model.safetensors" ||
    fail "offloading changed the trained adapter"

# 2. one MiB less than the plan as asked: checkpointing that recomputes norms and q/k/v; one MiB
# less than that: gradient checkpointing; each said in one line
expect_exit 0 ft rung0 100000 $((100000 - asked + 1))
grep -q "^tandem: --vram auto: the plan as asked needs $asked MiB, more than the $((asked - 1)) MiB this run can get on GPU-sim-0 (Sim) with $((100000 - asked + 1)) MiB held outside the ledger: using gradient checkpointing (--recompute attn), $attn MiB$" "$WORK/last.err" \
    || fail "--recompute attn line: $(cat "$WORK/last.err")"
[ "$(reserved)" = "$attn" ] || fail "reserved $(reserved), not --recompute attn's $attn MiB"
[ -f "$WORK/rung0/adapter_model.safetensors" ] || fail "rung0 did not train"
expect_exit 0 ft rung1 100000 $((100000 - attn + 1))
grep -q "^tandem: --vram auto: the plan as asked needs $asked MiB, more than the $((attn - 1)) MiB this run can get on GPU-sim-0 (Sim) with $((100000 - attn + 1)) MiB held outside the ledger: using gradient checkpointing, $gc MiB$" "$WORK/last.err" \
    || fail "checkpointing line: $(cat "$WORK/last.err")"
[ "$(reserved)" = "$gc" ] || fail "reserved $(reserved), not checkpointing's $gc MiB"
[ -f "$WORK/rung1/adapter_model.safetensors" ] || fail "rung1 did not train"

# 3. one MiB less than checkpointing: micro-batches, the optimizer batch unchanged
expect_exit 0 ft rung2 100000 $((100000 - gc + 1))
grep -q "using gradient checkpointing and micro-batch 4 x accumulation 2 (optimizer batch 8 x 1 unchanged), [0-9]* MiB$" "$WORK/last.err" \
    || fail "micro-batch line: $(cat "$WORK/last.err")"
micro=$(reserved)
[ -n "$micro" ] && [ "$micro" -lt "$gc" ] || fail "micro-batch reserved $micro MiB, checkpointing $gc"
[ -f "$WORK/rung2/adapter_model.safetensors" ] || fail "rung2 did not train"
grep -q '"global_step": 1' "$WORK/rung2/trainer_state.json" || fail "the micro-batched run took another number of steps"

# 4. nothing fits the GPU's reservable capacity: exit 1 at once, naming the smallest budget
expect_exit 1 ft never 1300 0
grep -q 'tandem: --vram auto: this run needs at least [0-9]* MiB (its smallest plan: gradient checkpointing and micro-batch 1 x accumulation 8 (optimizer batch 8 x 1 unchanged)), more than any GPU here may reserve: the largest, GPU-sim-0 (Sim), has 1300 MiB, of which tandem may reserve 85% = 1105 MiB' "$WORK/last.err" \
    || fail "impossible plan: $(cat "$WORK/last.err")"
need=$(sed -n 's/.*needs at least \([0-9]*\) MiB.*/\1/p' "$WORK/last.err")
[ -n "$need" ] && [ "$need" -gt 1105 ] && [ "$need" -lt "$micro" ] || fail "smallest $need MiB"
[ -e "$WORK/never" ] && fail "the impossible run wrote its OUT_DIR"
grep -q 'reserved' "$WORK/last.err" && fail "the impossible run reserved"

# 5. an explicit --vram is reserved as given, no plan chosen
expect_exit 0 ft explicit 1300 0 --vram 1
grep -q -- '--vram auto' "$WORK/last.err" && fail "--vram 1 planned: $(cat "$WORK/last.err")"
[ "$(reserved)" = 1024 ] || fail "--vram 1 reserved $(reserved) MiB"
# 6. under tandem gpu run the budget is its reservation: a smaller plan to fit it, and when
# nothing fits, the smallest plan with a warning (the user chose the reservation)
TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim,total_mb=100000,memory=discrete" expect_exit 0 \
    "$TANDEM" gpu run --vram "$(awk -v m="$gc" 'BEGIN { printf "%.4f", m / 1024 }')" -- \
    "$TANDEM" finetune "$WORK/model" --adapter "$WORK/d.jsonl:$WORK/gpurun" --max-seq-len 256 \
    --batch-size 8 --epochs 1 --no-join
grep -q "this run can get on GPU-sim-0 (Sim), the reservation of tandem gpu run: using gradient checkpointing, $gc MiB$" "$WORK/last.err" \
    || fail "gpu run, checkpointing: $(cat "$WORK/last.err")"
TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim,total_mb=100000,memory=discrete" expect_exit 0 \
    "$TANDEM" gpu run --vram 0.5 -- "$TANDEM" finetune "$WORK/model" \
    --adapter "$WORK/d.jsonl:$WORK/gpurun-small" --max-seq-len 256 --batch-size 8 --epochs 1 --no-join
grep -q "warning: --vram auto: this run needs at least $need MiB (its smallest plan: .*), more than the 512 MiB of the reservation .* of tandem gpu run on GPU-sim-0; training the smallest plan over it" "$WORK/last.err" \
    || fail "gpu run, nothing fits: $(cat "$WORK/last.err")"
grep -q "^tandem: --vram auto: $need MiB = " "$WORK/last.err" || fail "gpu run: not the smallest plan"
finish
