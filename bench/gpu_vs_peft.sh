#!/bin/bash
# tandem finetune on a GPU against Hugging Face transformers + PEFT LoRA on the same shapes
# (issue 6's benchmark). Random qwen2.5 models from `tandem init-model`, sequence 512 (every sample
# exactly 512 tokens, no padding), rank 16, q_proj,v_proj, AdamW lr 2e-4. Prints one table
# (tokens/s, MFU, peak memory, ratios) and the issue's targets with pass/miss.
#
#   bench/gpu_vs_peft.sh TANDEM_BIN [options]       measure (on the GPU machine)
#   bench/gpu_vs_peft.sh --combine ROWS.tsv...      one table from the rows of several calls
#   bench/gpu_vs_peft.sh --flops MODEL_DIR           model FLOPs per trained token (the MFU count)
#
# Options:
#   --models LIST     0.5b,1.5b,7b (default all three; any `tandem init-model` preset name works,
#                     e.g. `tiny` for a local smoke run)
#   --configs LIST    replaces every model's default configurations. Grammar: AxB[gc][-lora] =
#                     tandem, A fused adapters, batch B per adapter, [gc] = --grad-checkpoint,
#                     [-lora] = --method lora (the base in bf16, as PEFT's; default qlora: NF4);
#                     peftNxB = N PEFT processes at once, batch B each. Defaults:
#                       0.5b: 1x4 3x4 1x8 peft1x4 peft1x8     1.5b: 1x4 3x4 peft1x4 peft3x4
#                       7b:   1x4 1x4gc 3x4 peft1x4           other presets: 1x4 3x4 peft1x4
#   --skip-peft       tandem only          --skip-tandem    PEFT only
#   --skip-matmul     no bf16 matmul measurement (MFU then uses another call's rate at --combine)
#                     The rate: bench_train --matmul 8192 (tandem's own cuBLASLt GEMM path) when
#                     a bench_train binary is next to TANDEM_BIN or in its bin/ (BENCH_TRAIN=PATH
#                     names one), else torch.matmul
#   --warmup K        untimed steps first (5)        --steps T   timed steps (20)
#   --device D        tandem's --device (cuda); `cpu` for a local smoke run without a GPU
#   --work DIR        models, data and run directories (/tmp/tandem-gpu-bench); a model already
#                     there (marker .bench-complete) is reused, so a second call skips init-model
#   --out DIR         where rows, table and logs go ($OUT when set, else WORK/results)
#   --python PY       python3 with torch, transformers, peft (python3)
#   --tandem-flags S  extra flags for every tandem finetune, word-split (e.g. "--profile-ops":
#                     the per-op table lands at the end of each run's log)
#   --dry-run         print the plan and the commands, run nothing
#
# Rows (TSV, header `kind model ...`) go to OUT/rows-<stamp>.tsv; the table to OUT/table-<stamp>.md.
# The FLOP count per token (MFU) is written down in flops_per_token below and in docs/benchmarks.md.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SEQ=512
RANK=16
ALPHA=32
TARGETS=q_proj,v_proj

