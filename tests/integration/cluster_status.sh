#!/bin/bash
# tandem cluster status / run / watch against real sshd nodes on 127.0.0.2 and 127.0.0.3: two
# reachable nodes and one on a closed port (reported, not fatal); a detached job outlives its
# SSH session, finishes and is seen finished; a job killed mid-run is marked failed with its log
# tail; watch --until-done returns 1 then; the registry holds one JSON file per job.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster dead

expect_exit 0 "$TANDEM" cluster status --cluster "$CLUSTER"
grep -q '^n1 .*reachable  tandem' "$WORK/last.out" || fail "n1 not reachable: $(cat "$WORK/last.out")"
grep -q 'GPU-n1-0' "$WORK/last.out" || fail "n1's live GPU missing"
grep -q '^n2 .*reachable' "$WORK/last.out" || fail "n2 not reachable"
grep -q 'no GPU (CPU-only node)' "$WORK/last.out" || fail "n2 should be CPU-only"
grep -q '^dead .*UNREACHABLE: .*refused' "$WORK/last.out" || fail "dead node not reported with its reason"

expect_exit 0 "$TANDEM" cluster status --cluster "$CLUSTER" --json
jq -e '.nodes | length == 3' "$WORK/last.out" >/dev/null || fail "--json: three nodes"
jq -e '.jobs | type == "array"' "$WORK/last.out" >/dev/null || fail "--json: jobs array"
jq -e '.nodes[0].reachable and .nodes[0].tandem_version == "0.1.0"' "$WORK/last.out" >/dev/null \
    || fail "--json: n1 version"
jq -e '.nodes[0].gpu_status.gpus[0].uuid == "GPU-n1-0" and .nodes[0].gpu_status.gpus[0]["memory.free"] == 24564' \
    "$WORK/last.out" >/dev/null || fail "--json: n1 live GPU state"
jq -e '.nodes[0].cpu_cores > 0 and .nodes[0].ram_total_mb > 0' "$WORK/last.out" >/dev/null \
    || fail "--json: cores and RAM"
jq -e '(.nodes[2].reachable | not) and (.nodes[2].reason | test("refused"))' "$WORK/last.out" \
    >/dev/null || fail "--json: dead node"

# A reservation on n1's ledger shows up in its live state (the node's own gpu status).
mkdir -p "$WORK/ledger-n1"
TANDEM_LEDGER_DIR="$WORK/ledger-n1" TANDEM_FAKE_GPUS="uuid=GPU-n1-0,name=NVIDIA GeForce RTX 4090,total_mb=24564,memory=discrete" \
    "$TANDEM" gpu run --vram 4 --task holder -- sleep 30 &
holder=$!
wait_until 10 sh -c "TANDEM_LEDGER_DIR='$WORK/ledger-n1' TANDEM_FAKE_GPUS='uuid=GPU-n1-0,name=x,total_mb=24564,memory=discrete' '$TANDEM' gpu status --json | jq -e '.gpus[0].reservations | length == 1'"
expect_exit 0 "$TANDEM" cluster status --cluster "$CLUSTER" --json
jq -e '.nodes[0].gpu_status.gpus[0].reservations[0].task == "holder"' "$WORK/last.out" >/dev/null \
    || fail "n1's reservation not in cluster status"
kill "$holder"; wait "$holder" 2>/dev/null

# A detached job: started over SSH, it keeps running after the session ends, then finishes.
expect_exit 0 "$TANDEM" cluster run --cluster "$CLUSTER" --node n1 -- sh -c 'echo hello; sleep 1; echo bye'
ok_id=$(cat "$WORK/last.out")
[ -f "$XDG_STATE_HOME/tandem/jobs/$ok_id.json" ] || fail "no registry record for $ok_id"
jq -e '.state == "running" and .kind == "command" and .node.name == "n1" and (.pid > 0)' \
    "$XDG_STATE_HOME/tandem/jobs/$ok_id.json" >/dev/null || fail "registry record fields"
[ -f "$W1/jobs/$ok_id/pid" ] || fail "no pid file on the node"
pgrep -f 'sleep 1' >/dev/null || fail "job not running after the ssh session ended"
expect_exit 0 "$TANDEM" cluster watch --interval 0.2 --until-done
grep -q "$ok_id .*finished" "$WORK/last.out" || fail "job not finished: $(cat "$WORK/last.out")"
[ "$(cat "$W1/jobs/$ok_id/exit_code")" = 0 ] || fail "exit code file"
grep -q bye "$W1/jobs/$ok_id/log" || fail "log kept on the node"

# A job killed mid-run (wrapper and all, as a crash or OOM kill would) is failed, with its log.
expect_exit 0 "$TANDEM" cluster run --cluster "$CLUSTER" --node n2 -- sh -c 'echo "epoch 1 loss 2.5"; echo "about to die" >&2; sleep 60'
kill_id=$(cat "$WORK/last.out")
expect_exit 0 "$TANDEM" cluster watch --once
grep -q "$kill_id .*running" "$WORK/last.out" || fail "job should be running"
pid=$(jq .pid "$XDG_STATE_HOME/tandem/jobs/$kill_id.json")
kill -9 -- "-$pid"
expect_exit 1 "$TANDEM" cluster watch --interval 0.2 --until-done
grep -q "$kill_id .*failed .*gone and left no exit code" "$WORK/last.out" || fail "killed job not failed: $(cat "$WORK/last.out")"
grep -q '| about to die' "$WORK/last.out" || fail "log tail not shown"
jq -e '.state == "failed" and (.log_tail | test("epoch 1 loss 2.5"))' \
    "$XDG_STATE_HOME/tandem/jobs/$kill_id.json" >/dev/null || fail "registry: failed with log tail"

# A command that exits non-zero is failed with its code.
expect_exit 0 "$TANDEM" cluster run --cluster "$CLUSTER" --node n2 -- sh -c 'exit 3'
expect_exit 1 "$TANDEM" cluster watch --interval 0.2 --until-done
grep -q "failed .*exited with code 3" "$WORK/last.out" || fail "exit code 3 not reported"
expect_exit 0 "$TANDEM" cluster watch --once --submission "$(jq -r .submission "$XDG_STATE_HOME/tandem/jobs/$ok_id.json")"

# An unreachable node does not fail status; unknown node names and options are usage errors.
expect_exit 2 "$TANDEM" cluster run --cluster "$CLUSTER" --node nope -- true
grep -qF "no node 'nope' in $CLUSTER; its nodes: n1, n2, dead" "$WORK/last.err" || fail "unknown node: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" cluster run --cluster "$CLUSTER" --node dead -- true
grep -q 'unreachable' "$WORK/last.err" || fail "launch on dead node: reason"
expect_exit 2 "$TANDEM" cluster status --cluster "$CLUSTER" --bogus
expect_exit 2 "$TANDEM" cluster status --cluster "$WORK/missing.yaml"
grep -q 'missing.yaml: no such file' "$WORK/last.err" || fail "missing cluster file message"
finish
