#!/bin/bash
# bench/gpu_vs_peft.sh without a GPU: argument handling and the plan; a real CPU run on the tiny
# preset (data of exactly 512 tokens per sample, the steady-state tokens/s taken from
# metrics.jsonl, memory sampled through a simulated nvidia-smi that reports the tandem process and
# one foreign process); the FLOP count of docs/benchmarks.md on the real qwen2.5-0.5b shapes; and
# the table/targets of --combine on hand-written rows (test input, not measurements).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
B="$TANDEM_SOURCE_DIR/bench/gpu_vs_peft.sh"

# --- arguments --------------------------------------------------------------------------------
expect_exit 2 bash "$B"
expect_exit 0 bash "$B" --help
grep -q -- "--skip-peft" "$WORK/last.out" || fail "--help does not list --skip-peft"
expect_exit 2 bash "$B" "$TANDEM" --bogus
expect_exit 2 bash "$B" "$TANDEM" --configs 2y3
grep -q "2y3 is neither" "$WORK/last.err" || fail "bad --configs: no reason given"
expect_exit 2 bash "$B" "$TANDEM" --steps 0
expect_exit 2 bash "$B" "$TANDEM" --warmup 0
expect_exit 2 bash "$B" "$TANDEM" --device rocm
expect_exit 2 bash "$B" "$TANDEM" --models
expect_exit 2 bash "$B" "$WORK/no-such-tandem" --models tiny
expect_exit 2 bash "$B" --combine "$WORK/missing.tsv"

expect_exit 0 bash "$B" "$TANDEM" --dry-run --work "$WORK/dry"
plan=$(grep '^# plan' "$WORK/last.out")
for want in "qwen2.5-0.5b 1x4;" "qwen2.5-0.5b 3x4;" "qwen2.5-0.5b 1x8;" "qwen2.5-0.5b peft1x8;" \
    "qwen2.5-1.5b peft3x4;" "qwen2.5-7b 1x4gc;" "qwen2.5-7b peft1x4;"; do
    case "$plan" in *"$want"*) ;; *) fail "default plan lacks '$want': $plan" ;; esac
done
grep -q -- "tandem-qwen2.5-7b-1x4gc: .*--grad-checkpoint" "$WORK/last.out" || fail "gc run without --grad-checkpoint"
grep -q -- "--batch-size 8 --max-seq-len 512 --rank 16 --alpha 32 --targets q_proj,v_proj --val-split 0 --log-every 5" \
    "$WORK/last.out" || fail "tandem command line (batch 8, seq 512, r16, q/v, log every gcd(5,20))"
grep -q "peft-qwen2.5-1.5b-3x4: 3 x " "$WORK/last.out" || fail "three PEFT processes"
[ -e "$WORK/dry" ] && fail "--dry-run wrote $WORK/dry"
expect_exit 0 bash "$B" "$TANDEM" --dry-run --models 0.5b --skip-peft --skip-matmul --warmup 4 --steps 6
grep -q "^== peft" "$WORK/last.out" && fail "--skip-peft still plans PEFT"
grep -q "^== matmul" "$WORK/last.out" && fail "--skip-matmul still plans the matmul"
grep -q -- "--log-every 2 " "$WORK/last.out" || fail "log every gcd(4, 6) = 2"
expect_exit 0 bash "$B" "$TANDEM" --dry-run --models 7b --skip-tandem --configs peft2x4,1x4
[ "$(grep -c '^== ' "$WORK/last.out")" = 3 ] || fail "--skip-tandem --configs: expected matmul, init, one PEFT run"
expect_exit 0 bash "$B" "$TANDEM" --dry-run --models 0.5b --skip-matmul --configs 1x8,1x8-lora,1x4gc-lora
grep -q -- "^== tandem-qwen2.5-0.5b-1x8: .*--method qlora" "$WORK/last.out" || fail "AxB without -lora is not qlora"
grep -q -- "^== tandem-qwen2.5-0.5b-1x8-lora: .*--method lora " "$WORK/last.out" || fail "-lora: no --method lora"
grep -q -- "^== tandem-qwen2.5-0.5b-1x4gc-lora: .*--grad-checkpoint.*--method lora " "$WORK/last.out" ||
    fail "gc-lora: not both --grad-checkpoint and --method lora"
