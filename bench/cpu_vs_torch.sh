#!/bin/bash
# CPU training speed of `tandem finetune --device cpu` against transformers + PEFT on the same
# cores (issue 20). In one call, on one host, with the GPU hidden from PyTorch:
#   1. writes a random model (`tandem init-model --preset PRESET`, bf16 on disk) and the data
#      (random ids in [0, 256), each sample exactly SEQ tokens, labels = input ids);
#   2. runs PyTorch: bench/peft_reference.py train --device cpu --dtype float32 --threads T
#      (LoRA r16 alpha 32 on q_proj,v_proj, AdamW, clip 1.0) for each T of TORCH_THREADS;
#   3. runs `tandem finetune --device cpu --method M --threads T` (same shapes and settings,
#      --log-every 1) for each "M:T" of RUNS; tokens/s from adapter 0's metrics.jsonl
#      elapsed_ms between step WARMUP and step WARMUP+STEPS (loading and warm-up excluded);
#   4. optionally, before the runs of 3., tandem runs with --profile-ops (PROFILE="M:T[:S] ...",
#      1 timed step unless S): each op table in OUT/profile-M-tT.txt, the first in profile.txt;
#   5. prints a table (tok/s, s/step, speed-up and parallel efficiency against tandem lora at
#      1 thread, ratio to PyTorch at 16 threads, each run's peak resident memory: tandem's VmHWM
#      polled from /proc while it runs, PyTorch's ru_maxrss in its JSON) and writes it, rows.tsv
#      and the logs to OUT.
# A run is skipped when BUDGET seconds have passed since the start (the table says so).
#
#   bench/cpu_vs_torch.sh TANDEM_BIN
# Env: PRESET (qwen2.5-0.5b), BATCH (4), SEQ (256), WARMUP (1), STEPS (3; a "M:T:S" run entry
# overrides the steps), RUNS ("lora:16 qlora:16 lora:8 lora:4:2 lora:2:2 lora:1:1"),
# TORCH_THREADS ("16"; "16 1:1" adds a 1-thread run of 1 timed step), PROFILE ("", e.g.
# "lora:16:1 lora:1:1": run before RUNS), BUDGET (100000: no run starts after it), HARD_LIMIT (BUDGET +
# 600: a run still going then is killed, its row FAIL), TORCH_AFTER ("": PyTorch runs "T[:S]" after all the others,
# each only while under AFTER_BUDGET seconds, default 200), PAIRS (0: after everything else, that
# many more rounds of PyTorch then tandem lora, both at PAIR_THREADS (16) threads, each pair's
# ratio and their median in OUT/pairs.md: a host whose speed drifts between runs moves both
# sides of a pair alike), WORK (/tmp/tandem-cpu-vs-torch), OUT (default $OUT, else WORK/results), PYTHON
# (python3), PY_LD_LIBRARY_PATH (the library path for Python; default LD_LIBRARY_PATH minus the
# entries under .device/). Record results in docs/benchmarks.md with date, machine and command.
set -uo pipefail
TANDEM=${1:?usage: bench/cpu_vs_torch.sh TANDEM_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
PRESET=${PRESET:-qwen2.5-0.5b}
BATCH=${BATCH:-4}
SEQ=${SEQ:-256}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
RUNS=${RUNS-lora:16 qlora:16 lora:8 lora:4:2 lora:2:2 lora:1:1}
TORCH_THREADS=${TORCH_THREADS-16}
TORCH_AFTER=${TORCH_AFTER:-}
AFTER_BUDGET=${AFTER_BUDGET:-200}
PAIRS=${PAIRS:-0}
PAIR_THREADS=${PAIR_THREADS:-16}
TAG=
PROFILE=${PROFILE:-}
BUDGET=${BUDGET:-100000}
HARD_LIMIT=${HARD_LIMIT:-$((BUDGET + 600))}
WORK=${WORK:-/tmp/tandem-cpu-vs-torch}
RES=${OUT:-$WORK/results}
PYTHON=${PYTHON:-python3}
PY_LD=${PY_LD_LIBRARY_PATH-$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v '/\.device/' | paste -sd: -)}
T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
mkdir -p "$WORK" "$RES"
ROWS=$RES/rows.tsv
printf 'side\tmethod\tthreads\ttok_s\ts_per_step\tsteps\twall_s\tnote\tmax_rss_mib\n' >"$ROWS"
ncores=$(nproc)
echo "# $(date -u +%FT%TZ) $(uname -n): nproc $ncores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "# preset $PRESET, batch $BATCH x $SEQ, rank 16 q_proj,v_proj, warm-up $WARMUP, timed $STEPS (unless the run says)"
"$TANDEM" --version 2>/dev/null | head -n 1

