# adapters.toml keys for how an adapter's data is read (docs/adapters-toml.md): task,
# chat_template, train_on_prompt, skip_bad_lines and no_shuffle, per [[adapter]] row. One run
# (alone, --no-join; the join is integration.cotrain_toml) trains three rows of the tiny model:
# p with every key set, q with none (same data), s with skip_bad_lines on a file with a bad line.
# Each equals the same adapter trained alone with the matching flags (within 1e-3 relative, and
# the same loss-token count at every step), p's counts differ from q's in the same process, and
# no_shuffle gives the file order (the tiny tokenizer's counts: one per character + the end
# token). A row without skip_bad_lines fails with FILE:LINE of its own file while the row with it
# is skipped, the key beating the flag and the file's default; a wrong word is FILE:LINE:COL.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 4 # reverse 4, upper 2, add 6 lines
cd "$WORK" || exit 1
bad_line='{"instruction": "reverse: ab"}' # valid JSON, no response: a bad training line
{ head -2 data/reverse.jsonl; echo "$bad_line"; tail -2 data/reverse.jsonl; } >data/bad1.jsonl
{ head -1 data/add.jsonl; echo "$bad_line"; tail -5 data/add.jsonl; } >data/bad2.jsonl
FT=("$TANDEM" finetune "$M" --method lora --batch-size 1 --val-split 0 --log-every 1
    --max-seq-len 64 --device cpu --no-join --epochs 2)
tokens() { jq -c .tokens "$1/metrics.jsonl" | tr '\n' ' '; }

mkdir -p run
cat >run/adapters.toml <<EOF
[[adapter]]
label = "p"
data = "../data/reverse.jsonl"
output = "p"
task = "instruct"
chat_template = "none"
train_on_prompt = true
no_shuffle = true
[[adapter]]
label = "q"
data = "../data/reverse.jsonl"
output = "q"
[[adapter]]
label = "s"
data = "../data/bad1.jsonl"
output = "s"
skip_bad_lines = true
no_shuffle = true
EOF
# the references: each adapter alone, its keys as flags
"${FT[@]}" --adapter data/reverse.jsonl:ref/p --chat-template none --train-on-prompt --no-shuffle \
    >refp.out 2>refp.err &
refp=$!
"${FT[@]}" --adapter data/reverse.jsonl:ref/q >refq.out 2>refq.err &
refq=$!
"${FT[@]}" --adapter data/bad1.jsonl:ref/s --skip-bad-lines --no-shuffle >refs.out 2>refs.err &
refs=$!
expect_exit 0 "${FT[@]}" --adapters-config run/adapters.toml
wait $refp || { fail "reference p exited $?"; sed 's/^/  /' refp.err >&2; }
wait $refq || { fail "reference q exited $?"; sed 's/^/  /' refq.err >&2; }
wait $refs || { fail "reference s exited $?"; sed 's/^/  /' refs.err >&2; }

for a in p q s; do
    close_adapters ref/$a run/$a >/dev/null || fail "run/$a differs from training it alone with its flags"
    [ "$(tokens ref/$a)" = "$(tokens run/$a)" ] ||
        fail "run/$a: loss tokens $(tokens run/$a), alone with its flags $(tokens ref/$a)"
done
# p's keys reached p only: no chat template and the prompt in the loss make more tokens
[ "$(tokens run/p)" != "$(tokens run/q)" ] || fail "p and q trained on the same tokens: $(tokens run/p)"
sum() { tr ' ' '\n' | awk '{s += $1} END {print s + 0}'; }
[ "$(tokens run/p | sum)" -gt "$(tokens run/q | sum)" ] || fail "p: the prompt is not in its loss"
# no_shuffle: the file order, every epoch (s: its four good lines; q shuffles)
order() { jq -r 'select(.response) | .response | length + 1' "$1" | tr '\n' ' '; }
[ "$(tokens run/s)" = "$(order data/bad1.jsonl)$(order data/bad1.jsonl)" ] ||
    fail "s: loss tokens $(tokens run/s), not the file order $(order data/bad1.jsonl)(x2)"
[ "$(tokens run/q)" != "$(order data/reverse.jsonl)$(order data/reverse.jsonl)" ] ||
    fail "q was not shuffled (the file order could not be told apart)"

# skip_bad_lines is per row: the row without it fails with its own FILE:LINE, the other is skipped
check_bad() { # WHAT: the last run failed on bad2.jsonl:2 only
    grep -q 'bad2.jsonl:2: ' "$WORK/last.err" || fail "$1: no bad2.jsonl:2 error"
    ! grep -q 'bad1.jsonl' "$WORK/last.err" || fail "$1: bad1.jsonl reported though skipped"
    grep -q 'skip_bad_lines = true' "$WORK/last.err" || fail "$1: the message does not name the key"
    [ ! -e "$2" ] || fail "$1: $2 was written"
}
mkdir -p bad
cat >bad/adapters.toml <<EOF
skip_bad_lines = true
[[adapter]]
data = "../data/bad1.jsonl"
output = "b1"
[[adapter]]
data = "../data/bad2.jsonl"
output = "b2"
skip_bad_lines = false
EOF
expect_exit 1 "${FT[@]}" --adapters-config bad/adapters.toml
check_bad "the row's false over the file's default" bad/b1/adapter_model.safetensors
sed -i '/^skip_bad_lines = true$/d' bad/adapters.toml # now the flag gives row 1 its skip
expect_exit 1 "${FT[@]}" --adapters-config bad/adapters.toml --skip-bad-lines
check_bad "the row's false over --skip-bad-lines" bad/b1/adapter_model.safetensors

# a wrong word or type: FILE:LINE:COL and the accepted words, before anything trains
printf '[[adapter]]\ndata = "../data/reverse.jsonl"\noutput = "w"\nchat_template = "chatm"\n' >bad/adapters.toml
expect_exit 2 "${FT[@]}" --adapters-config bad/adapters.toml
grep -q "bad/adapters.toml:4:17: chat_template: unknown chat template 'chatm' (use chatml, llama3 or none)" \
    "$WORK/last.err" || { fail "chat_template word"; sed 's/^/  /' "$WORK/last.err" >&2; }
printf '[[adapter]]\ndata = "../data/reverse.jsonl"\noutput = "w"\nno_shuffle = "yes"\n' >bad/adapters.toml
expect_exit 2 "${FT[@]}" --adapters-config bad/adapters.toml
grep -q 'bad/adapters.toml:4:14: no_shuffle must be true or false, not a string' "$WORK/last.err" ||
    { fail "no_shuffle type"; sed 's/^/  /' "$WORK/last.err" >&2; }

# a data file that does not exist: the error starts with FILE:LINE of that row's data key
printf '[[adapter]]\ndata = "../data/reverse.jsonl"\noutput = "w1"\n\n[[adapter]]\n# two\ndata = "../data/nothere.jsonl"\noutput = "w2"\n' >bad/adapters.toml
expect_exit 1 "${FT[@]}" --adapters-config bad/adapters.toml
grep -q '^tandem: bad/adapters.toml:7: bad/../data/nothere.jsonl: cannot open: No such file or directory$' "$WORK/last.err" ||
    { fail "missing data file"; sed 's/^/  /' "$WORK/last.err" >&2; }
[ -e bad/w1 ] || [ -e bad/w2 ] && fail "missing data file: an OUT_DIR was written"
finish