die() { echo "gpu_vs_peft: $*" >&2; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------------------- the table ----
# combine ROWS.tsv...: prints the markdown table and the targets. Each tandem row is set against
# the PEFT row of the same model and batch: 3 fused adapters against 3 PEFT processes when that row
# exists (else against 1 process, said so in the reference column); --grad-checkpoint rows against
# PEFT without it (the issue's target). MFU uses the matmul rate measured in the same file (call);
# a file without one uses the mean of the other files' rates.
combine() {
    awk -F'\t' '
    function num(x) { return x ~ /^[0-9.eE+-]+$/ && x != "-" }
    function fmt(x, d) { return num(x) ? sprintf("%." d "f", x) : "-" }
    function ratio(a, b) { return (num(a) && num(b) && b > 0) ? a / b : "-" }
    function mfu(tok, fl, f,   r) {
        r = (f in rate) ? rate[f] : (nrate > 0 ? sumrate / nrate : "")
        if (!num(tok) || !num(fl) || r == "") return "-"
        return sprintf("%.1f%%", 100 * tok * fl / (r * 1e12))
    }
    function conf(a, b, gc, lora) { return (a == 1 ? "1 adapter" : a " fused") ", b" b (gc == 1 ? ", grad-ckpt" : "") (lora ? ", bf16 base (lora)" : "") }
    FNR == 1 && $1 == "kind" { next }
    $1 == "meta" { meta[++nmeta] = FILENAME ": " $2 " " $12; next }
    $1 == "matmul" { if (num($10)) { rate[FILENAME] = $10; sumrate += $10; nrate++ } ; next }
    $1 == "phase" { phase[++nphase] = sprintf("%-40s %8s s", $2, $11); next }
    $1 == "tandem" || $1 == "tandem-lora" || $1 == "peft" {
        i = ++n; kind[i] = $1 == "peft" ? "peft" : "tandem"; lora[i] = $1 == "tandem-lora"; model[i] = $2; ad[i] = $3; b[i] = $4; gc[i] = $5; tok[i] = $6
        peak[i] = $7; self[i] = $8; fl[i] = $9; file[i] = FILENAME; note[i] = $12
        if ($1 == "peft") { key = $2 SUBSEP $3 SUBSEP $4; pk[key] = i }
    }
    END {
        for (f in rate) printf "bf16 matmul rate (%s): %.1f TFLOP/s\n", f, rate[f]
        print ""
        print "| model | config | reference | tandem tok/s | PEFT tok/s | tok/s ratio | tandem MFU | PEFT MFU | tandem peak MiB (own) | PEFT peak MiB (own) | memory ratio |"
        print "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        for (i = 1; i <= n; i++) {
            if (kind[i] != "tandem") continue
            j = 0
            if (ad[i] > 1 && ((model[i] SUBSEP ad[i] SUBSEP b[i]) in pk)) j = pk[model[i] SUBSEP ad[i] SUBSEP b[i]]
            else if ((model[i] SUBSEP 1 SUBSEP b[i]) in pk) j = pk[model[i] SUBSEP 1 SUBSEP b[i]]
            if (j) used[j] = 1
            ref = j ? "PEFT " ad[j] (ad[j] == 1 ? " proc" : " procs") " b" b[j] : "-"
            tr = j ? ratio(tok[i], tok[j]) : "-"; mr = j ? ratio(peak[i], peak[j]) : "-"
            key = model[i] SUBSEP ad[i] SUBSEP b[i] SUBSEP gc[i] SUBSEP lora[i]
            tr_of[key] = tr; mr_of[key] = mr; ref_of[key] = ref
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) | %s (%s) | %s |\n", model[i], conf(ad[i], b[i], gc[i], lora[i]), ref,
                fmt(tok[i], 0), j ? fmt(tok[j], 0) : "-", num(tr) ? sprintf("%.2fx", tr) : "-",
                mfu(tok[i], fl[i], file[i]), j ? mfu(tok[j], fl[j], file[j]) : "-",
                fmt(peak[i], 0), fmt(self[i], 0), j ? fmt(peak[j], 0) : "-", j ? fmt(self[j], 0) : "-",
                num(mr) ? sprintf("%.2fx", mr) : "-"
        }
        for (j = 1; j <= n; j++) {
            if (kind[j] != "peft" || (j in used)) continue
            printf "| %s | PEFT %s, b%s | - | - | %s | - | - | %s | - | %s (%s) | - |\n", model[j],
                ad[j] == 1 ? "1 proc" : ad[j] " procs", b[j], fmt(tok[j], 0), mfu(tok[j], fl[j], file[j]), fmt(peak[j], 0), fmt(self[j], 0)
        }
        print ""
        print "Targets (issue 6; ratio = tandem / PEFT, memory = sampled peak of the process(es)):"
        target("qwen2.5-7b", 1, 4, 0, 1.1, 0.7, "7B, 1 adapter, b4: tok/s >= 1.1x PEFT, memory <= 0.7x")
        target("qwen2.5-0.5b", 1, 8, 0, 3.0, "", "0.5B, 1 adapter, b8: tok/s >= 3x PEFT")
        target("qwen2.5-1.5b", 3, 4, 0, 1.4, 0.7, "1.5B, 3 fused adapters, b4: tok/s >= 1.4x three PEFT processes, memory <= 0.7x")
        target("qwen2.5-7b", 1, 4, 1, 0.8, 0.35, "7B --grad-checkpoint, b4: tok/s >= 0.8x PEFT, memory <= 0.35x")
        print "Targets (issue 19, item 5; qlora unless said):"
        target("qwen2.5-0.5b", 1, 8, 0, 4.0, "", "0.5B, 1 adapter, b8: tok/s >= 4x PEFT")
        target("qwen2.5-0.5b", 1, 8, 0, 4.0, "", "0.5B, 1 adapter, b8, bf16 base (lora): tok/s >= 4x PEFT", 1)
        target("qwen2.5-1.5b", 3, 4, 0, 2.0, "", "1.5B, 3 fused adapters, b4: tok/s >= 2x three PEFT processes")
        target("qwen2.5-1.5b", 3, 4, 0, 2.0, "", "1.5B, 3 fused, b4, bf16 base (lora): tok/s >= 2x three PEFT processes", 1)
        if (nphase) { print ""; print "Phases (wall-clock):"; for (i = 1; i <= nphase; i++) print "  " phase[i] }
        for (i = 1; i <= nmeta; i++) print "# " meta[i]
    }
    function target(m, a, bb, g, tmin, mmax, text, lo,   key, tr, mr, ok, s) {
        key = m SUBSEP a SUBSEP bb SUBSEP g SUBSEP (lo ? 1 : 0)
        if (!(key in tr_of) || !num(tr_of[key]) || (mmax != "" && !num(mr_of[key]))) {
            printf "  %-82s not measured\n", text; return
        }
        tr = tr_of[key]; mr = mr_of[key]
        if (a > 1 && ref_of[key] !~ /procs/) { printf "  %-82s not measured (no %d-process PEFT row)\n", text, a; return }
        ok = tr >= tmin && (mmax == "" || mr <= mmax)
        s = sprintf("tok/s %.2fx", tr); if (mmax != "") s = s sprintf(", memory %.2fx", mr)
        printf "  %-82s %s -> %s\n", text, s, ok ? "PASS" : "MISS"
    }' "$@"
}

