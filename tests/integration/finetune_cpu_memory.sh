# A CPU run fits its plan to the machine's memory before it loads anything (docs/finetune.md,
# "Memory on the CPU"): the need it prints is the estimate with f32 activations and the CPU
# backend's kept scratch + 200 MiB for the process, the figure `tandem submit` places CPU
# processes with (unit.memory_plan holds the two equal). A /proc/meminfo stand-in
# (TANDEM_MEMINFO) plays the machine:
#  - MemTotal under even the smallest plan: exit 1 before the load, the message names that
#    plan's need, the need as asked, the machine's memory and what shrinks a run; nothing written;
#  - MemTotal under the plan as asked: the first plan that fits (checkpointing recomputing q/k/v,
#    then all of a layer, then micro-batches), said in one line, its adapter bit for bit the one
#    the same plan's flags train;
#  - MemAvailable under the need: a warning, the run trains;
#  - plenty: one "cpu memory" line, the run trains, and at its end the backend's peak (within
#    the plan) and the process's peak resident memory; --grad-checkpoint lowers the need (on a
#    batch of 16 x 512 tokens: on this file's tiny samples it saves under 1 MiB, which the
#    printed whole MiB could round away);
#  - an unreadable meminfo: a note, the run trains;
#  - a CPU host re-plans for a joiner whose adapters take the plan as asked past the machine's
#    memory (checkpointing, and back to the plan as asked when the joiner has left), and refuses
#    one whose smallest plan does not fit (the joiner exits 1 with the need and the limit; the
#    host trains on);
#  - a real cgroup memory limit under the need (root, a writable memory controller; else that
#    part is skipped with a note): exit 1 naming the cgroup limit.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cd "$WORK" || exit 1
for i in $(seq 1 12); do echo "{\"prompt\": \"p$i\", \"completion\": \"c$i\"}"; done >d.jsonl
RUN=(finetune "$M" --device cpu --no-join --epochs 1 --batch-size 4 --max-seq-len 64 --save-every 0)
meminfo() { printf 'MemTotal: %d kB\nMemFree: 1000 kB\nMemAvailable: %d kB\n' "$1" "$2" >"$WORK/meminfo"; }
need_of() {
    sed -n 's/.*as asked \([0-9]*\) MiB).*/\1/p; s/.*needs about \([0-9]*\) MiB.*/\1/p
        s/.*cpu memory: about \([0-9]*\) MiB.*/\1/p' "$1" | head -1
}

meminfo 102400 51200 # 100 MiB
TANDEM_MEMINFO="$WORK/meminfo" expect_exit 1 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/small
grep -q -- "--device cpu: this run needs at least [0-9]* MiB (its smallest plan: gradient checkpointing and micro-batch 1 x accumulation 4 (optimizer batch 4 x 1 unchanged); as asked [0-9]* MiB), more than this machine's 100 MiB of memory ($WORK/meminfo)" \
    "$WORK/last.err" || fail "too small: $(cat "$WORK/last.err")"
grep -q "method qlora" "$WORK/last.err" || fail "too small: no advice: $(cat "$WORK/last.err")"
grep -q "base loaded" "$WORK/last.err" && fail "too small: the model was loaded"
[ -e out/small ] && fail "too small: out/small was written"
need=$(need_of "$WORK/last.err")
[ "${need:-0}" -gt 200 ] || fail "the need ($need MiB) is not above the process's 200"

meminfo 102400000 51200 # 100 GB, 50 MiB available
TANDEM_MEMINFO="$WORK/meminfo" expect_exit 0 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/busy
grep -q "warning: this run needs about $need MiB .*more than the 50 MiB available now" "$WORK/last.err" ||
    fail "busy: $(cat "$WORK/last.err")"
[ -f out/busy/adapter_model.safetensors ] || fail "busy: no adapter"

meminfo 102400000 102400000
TANDEM_MEMINFO="$WORK/meminfo" expect_exit 0 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/fine
grep -q "cpu memory: about $need MiB (.*) of 100000 MiB available" "$WORK/last.err" ||
    fail "plenty: $(cat "$WORK/last.err")"
