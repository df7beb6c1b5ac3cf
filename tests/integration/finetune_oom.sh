#!/bin/bash
# An out-of-memory during training (injected with the trainer.step_oom fault point after a few
# steps) ends with exit 1, a message saying what happened, and a checkpoint of every unfinished
# adapter; `--resume` then finishes the run with adapters identical, byte for byte, to an
# uninterrupted run.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
"$TANDEM" init-model tiny --preset tiny >/dev/null || { fail "init-model"; finish; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" data 16
run() { # run OUT_PREFIX [extra flags...]
    local o=$1; shift
    "$TANDEM" finetune tiny --adapter data/reverse.jsonl:$o/reverse --adapter data/add.jsonl:$o/add \
        --device cpu --method lora --epochs 1 --batch-size 4 --max-seq-len 48 --save-every 0 \
        --seed 7 "$@"
}
expect_exit 0 run whole
TANDEM_FAULT_INJECT=trainer.step_oom expect_exit 1 run oom
grep -q "out of device memory at global step" "$WORK/last.err" || fail "OOM message: $(cat "$WORK/last.err")"
grep -q "checkpoint of every unfinished adapter was written" "$WORK/last.err" || fail "no checkpoint note"
grep -q -- "--resume" "$WORK/last.err" || fail "the message does not say how to continue"
for a in reverse add; do
    ls -d oom/$a/checkpoint-* >/dev/null 2>&1 || fail "$a: no checkpoint after the OOM"
    [ -e oom/$a/adapter_model.safetensors ] && fail "$a: a final adapter was written by the failed run"
done
expect_exit 0 run oom --resume
for a in reverse add; do
    cmp -s whole/$a/adapter_model.safetensors oom/$a/adapter_model.safetensors ||
        fail "$a: the resumed adapter differs from the uninterrupted run"
done
finish
