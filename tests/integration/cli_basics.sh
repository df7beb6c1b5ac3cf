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
finish
