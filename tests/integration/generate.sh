# tandem generate end to end on the tiny random model (CPU): a toy adapter trained for a few
# steps answers a prompt it never saw greedily, the same way twice and not the way the bare base
# does; --json's shape; stop reasons; --file with the adapter and the base side by side in one
# batch gives each the tokens it gives alone, and the KV cache the tokens of --no-cache;
# sampling is repeatable by seed; --messages; the EOS / end-of-turn warning; usage errors exit 2
# naming FILE:LINE, an unreadable adapter or one trained on another base model exits 1 naming
# it.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
"$TANDEM" init-model tiny --preset tiny --init-std 0.1 >/dev/null || { echo "init-model failed"; exit 1; }
for i in $(seq 1 24); do echo "{\"instruction\": \"w$i\", \"response\": \"hi!\"}"; done >greet.jsonl
expect_exit 0 "$TANDEM" finetune tiny --adapter greet.jsonl:out/greet --device cpu --epochs 4 \
    --batch-size 8 --lr 3e-2 --lr-schedule constant --rank 8 \
    --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --chat-template none \
    --save-every 0 --val-split 0
gen() { "$TANDEM" generate tiny --device cpu --chat-template none --prompt "w99" --max-new-tokens 6 --json "$@"; }
tokens() { jq -c '[.adapter, .index, .tokens]' "$@"; }
expect_exit 0 gen --adapter out/greet
cp "$WORK/last.out" tuned1.json
expect_exit 0 gen --adapter out/greet
[ "$(tokens tuned1.json)" = "$(tokens "$WORK/last.out")" ] || fail "greedy output differs between two runs"
expect_exit 0 gen
cp "$WORK/last.out" base.json
jq -e '(.text | type) == "string" and (.tokens | type) == "array" and .prompt_tokens > 0 and
       (.stop | IN("stop_token", "max_tokens", "context_full")) and .prompt == "w99" and
       .adapter == "out/greet" and .index == 0 and .timing.kv_cache == true and
       .timing.prefill_s > 0 and .timing.decode_s >= 0 and .timing.batch_size == 1' tuned1.json >/dev/null ||
    fail "--json shape: $(cat tuned1.json)"
[ "$(jq -c .tokens tuned1.json)" != "$(jq -c .tokens base.json)" ] ||
    fail "the adapter answers like the base: $(cat tuned1.json)"
echo "base: $(jq -c '{text, stop}' base.json)  adapter: $(jq -c '{text, stop}' tuned1.json)"
# at most N new tokens; plain text output is the JSON's text
expect_exit 0 "$TANDEM" generate tiny --chat-template none --prompt "w99" --max-new-tokens 2 --json
[ "$(jq '.tokens | length' "$WORK/last.out")" -le 2 ] || fail "--max-new-tokens 2: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" generate tiny --chat-template none --prompt "w99" --max-new-tokens 6 --adapter out/greet
[ "$(cat "$WORK/last.out")" = "$(jq -r .text tuned1.json)" ] || fail "text output differs from --json's text"
# --file: every line under each adapter, one batch (base and adapter rows in one pass); a line
# that names its adapter runs under that one only
printf '%s\n' '{"prompt": "w99"}' '{"prompt": "w7"}' '{"prompt": "w5", "adapter": "greet"}' \
    '{"prompt": "w5", "adapter": "base"}' >prompts.jsonl
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template none --file prompts.jsonl \
    --adapter greet=out/greet --adapter base --max-new-tokens 6 --json
cp "$WORK/last.out" side.json
[ "$(wc -l <side.json)" = 6 ] || fail "--file with 2 adapters: expected 6 results: $(cat side.json)"
[ "$(jq -c 'select(.index == 0 and .adapter == "greet") | .tokens' side.json)" = "$(jq -c .tokens tuned1.json)" ] ||
    fail "the adapter's answer in a batch differs from its answer alone"
[ "$(jq -c 'select(.index == 0 and .adapter == null) | .tokens' side.json)" = "$(jq -c .tokens base.json)" ] ||
    fail "the base's answer in a batch differs from its answer alone"
[ "$(jq -c 'select(.index >= 2) | .adapter' side.json | tr '\n' ' ')" = '"greet" null ' ] ||
    fail "lines naming their adapter: $(cat side.json)"
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template none --file prompts.jsonl \
    --adapter greet=out/greet --adapter base --max-new-tokens 6 --json --no-cache --batch-size 2
[ "$(tokens side.json)" = "$(tokens "$WORK/last.out")" ] || fail "KV cache and --no-cache differ"
jq -e 'select(.timing.kv_cache) | false' "$WORK/last.out" >/dev/null && fail "--no-cache used the cache"
# sampling: the same seed gives the same answers, another seed others
samp() { "$TANDEM" generate tiny --device cpu --chat-template none --file prompts.jsonl --json \
    --adapter greet=out/greet --adapter base --max-new-tokens 8 --temperature 1.5 --top-k 50 \
    --top-p 0.95 "$@"; }
