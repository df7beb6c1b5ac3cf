#!/bin/bash
# Malformed cluster.yaml files are refused with FILE:LINE:COLUMN and exit 2 (no node contacted).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
n=0
# bad LINE:COL MESSAGE-REGEX <<< yaml
bad() {
    local where=$1 pattern=$2 f="$WORK/bad$((n += 1)).yaml"
    cat >"$f"
    expect_exit 2 "$TANDEM" cluster status --cluster "$f"
    grep -Eq "^tandem: $f:$where: $pattern" "$WORK/last.err" \
        || fail "case $n: want $where $pattern, got: $(cat "$WORK/last.err")"
}
bad 1:1 'the file is empty' </dev/null
bad 3:1 "did not find expected ',' or ']' \\(while parsing a flow sequence at line 2\\)" <<'Y'
nodes:
  - name: [unclosed
Y
bad 1:1 'no `nodes:` list' <<'Y'
ssh_config: x
Y
bad 2:1 "unknown key 'nodse' in the top level \(did you mean 'nodes'\?\)" <<'Y'
ssh_config: x
nodse: []
Y
bad 2:5 "node 'a' uses transport ssh and needs a host" <<'Y'
nodes:
  - name: a
    workdir: /w
Y
bad 6:5 "duplicate node name 'a' \\(first at line 2\\)" <<'Y'
nodes:
  - {name: a, transport: local, workdir: /w}
  - name: b
    transport: local
    workdir: /w
  - {name: a, transport: local, workdir: /w}
Y
bad 7:13 "duplicate GPU uuid 'GPU-1' \(first at line 5\)" <<'Y'
nodes:
  - name: a
    transport: local
    workdir: /w
    gpus: [{uuid: GPU-1}]
  - {name: b, transport: local, workdir: /w,
     gpus: [{uuid: GPU-1}]}
Y
bad 4:19 'max_adapters must be between 1 and 4096' <<'Y'
nodes:
  - name: a
    transport: local
    max_adapters: 0
    workdir: /w
Y
bad 4:27 "vram_mb must be a whole number, got '-5'" <<'Y'
nodes:
  - {name: a, transport: local, workdir: /w,
     gpus: [
       {uuid: G, vram_mb: -5}]}
Y
bad 3:14 'workdir must be an absolute path' <<'Y'
nodes:
  - name: a
    workdir: relative/dir
    transport: local
Y
bad 5:5 "'host' is for transport ssh; node 'a' is local" <<'Y'
nodes:
  - name: a
    transport: local
    workdir: /w
    host: x
Y
bad 3:11 'port must be a whole number' <<'Y'
nodes:
  - name: a
    port: twenty-two
    host: h
    workdir: /w
Y
bad 2:11 "node name 'a b' must be" <<'Y'
nodes:
  - name: a b
    host: h
    workdir: /w
Y
bad 4:21 "cpu_max_params must be a number of parameters" <<'Y'
nodes:
  - name: a
    host: h
    cpu_max_params: 3Q
    workdir: /w
Y
bad 3:5 "duplicate key 'name' \\(first at line 2\\)" <<'Y'
nodes:
  - name: a
    name: b
Y
bad 2:1 'a second YAML document' <<'Y'
nodes: [{name: a, transport: local, workdir: /w}]
---
nodes: []
Y
# A good file with every field is accepted (the local node answers).
cat >"$WORK/good.yaml" <<Y
nodes:
  - name: here
    transport: local
    workdir: $WORK/here
    tandem: $TANDEM
    gpus:
      - {uuid: GPU-x, type: RTX 3090, vram_mb: 24576, memory_type: discrete, speed: 0.6}
    cpu_cores: 2
    ram_mb: 4096
    max_adapters: 3
    cpu_max_params: 1.5B
    env: {TANDEM_FAKE_GPUS: "uuid=GPU-x,name=RTX 3090,total_mb=24576,memory=discrete"}
Y
expect_exit 0 "$TANDEM" cluster status --cluster "$WORK/good.yaml" --json
jq -e '.nodes[0].reachable and .nodes[0].gpu_status.gpus[0].uuid == "GPU-x"' "$WORK/last.out" >/dev/null \
    || fail "local node: $(cat "$WORK/last.out" "$WORK/last.err")"
# The default path is used without --cluster.
mkdir -p "$WORK/xdg/tandem"
cp "$WORK/good.yaml" "$WORK/xdg/tandem/cluster.yaml"
XDG_CONFIG_HOME="$WORK/xdg" expect_exit 0 "$TANDEM" cluster status
grep -q '^here (local) reachable' "$WORK/last.out" || grep -q '^here  (local)  reachable' "$WORK/last.out" || fail "default path: $(cat "$WORK/last.out")"
finish