# ---- the model and the data ----
MODEL=$WORK/$PRESET
if [ ! -f "$MODEL/.complete" ]; then
    t=$(date +%s.%N)
    rm -rf "$MODEL"
    "$TANDEM" init-model "$MODEL" --preset "$PRESET" --dtype bf16 >/dev/null || { echo "init-model failed"; exit 1; }
    touch "$MODEL/.complete"
    echo "model written in $(since "$t") s"
fi
# data_file N: N samples (exactly SEQ random ids each), so that one epoch is N / BATCH steps
data_file() {
    local f=$WORK/data-$1-$SEQ.jsonl
    [ -s "$f" ] || awk -v n="$1" -v S="$SEQ" 'BEGIN { srand(1000)
        for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
            for (j = 0; j < S; j++) printf "%s%d", (j ? ", " : ""), int(rand() * 256)
            print "]}" } }' >"$f"
    echo "$f"
}

# run_limit: seconds a run may take before HARD_LIMIT (from the start) kills it (at least 10)
run_limit() { awk -v a="$(since "$T0")" -v b="$HARD_LIMIT" 'BEGIN { l = int(b - a); print (l < 10 ? 10 : l) }'; }
over_budget() { awk -v a="$(since "$T0")" -v b="${1:-$BUDGET}" 'BEGIN { exit !(a > b) }'; }
has_threads=0
"$TANDEM" finetune --help 2>&1 | grep -q -- '--threads' && has_threads=1

run_tandem() { # method threads steps [extra flags...]
    local method=$1 T=$2 steps=$3 name out t rc el0 el1 tok sps
    shift 3
    name="tandem-$method-t$T$([ $# -gt 0 ] && echo -profile)$TAG"
    out=$WORK/runs/$name
    if over_budget "${RUN_BUDGET:-}"; then
        printf 'tandem\t%s\t%s\tskipped\t-\t%s\t-\tover budget\n' "$method" "$T" "$steps" >>"$ROWS"
        echo "== $name: skipped (over the ${BUDGET} s budget)"
        return
    fi
    rm -rf "$out"
    mkdir -p "$out"
    local flags=()
    [ "$has_threads" = 1 ] && flags+=(--threads "$T")
    echo "== $name"
    t=$(date +%s.%N)
    local want=$((WARMUP + steps)) data
    data=$(data_file $((BATCH * want)))
    # in the background, its peak resident memory (VmHWM, a high-water mark: any read after the
    # peak gives it) polled from /proc until it ends, killed (124) past run_limit
    OMP_NUM_THREADS=$T TANDEM_LEDGER_DIR=$WORK/ledger "$TANDEM" finetune "$MODEL" \
        --adapter "$data:$out/a0" --device cpu --method "$method" "${flags[@]}" --epochs 1 \
        --batch-size "$BATCH" --max-seq-len "$SEQ" --rank 16 --alpha 32 --targets q_proj,v_proj \
        --val-split 0 --log-every 1 --save-every 0 --no-shuffle --no-join "$@" >"$out/log.txt" 2>&1 &
    local pid=$! hwm=0 v deadline killed=0
    deadline=$(awk -v a="$(date +%s)" -v l="$(run_limit)" 'BEGIN { print a + l }')
    while kill -0 "$pid" 2>/dev/null; do
        v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
        [ -n "$v" ] && hwm=$v
        if [ "$(date +%s)" -ge "$deadline" ]; then kill -TERM "$pid" 2>/dev/null; killed=1; fi
        sleep 0.2
    done
    wait "$pid"
    rc=$?
    [ "$killed" = 1 ] && rc=124
    local rss_mib
    rss_mib=$(awk -v k="$hwm" 'BEGIN { printf "%.0f", k / 1024 }')
    cp "$out/log.txt" "$RES/$name.log"
    read -r el0 el1 < <(awk -v a="$WARMUP" -v b="$want" '
        /"val_loss"/ { next }
        { s = $0; sub(/.*"step": */, "", s); sub(/[,}].*/, "", s)
          e = $0; sub(/.*"elapsed_ms": */, "", e); sub(/[,}].*/, "", e)
          if (s == a) x = e; if (s == b) y = e }
        END { print (x == "" ? "-" : x), (y == "" ? "-" : y) }' "$out/a0/metrics.jsonl" 2>/dev/null || echo "- -")
    if [ "$el0" != - ] && [ "$el1" != - ]; then
        tok=$(awk -v n="$((BATCH * SEQ * steps))" -v a="$el0" -v b="$el1" 'BEGIN { printf "%.1f", n / ((b - a) / 1000) }')
        sps=$(awk -v n="$steps" -v a="$el0" -v b="$el1" 'BEGIN { printf "%.2f", (b - a) / 1000 / n }')
    else
        tok=FAIL sps=-
        echo "   exit $rc; last lines:"; tail -n 5 "$out/log.txt" | sed 's/^/   /'
    fi
    local thr; thr=$(grep -m1 -i 'thread' "$out/log.txt" | cut -c1-100)
    echo "   tokens/s $tok ($sps s/step), max RSS $rss_mib MiB, $(since "$t") s in all; ${thr:-no threads line}"
    printf 'tandem\t%s\t%s\t%s\t%s\t%s\t%s\texit=%s\t%s\n' "$method$([ $# -gt 0 ] && echo ' (profiled)')" "$T" "$tok" "$sps" "$steps" "$(since "$t")" "$rc" "$rss_mib" >>"$ROWS"
}

