# tok/s counts every token trained (prompt, template and response: the sequences' whole length
# after truncation), not only the loss's counted tokens (docs/finetune.md "Progress"): at the
# last metrics.jsonl line of a one-epoch run without validation, tokens_per_sec x elapsed_ms is
# the training split's tokens as `data check` counts them, and well above its counted tokens.
# The progress line's tok/s is the same figure.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
expect_exit 0 "$TANDEM" data check data/reverse.jsonl --model "$M" --val-split 0 --json
tokens=$(jq .train.tokens "$WORK/last.out")
counted=$(jq .train.counted "$WORK/last.out")
[ "$tokens" -gt $((counted * 2)) ] || fail "test data: $tokens tokens, $counted counted: too close to tell apart"
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:out/r --epochs 1 --batch-size 2 \
    --val-split 0 --log-every 1 --device cpu --no-join
last=$(tail -n 1 out/r/metrics.jsonl)
trained=$(jq '.tokens_per_sec * .elapsed_ms / 1000' <<<"$last")
jq -e --argjson t "$tokens" '(.tokens_per_sec * .elapsed_ms / 1000) as $n |
                            ($n > $t * 0.99) and ($n < $t * 1.01)' <<<"$last" >/dev/null ||
    fail "tokens_per_sec x elapsed = $trained, want the $tokens tokens trained (counted: $counted)"
# the last log line shows the same rate (taken a moment apart: within 5 %)
shown=$(grep -o '[0-9]* tok/s' "$WORK/last.out" | tail -n 1 | cut -d' ' -f1)
jq -e --argjson s "${shown:-0}" '.tokens_per_sec as $r | ($s > $r * 0.95) and ($s < $r * 1.05 + 1)' \
    <<<"$last" >/dev/null || fail "the last log line shows ${shown:-no} tok/s, metrics.jsonl $(jq .tokens_per_sec <<<"$last")"
finish
