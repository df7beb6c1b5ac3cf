# A FIFO (or any non-regular file) given where tandem reads a file must be refused at once, naming
# the file, instead of blocking forever waiting for a writer (issue 13, item 9): the model's
# config.json, model.safetensors and tokenizer.json, a JSONL dataset and an adapters.toml, through
# `tandem finetune` (and the dataset through `tandem data check`). Each command runs under
# `timeout 10`: a blocked read would end with 124, not the expected exit 1.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cd "$WORK" || exit 1
printf '%s\n' '{"text": "hello"}' '{"text": "world"}' >good.jsonl

# refused CODE FILE CMD...: CMD exits CODE within 10 s and its stderr names FILE as not a regular
# file.
refused() {
    local want=$1 file=$2; shift 2
    expect_exit "$want" timeout 10 "$@"
    grep -qF "$file: not a regular file (a FIFO)" "$WORK/last.err" ||
        fail "$file not named as a FIFO: $(cat "$WORK/last.err")"
}

# the model directory with one of its files replaced by a FIFO
for f in config.json model.safetensors tokenizer.json; do
    d="$WORK/model-${f%%.*}"
    cp -r "$M" "$d"
    rm "$d/$f"
    mkfifo "$d/$f"
    refused 1 "$d/$f" "$TANDEM" finetune "$d" --adapter good.jsonl:"out-${f%%.*}" --device cpu \
       
    [ ! -e "out-${f%%.*}" ] || fail "$f: output written although the model was refused"
done

# the dataset
mkfifo data.fifo
refused 1 "data.fifo" "$TANDEM" finetune "$M" --adapter data.fifo:out-data --device cpu
refused 1 "data.fifo" "$TANDEM" data check data.fifo --model "$M"

# adapters.toml
mkfifo adapters.toml
refused 1 "adapters.toml" "$TANDEM" finetune "$M" --adapters-config adapters.toml --device cpu \
   

# a directory and a character device are refused the same way, naming their kind
mkdir dir.jsonl
expect_exit 1 timeout 10 "$TANDEM" data check dir.jsonl --model "$M"
grep -qF "dir.jsonl: not a regular file (a directory)" "$WORK/last.err" ||
    fail "directory: $(cat "$WORK/last.err")"
expect_exit 1 timeout 10 "$TANDEM" data check /dev/zero --model "$M"
grep -qF "/dev/zero: not a regular file (a character device)" "$WORK/last.err" ||
    fail "/dev/zero: $(cat "$WORK/last.err")"

# and the regular files still load
expect_exit 0 timeout 60 "$TANDEM" data check good.jsonl --model "$M"
finish
