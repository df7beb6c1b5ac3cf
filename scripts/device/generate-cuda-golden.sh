#!/bin/bash
# On the GPU machine (torch, transformers, peft; issue 16 part 1's open point): is
# `tandem generate --device cuda` (bf16) leaving transformers' greedy tokens by rounding or by a
# bug? Build HERE first with CUDA (make build) and pack (scripts/device/pack.sh, which includes
# tests/test_generate); carry .device-pack.
#   1. tests/fixtures/generate/gen_golden.py: the float32 fixtures again, now with each step's
#      float64 lead and best score (prompts and tokens must equal the committed ones), then with
#      --dtype bfloat16 (sdpa, eager) transformers' own bf16 greedy run on the same prompts ->
#      expected-bf16-{sdpa,eager}.json;
#   2. `tandem generate --json --top-logits 256` over every fixture prompt (ids lines), base and
#      PEFT adapter: --device cuda (batched, --no-cache, --batch-size 1) and --device cpu;
#   3. test_generate's golden tests on CUDA: the float32 fixtures and the new bf16 ones (first 16
#      tokens; what ctest's unit.generate_cuda checks once the bf16 fixtures are committed);
#   4. scripts/device/generate_cuda_compare.py: for every first mismatch the position, the
#      float32 model's lead there and tandem's, tandem's and transformers-bf16's logit errors
#      against float32 on the same context, and a verdict (rounding / BUG?).
# Output under $OUT: generate-golden/expected.json and expected-bf16-{sdpa,eager}.json (commit
# the three to tests/fixtures/generate/golden/ when the summary says the float32 prompts and
# tokens are unchanged), tandem-*/CASE.jsonl, generate-cuda-report.json, *.log.
# Prints the comparison table last. Budget ~2 min.
set -u
OUT=${OUT:-/tmp/tandem-generate-cuda-golden}
mkdir -p "$OUT"
exec > >(tee "$OUT/generate-cuda-golden.log") 2>&1
source scripts/device/device-env.sh
gpu_line
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
FIX=tests/fixtures/generate/golden
G=$OUT/generate-golden
mkdir -p "$G"
echo "== 1. transformers greedy: float32 (with leads) and bf16 on the fixtures' prompts"
BF=0
timeout 150 python3 tests/fixtures/generate/gen_golden.py --out "$G" || BF=1
SAME=$(python3 - "$FIX/expected.json" "$G/expected.json" <<'PY'
import json, sys
try:
    a, b = (json.load(open(p))["cases"] for p in sys.argv[1:])
    print("unchanged" if [(c["prompts"], c["tokens"]) for c in a] ==
          [(c["prompts"], c["tokens"]) for c in b] else "CHANGED")
except Exception as e:
    print("FAILED", e)
PY
)
echo "float32 fixtures' prompts and tokens against the committed ones: $SAME"
[ "$SAME" = unchanged ] || cp "$FIX/expected.json" "$G/expected.json"
for attn in sdpa eager; do
    timeout 120 python3 tests/fixtures/generate/gen_golden.py --dtype bfloat16 --attn $attn \
        --prompts "$G/expected.json" --out "$G" || BF=1
done
tdm() { env LD_LIBRARY_PATH="$DEVICE_LD" TANDEM_SOURCE_DIR="$PWD" "$@"; }
W=/tmp/gen-cuda-golden; rm -rf $W; mkdir -p $W
export TANDEM_LEDGER_DIR=$W/ledger
echo "== 2. tandem generate over the fixture prompts"
# the golden models have no tokenizer: the tiny preset's byte-level one (ids 0-255 are bytes, so
# every id decodes; no tokenizer_config.json, so EOS is config.json's eos_token_id 2)
tdm .device/tandem init-model $W/tk --preset tiny --seed 1 >/dev/null
for mdl in llama qwen2; do
    cp -r tests/fixtures/train/golden/$mdl $W/$mdl && cp $W/tk/tokenizer.json $W/$mdl/
