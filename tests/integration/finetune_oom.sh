#!/bin/bash
# An out-of-memory during training (injected with the trainer.step_oom fault point after a few
# steps) ends with exit 1, a message saying what happened, and a checkpoint of every unfinished
# adapter; `--resume` then finishes the run with adapters identical, byte for byte, to an
# uninterrupted run. The same with weights (add 0.3 of reverse's 1: add's optimizer batch is in
# progress over several global steps), injected before the step's first pass (trainer.step_oom)
# and after it added to add's partial gradient (trainer.pass_oom). And a run whose largest step
# does not fit at the start (model.reserve) stops before step 1 with nothing written.
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
run_weighted() { # run_weighted OUT_PREFIX [extra flags...]: the same adapters, add with weight 0.3
    local o=$1; shift
    printf '[[adapter]]\ndata = "data/reverse.jsonl"\noutput = "%s/reverse"\n\n[[adapter]]\ndata = "data/add.jsonl"\noutput = "%s/add"\nweight = 0.3\n' \
        "$o" "$o" >$o.toml
    "$TANDEM" finetune tiny --adapters-config $o.toml --device cpu --method lora --epochs 1 \
        --batch-size 4 --max-seq-len 48 --save-every 0 --seed 7 "$@"
}
oom_then_resume() { # oom_then_resume RUN_FN WHOLE_PREFIX OUT_PREFIX FAULT_POINT
    local fn=$1 whole=$2 o=$3 point=$4
    TANDEM_FAULT_INJECT=$point expect_exit 1 $fn $o
    grep -q "out of device memory at global step" "$WORK/last.err" || fail "$o: OOM message: $(cat "$WORK/last.err")"
    grep -q "checkpoint of every unfinished adapter was written" "$WORK/last.err" || fail "$o: no checkpoint note"
    grep -q -- "--resume" "$WORK/last.err" || fail "$o: the message does not say how to continue"
    for a in reverse add; do
        ls -d $o/$a/checkpoint-* >/dev/null 2>&1 || fail "$o/$a: no checkpoint after the OOM"
        [ -e $o/$a/adapter_model.safetensors ] && fail "$o/$a: a final adapter was written by the failed run"
    done
    expect_exit 0 $fn $o --resume
    for a in reverse add; do
        cmp -s $whole/$a/adapter_model.safetensors $o/$a/adapter_model.safetensors ||
            fail "$o/$a: the resumed adapter differs from the uninterrupted run"
    done
}
expect_exit 0 run whole
oom_then_resume run whole oom trainer.step_oom
expect_exit 0 run_weighted wwhole
oom_then_resume run_weighted wwhole woom trainer.step_oom
oom_then_resume run_weighted wwhole wpass trainer.pass_oom
# The largest step's memory does not fit when the trainer attaches (model.reserve: the
# allocation of tdm_model_reserve fails): exit 1 before step 1, the message names the step and
# what to do, nothing is written; the same command then trains as if nothing had happened.
TANDEM_FAULT_INJECT=model.reserve expect_exit 1 run nofit
grep -q "the largest step ([0-9]* rows) does not fit (lower --batch-size or --max-seq-len, or free memory)" \
    "$WORK/last.err" || fail "nofit: message: $(cat "$WORK/last.err")"
for a in reverse add; do
    [ -e nofit/$a/adapter_model.safetensors ] && fail "nofit/$a: an adapter was written"
    ls -d nofit/$a/checkpoint-* >/dev/null 2>&1 && fail "nofit/$a: a checkpoint was written"
    [ -s nofit/$a/metrics.jsonl ] && fail "nofit/$a: a step was logged"
done
expect_exit 0 run nofit
for a in reverse add; do
    cmp -s whole/$a/adapter_model.safetensors nofit/$a/adapter_model.safetensors ||
        fail "nofit/$a: differs from the uninterrupted run"
done
# add was in the middle of a batch when the OOM hit: its checkpoint holds the partial gradient
for o in woom wpass; do
    jq -e '.trainer.piece.seqs_done > 0' $o/add/checkpoint-0/tandem_state.json >/dev/null &&
        [ -s $o/add/checkpoint-0/grad_accum.safetensors ] || fail "$o/add: not saved in the middle of a batch"
done
finish
