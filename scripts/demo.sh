#!/bin/bash
# make run: the main job. Creates the `tiny` random model, writes three small instruct datasets
# with learnable patterns (reverse a word, uppercase a word, add two digits), trains three LoRA
# adapters FUSED on the CPU in one process (different ranks, targets and learning rates), shows
# their losses falling, writes the PEFT adapters and evaluates them against the bare base.
# Then the GPU-sharing demo (scripts/demo-gpu-sharing.sh) on a simulated GPU.
set -eu
TANDEM=${1:-build/tandem}
case $TANDEM in /*) ;; *) TANDEM="$PWD/$TANDEM" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
demo=$(mktemp -d /tmp/tandem-demo-XXXXXX)
trap 'rm -rf "$demo"' EXIT
cd "$demo"

echo "== tandem init-model tiny --preset tiny   (a random Qwen2-shaped model, ~3M parameters)"
"$TANDEM" init-model tiny --preset tiny
"$here/make-demo-data.sh" data 32
echo "== three datasets: $(wc -l < data/reverse.jsonl) x reverse, $(wc -l < data/upper.jsonl) x upper, $(wc -l < data/add.jsonl) x add; e.g."
head -n1 data/reverse.jsonl data/upper.jsonl data/add.jsonl | grep '^{' | sed 's/^/   /'
cat > adapters.toml <<'TOML'
batch_size = 8
[[adapter]]
data = "data/reverse.jsonl"
output = "out/reverse"
label = "reverse"
rank = 8
targets = ["q_proj", "v_proj"]
learning_rate = 1e-2

[[adapter]]
data = "data/upper.jsonl"
output = "out/upper"
label = "upper"
rank = 4
targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
learning_rate = 2e-3
epochs = 8

[[adapter]]
data = "data/add.jsonl"
output = "out/add"
label = "add"
rank = 16
targets = "gate_proj,up_proj,down_proj"
learning_rate = 1e-2
epochs = 2
TOML
echo; echo "== tandem finetune tiny --adapters-config adapters.toml   (3 adapters fused, CPU)"
start=$(date +%s%N)
"$TANDEM" finetune tiny --adapters-config adapters.toml --device cpu --epochs 3 --max-seq-len 64 \
    --lr-schedule constant --log-every 4 --eval-every 8 --save-every 0 --val-split 0.1
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN { printf "== trained in %.1f s\n", ns / 1e9 }'
echo; echo "== each OUT_DIR holds a PEFT adapter + run records:"
ls out/reverse | sed 's/^/   /'
echo; echo "== training loss, first and last logged (metrics.jsonl):"
for a in reverse upper add; do
    printf "   %-8s %s -> %s\n" "$a" \
        "$(jq -s '[.[] | select(.loss)] | first.loss * 1000 | round / 1000' out/$a/metrics.jsonl)" \
        "$(jq -s '[.[] | select(.loss)] | last.loss * 1000 | round / 1000' out/$a/metrics.jsonl)"
done
echo; echo "== tandem eval: loss on each dataset, bare base vs its adapter"
for a in reverse upper add; do
    base=$("$TANDEM" eval tiny --data data/$a.jsonl --json | jq '.loss * 1000 | round / 1000')
    tuned=$("$TANDEM" eval tiny --data data/$a.jsonl --adapter out/$a --json | jq '.loss * 1000 | round / 1000')
    printf "   %-8s base %s  with adapter %s\n" "$a" "$base" "$tuned"
done
echo
"$here/demo-gpu-sharing.sh" "$TANDEM"
