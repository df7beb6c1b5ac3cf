# Real OpenSSH servers for cluster tests (sourced after common.sh). Each node is an sshd on its own
# loopback address and port, with host keys, a user key and an sshd_config generated for this run
# under $WORK/ssh; it runs as the current user and is stopped when the test exits.
#
#   sshd_setup                 user key, known_hosts, an ssh_config ($SSH_CONFIG) for tandem
#   sshd_start NAME ADDR       starts a node; sets SSHD_PORT_<NAME> (skips the test, 77, when sshd
#                              cannot run here)
SSHD_BIN=${SSHD_BIN:-/usr/sbin/sshd}
SSH_DIR="$WORK/ssh"
SSH_CONFIG="$SSH_DIR/config"
SSHD_PIDS=()

sshd_stop_all() {
    local f
    for f in "$SSH_DIR"/*/sshd.pid; do
        [ -r "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    cleanup_work
}
trap sshd_stop_all EXIT

sshd_setup() {
    if [ ! -x "$SSHD_BIN" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
        echo "SKIP: OpenSSH server/client not installed (scripts/install-deps.sh installs them)" >&2
        exit 77
    fi
    mkdir -p "$SSH_DIR"
    chmod 700 "$SSH_DIR"
    ssh-keygen -q -t ed25519 -N '' -C tandem-test -f "$SSH_DIR/id_ed25519" || exit 1
    cp "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
    cat >"$SSH_CONFIG" <<CFG
Host *
    UserKnownHostsFile $SSH_DIR/known_hosts
    IdentityFile $SSH_DIR/id_ed25519
    IdentitiesOnly yes
    LogLevel ERROR
CFG
    export TANDEM_SSH_CONTROL_DIR="$SSH_DIR/ctl"
    # sshd (Debian) wants its privilege separation directory when started as root.
    if [ "$(id -u)" -eq 0 ]; then mkdir -p /run/sshd; fi
}

sshd_start() {
    local name=$1 addr=$2 port dir
    port=$(free_port) || { echo "no free port" >&2; exit 1; }
    dir="$SSH_DIR/$name"
    mkdir -p "$dir"
    ssh-keygen -q -t ed25519 -N '' -f "$dir/host_ed25519" || exit 1
    cat >"$dir/sshd_config" <<CFG
ListenAddress $addr
Port $port
HostKey $dir/host_ed25519
AuthorizedKeysFile $SSH_DIR/authorized_keys
PidFile $dir/sshd.pid
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
Subsystem sftp internal-sftp
LogLevel ERROR
CFG
    if ! "$SSHD_BIN" -f "$dir/sshd_config" -E "$dir/sshd.log"; then
        echo "SKIP: sshd does not start here:" >&2; cat "$dir/sshd.log" >&2
        exit 77
    fi
    local i
    for i in $(seq 1 100); do
        if ssh -F "$SSH_CONFIG" -o BatchMode=yes -o StrictHostKeyChecking=accept-new -p "$port" "$addr" true 2>/dev/null; then
            printf -v "SSHD_PORT_$name" '%s' "$port"
            return 0
        fi
        sleep 0.1
    done
    echo "sshd $name on $addr:$port did not answer:" >&2; cat "$dir/sshd.log" >&2
    exit 1
}
