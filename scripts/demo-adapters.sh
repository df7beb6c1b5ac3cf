#!/bin/bash
# Part of make run (scripts/demo.sh): creates the `tiny` random model, writes three instruct
# datasets (greet: any word -> "hi!"; last: a word -> its last letter; parity: a number -> odd or
# even) and, from the same generator, HELD prompts per task that are not in the training data;
# trains three LoRA adapters FUSED on the CPU in one process (different ranks and targets);
# shows each one's training loss falling, its greedy answers to held-out prompts beside the bare
# base model's (tandem generate), how many of its HELD held-out prompts it answers right, and its
# eval loss on them. The loss curves go to one HTML page (tandem report, $TANDEM_DEMO_REPORT,
# default /tmp/tandem-demo-report.html). Exits 1 when an adapter answers fewer than
# $TANDEM_DEMO_MIN_RIGHT (default 90) percent of its held-out prompts right
# (tests/integration/demo_adapters.sh checks it all).
#
# The settings, measured (docs/verification.md, "make run's adapters"): a random 3M-parameter
# base learns these tasks through LoRA alone with weights of std 0.1 (--init-std; at the default
# 0.02 the tied embeddings keep every logit within about +-5 and `last` gets 1 of 30 held-out
# prompts right), prompts without a chat template ("PROMPT\n\n" ANSWER EOS: the answer sits two
# tokens after the letter or digit it depends on), AdamW at a constant 2e-3 (at 3e-2, the earlier
# value, Adam's steps of about lr per weight blow the adapters up: even greet's constant answer
# stays around loss 0.3 and held-out answers are wrong), 512 lines per task (64 are memorised
# but `last` then gets 7 of 30 held-out prompts right) and 3 epochs (192 steps: after 2 epochs
# `last` got 26-30 of 30 depending on the seed, after 3 30 of 30 for seeds 1, 2, 7 and 42).
set -eu
TANDEM=${1:-build/tandem}
case $TANDEM in /*) ;; *) TANDEM="$PWD/$TANDEM" ;; esac
# OpenMP threads that spin-wait lose most of their time on a machine other jobs keep busy: this
# demo's training took 117-118 s with OMP_WAIT_POLICY=active and 12-23 s passive at load 6 on 2
# cores (docs/verification.md; docs/benchmarks.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
N=512 HELD=30 SHOW=2 MIN_RIGHT=${TANDEM_DEMO_MIN_RIGHT:-90}
demo=$(mktemp -d /tmp/tandem-demo-XXXXXX)
trap 'rm -rf "$demo"' EXIT
cd "$demo"

echo "== tandem init-model tiny --preset tiny --init-std 0.1   (a random Qwen2-shaped model, ~3M parameters)"
"$TANDEM" init-model tiny --preset tiny --init-std 0.1
# Deterministic: words of 3-5 letters from a-j and numbers 0-999 from one arithmetic sequence; the
# first N lines of each task train, the next HELD whose prompt is not among those N are held out.
mkdir -p data held
awk -v n=$N -v held=$HELD 'BEGIN {
    letters = "abcdefghij"; s = 7
    for (i = 0; kept < held; i++) {
        len = 3 + i % 3; w = ""
        for (k = 0; k < len; k++) { s = (s * 1103515245 + 12345) % 2147483648; w = w substr(letters, 1 + int(s / 65536) % 10, 1) }
        m = (i * 37 + 11) % 1000
        if (i < n) { dir = "data/"; seen[w] = 1 }
        else if (w in seen) continue
        else { dir = "held/"; kept++ }
        printf("{\"instruction\": \"%s\", \"response\": \"hi!\"}\n", w) > (dir "greet.jsonl")
        printf("{\"instruction\": \"%s\", \"response\": \"%s\"}\n", w, substr(w, len, 1)) > (dir "last.jsonl")
        printf("{\"instruction\": \"%d\", \"response\": \"%s\"}\n", m, m % 2 ? "odd" : "even") > (dir "parity.jsonl")
    }
}'
for a in greet last parity; do # numbers 0-999 from a step of 37: the held ones are not in data
    jq -r .instruction "held/$a.jsonl" | grep -qxFf - <(jq -r .instruction "data/$a.jsonl") &&
        { echo "demo: a held-out prompt of $a is in data/$a.jsonl" >&2; exit 1; }
done
echo "== three datasets of $N lines: greet (any word -> hi!), last (its last letter), parity;"
echo "   and $HELD held-out prompts each, not in the data. E.g."
head -n1 data/greet.jsonl data/last.jsonl data/parity.jsonl | grep '^{' | sed 's/^/   /'
all="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
cat >adapters.toml <<TOML
batch_size = 8
learning_rate = 2e-3
targets = "$all"

[[adapter]]
data = "data/greet.jsonl"
output = "out/greet"
label = "greet"
rank = 8
targets = "q_proj,v_proj"

[[adapter]]
data = "data/last.jsonl"
output = "out/last"
label = "last"
rank = 16

[[adapter]]
data = "data/parity.jsonl"
output = "out/parity"
label = "parity"
rank = 16
TOML
echo; echo "== tandem finetune tiny --adapters-config adapters.toml   (3 adapters fused, CPU, 192 steps each)"
start=$(date +%s%N)
"$TANDEM" finetune tiny --adapters-config adapters.toml --device cpu --epochs 3 --max-seq-len 64 \
    --chat-template none --lr-schedule constant --log-every 16 --save-every 0 --val-split 0 --no-join
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN { printf "== trained in %.1f s\n", ns / 1e9 }'
echo; echo "== each OUT_DIR holds a PEFT adapter + run records:"
ls out/greet | sed 's/^/   /'
echo; echo "== training loss every 16 steps (metrics.jsonl):"
for a in greet last parity; do
    printf "   %-8s %s\n" "$a" "$(jq -rs '[.[] | select(.loss) | .loss * 1000 | round / 1000 | tostring] | join("  ")' out/$a/metrics.jsonl)"
done
report=${TANDEM_DEMO_REPORT:-/tmp/tandem-demo-report.html}
echo; echo "== tandem report out -o $report   (loss curves + leaderboard, one offline HTML page;"
echo "   the same values are in out/*/runs/ for tensorboard --logdir out)"
"$TANDEM" report out -o "$report" | sed 's/^/   /'

