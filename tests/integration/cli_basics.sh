#!/bin/bash
# The command line's contract: --help at every level, exit code 2 for usage errors.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

expect_exit 0 "$TANDEM" --help
expect_exit 0 "$TANDEM" --version
expect_exit 0 "$TANDEM" version
expect_exit 2 "$TANDEM"
expect_exit 2 "$TANDEM" no-such-command
"$TANDEM" --help | grep -q "version" || fail "top-level help does not list commands"
# a flag the usage line names as required is not listed again among the optional ones (the
# synopsis: the lines before the first blank one)
synopsis() { "$TANDEM" "$1" --help | sed '/^$/q'; }
[ "$(synopsis eval | grep -o -- '--data FILE' | wc -l)" = 1 ] || fail "eval --help: --data FILE not once: $(synopsis eval)"
[ "$(synopsis finetune | grep -o -- '--adapters-config FILE.toml' | wc -l)" = 1 ] ||
    fail "finetune --help: --adapters-config not once: $(synopsis finetune)"
"$TANDEM" eval --help | grep -q "^  --data  *the JSONL data to measure (required)$" || fail "eval --help: no --data help line"
finish