[ -f out/fine/adapter_model.safetensors ] || fail "plenty: no adapter"
# the end's line: the backend's peak within the plan's need less the process's 200 MiB (each
# part of the plan is rounded up to whole MiB: 4 parts), and the process's peak resident memory
peak=$(sed -n 's/.*cpu memory: peak \([0-9]*\) MiB (backend), peak resident [0-9]* MiB (the process)$/\1/p' "$WORK/last.err")
[ -n "$peak" ] && [ "$peak" -gt 0 ] && [ "$peak" -le $((need - 200 + 4)) ] ||
    fail "plenty: the backend's peak '$peak' MiB against the plan's $need: $(grep 'cpu memory' "$WORK/last.err")"

TANDEM_MEMINFO="$WORK/nowhere" expect_exit 0 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/unknown
grep -q "the machine's memory is unknown" "$WORK/last.err" || fail "unknown: $(cat "$WORK/last.err")"

# Plans that fit: a batch of 16 x 512 tokens, its plans' needs measured with their flags in a
# machine that holds them all, then machines of exactly those sizes.
python3 -c "
import json
for i in range(16): print(json.dumps({'text': ('word%d ' % i) * 120}))" >long.jsonl
BIG_JOIN=(finetune "$M" --device cpu --epochs 1 --batch-size 16 --max-seq-len 512 --save-every 0)
BIG=("${BIG_JOIN[@]}" --no-join)
plan_run() { # plan_run OUT FLAGS...: the run in the current meminfo, its need printed
    TANDEM_MEMINFO="$WORK/meminfo" expect_exit 0 "$TANDEM" "${BIG[@]}" --adapter "long.jsonl:out/$1" "${@:2}"
    need_of "$WORK/last.err"
}
asked=$(plan_run asked)
attn=$(plan_run attn --grad-checkpoint --recompute attn)
layer=$(plan_run layer --grad-checkpoint)
[ "$layer" -lt "$attn" ] && [ "$attn" -lt "$asked" ] || fail "plans: as asked $asked, attn $attn, layer $layer MiB"
for plan in attn layer; do
    mb=${!plan}
    meminfo $((mb * 1024)) $((mb * 1024))
    [ "$(plan_run "auto_$plan")" = "$mb" ] || fail "$mb MiB machine: $(cat "$WORK/last.err")"
    case $plan in attn) words="gradient checkpointing (--recompute attn)" ;; layer) words="gradient checkpointing" ;; esac
    grep -qF "cpu memory: the plan as asked needs $asked MiB, more than this machine's $mb MiB of memory ($WORK/meminfo): using $words, $mb MiB" \
        "$WORK/last.err" || fail "$mb MiB machine: $(cat "$WORK/last.err")"
    cmp -s "out/auto_$plan/adapter_model.safetensors" "out/$plan/adapter_model.safetensors" ||
        fail "the $plan plan chosen for a $mb MiB machine trained another adapter than its flags"
done
meminfo $(((layer - 1) * 1024)) $(((layer - 1) * 1024))
split=$(plan_run auto_split)
[ "${split:-$layer}" -lt "$layer" ] || fail "micro-batches: $split MiB, not under $layer"
grep -q "using gradient checkpointing and micro-batch [0-9]* x accumulation [0-9]* (optimizer batch 16 x 1 unchanged), $split MiB" \
    "$WORK/last.err" || fail "micro-batches: $(cat "$WORK/last.err")"