echo; echo "== tandem generate: greedy answers to prompts NOT in the data, bare base vs adapter"
echo "   (one run: every held-out prompt with its adapter, the first $SHOW of each with the base too;"
echo "   one batch, KV cache)"
for a in greet last parity; do
    jq -c --arg a $a '{prompt: .instruction, adapter: $a}' "held/$a.jsonl"
    head -n $SHOW "held/$a.jsonl" | jq -c '{prompt: .instruction, adapter: "base"}'
done >prompts.jsonl
"$TANDEM" generate tiny --device cpu --chat-template none --file prompts.jsonl --max-new-tokens 8 \
    --adapter greet=out/greet --adapter last=out/last --adapter parity=out/parity --json >answers.jsonl
printf "   %-8s %-8s %-9s %-24s %s\n" adapter prompt expected "base model" "with the adapter"
# answers.jsonl is in prompts.jsonl's order: per task HELD adapter answers, then SHOW base ones.
# One row per answer (fields split by \x1f): task, prompt, expected, base (the first SHOW; its
# random bytes, often not UTF-8, print as ?, so the columns stay aligned), adapter, right|wrong.
jq -rs --argjson held $HELD --argjson show $SHOW --slurpfile g held/greet.jsonl \
    --slurpfile l held/last.jsonl --slurpfile p held/parity.jsonl '
    . as $ans | [["greet", $g], ["last", $l], ["parity", $p]] | to_entries[] |
    .key as $t | .value[0] as $a | .value[1] | to_entries[] |
    ($t * ($held + $show)) as $o | (.value.response | tojson) as $want |
    ($ans[$o + .key].text | tojson) as $tuned |
    [$a, .value.instruction, $want,
     (if .key < $show then $ans[$o + $held + .key].text | gsub("[^ -~]"; "?") | .[:20] | tojson
      else "" end),
     $tuned, (if $tuned == $want then "right" else "wrong" end)] | join("\u001f")' answers.jsonl >rows
while IFS=$'\x1f' read -r a prompt want base tuned mark; do
    if [ -n "$base" ]; then
        printf "   %-8s %-8s %-9s %-24s %s (%s)\n" "$a" "$prompt" "$want" "$base" "$tuned" "$mark"
    fi
done <rows
bad=0 score=""
for a in greet last parity; do
    right=$(awk -F'\x1f' -v a=$a '$1 == a && $6 == "right"' rows | wc -l)
    score="$score${score:+, }$a $right/$HELD"
    [ $((100 * right)) -ge $((MIN_RIGHT * HELD)) ] || bad=1
done
echo "   held-out prompts answered right: $score"
echo "   (the base model has random weights: its answers are noise)"
echo; echo "== tandem eval: mean loss on the held-out prompts, bare base vs its adapter"
for a in greet last parity; do
    base=$("$TANDEM" eval tiny --device cpu --chat-template none --data held/$a.jsonl --json | jq '.loss * 1000 | round / 1000')
    tuned=$("$TANDEM" eval tiny --device cpu --chat-template none --data held/$a.jsonl --adapter out/$a --json | jq '.loss * 1000 | round / 1000')
    printf "   %-8s base %s  with adapter %s\n" "$a" "$base" "$tuned"
done
if [ $bad = 1 ]; then
    echo "demo: an adapter answered fewer than $MIN_RIGHT% of its held-out prompts right" >&2
    exit 1
fi
