#!/bin/bash
# tandem submit against real sshd nodes: --dry-run prints every score and every exclusion
# (unreachable, max_adapters, cpu_max_params) and puts the adapters of one node in one process;
# staging copies the model and data once and a second submit copies nothing (SHA-256 compared);
# relative outputs land inside the node's workdir.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"
cluster_nodes_up
write_cluster dead

"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
mkdir -p "$WORK/data"
for n in a b c; do printf '{"text": "sample %s"}\n' "$n" >"$WORK/data/$n.jsonl"; done
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
output = "/tmp/absolute-out-c"
label = "c"
lora_dropout = 0.05
chat_template = "none"
no_shuffle = true
T
SUBMIT=("$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" --max-seq-len 64 --batch-size 1)

expect_exit 0 "${SUBMIT[@]}" --dry-run
out="$WORK/last.out"
grep -q 'dead .*excluded: unreachable: .*refused' "$out" || fail "dead node not excluded with its reason"
grep -q '^adapter 1 (a): -> n1' "$out" || fail "adapter a should go to n1 (fast GPU): $(cat "$out")"
grep -q '^adapter 2 (b): -> n1' "$out" || fail "adapter b should join n1"
grep -q 'n1 .*excluded: max_adapters 2 reached (0 running, 2 planned)' "$out" || fail "max_adapters exclusion"
grep -q '^adapter 3 (c): -> n2' "$out" || fail "adapter c should go to the CPU node"
grep -Eq 'n2 +score [0-9.]+ +\(CPU, .*speed 0.01' "$out" || fail "CPU score line"
grep -Eq 'n1 +score [0-9.]+ +\(NVIDIA GeForce RTX 4090, free [0-9]+ MiB, speed 1.00' "$out" || fail "GPU score line"
grep -q 'n1 .*one finetune process on GPU-n1-0 with 2 adapter(s): a b' "$out" || fail "one process for n1's adapters"
grep -q 'n2 .*one finetune process on the CPU with 1 adapter(s): c' "$out" || fail "n2 plan"
grep -q 'dry run' "$out" || fail "dry run note"
grep -q 'note: adapter 3 (c) writes /tmp/absolute-out-c on n2, outside its workdir .*cluster pull` will not copy it' "$out" \
    || fail "no note that c's absolute output cannot be pulled"
grep -q 'note: adapter [12] ' "$out" && fail "note for an output inside the workdir"
[ -e "$W1/models" ] && fail "dry run copied something"
ls "$XDG_STATE_HOME/tandem/jobs" 2>/dev/null | grep -q . && fail "dry run recorded a job"

# --json: the same plan as one document on stdout, progress on stderr, no jobs (dry run)
expect_exit 0 "${SUBMIT[@]}" --dry-run --json
j="$WORK/last.out"
jq -e '.dry_run == true and .submission == null and .jobs == [] and .error == null' "$j" >/dev/null ||
    fail "--json: header fields: $(head -c 300 "$j")"
jq -e '[.plan.adapters[] | .label + "->" + .node] == ["a->n1", "b->n1", "c->n2"]' "$j" >/dev/null ||
    fail "--json: placement: $(jq -c '[.plan.adapters[] | [.label, .node]]' "$j")"
jq -e '.plan.adapters[0].nodes[] | select(.node == "dead") | .eligible == false and (.why | test("unreachable"))' "$j" \
    >/dev/null || fail "--json: the dead node's exclusion"
jq -e '.plan.adapters[0].nodes[] | select(.node == "n1") | .eligible and .device == "GPU-n1-0" and .score > 0' "$j" \
    >/dev/null || fail "--json: n1's score"
jq -e '.plan.processes == [{"node": "n1", "device": "GPU-n1-0", "adapters": ["a", "b"]},
                           {"node": "n2", "device": "cpu", "adapters": ["c"]}]' "$j" >/dev/null ||
    fail "--json: processes: $(jq -c .plan.processes "$j")"
jq -e '.plan.model_params > 0 and .plan.budget_mb.gpu_one > 0' "$j" >/dev/null || fail "--json: budget"
grep -q 'note: adapter 3 (c) writes' "$WORK/last.err" || fail "--json: notes not on stderr"
# a plan that cannot place an adapter: still a document, with the error, exit 1
sed 's/cpu_max_params: 50M/cpu_max_params: 1M/' "$CLUSTER" >"$WORK/small.yaml"
expect_exit 1 "$TANDEM" submit --cluster "$WORK/small.yaml" --model "$WORK/model" \
    --adapters-config "$WORK/adapters.toml" --dry-run --json
