#!/bin/bash
# The whole cluster path with real training: three adapters of the tiny model on two real sshd
# nodes (CPU), watched until done, a leaderboard by validation loss, the best adapter pulled.
# Skips (77) only while `tandem finetune` does not exist in this build (exit 2, unknown command).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
"$TANDEM" finetune --help >/dev/null 2>&1
if [ $? -eq 2 ]; then
    echo "SKIP: this build has no 'tandem finetune' command yet (it exits 2: unknown command)" >&2
    exit 77
fi
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster
# Both nodes train on the CPU: n1's simulated GPU is withdrawn so the plan is n1 + n2 on CPUs.
sed -i 's/TANDEM_FAKE_GPUS: "uuid=GPU-n1-0[^"]*"/TANDEM_FAKE_GPUS: ""\n      CUDA_VISIBLE_DEVICES: ""/; /gpus:/,/vram_mb/d' "$CLUSTER"

"$TANDEM" init-model "$WORK/model" --preset tiny --seed 1 >/dev/null || fail "init-model"
mkdir -p "$WORK/data"
for n in a b c; do
    for i in $(seq 1 24); do
        printf '{"messages": [{"role": "user", "content": "say %s %d"}, {"role": "assistant", "content": "%s %d %s"}]}\n' \
            "$n" "$i" "$n" "$i" "$(printf '%s' "$n" | tr a-c x-z)"
    done >"$WORK/data/$n.jsonl"
done
cat >"$WORK/adapters.toml" <<'T'
epochs = 2
max_seq_len = 64
batch_size = 4
[[adapter]]
data = "data/a.jsonl"
output = "out/a"
label = "a"
learning_rate = 1e-3
[[adapter]]
data = "data/b.jsonl"
output = "out/b"
label = "b"
learning_rate = 1e-5
[[adapter]]
data = "data/c.jsonl"
output = "out/c"
label = "c"
learning_rate = 3e-4
T
expect_exit 0 "$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" --rank 4 --val-split 0.3
grep -q 'n1: started job' "$WORK/last.out" || fail "no job on n1: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q 'n2: started job' "$WORK/last.out" || fail "no job on n2"
[ "$(ls "$XDG_STATE_HOME/tandem/jobs" | wc -l)" = 2 ] || fail "two jobs (one process per node) expected"

expect_exit 0 timeout 500 "$TANDEM" cluster watch --interval 1 --until-done
cp "$WORK/last.out" "$WORK/watch.out"
grep -q 'Leaderboard (validation loss' "$WORK/watch.out" || fail "no leaderboard: $(cat "$WORK/watch.out" "$WORK/last.err")"
expect_exit 0 "$TANDEM" cluster watch --once --json
jq -e '.leaderboard | length == 3' "$WORK/last.out" >/dev/null || fail "three adapters on the board"
jq -e '[.leaderboard[].val_loss] | all(type == "number")' "$WORK/last.out" >/dev/null || fail "every adapter has a validation loss"
jq -e '[.leaderboard[].val_loss] | . == sort' "$WORK/last.out" >/dev/null || fail "board not sorted by validation loss"
best=$(jq -r '.leaderboard[0].label' "$WORK/last.out")

expect_exit 0 "$TANDEM" cluster pull --best "$WORK/best"
[ -s "$WORK/best/$best/adapter_model.safetensors" ] || fail "best adapter ($best) not pulled"
[ -s "$WORK/best/$best/adapter_config.json" ] || fail "adapter_config.json not pulled"
expect_exit 0 "$TANDEM" cluster pull --all "$WORK/all"
[ "$(ls "$WORK/all" | wc -l)" = 3 ] || fail "pull --all: three adapters expected"
finish
