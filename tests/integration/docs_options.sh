#!/bin/bash
# The option table (src/run/run_options.c) and the docs list exactly the same options: every
# flag of `tandem finetune` is a row of the "Flags" table of docs/finetune.md, every flag of
# `tandem eval` a row of its "tandem eval" table, every adapters.toml key a row of the key table of
# docs/adapters-toml.md, and nothing else. `--list-options` (hidden) prints the table as
# FLAG<TAB>TOML_KEY<TAB>SUBMIT, "-" for none.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
DOCS="$TANDEM_SOURCE_DIR/docs"

# doc_column FILE HEADING PATTERN: the PATTERN matches in the first column of the first table
# after the line HEADING, sorted and unique.
doc_column() {
    awk -v h="$2" '$0 == h {on = 1; next} on && /^\|/ {t = 1; split($0, c, "|"); print c[2]; next}
                   on && t && !/^\|/ {exit}' "$1" | grep -o -- "$3" | tr -d '` ' | sort -u
}
compare() { # compare WHAT TABLE_LIST DOC_LIST
    if [ "$2" != "$3" ]; then
        fail "$1 differ (< table, > docs): $(diff <(echo "$2") <(echo "$3") | grep '^[<>]' | tr '\n' ' ')"
    fi
}

expect_exit 0 "$TANDEM" finetune --list-options
ft=$(cut -f1 "$WORK/last.out" | grep -v '^-$' | sed 's/^/--/' | sort -u)
keys=$(cut -f2 "$WORK/last.out" | grep -v '^-$' | sort -u)
[ "$(echo "$ft" | wc -l)" -gt 30 ] || fail "finetune --list-options lists too few flags: $ft"
compare "finetune flags" "$ft" "$(doc_column "$DOCS/finetune.md" '## Flags' '--[a-z][a-z-]*')"
compare "adapters.toml keys" "$keys" \
    "$(doc_column "$DOCS/adapters-toml.md" '## Keys of an `[[adapter]]` table' '`[a-z_]*`')"

expect_exit 0 "$TANDEM" eval --list-options
ev=$(cut -f1 "$WORK/last.out" | grep -v '^-$' | sed 's/^/--/' | sort -u)
compare "eval flags" "$ev" "$(doc_column "$DOCS/finetune.md" '## `tandem eval`' '--[a-z][a-z-]*')"

# The comparison can fail: a flag missing from the docs is found.
sed 's/^| `--grad-accum` .*$//' "$DOCS/finetune.md" >"$WORK/finetune.md"
[ "$ft" != "$(doc_column "$WORK/finetune.md" '## Flags' '--[a-z][a-z-]*')" ] ||
    fail "a flag removed from the docs went unnoticed"

# submit passes on exactly the rows marked so, and says which in its help.
expect_exit 0 "$TANDEM" finetune --list-options
passed=$(awk -F'\t' '$3 == "submit" {print "--" $1}' "$WORK/last.out" | sort -u)
expect_exit 0 "$TANDEM" submit --help
compare "submit pass-through flags" "$passed" \
    "$(sed -n '/^finetune flags passed on/,$p' "$WORK/last.out" | grep -o -- '--[a-z-]*' | sort -u)"
finish
