# Two real ssh nodes and an unreachable one for cluster tests (sourced after common.sh and
# sshd.sh). write_cluster writes $CLUSTER: n1 (127.0.0.2, a simulated RTX 4090 through its env),
# n2 (127.0.0.3, CPU-only, a workdir whose name has a space and a quote) and, with "dead",
# a node on a closed port. Both real nodes run this build's tandem; on n1, whose simulated GPU
# stands for a CUDA machine, it runs behind $WORK/tandem-as-cuda, a wrapper whose --version says
# "features: cuda" whatever this build has (submit refuses GPU work to a tandem built without
# CUDA, and these tests must not depend on how this binary was built).
export XDG_STATE_HOME="$WORK/state"
CLUSTER="$WORK/cluster.yaml"
W1="$WORK/w1"
W2="$WORK/w2 it's"

cluster_nodes_up() {
    sshd_setup
    sshd_start n1 127.0.0.2
    sshd_start n2 127.0.0.3
    mkdir -p "$W1" "$W2"
}

write_cluster() {
    local dead=${1:-}
    cat >"$WORK/tandem-as-cuda" <<SH
#!/bin/sh
if [ "\$1" = --version ]; then "$TANDEM" --version | sed 's/^features: .*/features: cuda/'; exit; fi
exec "$TANDEM" "\$@"
SH
    chmod +x "$WORK/tandem-as-cuda"
    cat >"$CLUSTER" <<Y
ssh_config: $SSH_CONFIG
nodes:
  - name: n1
    host: 127.0.0.2
    port: $SSHD_PORT_n1
    workdir: $W1
    tandem: $WORK/tandem-as-cuda
    max_adapters: 2
    gpus:
      - {uuid: GPU-n1-0, type: RTX 4090, vram_mb: 24564}
    env:
      TANDEM_FAKE_GPUS: "uuid=GPU-n1-0,name=NVIDIA GeForce RTX 4090,total_mb=24564,memory=discrete"
      TANDEM_LEDGER_DIR: $WORK/ledger-n1
  - name: n2
    host: 127.0.0.3
    port: $SSHD_PORT_n2
    workdir: "$W2"
    tandem: $TANDEM
    cpu_max_params: 50M
    env:
      TANDEM_FAKE_GPUS: ""
      CUDA_VISIBLE_DEVICES: ""
      TANDEM_LEDGER_DIR: $WORK/ledger-n2
Y
    if [ "$dead" = dead ]; then
        cat >>"$CLUSTER" <<Y
  - name: dead
    host: 127.0.0.2
    port: $(free_port)
    workdir: /nonexistent
Y
    fi
}
