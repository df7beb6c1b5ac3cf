# `tandem data check`: summary (text and --json), bad lines (FILE:LINE: reason, 20 then a count,
# exit 1), --skip-bad-lines, truncation, chat template override, split independent of line order,
# data hash = sha256sum, usage errors. Uses the tiny model of `init-model` (no download).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }

cat >"$WORK/good.jsonl" <<'JSONL'
{"instruction": "Hi", "output": "Yo"}
{"instruction": "Add", "input": "1+1", "output": "2", "id": 7}

{"instruction": "Q", "response": "A", "system": "S"}
{"prompt": "P", "completion": "C"}
{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}
{"text": "hello"}
{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}
JSONL
expect_exit 0 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --val-split 0
grep -q "^samples: 7 (alpaca 2, instruct 1, completion 1, chat 1, text 1, tokens 1)$" "$WORK/last.out" \
    || fail "summary formats: $(cat "$WORK/last.out")"
grep -q "^chat template: chatml; eos: <|im_end|> (258)$" "$WORK/last.out" || fail "template line"
grep -q "(1 blank, 0 bad)" "$WORK/last.out" || fail "blank lines"
# tokens by hand (tiny tokenizer: one token per byte; a ChatML turn is len(role) + len(content) + 4):
# alpaca 25 + 30, instruct 34, completion 3, chat 23, text 6, tokens 3 = 124;
# counted (labels after the shift): 3 + 2 + 2 + 2 + 2 + 5 + 2 = 18
expect_exit 0 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --val-split 0 --json
[ "$(jq -r '.tokens' "$WORK/last.out")" = 124 ] || fail "tokens: $(jq .tokens "$WORK/last.out")"
[ "$(jq -r '.counted_tokens' "$WORK/last.out")" = 18 ] || fail "counted: $(jq .counted_tokens "$WORK/last.out")"
want_hash="sha256:$(sha256sum "$WORK/good.jsonl" | cut -d' ' -f1)"
[ "$(jq -r '.data_hash' "$WORK/last.out")" = "$want_hash" ] || fail "data hash"

# ShareGPT "conversations" (from/value, human/gpt/system) is chat data: the same conversations
# as "messages" lines give the same summary, tokens, counted tokens and split; a bad role is a
# FILE:LINE reason naming ShareGPT's roles
cat >"$WORK/openai.jsonl" <<'JSONL'
{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}
{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}, {"role": "assistant", "content": "w"}]}
JSONL
cat >"$WORK/sharegpt.jsonl" <<'JSONL'
{"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}], "id": "c1"}
{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}, {"from": "human", "value": "z"}, {"from": "gpt", "value": "w"}]}
JSONL
expect_exit 0 "$TANDEM" data check "$WORK/sharegpt.jsonl" --model "$M" --val-split 0.5 --json
sg=$(jq -c '[.samples, .formats.chat, .tokens, .counted_tokens, .train, .validation]' "$WORK/last.out")
expect_exit 0 "$TANDEM" data check "$WORK/openai.jsonl" --model "$M" --val-split 0.5 --json
oa=$(jq -c '[.samples, .formats.chat, .tokens, .counted_tokens, .train, .validation]' "$WORK/last.out")
[ "$sg" = "$oa" ] || fail "ShareGPT differs from the same messages: $sg vs $oa"
[ "$(jq -c '[.samples, .formats.chat, .train.samples, .validation.samples]' "$WORK/last.out")" = '[2,2,1,1]' ] ||
    fail "messages summary: $oa"
expect_exit 0 "$TANDEM" data check "$WORK/sharegpt.jsonl" --model "$M" --val-split 0
grep -q "^samples: 2 (.*chat 2" "$WORK/last.out" || fail "ShareGPT not counted as chat: $(cat "$WORK/last.out")"
printf '%s\n' '{"conversations": [{"from": "user", "value": "u"}, {"from": "gpt", "value": "a"}]}' \
    >"$WORK/sharegpt-bad.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/sharegpt-bad.jsonl" --model "$M"
grep -q 'sharegpt-bad.jsonl:1: conversations\[0\].from "user" is not system, human or gpt' "$WORK/last.err" "$WORK/last.out" ||
    fail "ShareGPT bad role: $(cat "$WORK/last.err")"

# truncation: 10 tokens keep the beginning; the templated samples (lines 1, 2, 4, 6; 25, 30, 34 and
# 23 tokens) lose 72 tokens, their responses with them, and are dropped
expect_exit 0 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --max-seq-len 10 --json
[ "$(jq -c '[.truncated, .tokens_cut, .dropped_no_loss, .dropped_lines, .samples]' "$WORK/last.out")" \
    = '[4,72,4,[1,2,4,6],3]' ] || fail "truncation: $(jq -c . "$WORK/last.out")"
# train_on_prompt: every templated token counts
expect_exit 0 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --max-seq-len 10 --train-on-prompt --json
[ "$(jq -r '.dropped_no_loss' "$WORK/last.out")" = 0 ] || fail "train-on-prompt keeps all"
# none template changes the token count (no ChatML markup)
expect_exit 0 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --chat-template none --json
[ "$(jq -r '.chat_template' "$WORK/last.out")" = none ] || fail "template override"
[ "$(jq -r '.tokens' "$WORK/last.out")" -lt 124 ] || fail "none is shorter"

# bad lines: 25 of them among good ones -> 20 listed, then a count; nothing loaded; exit 1
: >"$WORK/bad.jsonl"
for i in $(seq 1 50); do
    if [ $((i % 2)) -eq 0 ]; then echo '{"text": 3}' >>"$WORK/bad.jsonl"; else echo '{"text": "ok"}' >>"$WORK/bad.jsonl"; fi