[ -f out/auto_split/adapter_model.safetensors ] || fail "micro-batches: no adapter"
# A CPU host (about 205 MiB, 36 steps) and a joiner of 16 x 512-token samples (one step): in a
# machine of the joiner's checkpointed plan + 100 MiB the host re-plans to checkpointing for it
# and back to its plan as asked when it has left; in a machine of 215 MiB, under the joiner's
# smallest plan, it refuses it (exit 1) and trains on.
cotrain_pair() { # cotrain_pair MACHINE_MIB TAG: host and joiner, their exits in host_rc, join_rc
    meminfo $(($1 * 1024)) $(($1 * 1024))
    TANDEM_MEMINFO="$WORK/meminfo" "$TANDEM" finetune "$M" --device cpu --epochs 6 --batch-size 2 \
        --max-seq-len 32 --save-every 0 --adapter "d.jsonl:out/host_$2" >"host_$2.out" 2>"host_$2.err" &
    host=$!
    hold_host $host
    TANDEM_MEMINFO="$WORK/meminfo" "$TANDEM" "${BIG_JOIN[@]}" --adapter "long.jsonl:out/joiner_$2" \
        >"join_$2.out" 2>"join_$2.err" &
    joiner=$!
    release_host $host "join_$2.err"
    wait $joiner
    join_rc=$?
    wait $host
    host_rc=$?
}
cotrain_pair $((layer + 100)) replan
[ $host_rc -eq 0 ] && [ $join_rc -eq 0 ] || fail "re-plan: host $host_rc, joiner $join_rc: $(tail -3 host_replan.err; tail -3 join_replan.err)"
grep -q "co-training: with 1 adapter(s) of pid $joiner the plan as asked needs [0-9]* MiB, more than this machine's $((layer + 100)) MiB of memory ($WORK/meminfo): using gradient checkpointing, [0-9]* MiB" \
    host_replan.err || fail "re-plan: host: $(cat host_replan.err)"
grep -q "co-training: 1 adapter(s) left, 1 training: the plan as asked fits this machine's $((layer + 100)) MiB of memory ($WORK/meminfo): using it" \
    host_replan.err || fail "re-plan back: host: $(cat host_replan.err)"
[ -f out/joiner_replan/adapter_model.safetensors ] || fail "re-plan: the joiner's adapter is missing"
cotrain_pair 215 refused
[ $host_rc -eq 0 ] || fail "refused: host exited $host_rc: $(tail -3 host_refused.err)"
[ $join_rc -eq 1 ] || fail "refused: the joiner exited $join_rc, not 1: $(tail -3 join_refused.err)"
grep -q "with the adapters of pid $joiner, the finetune of pid $host needs at least [0-9]* MiB (its smallest plan: gradient checkpointing and micro-batch.*), more than this machine's 215 MiB of memory" join_refused.err ||
    fail "joiner's message: $(cat join_refused.err)"
grep -q "refused 1 adapter(s) of pid $joiner" host_refused.err || fail "host: $(cat host_refused.err)"
[ -f out/host_refused/adapter_model.safetensors ] || fail "the host's adapter is missing"
[ -e out/joiner_refused/adapter_model.safetensors ] && fail "the refused joiner's adapter was written"

# A cgroup memory limit of 150 MiB (below the need, far above what the tiny run uses): v1's
# memory hierarchy, or v2's when its memory controller is enabled at the root.
CG=""
if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/tandem-it-$$" 2>/dev/null; then
    CG=/sys/fs/cgroup/memory/tandem-it-$$
    echo $((150 << 20)) >"$CG/memory.limit_in_bytes"
elif [ "$(id -u)" = 0 ] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
    mkdir "/sys/fs/cgroup/tandem-it-$$" 2>/dev/null; then
    CG=/sys/fs/cgroup/tandem-it-$$
    echo $((150 << 20)) >"$CG/memory.max"
fi
if [ -n "$CG" ]; then
    meminfo 102400000 102400000
    TANDEM_MEMINFO="$WORK/meminfo" expect_exit 1 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' \
        sh "$CG" "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/cgroup
    grep -q "needs at least [0-9]* MiB (its smallest plan: .*; as asked $need MiB), more than this process's cgroup memory limit of 150 MiB" \
        "$WORK/last.err" || fail "cgroup: $(cat "$WORK/last.err")"
    rmdir "$CG" || echo "note: could not remove $CG"
else
    echo "note: no writable cgroup memory controller here: the cgroup part is not run"
fi
finish