# flops_per_token MODEL_DIR: frozen-base FLOPs of one trained token (sequence SEQ), the same
# count for tandem and PEFT (docs/benchmarks.md, "MFU"):
#   N     = L * (d*H*hd + 2*d*KV*hd + H*hd*d + 3*d*f) + d*V   matmul weights: q,k,v,o,gate,up,down
#                                                             per layer, plus the lm_head
#   base  = 2*N (forward) + 2*N (backward, activation gradients only: the base is frozen)
#   attn  = L * 6 * S * H*hd                                  QK^T and PV: 2*2*S*H*hd forward,
#                                                             halved by the causal mask, x3 with
#                                                             the backward (2x forward)
#   total = base + attn. Not counted: the LoRA matmuls (0.3 % at 7B r16 q,v), recomputation under
#   --grad-checkpoint (MFU counts the model's work, not the implementation's), norms, RoPE,
#   SwiGLU, softmax and the optimizer.
cfg_int() { sed -n "s/.*\"$2\": *\([0-9][0-9]*\).*/\1/p" "$1/config.json" | head -n 1; }
flops_per_token() {
    local dir=$1 d f L H KV hd V
    d=$(cfg_int "$dir" hidden_size); f=$(cfg_int "$dir" intermediate_size)
    L=$(cfg_int "$dir" num_hidden_layers); H=$(cfg_int "$dir" num_attention_heads)
    KV=$(cfg_int "$dir" num_key_value_heads); hd=$(cfg_int "$dir" head_dim)
    V=$(cfg_int "$dir" vocab_size)
    [ -n "$KV" ] || KV=$H
    [ -n "$hd" ] || hd=$((d / H))
    awk -v d="$d" -v f="$f" -v L="$L" -v H="$H" -v KV="$KV" -v hd="$hd" -v V="$V" \
        -v S="$SEQ" 'BEGIN {
        N = L * (d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * f) + d * V
        base = 4 * N
        attn = L * 6 * S * H * hd
        printf "%.0f\n", base + attn }'
}

