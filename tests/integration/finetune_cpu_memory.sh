# A CPU run checks the machine's memory before it loads anything (docs/finetune.md, "Memory on
# the CPU"): the need it prints is the estimate with f32 activations and the CPU backend's kept
# scratch + 200 MiB for the process, the figure `tandem submit` places CPU processes with
# (unit.memory_plan holds the two equal). A /proc/meminfo stand-in (TANDEM_MEMINFO) plays the
# machine:
#  - MemTotal under the need: exit 1 before the load, the message names the need, its parts, the
#    machine's memory and what shrinks a run; nothing written;
#  - MemAvailable under the need: a warning, the run trains;
#  - plenty: one "cpu memory" line, the run trains; --grad-checkpoint lowers the need;
#  - an unreadable meminfo: a note, the run trains;
#  - a CPU host refuses a joiner whose adapters would take the need past the machine's memory
#    (the joiner exits 1 with the need and the limit; the host trains on);
#  - a real cgroup memory limit under the need (root, a writable memory controller; else that
#    part is skipped with a note): exit 1 naming the cgroup limit.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cd "$WORK" || exit 1
for i in $(seq 1 12); do echo "{\"prompt\": \"p$i\", \"completion\": \"c$i\"}"; done >d.jsonl
RUN=(finetune "$M" --device cpu --no-join --epochs 1 --batch-size 4 --max-seq-len 64 --save-every 0)
meminfo() { printf 'MemTotal: %d kB\nMemFree: 1000 kB\nMemAvailable: %d kB\n' "$1" "$2" >"$WORK/meminfo"; }
need_of() { sed -n 's/.*needs about \([0-9]*\) MiB.*/\1/p; s/.*cpu memory: about \([0-9]*\) MiB.*/\1/p' "$1" | head -1; }

meminfo 102400 51200 # 100 MiB
TANDEM_MEMINFO="$WORK/meminfo" expect_exit 1 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/small
grep -q -- "--device cpu: this run needs about [0-9]* MiB (weights [0-9]* + activations [0-9]* + adapters [0-9]* + backend scratch [0-9]* + process 200), more than this machine's 100 MiB of memory ($WORK/meminfo)" \
    "$WORK/last.err" || fail "too small: $(cat "$WORK/last.err")"
grep -q "grad-checkpoint" "$WORK/last.err" || fail "too small: no advice: $(cat "$WORK/last.err")"
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
TANDEM_MEMINFO="$WORK/meminfo" expect_exit 0 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/gc --grad-checkpoint
gc=$(need_of "$WORK/last.err")
[ "${gc:-0}" -gt 0 ] && [ "$gc" -lt "$need" ] || fail "--grad-checkpoint: $gc MiB, without $need"

TANDEM_MEMINFO="$WORK/nowhere" expect_exit 0 "$TANDEM" "${RUN[@]}" --adapter d.jsonl:out/unknown
grep -q "the machine's memory is unknown" "$WORK/last.err" || fail "unknown: $(cat "$WORK/last.err")"
# A CPU host (about 205 MiB) in a 400 MiB machine, and a joiner of 16 x 512-token samples (about
# 600 MiB more): refused, exit 1; the host is undisturbed.
python3 -c "
import json
for i in range(16): print(json.dumps({'text': ('word%d ' % i) * 120}))" >long.jsonl
meminfo $((400 * 1024)) $((400 * 1024))
export TANDEM_MEMINFO="$WORK/meminfo"
"$TANDEM" finetune "$M" --device cpu --epochs 2 --batch-size 2 --max-seq-len 32 --save-every 0 \
    --adapter d.jsonl:out/host >host.out 2>host.err &
host=$!
hold_host $host
"$TANDEM" finetune "$M" --device cpu --epochs 1 --batch-size 16 --max-seq-len 512 --save-every 0 \
    --adapter long.jsonl:out/joiner >join.out 2>join.err &
joiner=$!
release_host $host join.err
wait $joiner
rc=$?
wait $host || fail "host exited $?: $(tail -3 host.err)"
unset TANDEM_MEMINFO
[ $rc -eq 1 ] || fail "the joiner exited $rc, not 1: $(tail -3 join.err)"
grep -q "with the adapters of pid $joiner, the finetune of pid $host: --device cpu: this run needs about [0-9]* MiB .*, more than this machine's 400 MiB of memory" join.err ||
    fail "joiner's message: $(cat join.err)"
grep -q "refused 1 adapter(s) of pid $joiner" host.err || fail "host: $(cat host.err)"
[ -f out/host/adapter_model.safetensors ] || fail "the host's adapter is missing"
[ -e out/joiner/adapter_model.safetensors ] && fail "the refused joiner's adapter was written"

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
    grep -q "needs about $need MiB (.*), more than this process's cgroup memory limit of 150 MiB" \
        "$WORK/last.err" || fail "cgroup: $(cat "$WORK/last.err")"
    rmdir "$CG" || echo "note: could not remove $CG"
else
    echo "note: no writable cgroup memory controller here: the cgroup part is not run"
fi
finish
