# `tandem finetune` and `tandem eval` end to end on the tiny random model (CPU):
#  - three adapters fused from an adapters.toml (different ranks, targets, learning rates, data
#    sizes, epochs): PEFT files with the right tensor names and shapes, trainer_state.json,
#    metadata.json, metrics.jsonl well-formed, checkpoints, and the training loss falls;
#  - determinism: the same run again (with --profile-ops, whose table it checks) gives
#    byte-identical adapters;
#  - kill -9 mid-run, then --resume: the same final adapter bytes and logged losses;
#  - weights (upper 0.375 and add 0.3 of reverse's 1: lighter adapters spread their optimizer
#    batches over global steps): the same samples per optimizer step as without weights, one log
#    line per optimizer step, checkpoints in the middle of a batch (with its partial gradient),
#    and kill -9 / --resume gives the uninterrupted weighted run's bytes and losses;
#  - eval with the adapter is lower than without; --json shape;
#  - bad data: exit 1 with FILE:LINE and nothing written; usage errors exit 2.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1

write_toml() { # write_toml FILE PREFIX [UPPER_WEIGHT ADD_WEIGHT]
    cat >"$1" <<EOF
[[adapter]]
data = "data/reverse.jsonl"
output = "$2/reverse"
label = "reverse"
rank = 8
learning_rate = 5e-3

[[adapter]]
data = "data/upper.jsonl"
output = "$2/upper"
label = "upper"
rank = 4
targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
learning_rate = 1e-2
epochs = 3
${3:+weight = $3}

[[adapter]]
data = "data/add.jsonl"
output = "$2/add"
label = "add"
rank = 2
targets = "gate_proj,up_proj,down_proj"
learning_rate = 1e-2
epochs = 1
${4:+weight = $4}
EOF
}
COMMON=(--batch-size 4 --epochs 2 --val-split 0.1 --log-every 1 --eval-every 3 --save-every 2
        --lr-schedule constant --max-seq-len 64 --seed 7)

write_toml run1.toml run1
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config run1.toml "${COMMON[@]}"
# the CPU backend's thread count is said once, at start
[ "$(grep -Ec '^tandem: cpu: [0-9]+ threads \(' last.err)" = 1 ] ||
    fail "no single 'cpu: N threads' line: $(grep -i thread last.err)"
for a in reverse upper add; do
    d="run1/$a"
    for f in adapter_model.safetensors adapter_config.json trainer_state.json metadata.json \
             metrics.jsonl; do
        [ -s "$d/$f" ] || fail "$d/$f missing"
    done
    ls -d "$d"/checkpoint-* >/dev/null 2>&1 || fail "$d: no checkpoint"
    jq -e '.peft_type == "LORA" and .task_type == "CAUSAL_LM"' "$d/adapter_config.json" >/dev/null \
        || fail "$d adapter_config"
    jq -e '.global_step > 0 and (.log_history | length) > 0' "$d/trainer_state.json" >/dev/null \
        || fail "$d trainer_state"
    jq -e '(.data_hash | startswith("sha256:")) and .lora_rank > 0 and .train_loss > 0' \
        "$d/metadata.json" >/dev/null || fail "$d metadata"
    jq -e -s 'length > 0 and all(.step >= 1)' "$d/metrics.jsonl" >/dev/null || fail "$d metrics"
    # the training loss falls: the last logged loss is below the first
    first=$(jq -s '[.[] | select(.loss)] | first.loss' "$d/metrics.jsonl")
    last=$(jq -s '[.[] | select(.loss)] | last.loss' "$d/metrics.jsonl")
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "$d: loss did not fall ($first -> $last)"
done
# ranks / targets / shapes as configured (safetensors header: 8-byte length, then JSON)
hdr() { local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' '); dd if="$1" bs=1 skip=8 count="$n" status=none; }
hdr run1/upper/adapter_model.safetensors >upper.hdr
jq -e '."base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight".shape == [4, 256]' upper.hdr >/dev/null \
    || fail "upper k_proj A shape: $(jq -c '."base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"' upper.hdr)"
jq -e '."base_model.model.model.layers.3.self_attn.o_proj.lora_B.weight".shape == [256, 4]' upper.hdr >/dev/null \
    || fail "upper o_proj B shape"
hdr run1/add/adapter_model.safetensors >add.hdr
jq -e '."base_model.model.model.layers.1.mlp.down_proj.lora_A.weight".shape == [2, 688]' add.hdr >/dev/null \
    || fail "add down_proj A shape"
jq -e 'has("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") | not' add.hdr >/dev/null \
    || fail "add must not target q_proj"