if [ "${1:-}" = "--combine" ]; then
    shift
    [ $# -gt 0 ] || die "--combine needs ROWS.tsv files"
    for f in "$@"; do [ -r "$f" ] || die "$f: cannot read"; done
    combine "$@"
    exit 0
fi

if [ "${1:-}" = "--flops" ]; then
    [ $# = 2 ] && [ -r "$2/config.json" ] || die "--flops MODEL_DIR (a directory with config.json)"
    flops_per_token "$2"
    exit 0
fi

# ---------------------------------------------------------------------------- arguments ----
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h | --help) usage; exit 0 ;; esac
TANDEM=$1
shift
MODELS=0.5b,1.5b,7b
CONFIGS=""
SKIP_PEFT=0
SKIP_TANDEM=0
SKIP_MATMUL=0
WARMUP=5
STEPS=20
DEVICE=cuda
WORK=/tmp/tandem-gpu-bench
RES=""
PY=python3
DRY=0
TANDEM_FLAGS=""
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
    case "$1" in
    --models) need "$@"; MODELS=$2; shift ;;
    --configs) need "$@"; CONFIGS=$2; shift ;;
    --skip-peft) SKIP_PEFT=1 ;;
    --skip-tandem) SKIP_TANDEM=1 ;;
    --skip-matmul) SKIP_MATMUL=1 ;;
    --warmup) need "$@"; WARMUP=$2; shift ;;
    --steps) need "$@"; STEPS=$2; shift ;;
    --device) need "$@"; DEVICE=$2; shift ;;
    --work) need "$@"; WORK=$2; shift ;;
    --out) need "$@"; RES=$2; shift ;;
    --python) need "$@"; PY=$2; shift ;;
    --tandem-flags) need "$@"; TANDEM_FLAGS=$2; shift ;;
    --dry-run) DRY=1 ;;
    *) die "unknown option $1 (see the header of $0)" ;;
    esac
    shift
done
[[ $WARMUP =~ ^[0-9]+$ ]] || die "--warmup $WARMUP: a whole number >= 0"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "--steps $STEPS: a whole number >= 1"
[ "$WARMUP" -ge 1 ] || [ "$SKIP_TANDEM" = 1 ] ||
    die "--warmup 0: tandem's timing starts at a log point after the warm-up; use --warmup >= 1"
