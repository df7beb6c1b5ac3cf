#!/bin/bash
# `tandem submit` never places GPU work on a node whose tandem was built without CUDA (issue 13,
# item 18). `tandem --version` prints a "features:" line (cuda | cpu-only), `gpu status --json`
# carries it as "features", the node probe reads it. Node n1 has a (simulated) GPU; its `tandem:`
# is a real wrapper script that answers --version as a build with CUDA (tests/lib/cluster.sh) or
# without it (here) would and runs this build's tandem for everything else, so the test does not
# depend on how this binary was built.
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/sshd.sh"
. "$TANDEM_SOURCE_DIR/tests/lib/cluster.sh"

# This binary's own report, and the same word in gpu status --json.
expect_exit 0 "$TANDEM" --version
grep -Eq '^tandem [0-9]+\.[0-9]+\.[0-9]+$' "$WORK/last.out" || fail "first line: $(cat "$WORK/last.out")"
own=$(sed -n 's/^features: //p' "$WORK/last.out")
case "$own" in cuda|cpu-only) ;; *) fail "no features line: $(cat "$WORK/last.out")" ;; esac
expect_exit 0 "$TANDEM" gpu status --json
[ "$(jq -r .features "$WORK/last.out")" = "$own" ] || fail "gpu status --json features: $(jq -c .features "$WORK/last.out"), --version says $own"

cluster_nodes_up
write_cluster
make_wrapper() { # make_wrapper FILE FEATURES: a tandem whose --version reports FEATURES
    cat >"$1" <<SH
#!/bin/sh
if [ "\$1" = --version ]; then echo "tandem 0.1.0"; echo "features: $2"; exit 0; fi
exec "$TANDEM" "\$@"
SH
    chmod +x "$1"
}
make_wrapper "$WORK/tandem-cpu-only" cpu-only
# n1 (the simulated RTX 4090) runs a wrapper; n2 (CPU-only) this build's tandem.
awk -v t="$WORK/tandem-cpu-only" '/name: n1/{n1=1} /name: n2/{n1=0} n1 && /^    tandem:/{$0="    tandem: " t} {print}' \
    "$CLUSTER" >"$WORK/nocuda.yaml"
grep -q "tandem: $WORK/tandem-cpu-only" "$WORK/nocuda.yaml" || fail "wrapper not set on n1"

"$TANDEM" init-model "$WORK/model" --preset tiny >/dev/null || fail "init-model"
mkdir -p "$WORK/data"
for n in a b; do printf '{"text": "sample %s"}\n' "$n" >"$WORK/data/$n.jsonl"; done
cat >"$WORK/adapters.toml" <<'T'
[[adapter]]
data = "data/a.jsonl"
output = "out/a"
label = "a"
[[adapter]]
data = "data/b.jsonl"
output = "out/b"
label = "b"
T
submit() { "$TANDEM" submit --cluster "$1" --model "$WORK/model" --adapters-config "$WORK/adapters.toml" --max-seq-len 64 --batch-size 1 --dry-run; }

# A tandem with CUDA: n1's GPU takes both adapters (as without the features line before).
expect_exit 0 submit "$CLUSTER"
grep -q '^adapter 1 (a): -> n1' "$WORK/last.out" || fail "CUDA build: a should go to n1's GPU: $(cat "$WORK/last.out")"
grep -q 'n1 .*one finetune process on GPU-n1-0' "$WORK/last.out" || fail "CUDA build: n1's GPU process"

# A tandem without CUDA: n1 is excluded with the reason; the CPU node takes the work.
expect_exit 0 submit "$WORK/nocuda.yaml"
cp "$WORK/last.out" "$WORK/plan.out"
grep -q "n1 .*excluded: has GPUs, but its tandem ($WORK/tandem-cpu-only) was built without CUDA (features: cpu-only)" "$WORK/plan.out" \
    || fail "no-CUDA exclusion not in the plan: $(cat "$WORK/plan.out")"
grep -q '^adapter 1 (a): -> n2' "$WORK/plan.out" || fail "a should go to the CPU node n2"
grep -q '^adapter 2 (b): -> n2' "$WORK/plan.out" || fail "b should go to the CPU node n2"
grep -q 'GPU-n1-0' "$WORK/plan.out" && fail "the plan still uses n1's GPU"

# No CPU node left: nothing fits, and the error says why.
sed '/name: n2/,$d' "$WORK/nocuda.yaml" >"$WORK/only-n1.yaml"
expect_exit 1 submit "$WORK/only-n1.yaml"
grep -q 'adapter 1 fits on no node (n1: has GPUs, but its tandem .* was built without CUDA' "$WORK/last.err" \
    || fail "unplaceable message: $(cat "$WORK/last.err")"

# cluster status shows what each node's tandem was built with.
expect_exit 0 "$TANDEM" cluster status --cluster "$WORK/nocuda.yaml" --json
[ "$(jq -r '.nodes[] | select(.name == "n1") | .tandem_features' "$WORK/last.out")" = cpu-only ] || fail "status: n1 features"
[ "$(jq -r '.nodes[] | select(.name == "n2") | .tandem_features' "$WORK/last.out")" = "$own" ] || fail "status: n2 features"
finish