[ "$(jq -r .r run1/reverse/adapter_config.json)" = 8 ] || fail "reverse rank"
jq -e ".epoch == 1" run1/add/metadata.json >/dev/null || fail "add epochs: $(jq .epoch run1/add/metadata.json)"
jq -e ".epoch == 3" run1/upper/metadata.json >/dev/null || fail "upper epochs"

# determinism: the same command again gives the same bytes, also with --profile-ops (timing
# every op changes nothing), which prints the per-op table at the end, and on one CPU (the
# default thread count follows the affinity mask; results do not depend on it)
write_toml run2.toml run2
expect_exit 0 env -u OMP_NUM_THREADS taskset -c "$(taskset -pc $$ | sed 's/.*: *//; s/[,-].*//')" \
    "$TANDEM" finetune "$M" --adapters-config run2.toml "${COMMON[@]}" --profile-ops
grep -q '^tandem: cpu: 1 threads (the CPUs this process may use: affinity 1' last.err ||
    fail "one CPU in the mask: $(grep 'cpu:' last.err)"
grep -q '^tandem: cpu: 1 threads .*; GEMMs: ' last.err || fail "the thread note names no GEMM mode"
# the OpenBLAS kernel set, never a pre-AVX fallback on a CPU with AVX (src/main.c re-executes)
core=$(sed -n 's/^tandem: cpu: .*; OpenBLAS core \([A-Za-z0-9_]*\).*/\1/p' last.err | head -n 1)
[ -n "$core" ] || fail "the thread note names no OpenBLAS core: $(grep 'cpu:' last.err)"
if grep -qw avx /proc/cpuinfo; then
    case "$core" in Prescott | Core2 | Penryn | Dunnington | Nehalem | Atom | Opteron | Barcelona)
        fail "OpenBLAS core $core on a CPU with AVX" ;;
    esac
fi
grep -q '^op profile (backend cpu)' last.err || fail "--profile-ops: no table"
for op in linear_fwd linear_bwd lora_bwd cross_entropy adamw; do
    grep -Eq "^  $op +[1-9][0-9]* " last.err || fail "--profile-ops: no $op row with calls"
done
for a in reverse upper add; do
    cmp -s run1/$a/adapter_model.safetensors run2/$a/adapter_model.safetensors || fail "$a: not deterministic"
done
# the GEMM mode (docs/engine.md): an unknown TANDEM_CPU_GEMM is refused, naming the variable
expect_exit 2 env TANDEM_CPU_GEMM=tile "$TANDEM" finetune "$M" --adapters-config run2.toml "${COMMON[@]}"
grep -q 'TANDEM_CPU_GEMM=tile: unknown mode' last.err || fail "TANDEM_CPU_GEMM=tile: $(tail -1 last.err)"
# an OUT_DIR with checkpoints is not silently overwritten
expect_exit 2 "$TANDEM" finetune "$M" --adapters-config run2.toml "${COMMON[@]}"
grep -q -- "--resume" last.err || fail "existing checkpoints message"

# kill -9 after the first checkpoints, then --resume: same adapters, same logged losses
kill_and_resume() { # kill_and_resume REF PREFIX [UPPER_WEIGHT ADD_WEIGHT]
    local ref=$1 run=$2; shift 2
    write_toml $run.toml $run "$@"
    kill9_when $run/reverse/checkpoint-4 "$TANDEM" finetune "$M" --adapters-config $run.toml "${COMMON[@]}"
    expect_exit 0 "$TANDEM" finetune "$M" --adapters-config $run.toml "${COMMON[@]}" --resume
    same_run $ref $run "resume differs" reverse upper add
}
kill_and_resume run1 run3

# weights: upper puts 1.5 of its 4 sequences in each pass, add 1.2 (reverse, the heaviest, 4)
write_toml w1.toml w1 0.375 0.3
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config w1.toml "${COMMON[@]}"
for a in reverse upper add; do
    # the same samples form every optimizer step: the same counted tokens, step by step
    diff <(jq -c 'select(.loss) | [.step, .tokens]' run1/$a/metrics.jsonl) \
         <(jq -c 'select(.loss) | [.step, .tokens]' w1/$a/metrics.jsonl) >/dev/null || fail "w1/$a: other batches than unweighted"
    # a log line at every optimizer step (--log-every 1), steps 1..max_steps
    jq -e -s --argjson n "$(jq .max_steps w1/$a/trainer_state.json)" \
        '[.[] | select(.loss) | .step] == [range(1; $n + 1)]' w1/$a/metrics.jsonl >/dev/null || fail "w1/$a: log lines"
    # the first step's loss is computed before any update: equal to the unweighted run's
    awk -v a="$(jq -s '[.[] | select(.loss)] | first.loss' run1/$a/metrics.jsonl)" \
        -v b="$(jq -s '[.[] | select(.loss)] | first.loss' w1/$a/metrics.jsonl)" \
        'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * a) }' || fail "w1/$a: first loss differs"