expect_exit 2 bash "$B" "$TANDEM" --dry-run --configs 1x8-qlora

# --- FLOPs per token: the formula of docs/benchmarks.md on Qwen2.5-0.5B's shapes -------------------
mkdir -p "$WORK/q05"
cat >"$WORK/q05/config.json" <<'EOF'
{"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
 "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936}
EOF
# N = 24*(896*896 + 2*896*128 + 896*896 + 3*896*4864) + 896*151936 = 493961216; 4N = 1975844864
# attn = 24*6*512*896 = 66060288 (LoRA not counted: frozen-base FLOPs)
got=$(bash "$B" --flops "$WORK/q05")
[ "$got" = 2041905152 ] || fail "flops per token of qwen2.5-0.5b: $got, expected 2041905152"

# --- a real run on the CPU, tiny preset ---------------------------------------------------------
mkdir -p "$WORK/bin"
cat >"$WORK/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# Simulated nvidia-smi: every running tandem process uses 1234 MiB; a foreign pid 1 uses 999.
# FAKE_SMI_NOAPPS=1: no process listed (as in some containers); memory.used is 1000 MiB, plus
# 500 while a tandem process of this test runs (its command line names FAKE_SMI_TAG: other
# tandem processes on a shared machine must not count).
busy=$(ps -e -o comm=,args= | awk -v tag="$FAKE_SMI_TAG" '$1 == "tandem" && index($0, tag)' | wc -l)
case "$*" in
*query-compute-apps*)
    [ -n "${FAKE_SMI_NOAPPS:-}" ] && exit 0
    ps -e -o pid=,comm= | awk '$2 == "tandem" { print $1 ", 1234" }'; echo "1, 999" ;;
*memory.used*) [ "$busy" -gt 0 ] && echo 1500 || echo 1000 ;;
*query-gpu*) echo "Simulated GPU, 1000 MiB, 0.0" ;;
esac
EOF
chmod +x "$WORK/bin/nvidia-smi"
PATH="$WORK/bin:$PATH" expect_exit 0 bash "$B" "$TANDEM" --device cpu --models tiny --configs 1x1,2x1 \
    --skip-peft --skip-matmul --warmup 1 --steps 1 --work "$WORK/w" --out "$WORK/res"