done
python3 - "$FIX/expected.json" $W >$W/cases.txt <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cases"]:
    with open(f"{sys.argv[2]}/{c['name']}.prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"ids": p}) + "\n" for p in c["prompts"])
    print(c["name"], c["model"], c["adapter"] or "-", d["max_new_tokens"])
PY
RUNS=0
while read -r name mdl adapter n; do
    ad=(); [ "$adapter" != - ] && ad=(--adapter "$name=tests/fixtures/train/golden/$adapter/adapter")
    for run in cuda cuda-nocache cuda-b1 cpu; do
        case $run in
        cuda) extra=(--device cuda) ;;
        cuda-nocache) extra=(--device cuda --no-cache) ;;
        cuda-b1) extra=(--device cuda --batch-size 1) ;;
        cpu) extra=(--device cpu) ;;
        esac
        mkdir -p "$OUT/tandem-$run"
        tdm timeout 60 .device/tandem generate $W/$mdl --method lora --chat-template none \
            --file $W/$name.prompts.jsonl --max-new-tokens "$n" --json --top-logits 256 \
            "${extra[@]}" "${ad[@]}" </dev/null >"$OUT/tandem-$run/$name.jsonl" 2>"$W/$name.$run.err" ||
            { RUNS=1; echo "tandem generate $name $run failed:"; tail -3 "$W/$name.$run.err"; }
    done
    python3 -c 'import json, sys; print(sys.argv[1] + ":", *(json.loads(l)["tokens"][:6] for l in open(sys.argv[2])))' \
        "$name" "$OUT/tandem-cuda/$name.jsonl" 2>/dev/null
done <$W/cases.txt
echo "== 3. test_generate golden tests, CUDA backend"
TANDEM_GENERATE_BACKEND=cuda TANDEM_GENERATE_ONLY=golden TANDEM_GENERATE_GOLDEN="$G" \
    tdm timeout 60 .device/bin/test_generate >"$OUT/test_generate_cuda.log" 2>&1
TG=$?
grep -E "GENERATE OK|prompt|FAIL|ERROR|OK \]|SKIP" "$OUT/test_generate_cuda.log" | head -30
echo "== 4. rounding or a bug"
timeout 120 python3 scripts/device/generate_cuda_compare.py "$G" "$OUT/tandem-cuda" \
    "$OUT/generate-cuda-report.json" nocache="$OUT/tandem-cuda-nocache" b1="$OUT/tandem-cuda-b1" \
    cpu="$OUT/tandem-cpu" >"$OUT/compare.txt" 2>"$OUT/compare.err"
CMP=$?
[ $CMP = 0 ] || tail -20 "$OUT/compare.err"
echo
echo "== summary"
printf '%-52s %s\n' "fixtures (gen_golden.py float32 + bf16 sdpa/eager)" "$([ $BF = 0 ] && echo ok || echo FAIL)"
printf '%-52s %s\n' "float32 prompts/tokens vs committed" "$SAME"
printf '%-52s %s\n' "tandem generate runs (cuda x3, cpu)" "$([ $RUNS = 0 ] && echo ok || echo FAIL)"
printf '%-52s %s\n' "test_generate CUDA golden (f32 + bf16 fixtures)" "$([ $TG = 0 ] && echo PASS || echo "FAIL rc=$TG")"
grep -h "GENERATE OK" "$OUT/test_generate_cuda.log" | sed 's/^/  /'
printf '%-52s %s\n' "compare (generate_cuda_compare.py)" "$([ $CMP = 0 ] && echo ok || echo "FAIL rc=$CMP")"
echo "columns: diff@ first token tandem cuda != transformers f32 (sdpa@/eagr@: transformers bf16's);"
echo "  fp32 lead: f32 top1-top2 there; own-alt: f32's preference of its token over tandem's; td lead:"
echo "  tandem's of its own; td err / hf16 err: max |logit - f32| on tandem's sequence;"
echo "  td rel / hf rel: the same errors over the step's best f32 logit (test_generate's BF16_REACH"
echo "  assumes < 1/64 = 0.0156); nocache/b1: same tokens as the batched cached run; cpu: tandem cpu =="
echo "  f32 fixtures"
cat "$OUT/compare.txt"
