#!/bin/bash
# make run: the main job. Creates the `tiny` random model, writes three small instruct datasets
# (greet: any name -> "hi!"; last: a word -> its last letter; parity: a number -> odd or even),
# trains three LoRA adapters FUSED on the CPU in one process (different ranks, targets and
# learning rates), shows each one's training loss falling and its greedy answer to a prompt that
# is NOT in its data beside the bare base model's (tandem generate), and its eval loss; the loss
# curves go to one HTML page (tandem report, $TANDEM_DEMO_REPORT, default
# /tmp/tandem-demo-report.html).
# Then the GPU-sharing demo (scripts/demo-gpu-sharing.sh) on a simulated GPU.
# What makes a random 3M-parameter base plus LoRA learn within the demo's ~100 steps: weights of
# std 0.1 instead of 0.02 (--init-std; at 0.02 the tied embeddings keep every logit within about
# +-5 and the losses barely move), and prompts rendered without a chat template (--chat-template
# none: "PROMPT\n\n" ANSWER EOS), so the answer sits a few tokens after what it depends on.
set -eu
TANDEM=${1:-build/tandem}
case $TANDEM in /*) ;; *) TANDEM="$PWD/$TANDEM" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
demo=$(mktemp -d /tmp/tandem-demo-XXXXXX)
trap 'rm -rf "$demo"' EXIT
cd "$demo"

echo "== tandem init-model tiny --preset tiny --init-std 0.1   (a random Qwen2-shaped model, ~3M parameters)"
"$TANDEM" init-model tiny --preset tiny --init-std 0.1
# 64 lines each, deterministic; words of 3-5 letters from a-j. Held-out prompts are below.
mkdir -p data
awk 'BEGIN {
    letters = "abcdefghij"; s = 7
    for (i = 0; i < 64; i++) {
        len = 3 + i % 3; w = ""
        for (k = 0; k < len; k++) { s = (s * 1103515245 + 12345) % 2147483648; w = w substr(letters, 1 + int(s / 65536) % 10, 1) }
        printf("{\"instruction\": \"%s\", \"response\": \"hi!\"}\n", w) > "data/greet.jsonl"
        printf("{\"instruction\": \"%s\", \"response\": \"%s\"}\n", w, substr(w, len, 1)) > "data/last.jsonl"
        n = (i * 37 + 11) % 100
        printf("{\"instruction\": \"%d\", \"response\": \"%s\"}\n", n, n % 2 ? "odd" : "even") > "data/parity.jsonl"
    }
}'
echo "== three datasets of 64 lines: greet (any name -> hi!), last (last letter), parity; e.g."
head -n1 data/greet.jsonl data/last.jsonl data/parity.jsonl | grep '^{' | sed 's/^/   /'
all="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
cat > adapters.toml <<TOML
batch_size = 8
[[adapter]]
data = "data/greet.jsonl"
output = "out/greet"
label = "greet"
rank = 8
targets = "$all"
learning_rate = 3e-2

[[adapter]]
data = "data/last.jsonl"
output = "out/last"
label = "last"
rank = 16
targets = "$all"
learning_rate = 3e-2

[[adapter]]
data = "data/parity.jsonl"
output = "out/parity"
label = "parity"
rank = 16
targets = "$all"
learning_rate = 3e-2
TOML
echo; echo "== tandem finetune tiny --adapters-config adapters.toml   (3 adapters fused, CPU)"
start=$(date +%s%N)
"$TANDEM" finetune tiny --adapters-config adapters.toml --device cpu --epochs 12 --max-seq-len 64 \
    --chat-template none --lr-schedule constant --log-every 16 --save-every 0 --val-split 0
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN { printf "== trained in %.1f s\n", ns / 1e9 }'
echo; echo "== each OUT_DIR holds a PEFT adapter + run records:"
ls out/greet | sed 's/^/   /'
echo; echo "== training loss, first and last logged (metrics.jsonl):"
for a in greet last parity; do
    printf "   %-8s %s -> %s\n" "$a" \
        "$(jq -s '[.[] | select(.loss)] | first.loss * 1000 | round / 1000' out/$a/metrics.jsonl)" \
        "$(jq -s '[.[] | select(.loss)] | last.loss * 1000 | round / 1000' out/$a/metrics.jsonl)"
done
report=${TANDEM_DEMO_REPORT:-/tmp/tandem-demo-report.html}
echo; echo "== tandem report out -o $report   (loss curves + leaderboard, one offline HTML page;"
echo "   the same values are in out/*/runs/ for tensorboard --logdir out)"
"$TANDEM" report out -o "$report" | sed 's/^/   /'
echo; echo "== tandem generate: greedy answers to prompts NOT in the data, bare base vs adapter"
echo "   (one run: the three adapters and the base side by side, one batch, KV cache)"
printf "   %-8s %-8s %-9s %-22s %s\n" adapter prompt expected "base model" "with the adapter"
HELD='greet|fiji|hi!
greet|ceded|hi!
last|bead|d
last|jihg|g
parity|56|even
parity|37|odd'
: >held-out.jsonl
while IFS='|' read -r a prompt want; do
    if grep -qF "\"instruction\": \"$prompt\"" "data/$a.jsonl"; then
        echo "demo: '$prompt' is in data/$a.jsonl, not held out" >&2; exit 1
    fi
    jq -cn --arg p "$prompt" --arg a "$a" '{prompt: $p, adapter: $a}, {prompt: $p, adapter: "base"}' >>held-out.jsonl
done <<<"$HELD"
"$TANDEM" generate tiny --device cpu --chat-template none --file held-out.jsonl --max-new-tokens 8 \
    --adapter greet=out/greet --adapter last=out/last --adapter parity=out/parity --json >answers.jsonl ||
    exit 1
ok=0 n=0 i=0
while IFS='|' read -r a prompt want; do
    base=$(jq -s ".[$((2 * i + 1))].text" answers.jsonl) tuned=$(jq -s ".[$((2 * i))].text" answers.jsonl)
    i=$((i + 1)); n=$((n + 1)); mark="wrong"; [ "$tuned" = "\"$want\"" ] && { mark="right"; ok=$((ok + 1)); }
    printf "   %-8s %-8s %-9s %-22s %s (%s)\n" "$a" "$prompt" "$want" "$base" "$tuned" "$mark"
done <<<"$HELD"
echo "   $ok of $n right with the adapters (the base model has random weights: its answers are noise)"
echo; echo "== tandem eval: mean loss on each dataset, bare base vs its adapter"
for a in greet last parity; do
    base=$("$TANDEM" eval tiny --device cpu --chat-template none --data data/$a.jsonl --json | jq '.loss * 1000 | round / 1000')
    tuned=$("$TANDEM" eval tiny --device cpu --chat-template none --data data/$a.jsonl --adapter out/$a --json | jq '.loss * 1000 | round / 1000')
    printf "   %-8s base %s  with adapter %s\n" "$a" "$base" "$tuned"
done
echo
"$here/demo-gpu-sharing.sh" "$TANDEM"
