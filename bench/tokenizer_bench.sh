#!/bin/sh
# Encode speed of `tandem tokenize --file` against Hugging Face `tokenizers` on the same text and
# machine. Prints tokens/s for both (HF: one thread, and encode_batch with all cores; tandem is
# single-threaded). The HF part runs only where `python3 -c 'import tokenizers'` works, the tandem
# part only where TANDEM runs; the generated text is deterministic, so halves run on two machines
# still see the same text.
# Usage: bench/tokenizer_bench.sh [TANDEM] [TOKENIZER_DIR_OR_JSON] [MB]
#   defaults: build/tandem, build/test-tokenizers/qwen3, 20 (MB of generated text)
set -eu
TANDEM=${1:-build/tandem}
TOK=${2:-build/test-tokenizers/qwen3}
MB=${3:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/tandem-tokbench-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[ -e "$TOK" ] || sh "$HERE/../scripts/fetch-test-tokenizers.sh" "$(dirname "$(dirname "$TOK")")"
JSON=$TOK
[ -d "$TOK" ] && JSON="$TOK/tokenizer.json"

python3 "$HERE/tokenizer_bench.py" gen "$WORK/in.jsonl" --mb "$MB"
BYTES=$(wc -c <"$WORK/in.jsonl")
now() { date +%s.%N; }
if "$TANDEM" --version >/dev/null 2>&1; then
    t0=$(now)
    "$TANDEM" tokenize "$JSON" --file "$WORK/in.jsonl" --stats >"$WORK/out.jsonl" 2>"$WORK/stats.txt"
    t1=$(now)
    # stats: pure encode time measured inside tandem; wall: the whole command (load, JSON in/out)
    sed 's/^tokenize stats:/tandem tokenize (1 thread):/' "$WORK/stats.txt"
    awk -v t0="$t0" -v t1="$t1" -v b="$BYTES" 'BEGIN { printf "tandem wall time for the whole command: %.3f s (%.2f MB/s of JSONL)\n", t1 - t0, b / (t1 - t0) / 1e6 }'
else
    echo "tandem: $TANDEM does not run here (not built, or its shared libraries are missing), skipped"
fi
if python3 -c 'import tokenizers' 2>/dev/null; then
    python3 "$HERE/tokenizer_bench.py" hf "$JSON" "$WORK/in.jsonl"
else
    echo "hf-tokenizers: not installed here (pip install tokenizers), skipped"
fi