case "$DEVICE" in cuda | cpu) ;; *) die "--device $DEVICE: cuda or cpu" ;; esac
[ "$DRY" = 1 ] || [ -x "$TANDEM" ] || die "$TANDEM: not an executable tandem binary"
case "$TANDEM" in /*) ;; *) TANDEM=$PWD/$TANDEM ;; esac
[ -n "$RES" ] || RES=${OUT:-$WORK/results}

preset_of() {
    case "$1" in
    0.5b) echo qwen2.5-0.5b ;; 1.5b) echo qwen2.5-1.5b ;; 7b) echo qwen2.5-7b ;; *) echo "$1" ;;
    esac
}
default_configs() {
    case "$1" in
    qwen2.5-0.5b) echo "1x4 3x4 1x8 peft1x4 peft1x8" ;;
    qwen2.5-1.5b) echo "1x4 3x4 peft1x4 peft3x4" ;;
    qwen2.5-7b) echo "1x4 1x4gc 3x4 peft1x4" ;;
    *) echo "1x4 3x4 peft1x4" ;;
    esac
}
PLAN=()   # "preset config" pairs, in run order: per model tandem first, then PEFT
for m in ${MODELS//,/ }; do
    p=$(preset_of "$m")
    cs=${CONFIGS//,/ }
    [ -n "$cs" ] || cs=$(default_configs "$p")
    for c in $cs; do
        if [[ $c =~ ^peft([1-9][0-9]*)x([1-9][0-9]*)$ ]]; then
            [ "$SKIP_PEFT" = 1 ] && continue
        elif [[ $c =~ ^([1-9][0-9]*)x([1-9][0-9]*)(gc)?(-lora)?$ ]]; then
            [ "$SKIP_TANDEM" = 1 ] && continue
        else
            die "--configs: $c is neither AxB[gc][-lora] nor peftNxB"
        fi
        PLAN+=("$p $c")
    done
done
[ ${#PLAN[@]} -gt 0 ] || [ "$SKIP_MATMUL" = 0 ] || die "nothing to run (every configuration skipped)"

# ------------------------------------------------------------------------ measurement ----
# log_every: tandem's metrics.jsonl gives elapsed_ms at each log point; the timed window is
# [step WARMUP, step WARMUP+STEPS], so both must be log points: log every gcd(WARMUP, STEPS).
gcd() { local a=$1 b=$2 t; while [ "$b" -gt 0 ]; do t=$((a % b)); a=$b; b=$t; done; echo "$a"; }
LOG_EVERY=$(gcd "$WARMUP" "$STEPS")
[ "$LOG_EVERY" -ge 1 ] || LOG_EVERY=1

# make_data N SEED FILE: N samples in tandem's `tokens` format, each exactly SEQ random ids in
# [0, 256) (the byte ids every init-model tokenizer has; finetune accepts ids below
# min(config vocab, tokenizer size)). labels default to input_ids: every token is learned.
make_data() {
    awk -v n="$1" -v seed="$2" -v S="$SEQ" 'BEGIN {
        srand(seed)
        for (i = 0; i < n; i++) {
            printf "{\"input_ids\": ["
            for (j = 0; j < S; j++) printf "%s%d", (j ? ", " : ""), int(rand() * 256)
            print "]}"
        } }' >"$3.tmp" && mv "$3.tmp" "$3"
}
data_file() { # data_file BATCH INDEX: the INDEX-th adapter's (or process's) data for this batch
    local n=$(($1 * (WARMUP + STEPS))) f
    f="$WORK/data/n$n-$2.jsonl"
    [ "$DRY" = 1 ] || [ -s "$f" ] || make_data "$n" "$((1000 + $2))" "$f"
    echo "$f"
}

# mem_sampler OUTFILE PID...: every 100 ms while any PID lives, one line "mine all used": the
# summed nvidia-smi used_memory (MiB) of the compute apps that are one of the PIDs or their
# descendants; of every compute app (when PID namespaces differ, no PID matches); and the GPU's
# memory.used (when no per-process figure is visible at all).
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1; }
mem_sampler() {
    local out=$1; shift
    local roots="$*" alive p tree used
    : >"$out"
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    while :; do
        alive=0
        for p in $roots; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || break
        tree=$(ps -e -o pid=,ppid= | awk -v roots=" $roots " '
            { pp[$1] = $2 }
            END { n = split(roots, r, " "); for (i = 1; i <= n; i++) in_[r[i]] = 1
                  do { ch = 0; for (k in pp) if (!(k in in_) && (pp[k] in in_)) { in_[k] = 1; ch = 1 } } while (ch)
                  for (k in in_) printf " %s", k; print " " }')
        used=$(gpu_used)
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            awk -F', *' -v tree="$tree" -v used="${used:-0}" '
                $2 ~ /^[0-9]+$/ { all += $2; if (index(tree, " " $1 " ")) mine += $2 }
                END { printf "%d %d %d\n", mine, all, used }' >>"$out"
        sleep 0.1
    done
}
# peak_of FILE BASE: "PEAK HOW": the peak of "mine"; when no sample matched the PIDs, of "all";
# when no process was listed at all, of memory.used minus BASE (memory.used before the launch).
peak_of() {
    awk -v base="${2:-0}" '{ if ($1 > m) m = $1; if ($2 > a) a = $2; if ($3 > u) u = $3; n++ }
        END { if (n == 0) print "- no-nvidia-smi-samples"
              else if (m > 0) print m, "pid-matched"
              else if (a > 0) print a, "all-compute-apps"
              else if (u - base > 0) print u - base, "gpu-memory.used-minus-baseline"
              else print "- no-usage-seen" }' "$1"
}
jnum() { sed -n "s/.*\"$1\": \([-0-9.eE+]*\).*/\1/p" "$2" | head -n 1; }

ROWS=""
row() { # kind model adapters batch gc tok_s peak_mib self_mib flops_tok matmul_tflops wall_s note
    local IFS=$'\t'
    echo "$*" >>"$ROWS"
}

