#!/bin/bash
# `tandem finetune --lora-dropout` end to end on the tiny random model (CPU):
#  - two adapters fused with --lora-dropout 0.1 train (the loss falls) and adapter_config.json
#    records lora_dropout 0.1;
#  - the same command gives byte-identical adapters (the masks are a function of the seed, the
#    adapter's step and the piece's position in its batch), and they differ from a run without dropout;
#  - kill -9 after a checkpoint, then --resume: the same adapter bytes and logged losses; an
#    injected out-of-memory, then --resume: the same bytes too; --resume with another dropout is
#    refused;
#  - adapters.toml's lora_dropout per adapter over the flag; --init-adapter takes the adapter's
#    own lora_dropout from its adapter_config.json.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
"$TANDEM" init-model tiny --preset tiny >/dev/null || { fail "init-model"; finish; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" data 16
run() { # run OUT_PREFIX [extra flags...]
    local o=$1; shift
    "$TANDEM" finetune tiny --adapter data/reverse.jsonl:$o/reverse --adapter data/add.jsonl:$o/add \
        --device cpu --method lora --epochs 2 --batch-size 4 --grad-accum 2 --max-seq-len 48 \
        --val-split 0.1 --eval-every 2 --save-every 2 --log-every 1 --lr 5e-3 \
        --lr-schedule constant --seed 7 "$@"
}

expect_exit 0 run d1 --lora-dropout 0.1
for a in reverse add; do
    jq -e '.lora_dropout == 0.1' d1/$a/adapter_config.json >/dev/null ||
        fail "$a: adapter_config lora_dropout $(jq .lora_dropout d1/$a/adapter_config.json)"
    first=$(jq -s '[.[] | select(.loss)] | first.loss' d1/$a/metrics.jsonl)
    last=$(jq -s '[.[] | select(.loss)] | last.loss' d1/$a/metrics.jsonl)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "$a: loss did not fall ($first -> $last)"
done

# determinism, and the dropout acts
expect_exit 0 run d2 --lora-dropout 0.1
same_run d1 d2 "not deterministic with dropout" reverse add
expect_exit 0 run n0
for a in reverse add; do
    cmp -s d1/$a/adapter_model.safetensors n0/$a/adapter_model.safetensors && fail "$a: dropout changed nothing"
    jq -e '.lora_dropout == 0' n0/$a/adapter_config.json >/dev/null || fail "$a: lora_dropout without the flag"
done

# kill -9 (checkpoints every step: they do not change the trajectory), then --resume: the very
# same run
kill9_when d3/add/checkpoint-3 run d3 --lora-dropout 0.1 --save-every 1
expect_exit 2 run d3 --lora-dropout 0.2 --resume
grep -q "trained with LoRA dropout 0.1, this run has 0.2" last.err || fail "resume dropout mismatch: $(cat last.err)"
expect_exit 0 run d3 --lora-dropout 0.1 --resume
same_run d1 d3 "resume after kill -9 differs" reverse add

# an out-of-memory inside a step (rolled back, checkpointed), then --resume
TANDEM_FAULT_INJECT=trainer.step_oom expect_exit 1 run d4 --lora-dropout 0.1
grep -q "out of device memory at global step" last.err || fail "OOM message: $(cat last.err)"
expect_exit 0 run d4 --lora-dropout 0.1 --resume
same_run d1 d4 "resume after the OOM differs" reverse add

# adapters.toml: a per-adapter lora_dropout wins over the flag
cat >dropout.toml <<T
[[adapter]]
data = "data/reverse.jsonl"
output = "t/reverse"
lora_dropout = 0.25
[[adapter]]
data = "data/add.jsonl"
output = "t/add"
T
expect_exit 0 "$TANDEM" finetune tiny --adapters-config dropout.toml --lora-dropout 0.05 --device cpu \
    --method lora --epochs 1 --batch-size 8 --max-seq-len 48 --val-split 0 --save-every 0
jq -e '.lora_dropout == 0.25' t/reverse/adapter_config.json >/dev/null || fail "toml lora_dropout"
jq -e '.lora_dropout == 0.05' t/add/adapter_config.json >/dev/null || fail "flag lora_dropout"

# --init-adapter: the adapter's own lora_dropout applies, as its rank and targets do
expect_exit 0 "$TANDEM" finetune tiny --adapter data/add.jsonl:init/add --init-adapter d1/add \
    --lora-dropout 0 --device cpu --method lora --epochs 1 --batch-size 8 --max-seq-len 48 \
    --val-split 0 --save-every 0
jq -e '.lora_dropout == 0.1' init/add/adapter_config.json >/dev/null ||
    fail "--init-adapter lora_dropout: $(jq .lora_dropout init/add/adapter_config.json)"

# evaluation never drops: the same loss twice
expect_exit 0 "$TANDEM" eval tiny --data data/add.jsonl --adapter d1/add --method lora --json
e1=$(jq .loss last.out)
expect_exit 0 "$TANDEM" eval tiny --data data/add.jsonl --adapter d1/add --method lora --json
[ "$(jq .loss last.out)" = "$e1" ] || fail "eval with a dropout adapter is not deterministic"
finish