cp "$WORK/last.out" "$WORK/run.out"
for f in "$WORK"/w/data/*.jsonl; do
    awk '{ n = gsub(/,/, ","); if (n + 1 != 512) { print FILENAME ":" NR ": " n + 1 " ids"; bad = 1 } } END { exit bad }' "$f" ||
        fail "$f: a sample without exactly 512 ids"
    "$TANDEM" data check "$f" --model "$WORK/w/models/tiny" --max-seq-len 512 --val-split 0 --json >"$WORK/dc.json" ||
        fail "data check $f"
    [ "$(jq '.longest == 512 and .truncated == 0 and .tokens == 512 * .samples and .samples == 2' "$WORK/dc.json")" = true ] ||
        fail "$f: not 2 samples of exactly 512 tokens: $(jq -c '{samples, tokens, longest, truncated}' "$WORK/dc.json")"
done
[ "$(ls "$WORK"/w/data/*.jsonl | wc -l)" = 2 ] || fail "expected 2 data files (2 adapters x batch 1)"
cmp -s "$WORK/w/data/n2-0.jsonl" "$WORK/w/data/n2-1.jsonl" && fail "both adapters got the same data"
rows=$(ls "$WORK"/res/rows-*.tsv)
for a in 1 2; do
    line=$(awk -F'\t' -v a=$a '$1 == "tandem" && $3 == a' "$rows")
    [ -n "$line" ] || { fail "no tandem row for $a adapter(s)"; continue; }
    tok=$(echo "$line" | cut -f6); peak=$(echo "$line" | cut -f7); fl=$(echo "$line" | cut -f9)
    # the same figure from the run's own metrics.jsonl: a*1*512*1 tokens over steps 1..2
    want=$(jq -s --argjson a $a '($a * 512) / ((.[1].elapsed_ms - .[0].elapsed_ms) / 1000)' \
        "$WORK/res/tandem-tiny-${a}x1.metrics.jsonl")
    awk -v t="$tok" -v w="$want" 'BEGIN { exit !(t > 0 && (t - w) ^ 2 < 0.01 + 1e-6 * w * w) }' ||
        fail "$a adapters: tokens/s $tok, metrics.jsonl says $want"
    [ "$peak" = 1234 ] || fail "$a adapters: sampled peak $peak, expected the tandem process's 1234 MiB"
    echo "$line" | grep -q "mem=pid-matched" || fail "$a adapters: memory not matched by pid: $line"
    [ "$fl" = "$(bash "$B" --flops "$WORK/w/models/tiny")" ] || fail "flops column $fl"
done
grep -q "^| tiny | 2 fused, b1 | - |" "$WORK/run.out" || fail "table row of the 2-adapter run missing"
grep -q "init-model tiny" "$WORK/run.out" || fail "phase timing of init-model missing"
# a second call reuses the model
PATH="$WORK/bin:$PATH" expect_exit 0 bash "$B" "$TANDEM" --device cpu --models tiny --configs 1x1 \
    --skip-peft --skip-matmul --warmup 1 --steps 1 --work "$WORK/w" --out "$WORK/res2"
grep -q "reusing $WORK/w/models/tiny" "$WORK/last.out" || fail "second call did not reuse the model"
# no per-process figures: the peak is memory.used minus its value before the launch
FAKE_SMI_NOAPPS=1 FAKE_SMI_TAG="$WORK/w/models" PATH="$WORK/bin:$PATH" expect_exit 0 bash "$B" "$TANDEM" --device cpu --models tiny \
    --configs 1x1 --skip-peft --skip-matmul --warmup 1 --steps 1 --work "$WORK/w" --out "$WORK/res3"
line=$(awk -F'\t' '$1 == "tandem"' "$WORK"/res3/rows-*.tsv)
[ "$(echo "$line" | cut -f7)" = 500 ] && echo "$line" | grep -q "mem=gpu-memory.used-minus-baseline" ||
    fail "memory.used fallback: $line"

# --- --combine on hand-written rows (test input) -----------------------------------------------
T=$'\t'
hdr="kind${T}model${T}adapters${T}batch${T}gc${T}tok_s${T}peak_mib${T}self_mib${T}flops_tok${T}matmul_tflops${T}wall_s${T}note"
{
    echo "$hdr"
    echo "matmul${T}-${T}-${T}-${T}-${T}-${T}-${T}-${T}-${T}800${T}9${T}-"
    echo "tandem${T}qwen2.5-0.5b${T}1${T}8${T}0${T}120000${T}3000${T}2500${T}2e9${T}800${T}30${T}-"
    echo "peft${T}qwen2.5-0.5b${T}1${T}8${T}0${T}30000${T}10000${T}9000${T}2e9${T}800${T}40${T}-"
    echo "tandem${T}qwen2.5-1.5b${T}3${T}4${T}0${T}50000${T}20000${T}-${T}6e9${T}800${T}30${T}-"
    echo "peft${T}qwen2.5-1.5b${T}1${T}4${T}0${T}16000${T}11000${T}9000${T}6e9${T}800${T}30${T}-"
    echo "peft${T}qwen2.5-1.5b${T}3${T}4${T}0${T}40000${T}32768${T}27000${T}6e9${T}800${T}30${T}-"
    echo "tandem-lora${T}qwen2.5-0.5b${T}1${T}8${T}0${T}150000${T}3500${T}3000${T}2e9${T}800${T}30${T}-"
    echo "tandem-lora${T}qwen2.5-1.5b${T}3${T}4${T}0${T}82000${T}24000${T}-${T}6e9${T}800${T}30${T}-"
    echo "phase${T}init-model qwen2.5-1.5b${T}-${T}-${T}-${T}-${T}-${T}-${T}-${T}-${T}12.5${T}-"
} >"$WORK/a.tsv"
{
    echo "$hdr"
    echo "tandem${T}qwen2.5-7b${T}1${T}4${T}0${T}17000${T}15000${T}-${T}3e10${T}-${T}30${T}-"
    echo "tandem${T}qwen2.5-7b${T}1${T}4${T}1${T}12000${T}9000${T}-${T}3e10${T}-${T}30${T}-"
    echo "tandem${T}qwen2.5-7b${T}3${T}4${T}0${T}FAIL${T}-${T}-${T}3e10${T}-${T}30${T}exit=1"
    echo "peft${T}qwen2.5-7b${T}1${T}4${T}0${T}14868${T}27750${T}27000${T}3e10${T}-${T}30${T}-"
} >"$WORK/b.tsv"
expect_exit 0 bash "$B" --combine "$WORK/a.tsv" "$WORK/b.tsv"
o="$WORK/last.out"
has() { grep -qF -- "$1" "$o" || fail "combine: missing '$1'"; }
# 120000 tok/s * 2e9 FLOP / 800 TFLOP/s = 30 %; 30000 -> 7.5 %
has "| qwen2.5-0.5b | 1 adapter, b8 | PEFT 1 proc b8 | 120000 | 30000 | 4.00x | 30.0% | 7.5% | 3000 (2500) | 10000 (9000) | 0.30x |"
has "| qwen2.5-1.5b | 3 fused, b4 | PEFT 3 procs b4 | 50000 | 40000 | 1.25x |"
has "| qwen2.5-1.5b | PEFT 1 proc, b4 | - | - | 16000 |"
# b.tsv has no matmul row: its MFU uses a.tsv's 800 TFLOP/s (17000 * 3e10 / 8e14 = 63.8 %)
has "| qwen2.5-7b | 1 adapter, b4 | PEFT 1 proc b4 | 17000 | 14868 | 1.14x | 63.8% |"
has "| qwen2.5-7b | 1 adapter, b4, grad-ckpt | PEFT 1 proc b4 | 12000 | 14868 | 0.81x |"
has "| qwen2.5-7b | 3 fused, b4 | PEFT 1 proc b4 | - | 14868 | - |"
grep -E "7B, 1 adapter, b4: .*tok/s 1.14x, memory 0.54x -> PASS" "$o" >/dev/null || fail "7B target line"
grep -E "0.5B, 1 adapter, b8: .*tok/s 4.00x -> PASS" "$o" >/dev/null || fail "0.5B target line"
grep -E "1.5B, 3 fused adapters, b4: .*tok/s 1.25x, memory 0.61x -> MISS" "$o" >/dev/null || fail "1.5B target line"
grep -E "7B --grad-checkpoint, b4: .*tok/s 0.81x, memory 0.32x -> PASS" "$o" >/dev/null || fail "gc target line"
# the bf16 base (tandem --method lora) beside qlora, against the same PEFT rows
has "| qwen2.5-0.5b | 1 adapter, b8, bf16 base (lora) | PEFT 1 proc b8 | 150000 | 30000 | 5.00x |"
has "| qwen2.5-1.5b | 3 fused, b4, bf16 base (lora) | PEFT 3 procs b4 | 82000 | 40000 | 2.05x |"
grep -E "0.5B, 1 adapter, b8: tok/s >= 4x PEFT +tok/s 4.00x -> PASS" "$o" >/dev/null || fail "issue 19 0.5B target line"
grep -E "0.5B, 1 adapter, b8, bf16 base \(lora\): .*tok/s 5.00x -> PASS" "$o" >/dev/null || fail "issue 19 0.5B lora line"
grep -E "1.5B, 3 fused adapters, b4: tok/s >= 2x .*tok/s 1.25x -> MISS" "$o" >/dev/null || fail "issue 19 1.5B target line"
grep -E "1.5B, 3 fused, b4, bf16 base \(lora\): .*tok/s 2.05x -> PASS" "$o" >/dev/null || fail "issue 19 1.5B lora line"
has "init-model qwen2.5-1.5b"
# only a.tsv: the 7B targets are not measured
expect_exit 0 bash "$B" --combine "$WORK/a.tsv"
grep -E "7B, 1 adapter, b4: .* not measured" "$WORK/last.out" >/dev/null || fail "missing 7B rows not reported as not measured"
finish
