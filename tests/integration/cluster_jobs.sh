#!/bin/bash
# tandem submit --json, cluster logs [--follow] and cluster cancel against a real sshd node: a
# finetune submitted on the CPU prints its job id in the JSON document; `cluster logs` shows its
# log, `--follow` streams it until the job ends; `cluster cancel` sends SIGTERM to the finetune
# (not its wrapper), which checkpoints and exits 143, recorded in the registry, the resume
# command in the log tail it prints (and the finetune's stop report names the adapters.toml's
# OUT_DIR: it printed freed memory before); a second cancel and unknown jobs are handled.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster
# CPU only: n1's simulated GPU is withdrawn (as cluster_e2e does)
sed -i 's/TANDEM_FAKE_GPUS: "uuid=GPU-n1-0[^"]*"/TANDEM_FAKE_GPUS: ""\n      CUDA_VISIBLE_DEVICES: ""/; /gpus:/,/vram_mb/d' "$CLUSTER"
"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cat >"$WORK/adapters.toml" <<'T'
epochs = 100
max_seq_len = 64
batch_size = 2
[[adapter]]
data = "data/reverse.jsonl"
output = "out/r"
label = "r"
T
expect_exit 0 "$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" \
    --val-split 0 --log-every 1 --save-every 100000 --json
doc="$WORK/submit.json"
cp "$WORK/last.out" "$doc"
id=$(jq -r '.jobs[0].id' "$doc")
node=$(jq -r '.jobs[0].node' "$doc")
[ "$(jq '.jobs | length' "$doc")" = 1 ] && [ "$id" != null ] || fail "submit --json: no job: $(cat "$doc" "$WORK/last.err")"
[ "$(jq -r .submission "$doc")" = "$(jq -r '.jobs[0].submission' "$doc")" ] || fail "submit --json: submission ids differ"
[ -f "$XDG_STATE_HOME/tandem/jobs/$id.json" ] || fail "job $id not in the registry"
grep -q "$node: started job $id" "$WORK/last.err" || fail "submit --json: progress not on stderr"
case $node in n1) W=$W1 ;; *) W=$W2 ;; esac

# the log, whole, then followed until the job ends
stepped() { "$TANDEM" cluster logs "$id" | grep -q '^\[r\] epoch .* step [2-9]'; }
wait_until 120 stepped
# --cluster FILE, which every cluster command takes (docs/cluster-yaml.md), is taken and checked
expect_exit 0 "$TANDEM" cluster logs --cluster "$CLUSTER" "$id"
grep -q '^adapter 0: .*reverse.jsonl' "$WORK/last.out" || fail "cluster logs: no start line: $(head -5 "$WORK/last.out")"
cmp -s "$WORK/last.out" <(head -c "$(stat -c %s "$WORK/last.out")" "$W/jobs/$id/log") || fail "cluster logs differs from the node's log"
: >"$WORK/follow.out"
"$TANDEM" cluster logs "$id" --follow --interval 0.2 >"$WORK/follow.out" 2>"$WORK/follow.err" &
follower=$!
n0=$(grep -c '^\[r\] epoch' "$WORK/follow.out")
more() { [ "$(grep -c '^\[r\] epoch' "$WORK/follow.out")" -gt $((n0 + 1)) ]; }
wait_until 60 more

# cancel: SIGTERM to the finetune, a checkpoint, exit 143 recorded
expect_exit 0 "$TANDEM" cluster cancel "$id" --timeout 120
grep -q "job $id: SIGTERM sent to pid [0-9]* on $node" "$WORK/last.out" || fail "cancel: no signal line: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q "job $id ended (failed, exit code 143)" "$WORK/last.out" || fail "cancel: not ended with 143: $(cat "$WORK/last.out")"
grep -q -- "--resume" "$WORK/last.out" || fail "cancel: the resume command is not in the log tail it printed: $(cat "$WORK/last.out")"
ls -d "$W"/out/r/checkpoint-* >/dev/null 2>&1 || fail "cancel: no checkpoint written on $node"
# the stop report names the OUT_DIR of the adapters.toml (freed strings were printed before)
grep -q "^  $W/out/r: step [0-9]* of [0-9]* saved$" "$W/jobs/$id/log" || fail "stop report: $(tail -4 "$W/jobs/$id/log")"
[ "$(jq -c '[.state, .exit_code]' "$XDG_STATE_HOME/tandem/jobs/$id.json")" = '["failed",143]' ] ||
    fail "registry: $(jq -c '[.state, .exit_code, .why]' "$XDG_STATE_HOME/tandem/jobs/$id.json")"
# the follower saw the end and stopped by itself
wait_until 30 sh -c "! kill -0 $follower 2>/dev/null"
wait $follower
rc=$?
[ $rc -eq 0 ] || fail "cluster logs --follow exited $rc"
grep -q "to continue exactly where it stopped" "$WORK/follow.out" || fail "--follow missed the end of the log: $(tail -3 "$WORK/follow.out")"
cmp -s "$WORK/follow.out" <(tail -c "$(stat -c %s "$WORK/follow.out")" "$W/jobs/$id/log") ||
    fail "--follow's output is not the log's end"

expect_exit 0 "$TANDEM" cluster cancel --cluster "$CLUSTER" "$id"
grep -q "already ended (failed)" "$WORK/last.out" || fail "second cancel: $(cat "$WORK/last.out")"
for sub in logs cancel; do
    expect_exit 2 "$TANDEM" cluster $sub --cluster "$WORK/no-such.yaml" "$id"
    grep -q "no-such.yaml" "$WORK/last.err" || fail "cluster $sub --cluster of a missing file: $(cat "$WORK/last.err")"
done
expect_exit 2 "$TANDEM" cluster logs no-such-job
grep -q "no job 'no-such-job' in the registry" "$WORK/last.err" || fail "unknown job: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" cluster cancel
finish