jq -e '(.error | test("adapter 3 fits on no node")) and .plan.adapters[2].node == null' "$WORK/last.out" \
    >/dev/null || fail "--json: no error or placement: $(head -c 300 "$WORK/last.out")"

# An explicit --vram is the budget of each node's process, however many adapters it trains.
expect_exit 0 "${SUBMIT[@]}" --dry-run --vram 3
grep -q 'one adapter needs 3072 MiB on a GPU (0 MiB more' "$WORK/last.out" || fail "--vram not used as the budget: $(head -n 3 "$WORK/last.out")"
expect_exit 2 "${SUBMIT[@]}" --dry-run --vram lots

# The model is above n2's cpu_max_params: the CPU node is excluded and c fits nowhere.
sed 's/cpu_max_params: 50M/cpu_max_params: 1M/' "$CLUSTER" >"$WORK/small.yaml"
expect_exit 1 "$TANDEM" submit --cluster "$WORK/small.yaml" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" --dry-run
grep -q 'n2 .*excluded: CPU-only, and the model.s [0-9]* parameters exceed cpu_max_params 1000000' "$WORK/last.out" \
    || fail "cpu_max_params exclusion: $(cat "$WORK/last.out")"
grep -q 'adapter 3 fits on no node' "$WORK/last.err" || fail "unplaceable adapter message"

# Staging: everything copied once, nothing the second time.
expect_exit 0 "${SUBMIT[@]}" --stage-only
grep -Eq '^n1: model [1-9][0-9]* file\(s\) copied, 0 already there; data 2 copied, 0 already there' "$WORK/last.out" \
    || fail "first staging n1: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -Eq '^n2: model [1-9][0-9]* file\(s\) copied, 0 already there; data 1 copied' "$WORK/last.out" || fail "first staging n2"
m1=$(ls -d "$W1"/models/model-*)
cmp -s "$m1/model.safetensors" "$WORK/model/model.safetensors" || fail "model not copied byte-exact"
toml1=$(ls "$W1"/jobs/*/adapters.toml | head -1)
grep -qF "output = \"$W1/out/a\"" "$toml1" || fail "relative output not in n1's workdir: $(cat "$toml1")"
grep -qF "data = \"$W1/data/" "$toml1" || fail "data path not on the node"
grep -qF 'label = "c"' "$toml1" && fail "n1's adapters.toml holds n2's adapter"
toml2=$(ls "$W2"/jobs/*/adapters.toml | head -1)
grep -qF 'output = "/tmp/absolute-out-c"' "$toml2" || fail "absolute output kept"
grep -qF 'epochs = 1' "$toml2" || fail "file defaults carried into the node's adapters.toml"
grep -qF 'lora_dropout = 0.05' "$toml2" || fail "lora_dropout not carried into the node's adapters.toml"
grep -qF 'chat_template = "none"' "$toml2" && grep -qF 'no_shuffle = true' "$toml2" ||
    fail "chat_template, no_shuffle not carried into the node's adapters.toml: $(cat "$toml2")"

expect_exit 0 "${SUBMIT[@]}" --stage-only
grep -Eq '^n1: model 0 file\(s\) copied, [1-9][0-9]* already there; data 0 copied, 2 already there' "$WORK/last.out" \
    || fail "second staging copied something: $(cat "$WORK/last.out")"
grep -Eq '^n2: model 0 file\(s\) copied, [1-9][0-9]* already there; data 0 copied, 1 already there' "$WORK/last.out" \
    || fail "second staging n2"

# A changed file on the node is copied again (compared by content, not by name).
echo garbage >"$m1/config.json"
expect_exit 0 "${SUBMIT[@]}" --stage-only
grep -Eq '^n1: model 1 file\(s\) copied' "$WORK/last.out" || fail "damaged file not re-copied"
cmp -s "$m1/config.json" "$WORK/model/config.json" || fail "damaged file not repaired"

# Usage errors.
expect_exit 2 "$TANDEM" submit --cluster "$CLUSTER" --model "$WORK/model"
expect_exit 2 "${SUBMIT[@]}" --bogus-flag
finish