run_tandem() { # preset dir A B gc method
    local preset=$1 dir=$2 A=$3 B=$4 gc=$5 method=$6 name out i args=() t0 rc el0 el1 tok peak self fl
    local lsuf; lsuf=$([ "$method" = lora ] && echo -lora) # in the run's name and its row kind
    name="tandem-$preset-${A}x$B$([ "$gc" = 1 ] && echo gc)$lsuf"
    out="$WORK/runs/$name"
    for ((i = 0; i < A; i++)); do args+=(--adapter "$(data_file "$B" "$i"):$out/a$i"); done
    [ "$gc" = 1 ] && args+=(--grad-checkpoint)
    # shellcheck disable=SC2206 # word splitting of the extra flags is the point
    [ -n "$TANDEM_FLAGS" ] && args+=($TANDEM_FLAGS)
    local cmd=("$TANDEM" finetune "$dir" "${args[@]}" --device "$DEVICE" --method "$method" --epochs 1
        --batch-size "$B" --max-seq-len "$SEQ" --rank "$RANK" --alpha "$ALPHA" --targets "$TARGETS"
        --val-split 0 --log-every "$LOG_EVERY" --save-every 0 --no-wait-gpu)
    echo "== $name: ${cmd[*]}"
    [ "$DRY" = 1 ] && return 0
    rm -rf "$out"
    mkdir -p "$out"
    t0=$(now)
    local base; base=$(gpu_used)
    TANDEM_LEDGER_DIR="$WORK/ledger" "${cmd[@]}" >"$out/log.txt" 2>&1 &
    local pid=$!
    mem_sampler "$out/mem.txt" "$pid" &
    local spid=$!
    wait "$pid"; rc=$?
    wait "$spid"
    cp "$out/log.txt" "$RES/$name.log"
    [ -f "$out/a0/metrics.jsonl" ] && cp "$out/a0/metrics.jsonl" "$RES/$name.metrics.jsonl"
    read -r peak pnote < <(peak_of "$out/mem.txt" "$base")
    self=$(sed -n 's/.*device memory:.*peak \([0-9][0-9]*\) MiB.*/\1/p' "$out/log.txt" | tail -n 1)
    # adapter 0 logs first at every step, before any adapter's final save (trainer.c): its
    # elapsed_ms at steps WARMUP and WARMUP+STEPS bound the timed window.
    read -r el0 el1 < <(awk -v a="$WARMUP" -v b="$((WARMUP + STEPS))" '
        /"val_loss"/ { next }
        { s = $0; sub(/.*"step":/, "", s); sub(/,.*/, "", s)
          e = $0; sub(/.*"elapsed_ms":/, "", e); sub(/,.*/, "", e)
          if (s == a) x = e; if (s == b) y = e }
        END { print (x == "" ? "-" : x), (y == "" ? "-" : y) }' "$out/a0/metrics.jsonl" 2>/dev/null ||
        echo "- -")
    fl=$(flops_per_token "$dir")
    if [ "$rc" = 0 ] && [ "$el0" != - ] && [ "$el1" != - ]; then
        tok=$(awk -v n="$((A * B * SEQ * STEPS))" -v a="$el0" -v b="$el1" 'BEGIN { printf "%.1f", n / ((b - a) / 1000) }')
    else
        tok=FAIL
        echo "   exit $rc; last lines of $RES/$name.log:"; tail -n 5 "$out/log.txt" | sed 's/^/   /'
    fi
    echo "   tokens/s $tok, peak ${peak} MiB ($pnote), tandem's own peak ${self:--} MiB, $(since "$t0") s in all"
    row "tandem$lsuf" "$preset" "$A" "$B" "$gc" "$tok" "$peak" "${self:--}" "$fl" "$MATMUL" "$(since "$t0")" "exit=$rc mem=$pnote"
}

