#!/bin/bash
# A cluster.yaml node with several GPUs runs one finetune process per GPU it uses (issue 17
# part 1; docs/cluster.md, "Placement"): a real sshd node with two simulated GPUs (training on
# the CPU backend through TANDEM_SIM_GPU_COMPUTE=cpu):
#  - the plan prints the GPU of each adapter and one process per GPU (text and --json);
#  - submit starts one job per GPU, each pinned to its GPU (CUDA_VISIBLE_DEVICES) and holding
#    its own reservation in the node's ledger; both jobs train to the end.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster
# n1: two equal simulated GPUs, training for real on the CPU backend; n2 out of the way
GPUS="uuid=GPU-n1-0,name=NVIDIA GeForce RTX 4090,total_mb=24564,memory=discrete;uuid=GPU-n1-1,name=NVIDIA GeForce RTX 4090,total_mb=24564,memory=discrete"
sed -i "s/TANDEM_FAKE_GPUS: \"uuid=GPU-n1-0[^\"]*\"/TANDEM_FAKE_GPUS: \"$GPUS\"\n      TANDEM_SIM_GPU_COMPUTE: cpu/; s/max_adapters: 2/max_adapters: 3/; s/cpu_max_params: 50M/cpu_max_params: 1/" "$CLUSTER"
sed -i "s/      - {uuid: GPU-n1-0, type: RTX 4090, vram_mb: 24564}/&\n      - {uuid: GPU-n1-1, type: RTX 4090, vram_mb: 24564}/" "$CLUSTER"

"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
mkdir -p "$WORK/data"
for n in a b c; do
    for i in 1 2 3 4; do printf '{"text": "sample %s %d"}\n' "$n" "$i"; done >"$WORK/data/$n.jsonl"
done
cat >"$WORK/adapters.toml" <<'T'
epochs = 1
[[adapter]]
data = "data/a.jsonl"
output = "out/a"
label = "a"
[[adapter]]
data = "data/b.jsonl"
output = "out/b"
label = "b"
[[adapter]]
data = "data/c.jsonl"
output = "out/c"
label = "c"
T
SUBMIT=("$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model" --adapters-config "$WORK/adapters.toml"
        --max-seq-len 64 --batch-size 2 --val-split 0)

expect_exit 0 "${SUBMIT[@]}" --dry-run
out="$WORK/last.out"
# a: GPU-n1-0 (the first of two equal GPUs); b: a process of its own on GPU-n1-1 scores above
# joining a's; c: GPU-n1-0 again (both GPUs hold one adapter: the first wins the tie)
grep -q '^adapter 1 (a): -> n1 GPU-n1-0$' "$out" || fail "a not on GPU-n1-0: $(cat "$out")"
grep -q '^adapter 2 (b): -> n1 GPU-n1-1$' "$out" || fail "b not on GPU-n1-1"
grep -q '^adapter 3 (c): -> n1 GPU-n1-0$' "$out" || fail "c not on GPU-n1-0"
grep -q 'n1 .*one finetune process on GPU-n1-0 with 2 adapter(s): a c' "$out" || fail "no process on GPU-n1-0"
grep -q 'n1 .*one finetune process on GPU-n1-1 with 1 adapter(s): b' "$out" || fail "no process on GPU-n1-1"
expect_exit 0 "${SUBMIT[@]}" --dry-run --json
jq -e '[.plan.adapters[] | .label + "@" + .device] == ["a@GPU-n1-0", "b@GPU-n1-1", "c@GPU-n1-0"]' \
    "$WORK/last.out" >/dev/null || fail "--json: devices: $(jq -c '[.plan.adapters[] | [.label, .device]]' "$WORK/last.out")"
jq -e '[.plan.processes[] | .device + ":" + (.adapters | join(","))] == ["GPU-n1-0:a,c", "GPU-n1-1:b"]' \
    "$WORK/last.out" >/dev/null || fail "--json: processes: $(jq -c .plan.processes "$WORK/last.out")"

# the real submit: one job per GPU, one reservation per GPU, both finish
expect_exit 0 "${SUBMIT[@]}"
grep -q 'n1: started job .*2 adapter(s) on GPU-n1-0' "$WORK/last.out" || fail "no job on GPU-n1-0: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q 'n1: started job .*1 adapter(s) on GPU-n1-1' "$WORK/last.out" || fail "no job on GPU-n1-1"
[ "$(ls "$XDG_STATE_HOME/tandem/jobs" | wc -l)" = 2 ] || fail "two jobs (one per GPU) expected"
jq -s -e '[.[].device] | sort == ["GPU-n1-0", "GPU-n1-1"]' "$XDG_STATE_HOME"/tandem/jobs/*.json >/dev/null ||
    fail "the jobs' devices: $(jq -c .device "$XDG_STATE_HOME"/tandem/jobs/*.json)"
expect_exit 0 timeout 300 "$TANDEM" cluster watch --interval 1 --until-done
for a in a b c; do
    [ -s "$W1/out/$a/adapter_model.safetensors" ] || fail "$a did not finish: $(cat "$W1"/jobs/*/log)"
done
grep -h "reserved .* MiB on GPU-n1-" "$W1"/jobs/*/log | sed 's/.* on //' | sort | tr '\n' ' ' |
    grep -qx "GPU-n1-0 GPU-n1-1 " || fail "not one reservation per GPU: $(grep -h reserved "$W1"/jobs/*/log)"
finish
