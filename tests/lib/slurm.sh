# A real Slurm cluster for tests (sourced after common.sh): munged, slurmctld and NODES slurmd
# daemons (Debian's Slurm, several slurmd on one host), everything under $WORK/slurm, started as
# root and stopped by PID when the test exits. Facts behind the settings: shared/SLURM.md.
# A requeued job may start again only after cred_expire (default 120 s) and the next pass of
# the main scheduler (sched_interval, default 60 s): 5 s and 2 s here, so a requeue costs about
# 6 s instead of about 3 minutes. Time limits and --signal stay Slurm's own: slurmctld checks
# them every 30 s (a fixed period), so a 1-minute job gets USR1@30 between 30 and 60 s in.
#
#   slurm_start NODES [GPUS_PER_NODE]   starts the cluster (skips the test, exit 77, when Slurm is
#                                       not installed or this is not root); exports SLURM_CONF.
#                                       With GPUS_PER_NODE > 0 each node has that many fake GPU
#                                       GRES (character devices under $WORK/slurm/dev), so
#                                       --gres=gpu:1 is scheduled and sets CUDA_VISIBLE_DEVICES.
#   slurm_wait_idle SECONDS             until every node is idle
#   slurm_job_state ID                  the job's state (RUNNING, COMPLETED, ...), from scontrol
#   slurm_stop                          cancels jobs, stops the daemons and leftover steps
#   slurm_cluster_yaml FILE [KEY=VALUE...]
#                                       writes the tests' cluster.yaml (scheduler: slurm, below)
#                                       into FILE; KEY=VALUE sets a key of the slurm block
#                                       (replacing the default, or added after them), KEY= drops
#                                       it, env.NAME=VALUE adds to its env. Needs $SHARED (the
#                                       shared workdir) and $TANDEM.
SLURM_DIR="$WORK/slurm"
SLURM_PIDS=()

slurm_stop() {
    [ -n "${SLURM_CONF:-}" ] || return 0
    scancel --quiet --full --user="$(id -un)" 2>/dev/null
    local f p
    for f in "$SLURM_DIR"/run/slurmd-*.pid "$SLURM_DIR"/run/slurmctld.pid; do
        [ -r "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    sleep 0.3
    # slurmstepd ignores SIGTERM and survives slurmd: find this cluster's by its SLURM_CONF.
    for p in $(pgrep -f slurmstepd 2>/dev/null); do
        if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_CONF=$SLURM_CONF"; then
            pkill -9 -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null
        fi
    done
    [ -r "$SLURM_DIR/run/munged.pid" ] && kill "$(cat "$SLURM_DIR/run/munged.pid")" 2>/dev/null
    unset SLURM_CONF
}

slurm_cleanup() { slurm_stop; cleanup_work; }
trap slurm_cleanup EXIT

slurm_start() {
    local nodes=$1 gpus=${2:-0} b
    for b in slurmctld slurmd munged mungekey sbatch squeue scontrol scancel; do
        if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
            echo "SKIP: Slurm is not installed ($b missing; scripts/install-deps.sh installs it)" >&2
            exit 77
        fi
    done
    if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP: starting slurmd and munged needs root" >&2
        exit 77
    fi
    mkdir -p "$SLURM_DIR"/{etc,run,log,state,spool,munge,dev}
    chmod 755 "$SLURM_DIR" "$SLURM_DIR/munge"
    local key="$SLURM_DIR/etc/munge.key" sock="$SLURM_DIR/munge/munge.socket"
    /usr/sbin/mungekey --create --keyfile="$key" 2>/dev/null || mungekey --create --keyfile="$key"
    chmod 600 "$key"
    /usr/sbin/munged --socket="$sock" --key-file="$key" --log-file="$SLURM_DIR/log/munged.log" \
        --pid-file="$SLURM_DIR/run/munged.pid" --seed-file="$SLURM_DIR/munge/seed" --force ||
        { fail "munged did not start"; cat "$SLURM_DIR/log/munged.log" >&2; exit 1; }

    local cpus mem_mb ctl_port
    cpus=$(nproc)
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / (nodes + 1) ))
    ctl_port=$(free_port)
    export SLURM_CONF="$SLURM_DIR/etc/slurm.conf"
    local gres_line="" gres_types=""
    if [ "$gpus" -gt 0 ]; then
        gres_types="GresTypes=gpu"
        : >"$SLURM_DIR/etc/gres.conf"
        echo "AutoDetect=off" >>"$SLURM_DIR/etc/gres.conf"
    fi
    cat >"$SLURM_CONF" <<EOF