run_peft() { # preset dir NPROC B
    local preset=$1 dir=$2 N=$3 B=$4 name out i t0 pids=() rc=0 tok peak self fl
    name="peft-$preset-${N}x$B"
    out="$WORK/runs/$name"
    echo "== $name: $N x $PY $HERE/peft_reference.py train --model $dir --batch $B --warmup $WARMUP --steps $STEPS"
    [ "$DRY" = 1 ] && return 0
    rm -rf "$out"
    mkdir -p "$out"
    t0=$(now)
    local base; base=$(gpu_used)
    for ((i = 0; i < N; i++)); do
        py "$HERE/peft_reference.py" train --model "$dir" --data "$(data_file "$B" "$i")" \
            --batch "$B" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS" --rank "$RANK" \
            --alpha "$ALPHA" --targets "$TARGETS" --json "$out/p$i.json" \
            --barrier "$out/barrier" --barrier-n "$N" >"$out/p$i.log" 2>&1 &
        pids+=($!)
    done
    mem_sampler "$out/mem.txt" "${pids[@]}" &
    local spid=$!
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    wait "$spid"
    for ((i = 0; i < N; i++)); do
        cp "$out/p$i.log" "$RES/$name-p$i.log"
        [ -s "$out/p$i.json" ] || [ "$rc" != 0 ] || rc=1
    done
    read -r peak pnote < <(peak_of "$out/mem.txt" "$base")
    grep -qs '"barrier_met": false' "$out"/p*.json && pnote="$pnote barrier-missed"
    fl=$(flops_per_token "$dir")
    if [ "$rc" = 0 ]; then
        # N processes: all their tokens over the span from the first timed start to the last end
        # (they start together at the barrier), i.e. the joint rate.
        tok=$(for ((i = 0; i < N; i++)); do
            echo "$(jnum tokens "$out/p$i.json") $(jnum t_start "$out/p$i.json") $(jnum t_end "$out/p$i.json") $(jnum tok_s "$out/p$i.json")"
        done | awk '{ n += $1; if (s == "" || $2 < s) s = $2; if ($3 > e) e = $3; one = $4; k++ }
            END { if (k == 1) printf "%.1f", one; else printf "%.1f", n / (e - s) }')
        self=$(for ((i = 0; i < N; i++)); do jnum max_memory_allocated_mib "$out/p$i.json"; done |
            awk '{ s += $1 } END { printf "%.0f", s }')
    else
        tok=FAIL; self=-
        echo "   exit $rc; last lines:"; tail -n 5 "$out/p0.log" | sed 's/^/   /'
    fi
    echo "   tokens/s $tok, peak ${peak} MiB ($pnote), torch max_memory_allocated ${self} MiB, $(since "$t0") s in all" \
        "(model load $(jnum load_s "$out/p0.json") s; AutoTokenizer loaded the directory: $(sed -n 's/.*"tokenizer_loaded": \([a-z]*\).*/\1/p' "$out/p0.json" 2>/dev/null))"
    row peft "$preset" "$N" "$B" 0 "$tok" "$peak" "$self" "$fl" "$MATMUL" "$(since "$t0")" "exit=$rc mem=$pnote"
}

# PyTorch runs with the library path it would have without tandem: the entries added for tandem's
# binary (.device/ libraries, /usr/local/cuda) are dropped, so torch loads its own cuBLAS/cuDNN
# and the host's libgomp/libz stay torch's. PEFT_LD_LIBRARY_PATH overrides.
if [ -n "${PEFT_LD_LIBRARY_PATH+set}" ]; then
    PY_LD=$PEFT_LD_LIBRARY_PATH
else
    PY_LD=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v -e '/\.device' -e '^/usr/local/cuda' | paste -sd: -)
fi
py() { LD_LIBRARY_PATH="$PY_LD" "$PY" "$@"; }

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
MATMUL=-
echo "# gpu_vs_peft $STAMP: models $MODELS, warm-up $WARMUP + $STEPS timed steps, seq $SEQ, rank $RANK, $TARGETS, device $DEVICE"
echo "# plan: ${PLAN[*]/%/;}"
echo "# python: $PY with LD_LIBRARY_PATH='$PY_LD'"
# the engine's own GEMM timing, when its bench_train binary is there
if [ -z "${BENCH_TRAIN:-}" ]; then
    for c in "$(dirname "$TANDEM")/bench_train" "$(dirname "$TANDEM")/bin/bench_train"; do
        [ -x "$c" ] && { BENCH_TRAIN=$c; break; }
    done
fi
if [ "$DRY" = 1 ] && [ "$SKIP_MATMUL" = 0 ]; then
    if [ -n "${BENCH_TRAIN:-}" ]; then
        echo "== matmul: $BENCH_TRAIN --matmul 8192 --device cuda (on cuda; else torch.matmul)"
    else
        echo "== matmul: $PY $HERE/peft_reference.py matmul --n 8192 --runs 10"
    fi
fi
if [ "$DRY" = 0 ]; then
    mkdir -p "$WORK/models" "$WORK/data" "$WORK/runs" "$RES" || die "cannot create $WORK / $RES"
    ROWS="$RES/rows-$STAMP.tsv"
    printf 'kind\tmodel\tadapters\tbatch\tgc\ttok_s\tpeak_mib\tself_mib\tflops_tok\tmatmul_tflops\twall_s\tnote\n' >"$ROWS"
    GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    row meta "$STAMP" - - - - - - - - - "gpu=${GPU:-none}; host=$(uname -n); tandem=$TANDEM; $("$TANDEM" --version 2>/dev/null | head -n 1)"
    echo "# GPU: ${GPU:-none}; compute apps before the run: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';')"