run_torch() { # threads steps [budget]
    local T=$1 steps=$2 name=torch-t$1$TAG t tok sps
    if over_budget "${3:-}"; then
        printf 'torch\tlora-fp32\t%s\tskipped\t-\t%s\t-\tover budget\n' "$T" "$steps" >>"$ROWS"
        echo "== $name: skipped (over the ${BUDGET} s budget)"
        return
    fi
    echo "== $name"
    t=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=$T LD_LIBRARY_PATH=$PY_LD timeout "$(run_limit)" \
        "$PYTHON" "$HERE/peft_reference.py" train \
        --device cpu --dtype float32 --threads "$T" --model "$MODEL" \
        --data "$(data_file $((BATCH * (WARMUP + steps))))" \
        --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$steps" \
        --json "$RES/$name.json" >"$RES/$name.log" 2>&1
    tok=$(sed -n 's/.*"tok_s": \([-0-9.eE+]*\).*/\1/p' "$RES/$name.json" 2>/dev/null | head -n 1)
    if [ -n "$tok" ]; then
        sps=$(awk -v t="$tok" -v n="$((BATCH * SEQ))" 'BEGIN { printf "%.2f", n / t }')
        tok=$(awk -v t="$tok" 'BEGIN { printf "%.1f", t }')
    else
        tok=FAIL sps=-
        tail -n 5 "$RES/$name.log" | sed 's/^/   /'
    fi
    local rss_mib
    rss_mib=$(sed -n 's/.*"max_rss_mib": \([-0-9.eE+]*\).*/\1/p' "$RES/$name.json" 2>/dev/null | head -n 1)
    rss_mib=$(awk -v r="$rss_mib" 'BEGIN { print (r == "" ? "-" : sprintf("%.0f", r)) }')
    echo "   tokens/s $tok ($sps s/step), max RSS $rss_mib MiB, $(since "$t") s in all"
    printf 'torch\tlora-fp32\t%s\t%s\t%s\t%s\t%s\t-\t%s\n' "$T" "$tok" "$sps" "$steps" "$(since "$t")" "$rss_mib" >>"$ROWS"
}

for spec in $TORCH_THREADS; do
    IFS=: read -r T S <<<"$spec"
    run_torch "$T" "${S:-$STEPS}"