ClusterName=tandemtest
SlurmctldHost=localhost
SlurmctldPort=$ctl_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( mem_mb / cpus / 2 ))
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2
DependencyParameters=kill_invalid_depend
MinJobAge=300
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_DIR/log/jobcomp.txt
MpiDefault=none
$gres_types
EOF
    local i
    for i in $(seq 1 "$nodes"); do
        [ "$gpus" -gt 0 ] && gres_line="Gres=gpu:$gpus"
        echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus RealMemory=$mem_mb $gres_line State=UNKNOWN" >>"$SLURM_CONF"
        if [ "$gpus" -gt 0 ]; then
            local g first=$(( (i - 1) * gpus ))
            for g in $(seq "$first" $(( first + gpus - 1 ))); do
                [ -e "$SLURM_DIR/dev/gpu$g" ] || mknod -m 666 "$SLURM_DIR/dev/gpu$g" c 1 3
            done
            echo "NodeName=node$i Name=gpu File=$SLURM_DIR/dev/gpu[$first-$(( first + gpus - 1 ))]" >>"$SLURM_DIR/etc/gres.conf"
        fi
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"

    /usr/sbin/slurmctld -i || { fail "slurmctld did not start"; cat "$SLURM_DIR/log/slurmctld.log" >&2; exit 1; }
    for i in $(seq 1 "$nodes"); do
        /usr/sbin/slurmd -N "node$i" ||
            { fail "slurmd node$i did not start"; cat "$SLURM_DIR/log/slurmd-node$i.log" >&2; exit 1; }
    done
}

# The defaults: partition debug of slurm_start's cluster, a 10-minute time limit, USR1 30 s before
# it, one fake GPU per job of a size every test adapter fits, at most one adapter per job (so an
# array of one task per adapter), trained on the CPU (device: cpu: the GPUs are simulated, --gres
# is scheduled, the CPU trains) with one thread, beside a ledger of the test's own.
slurm_cluster_yaml() {
    local file=$1 kv k
    shift
    local keys=(partition time signal_grace gpus_per_job gpu_vram_mb device max_adapters cpu_max_params)
    local -A val=([partition]=debug [time]='"10"' [signal_grace]=30 [gpus_per_job]=1
                  [gpu_vram_mb]=24000 [device]=cpu [max_adapters]=1 [cpu_max_params]=50M)
    local env=("TANDEM_LEDGER_DIR: $WORK/ledger" 'OMP_NUM_THREADS: "1"')
    for kv in "$@"; do
        k=${kv%%=*}
        case $k in
        env.*) env+=("${k#env.}: ${kv#*=}") ;;
        *) [ -v "val[$k]" ] || keys+=("$k"); val[$k]=${kv#*=} ;;
        esac
    done
    {
        printf 'scheduler: slurm\nslurm:\n'
        for k in "${keys[@]}"; do [ -n "${val[$k]}" ] && printf '  %s: %s\n' "$k" "${val[$k]}"; done
        printf '  workdir: %s\n  tandem: %s\n  env:\n' "${SHARED:?}" "$TANDEM"
        printf '    %s\n' "${env[@]}"
    } >"$file"
}

slurm_all_idle() {
    local states
    states=$(sinfo -h -N -o '%T' 2>/dev/null) || return 1
    [ -n "$states" ] && ! echo "$states" | grep -qv '^idle$'
}

slurm_wait_idle() {
    wait_until "$1" slurm_all_idle || { cat "$SLURM_DIR"/log/*.log >&2; exit 1; }
}

slurm_job_state() {
    scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p'
}
