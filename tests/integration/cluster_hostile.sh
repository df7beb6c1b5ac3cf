#!/bin/bash
# Hostile names end to end through real ssh: arguments and file names with spaces, quotes,
# $(...), backticks, ;, newlines and globs reach the node byte-exact (as argv and through
# rsync), and nothing in them is executed (the canary files are never created).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster

# Canary names are relative: were anything executed, it would run in the remote shell's
# directory (HOME) or the job's (the node's workdir); all of these are checked at the end.
K="tandem-canary-$$"
HOSTILE="a b 'q' \"d\" \$(touch $K-1) \`touch $K-2\`; touch $K-3 & * ? [x] \\ |
second line \$HOME"
HOSTILE_FILE="$HOSTILE"                         # newline, glob, quotes, no slash
HOSTILE_DATA="${HOSTILE//$'\n'/ }"              # adapters.toml paths refuse control characters

# 1. As an argument of a remote command: printf writes each argument on its own record.
expect_exit 0 "$TANDEM" cluster run --cluster "$CLUSTER" --node n2 -- printf '%s\0' "$HOSTILE" "--x" ""
id=$(cat "$WORK/last.out")
expect_exit 0 "$TANDEM" cluster watch --interval 0.2 --until-done
printf '%s\0' "$HOSTILE" "--x" "" >"$WORK/expected"
cmp -s "$WORK/expected" "$W2/jobs/$id/log" || fail "arguments not byte-exact on the node"

# 2. As a file name created on the node (workdir with a quote and a space, too).
expect_exit 0 "$TANDEM" cluster run --cluster "$CLUSTER" --node n2 -- touch "$W2/$HOSTILE_FILE"
expect_exit 0 "$TANDEM" cluster watch --interval 0.2 --until-done
[ -f "$W2/$HOSTILE_FILE" ] || fail "file with the hostile name not created byte-exact"

# 3. As a data file name staged by submit (rsync) and written into the node's adapters.toml.
"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
mkdir -p "$WORK/in"
printf '{"text": "hello"}\n' >"$WORK/in/$HOSTILE_DATA.jsonl"
# (jq's JSON string escapes are valid TOML basic-string escapes)
esc=$(jq -n --arg s "in/$HOSTILE_DATA.jsonl" '$s')
printf '[[adapter]]\ndata = %s\noutput = "out/one"\nlabel = "one"\n' "$esc" >"$WORK/adapters.toml"
expect_exit 0 "$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" --stage-only --max-seq-len 64 --batch-size 1
staged=$(find "$W1/data" "$W2/data" -type f -name '*.jsonl' 2>/dev/null | head -1)
[ -n "$staged" ] || fail "data not staged: $(cat "$WORK/last.out" "$WORK/last.err")"
found=0
for f in "$W1"/data/*/* "$W2"/data/*/*; do
    [ "$(basename "$f")" = "$HOSTILE_DATA.jsonl" ] && cmp -s "$f" "$WORK/in/$HOSTILE_DATA.jsonl" && found=1
done
[ "$found" = 1 ] || fail "staged data file name not byte-exact"
toml=$(find "$W1/jobs" "$W2/jobs" -name adapters.toml 2>/dev/null | head -1)
grep -qF 'touch' "$toml" || fail "adapters.toml lacks the data path"

for d in "$HOME" "$W1" "$W2" "$WORK" "$PWD"; do
    for i in 1 2 3; do [ -e "$d/$K-$i" ] && fail "canary $d/$K-$i created: something was executed"; done
done
finish