done
# upper and add saved checkpoints in the middle of a batch, each with its partial gradient
for a in upper add; do
    mid=0
    for c in w1/$a/checkpoint-*; do
        jq -e '.trainer.piece.seqs_done > 0' $c/tandem_state.json >/dev/null || continue
        mid=$((mid + 1))
        { jq -e '.files | index("grad_accum.safetensors")' $c/tandem_state.json >/dev/null &&
            [ -s $c/grad_accum.safetensors ]; } || fail "$c: no partial gradient"
    done
    [ $mid -gt 0 ] || fail "w1/$a: no checkpoint in the middle of a batch"
done
kill_and_resume w1 w2 0.375 0.3

# eval: the trained adapter beats the bare base on its own data
expect_exit 0 "$TANDEM" eval "$M" --data data/add.jsonl --json
base=$(jq .loss last.out)
jq -e 'has("loss") and has("tokens") and has("perplexity") and .tokens > 0' last.out >/dev/null || fail "eval json"
expect_exit 0 "$TANDEM" eval "$M" --data data/add.jsonl --adapter run1/add --json
tuned=$(jq .loss last.out)
awk -v a="$base" -v b="$tuned" 'BEGIN { exit !(b < a) }' || fail "eval: adapter $tuned not below base $base"
expect_exit 0 "$TANDEM" eval "$M" --data data/add.jsonl --adapter run1/add
grep -q "perplexity" last.out || fail "eval text"

# --init-adapter: starts from a PEFT adapter whose rank and targets win over the flags
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:init/add --init-adapter run1/add \
    --rank 16 --targets q_proj --epochs 1 --batch-size 8 --save-every 0 --val-split 0 --max-seq-len 64
jq -e '.r == 2 and .target_modules == ["gate_proj", "up_proj", "down_proj"]' init/add/adapter_config.json \
    >/dev/null || fail "--init-adapter shape: $(jq -c '[.r, .target_modules]' init/add/adapter_config.json)"
first=$(jq -s '[.[] | select(.loss)] | first.loss' init/add/metrics.jsonl)
awk -v a="$first" -v b="$base" 'BEGIN { exit !(a < b - 0.5) }' || fail "--init-adapter: first loss $first not below base $base"

# bad data: every bad line as FILE:LINE, exit 1, nothing written
printf '{"instruction": "a", "response": "b"}\n{"instruction": "a"\n' >bad.jsonl
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/add.jsonl:bad/one --adapter bad.jsonl:bad/two
grep -q "^bad.jsonl:2" last.err || fail "bad line report: $(cat last.err)"
[ -e bad ] && fail "bad data: something was written"

# usage errors
# no adapter at all says so; both ways at once say "not both"
expect_exit 2 "$TANDEM" finetune "$M" --device cpu
grep -q "finetune: no adapter given: give --adapter DATA.jsonl:OUT_DIR (one or more) or --adapters-config FILE$" last.err ||
    fail "no adapter message: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapter nocolon
expect_exit 2 "$TANDEM" finetune "$M" --adapter a.jsonl:o --rank 0
expect_exit 2 "$TANDEM" finetune "$M" --adapter a.jsonl:o --schedule fastest
expect_exit 2 "$TANDEM" finetune "$M" --adapter a.jsonl:o --lora-dropout 1
grep -q "lora-dropout needs a probability" last.err || fail "dropout message"
expect_exit 2 "$TANDEM" finetune "$M" --adapter a.jsonl:o --adapters-config run1.toml
grep -q "or --adapters-config FILE, not both$" last.err || fail "both ways message: $(cat last.err)"
expect_exit 2 "$TANDEM" eval "$M"
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/add.jsonl:cu/x --device cuda
# --base-compute fp8: a bad value or --method lora is a usage error (2); the CPU backend refuses
# it (1); each message names the option, and nothing is written
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:f8/x --base-compute fp16
grep -q "bf16 or fp8" last.err || fail "--base-compute value message: $(cat last.err)"
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/add.jsonl:f8/x --device cpu --no-join \
    --base-compute fp8
grep -q "base-compute fp8 needs a CUDA GPU" last.err || fail "fp8 on the CPU: $(cat last.err)"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:f8/x --device cpu --no-join \
    --method lora --base-compute fp8
grep -q "needs --method qlora" last.err || fail "fp8 with lora: $(cat last.err)"
[ ! -e f8/x/adapter_model.safetensors ] || fail "a refused fp8 run wrote an adapter"
finish