expect_exit 0 samp --seed 3
tokens "$WORK/last.out" >s3.txt
expect_exit 0 samp --seed 3 --batch-size 1
[ "$(tokens "$WORK/last.out")" = "$(cat s3.txt)" ] || fail "sampling with one seed is not repeatable"
expect_exit 0 samp --seed 4
[ "$(tokens "$WORK/last.out")" != "$(cat s3.txt)" ] || fail "seeds 3 and 4 sample the same answers"
# "ids" lines (the rendered prompt's ids: the tiny byte-level vocabulary maps byte b to id b) give
# what the text gives; --top-logits: each step's best logits, the first being the token taken
printf '%s\n' '{"ids": [119, 57, 57, 10, 10]}' >ids.jsonl
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template none --file ids.jsonl \
    --adapter out/greet --max-new-tokens 6 --json --top-logits 2
[ "$(jq -c .tokens "$WORK/last.out")" = "$(jq -c .tokens tuned1.json)" ] ||
    fail "an ids prompt differs from its text: $(cat "$WORK/last.out") vs $(cat tuned1.json)"
jq -e '.prompt == [119, 57, 57, 10, 10] and .prompt_tokens == 5 and
       (.top | length) == (.tokens | length) + (if .stop == "stop_token" then 1 else 0 end) and
       ([.top[] | length] | unique) == [2] and
       ([range(.tokens | length) as $i | .top[$i][0][0] == .tokens[$i]] | all) and
       ([.top[] | .[0][1] >= .[1][1]] | all)' "$WORK/last.out" >/dev/null ||
    fail "--top-logits / ids: $(cat "$WORK/last.out")"
# --messages: a conversation ending in a user turn
echo '[{"role": "user", "content": "w1"}, {"role": "assistant", "content": "hi!"},
       {"role": "user", "content": "w99"}]' >conv.json
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template none --messages conv.json \
    --adapter out/greet --max-new-tokens 4 --json
jq -e '(.prompt | length) == 3 and .prompt_tokens > 10' "$WORK/last.out" >/dev/null ||
    fail "--messages: $(cat "$WORK/last.out")"
# the template's end of turn is not the tokenizer's EOS: warned, and both stop
mkdir -p tiny-eos && cp tiny/* tiny-eos/ && echo '{"eos_token": "<|endoftext|>"}' >tiny-eos/tokenizer_config.json
expect_exit 0 "$TANDEM" generate tiny-eos --device cpu --chat-template chatml --prompt hi --max-new-tokens 2
grep -q "ends a turn with <|im_end|> (id 258) but the tokenizer's EOS is <|endoftext|>" "$WORK/last.err" ||
    fail "no warning about <|im_end|> vs EOS: $(cat "$WORK/last.err")"
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template chatml --prompt hi --max-new-tokens 2
grep -q "warning" "$WORK/last.err" && fail "a warning where EOS is <|im_end|>: $(cat "$WORK/last.err")"
# usage and runtime errors
expect_exit 2 "$TANDEM" generate tiny
expect_exit 2 "$TANDEM" generate tiny --prompt x --max-new-tokens 0
expect_exit 2 "$TANDEM" generate tiny --prompt x --method fp8
expect_exit 2 "$TANDEM" generate tiny --prompt x --file prompts.jsonl
expect_exit 2 "$TANDEM" generate tiny --prompt x --top-p 0
printf '%s\n' '{"prompt": "a"}' 'not json' >bad.jsonl
expect_exit 2 "$TANDEM" generate tiny --file bad.jsonl
grep -q "bad.jsonl:2" "$WORK/last.err" || fail "a bad line: not named: $(cat "$WORK/last.err")"
echo '{"prompt": "a", "adapter": "nope"}' >bad.jsonl
expect_exit 2 "$TANDEM" generate tiny --file bad.jsonl --adapter out/greet
grep -q "bad.jsonl:1: adapter 'nope'" "$WORK/last.err" || fail "unknown adapter: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" generate tiny --prompt x --top-logits 2
grep -q "needs --json" "$WORK/last.err" || fail "--top-logits without --json: $(cat "$WORK/last.err")"
echo '{"ids": [1, 99999]}' >bad.jsonl
expect_exit 2 "$TANDEM" generate tiny --file bad.jsonl
grep -q 'bad.jsonl:1: "ids"\[1\] = 99999 is outside' "$WORK/last.err" ||
    fail "an id outside the vocabulary: $(cat "$WORK/last.err")"
echo '{"ids": "12"}' >bad.jsonl
expect_exit 2 "$TANDEM" generate tiny --file bad.jsonl
grep -q 'bad.jsonl:1: "ids" must be' "$WORK/last.err" || fail "ids not an array: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" generate tiny --prompt x --adapter "$WORK/no-such-adapter"
grep -q "no-such-adapter" "$WORK/last.err" || fail "missing adapter: message does not name it: $(cat "$WORK/last.err")"
# an adapter trained on another base model (same shapes, other weights) exits 1 as in eval, also
# when a --file line is what names it
"$TANDEM" init-model tiny2 --preset tiny --init-std 0.1 --seed 5 >/dev/null
expect_exit 1 "$TANDEM" generate tiny2 --device cpu --prompt hi --max-new-tokens 4 --adapter out/greet
grep -q "generate: out/greet was trained on another base model than tiny2 (out/greet/metadata.json records base_model_identity" "$WORK/last.err" ||
    fail "another base: $(cat "$WORK/last.err")"
echo '{"prompt": "a", "adapter": "g"}' >named.jsonl
expect_exit 1 "$TANDEM" generate tiny2 --device cpu --file named.jsonl --adapter g=out/greet --adapter base
grep -q "out/greet was trained on another base model" "$WORK/last.err" || fail "another base (--file): $(cat "$WORK/last.err")"
finish