fi
T_ALL=$(now)
# the matmul rate: the engine's own cuBLASLt GEMM when bench_train is there, else torch.matmul
if [ "$SKIP_MATMUL" = 0 ] && [ "$DRY" = 0 ]; then
    t0=$(now)
    if [ -n "${BENCH_TRAIN:-}" ] && [ "$DEVICE" = cuda ] &&
        "$BENCH_TRAIN" --matmul 8192 --device cuda >"$RES/matmul-$STAMP.log" 2>&1; then
        MATMUL=$(sed -n 's/.*tdm_be_linear_fwd: \([0-9.]*\) TFLOP.*/\1/p' "$RES/matmul-$STAMP.log")
        echo "== bf16 matmul 8192^3, tandem's cuBLASLt GEMM ($BENCH_TRAIN): median $MATMUL TFLOP/s"
        row matmul - - - - - - - - "$MATMUL" "$(since "$t0")" "tdm_be_linear_fwd (cuBLASLt) bf16 8192^3, median of 10"
    elif py "$HERE/peft_reference.py" matmul --json "$RES/matmul-$STAMP.json" >"$RES/matmul-$STAMP.log" 2>&1; then
        MATMUL=$(jnum tflops_median "$RES/matmul-$STAMP.json")
        echo "== bf16 matmul 8192^3: median $MATMUL TFLOP/s (min $(jnum tflops_min "$RES/matmul-$STAMP.json"), max $(jnum tflops_max "$RES/matmul-$STAMP.json"))"
        row matmul - - - - - - - - "$MATMUL" "$(since "$t0")" "torch.matmul bf16 8192^3, median of 10"
    else
        echo "== bf16 matmul failed (MFU left to --combine):"; tail -n 3 "$RES/matmul-$STAMP.log"
    fi
    row phase "matmul" - - - - - - - - "$(since "$t0")" -
fi

declare -A READY
for entry in "${PLAN[@]}"; do
    read -r preset c <<<"$entry"
    dir="$WORK/models/$preset"
    if [ -z "${READY[$preset]:-}" ]; then
        if [ "$DRY" = 1 ]; then
            echo "== init-model: $TANDEM init-model $dir --preset $preset (unless $dir/.bench-complete exists)"
        elif [ -f "$dir/.bench-complete" ]; then
            echo "== $preset: reusing $dir"
        else
            t0=$(now)
            rm -rf "$dir"
            if ! "$TANDEM" init-model "$dir" --preset "$preset" >"$RES/init-$preset.log" 2>&1; then
                echo "== init-model $preset failed:"; cat "$RES/init-$preset.log"
                row phase "init-model $preset (FAILED)" - - - - - - - - "$(since "$t0")" -
                READY[$preset]=failed
                continue
            fi
            touch "$dir/.bench-complete"
            echo "== init-model $preset: $(since "$t0") s, $(du -sh "$dir" | cut -f1)"
            row phase "init-model $preset" - - - - - - - - "$(since "$t0")" -
        fi
        READY[$preset]=ok
    fi
    [ "${READY[$preset]}" = ok ] || continue
    t0=$(now)
    if [[ $c =~ ^peft([0-9]+)x([0-9]+)$ ]]; then
        run_peft "$preset" "$dir" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    elif [[ $c =~ ^([0-9]+)x([0-9]+)(gc)?(-lora)?$ ]]; then
        run_tandem "$preset" "$dir" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" \
            "$([ -n "${BASH_REMATCH[3]}" ] && echo 1 || echo 0)" "$([ -n "${BASH_REMATCH[4]}" ] && echo lora || echo qlora)"
    fi
    [ "$DRY" = 1 ] || row phase "$preset $c" - - - - - - - - "$(since "$t0")" -
done
[ "$DRY" = 1 ] && exit 0
row phase "total" - - - - - - - - "$(since "$T_ALL")" -
echo
combine "$ROWS" | tee "$RES/table-$STAMP.md"
echo
echo "rows: $ROWS (combine several calls: $0 --combine ROWS.tsv...)"
