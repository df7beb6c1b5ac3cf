# `tandem gpu status` of co-training (issue 15 behaviour 9; docs/co-training.md "Live status"):
# real `tandem finetune` processes of the tiny model on the CPU, in this test's own ledger
# directory. While a host and a joiner train:
#  - `gpu status --json` lists one host (the host's pid) with both adapters, the joined one with
#    the joiner's pid and user, steps advancing between two calls, shares summing to 1;
#  - the text view names the joiner; the host's own output shows the joined adapter's progress
#    labelled with the joiner's pid and user;
#  - `--watch` on a pipe prints one snapshot per interval (text and --json) and exits 0 on
#    SIGINT; --interval without --watch and a bad interval are usage errors;
# then both are stopped (Ctrl-C) and the host is no longer listed.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 32
cd "$WORK" || exit 1
ME=$(id -un)
COMMON=(--batch-size 2 --epochs 20 --val-split 0 --log-every 1 --max-seq-len 64 --seed 7
        --device cpu)
status_json() { "$TANDEM" gpu status --json; }
# n_adapters_is N: the one listed host has published N adapters
n_adapters_is() { [ "$(status_json | jq '[.cotrain_hosts[].status.adapters // [] | length] | add // 0')" = "$1" ]; }

expect_exit 2 "$TANDEM" gpu status --interval 1
grep -q -- "--interval only applies with --watch" "$WORK/last.err" || fail "--interval alone: no reason"
expect_exit 2 "$TANDEM" gpu status --watch --interval 0
expect_exit 0 "$TANDEM" gpu status --json
[ "$(jq -c .cotrain_hosts "$WORK/last.out")" = "[]" ] || fail "a host listed before any finetune"

"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:co/reverse "${COMMON[@]}" >host.out 2>host.err &
host=$!
wait_until 60 n_adapters_is 1
"$TANDEM" finetune "$M" --adapter data/add.jsonl:co/add "${COMMON[@]}" >join.out 2>join.err &
joiner=$!
wait_until 60 n_adapters_is 2
s1=$(status_json)
[ "$(jq '.cotrain_hosts | length' <<<"$s1")" = 1 ] || fail "want one host, got: $(jq -c .cotrain_hosts <<<"$s1")"
h=$(jq '.cotrain_hosts[0]' <<<"$s1")
[ "$(jq .pid <<<"$h")" = "$host" ] || fail "the host listed is not pid $host"
[ "$(jq -r .device <<<"$h")" = cpu ] || fail "host device is not cpu"
[ "$(jq -c '.status.adapters[0].joiner' <<<"$h")" = null ] || fail "the host's own adapter has a joiner"
[ "$(jq '.status.adapters[1].joiner.pid' <<<"$h")" = "$joiner" ] || fail "joined adapter: not the joiner's pid $joiner"
[ "$(jq -r '.status.adapters[1].joiner.user' <<<"$h")" = "$ME" ] || fail "joined adapter: not user $ME"
[ "$(jq -r '.status.adapters[1].output' <<<"$h")" = "$WORK/co/add" ] || fail "joined adapter: output"
[ "$(jq -r '[.status.adapters[].state] | join(",")' <<<"$h")" = "training,training" ] ||
    fail "states: $(jq -c '[.status.adapters[].state]' <<<"$h")"
step1=$(jq '.status.adapters[1].step' <<<"$h")
# steps advance: a later call shows the joined adapter further on, and both adapters' shares of
# the passes sum to 1
advanced() { [ "$(status_json | jq ".cotrain_hosts[0].status.adapters[1].step > $step1")" = true ]; }
wait_until 60 advanced
s2=$(status_json)
jq -e '.cotrain_hosts[0].status | (.adapters | map(.share // 0) | add) as $s |
       ($s > 0.99 and $s < 1.01) and (.adapters[0].step > 0) and (.adapters[1].total_steps > 0)' \
    <<<"$s2" >/dev/null || fail "shares or steps wrong: $(jq -c .cotrain_hosts[0].status <<<"$s2")"

# the text view
expect_exit 0 "$TANDEM" gpu status
grep -q "^co-training hosts" "$WORK/last.out" || fail "text: no co-training section"
grep -q "^  pid $host .* cpu " "$WORK/last.out" || fail "text: no line of host $host"
grep -q "\[1\] add .* joiner pid $joiner ($ME)" "$WORK/last.out" || fail "text: the joiner is not named"
grep -q "\[0\] reverse .* own" "$WORK/last.out" || fail "text: the host's adapter is not marked own"

# --watch on a pipe: snapshots per interval; SIGINT ends it with 0
"$TANDEM" gpu status --watch --interval 0.2 >watch.out 2>watch.err &
w=$!
snapshots() { [ "$(grep -c '^co-training hosts' watch.out)" -ge "$1" ]; }
wait_until 30 snapshots 3
kill -INT $w
wait $w
rc=$?
[ $rc -eq 0 ] || fail "gpu status --watch exited $rc after SIGINT, want 0"
grep -q "joiner pid $joiner" watch.out || fail "--watch: the joiner is not named"
"$TANDEM" gpu status --watch --json --interval 0.2 >watch.jsonl 2>watch.err &
w=$!
lines() { [ "$(wc -l <watch.jsonl)" -ge "$1" ]; }
wait_until 30 lines 3
kill -INT $w
wait $w || fail "gpu status --watch --json exited $? after SIGINT"
jq -e -s 'length >= 3 and all(.[]; .cotrain_hosts | length == 1) and
          (.[0].cotrain_hosts[0].status.global_step <= .[-1].cotrain_hosts[0].status.global_step)' \
    watch.jsonl >/dev/null || fail "--watch --json: not one host per line: $(head -c 400 watch.jsonl)"

# the host's own output shows the joined adapter with its joiner
grep -q "^\[add (pid $joiner, $ME)\] epoch " host.out || fail "the host does not show the joined adapter's progress"
grep -q '^\[add\] epoch ' join.out || fail "the joiner does not show its own progress"

kill -INT $joiner
wait $joiner
rc=$?
[ $rc -eq 130 ] || fail "joiner exited $rc after Ctrl-C, want 130"
# handed back: the status says so before the host goes on alone
detached() { [ "$(status_json | jq -r '.cotrain_hosts[0].status.adapters[1].state')" = detached ]; }
wait_until 30 detached
kill -INT $host
wait $host
rc=$?
[ $rc -eq 130 ] || fail "host exited $rc after Ctrl-C, want 130"
expect_exit 0 "$TANDEM" gpu status --json
[ "$(jq -c .cotrain_hosts "$WORK/last.out")" = "[]" ] || fail "the stopped host is still listed"
finish