done
expect_exit 1 "$TANDEM" data check "$WORK/bad.jsonl" --model "$M"
[ "$(grep -c "^$WORK/bad.jsonl:[0-9]*: \"text\" must be a string, not an integer$" "$WORK/last.err")" = 20 ] \
    || fail "20 bad lines listed: $(cat "$WORK/last.err")"
grep -q "^$WORK/bad.jsonl:2: " "$WORK/last.err" || fail "first bad line is line 2"
grep -q "^\.\.\. and 5 more bad lines$" "$WORK/last.err" || fail "count of the rest"
[ ! -s "$WORK/last.out" ] || fail "no summary when failing"
expect_exit 0 "$TANDEM" data check "$WORK/bad.jsonl" --model "$M" --skip-bad-lines --json
[ "$(jq -c '[.samples, .bad_lines]' "$WORK/last.out")" = '[25,25]' ] || fail "skip-bad-lines"
grep -q "and 5 more bad lines" "$WORK/last.err" || fail "skipped lines still reported"

# invalid JSON and invalid UTF-8 carry a column
printf '{"text": "a"}\n{"text": "a" x}\n{"text": "\xff"}\n' >"$WORK/col.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/col.jsonl" --model "$M"
grep -q "^$WORK/col.jsonl:2:14: invalid JSON: " "$WORK/last.err" || fail "json column: $(cat "$WORK/last.err")"
grep -q "^$WORK/col.jsonl:3:11: invalid UTF-8$" "$WORK/last.err" || fail "utf-8 column: $(cat "$WORK/last.err")"

# the split depends on content and seed, not on line order
for i in $(seq 1 200); do echo "{\"text\": \"sample $i\"}"; done >"$WORK/many.jsonl"
tac "$WORK/many.jsonl" >"$WORK/rev.jsonl"
expect_exit 0 "$TANDEM" data check "$WORK/many.jsonl" --model "$M" --val-split 0.3 --seed 5 --json
a=$(jq -c '[.train, .validation]' "$WORK/last.out")
expect_exit 0 "$TANDEM" data check "$WORK/rev.jsonl" --model "$M" --val-split 0.3 --seed 5 --json
b=$(jq -c '[.train, .validation]' "$WORK/last.out")
[ "$a" = "$b" ] || fail "split depends on order: $a vs $b"
v=$(jq -r '.validation.samples' "$WORK/last.out")
[ "$v" -gt 30 ] && [ "$v" -lt 90 ] || fail "val fraction: $v of 200"
expect_exit 0 "$TANDEM" data check "$WORK/many.jsonl" --model "$M" --val-split 0.3 --seed 6 --json
[ "$(jq -c '[.train, .validation]' "$WORK/last.out")" != "$a" ] || fail "seed changes the split"

# a file with no training sample fails, saying why and which option to change: a completion cut
# off by --max-seq-len (raise it), every sample in validation (lower --val-split), a sample with no
# counted token even uncut, an empty file
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' >"$WORK/one.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/one.jsonl" --model "$M" --max-seq-len 3
grep -q "one.jsonl: no training sample (0 samples, 0 for validation): 1 sample(s) lost every token counted in the loss (their completion) when cut to --max-seq-len 3 tokens: raise --max-seq-len (the longest sample has 25 tokens)$" \
    "$WORK/last.err" || fail "no training sample, cut: $(cat "$WORK/last.err")"
echo '{"text": "hello"}' >"$WORK/val.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/val.jsonl" --model "$M" --val-split 0.99
grep -q "val.jsonl: no training sample (1 samples, 1 for validation): all 1 sample(s) went to validation (--val-split 0.99): lower --val-split$" \
    "$WORK/last.err" || fail "no training sample, validation: $(cat "$WORK/last.err")"
{ echo '{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}'; cat "$WORK/val.jsonl" "$WORK/one.jsonl"; } >"$WORK/mixed.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/mixed.jsonl" --model "$M" --max-seq-len 3 --val-split 0.99
grep -q "mixed.jsonl: no training sample (1 samples, 1 for validation): 1 sample(s) lost .* --max-seq-len 3 tokens: raise --max-seq-len (the longest sample has 25 tokens); 1 sample(s) have no token counted in the loss even uncut (a single token, or every label -100): fix them (\`tandem data check\` lists their lines); the other 1 sample(s) went to validation (--val-split 0.99): lower --val-split$" \
    "$WORK/last.err" || fail "no training sample, mixed: $(cat "$WORK/last.err")"
: >"$WORK/empty.jsonl"
expect_exit 1 "$TANDEM" data check "$WORK/empty.jsonl" --model "$M"
grep -q "empty.jsonl: no training sample (0 samples, 0 for validation): the file has no sample (0 lines: 0 blank, 0 bad)$" \
    "$WORK/last.err" || fail "no training sample, empty: $(cat "$WORK/last.err")"

# usage and file errors
expect_exit 2 "$TANDEM" data check "$WORK/good.jsonl"
grep -q "^tandem: data check: --model MODEL_DIR is required: the samples are tokenized with its tokenizer" \
    "$WORK/last.err" || fail "no --model message: $(cat "$WORK/last.err")"
grep -q "^usage: tandem data check" "$WORK/last.err" || fail "no usage after the --model message"
expect_exit 2 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --chat-template jinja
expect_exit 2 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --val-split 1
expect_exit 2 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --max-seq-len 0
expect_exit 2 "$TANDEM" data check "$WORK/good.jsonl" --model "$M" --bogus
expect_exit 1 "$TANDEM" data check "$WORK/absent.jsonl" --model "$M"
grep -q "absent.jsonl: cannot open" "$WORK/last.err" || fail "missing file message"
expect_exit 0 "$TANDEM" data check --help
finish