done
# each profile's table in profile-M-tT.txt; the first one's also in profile.txt
for spec in $PROFILE; do
    IFS=: read -r M T S <<<"$spec"
    run_tandem "$M" "$T" "${S:-1}" --profile-ops
    sed -n '/^op profile/,$p' "$RES/tandem-$M-t$T-profile.log" | grep -v '^report:' | head -n 40 >"$RES/profile-$M-t$T.txt"
    [ -f "$RES/profile.txt" ] || cp "$RES/profile-$M-t$T.txt" "$RES/profile.txt"
    cat "$RES/profile-$M-t$T.txt"
done
for spec in $RUNS; do
    IFS=: read -r M T S <<<"$spec"
    run_tandem "$M" "$T" "${S:-$STEPS}"
done
for spec in $TORCH_AFTER; do
    IFS=: read -r T S <<<"$spec"
    run_torch "$T" "${S:-$STEPS}" "$AFTER_BUDGET"
done

# alternating pairs, after the rest: the table below counts only the runs above
ROWS_MAIN=$ROWS
if [ "$PAIRS" -gt 0 ]; then
    ROWS=$RES/rows-pairs.tsv
    head -n 1 "$ROWS_MAIN" >"$ROWS"
    RUN_BUDGET=$AFTER_BUDGET
    for r in $(seq "$PAIRS"); do
        TAG=-pair$r
        run_torch "$PAIR_THREADS" "$STEPS" "$AFTER_BUDGET"
        run_tandem lora "$PAIR_THREADS" "$STEPS"
    done
    TAG= RUN_BUDGET=
    {
        echo "| pair | PyTorch tok/s | tandem lora tok/s | ratio |"
        echo "| --- | --- | --- | --- |"
        awk -F'\t' 'NR > 1 && $1 == "torch" { t = $4 }
            NR > 1 && $1 == "tandem" { n++; r = (t + 0 > 0 && $4 + 0 > 0) ? $4 / t : 0
                printf "| %d | %s | %s | %s |\n", n, t, $4, (r > 0 ? sprintf("%.2fx", r) : "-")
                if (r > 0) rs[++k] = r; t = "" }
            END { if (k) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (rs[j] < rs[i]) { x = rs[i]; rs[i] = rs[j]; rs[j] = x }
                    med = k % 2 ? rs[(k + 1) / 2] : (rs[k / 2] + rs[k / 2 + 1]) / 2
                    printf "| median of %d | | | %.2fx (min %.2fx, max %.2fx) |\n", k, med, rs[1], rs[k] } }' "$ROWS"
    } >"$RES/pairs.md"
    ROWS=$ROWS_MAIN
fi

# ---- the table ----
{
    echo "| side | method | threads | tok/s | s/step | timed steps | speed-up vs tandem lora 1 thread | parallel efficiency | vs PyTorch 16 threads | max RSS MiB |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    awk -F'\t' 'NR == 1 { next }
        { side[NR] = $1; m[NR] = $2; t[NR] = $3; tok[NR] = $4; sps[NR] = $5; st[NR] = $6; rss[NR] = ($9 == "" ? "-" : $9); n = NR
          if ($1 == "tandem" && $2 == "lora" && $3 == 1 && $4 + 0 > 0) base = $4
          if ($1 == "torch" && $3 == 16 && $4 + 0 > 0) torch16 = $4 }
        END { for (i = 2; i <= n; i++) {
                su = "-"; eff = "-"; vt = "-"
                if (side[i] == "tandem" && m[i] == "lora" && base > 0 && tok[i] + 0 > 0) {
                    su = sprintf("%.2fx", tok[i] / base); eff = sprintf("%.0f%%", 100 * tok[i] / base / t[i]) }
                if (torch16 > 0 && tok[i] + 0 > 0) vt = sprintf("%.2fx", tok[i] / torch16)
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", side[i], m[i], t[i], tok[i], sps[i], st[i], su, eff, vt, rss[i] } }' "$ROWS"
} >"$RES/table.md"
echo
echo "total $(since "$T0") s"
cat "$RES/table.md"
[ -f "$RES/pairs.md" ] && echo && cat "$RES/pairs.md"
