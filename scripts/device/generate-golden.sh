#!/bin/bash
# On the GPU machine (torch, transformers, peft; issue 16 part 1): the golden fixtures of `tandem
# generate` and its checks there. Build HERE first with CUDA (make build) and pack
# (scripts/device/pack.sh, which includes tests/test_generate); carry .device-pack.
#   1. tests/fixtures/generate/gen_golden.py: transformers' generate(do_sample=False) on the
#      golden Llama / Qwen2 models, base and PEFT adapter, float64 == float32 -> expected.json;
#   2. test_generate on the CPU backend: every test, the golden one against the fresh fixtures;
#   3. test_generate's golden test on the CUDA backend (bf16: the first 16 tokens must agree);
#   4. speed: `tandem generate --device cuda` vs transformers generate (bf16, sdpa) on a random
#      qwen2.5-0.5b-shaped model, the same prompt lengths, batch 1 and 16, 64 new tokens.
# Output: $OUT/generate-golden/expected.json (commit it as tests/fixtures/generate/golden/
# expected.json), $OUT/*.log, $OUT/speed.json. Prints a summary table last. Budget ~4 min.
set -u
OUT=${OUT:-/tmp/tandem-generate-golden}
mkdir -p "$OUT"
exec > >(tee "$OUT/generate-golden.log") 2>&1
source scripts/device/device-env.sh
gpu_line
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
echo "== 1. transformers generate(do_sample=False) -> fixtures"
timeout 120 python3 tests/fixtures/generate/gen_golden.py --out "$OUT/generate-golden"
GEN=$?
tdm() { env LD_LIBRARY_PATH="$DEVICE_LD" TANDEM_SOURCE_DIR="$PWD" TANDEM_GENERATE_GOLDEN="$OUT/generate-golden" "$@"; }
echo "== 2. test_generate, CPU backend"
tdm timeout 150 .device/bin/test_generate >"$OUT/test_generate_cpu.log" 2>&1
CPU=$?
grep -E "GENERATE OK|cached ==|differ|FAIL|SKIP" "$OUT/test_generate_cpu.log"
echo "== 3. test_generate golden, CUDA backend"
TANDEM_GENERATE_BACKEND=cuda TANDEM_GENERATE_ONLY=golden tdm timeout 60 .device/bin/test_generate \
    >"$OUT/test_generate_cuda.log" 2>&1
CUDA=$?
grep -E "GENERATE OK|prompt|FAIL|ERROR" "$OUT/test_generate_cuda.log" | head -20
echo "== 4. speed, qwen2.5-0.5b shapes (random weights), 64 new tokens"
W=/tmp/gen-speed; rm -rf $W; mkdir -p $W
export TANDEM_LEDGER_DIR=$W/ledger
tdm .device/tandem init-model $W/m --preset qwen2.5-0.5b --seed 1 >/dev/null
for b in 1 16; do
    for i in $(seq 1 $b); do echo "{\"prompt\": \"$(printf 'prompt %03d ' $i; head -c 96 /dev/zero | tr '\0' 'x')\"}"; done >$W/p$b.jsonl
    tdm .device/tandem generate $W/m --device cuda --method lora --chat-template none --file $W/p$b.jsonl \
        --max-new-tokens 64 --batch-size $b --json >$W/t$b.json 2>$W/t$b.err || tail -3 $W/t$b.err
done
timeout 120 python3 - "$W" "$OUT/speed.json" <<'PY'
import json, sys, time, torch, transformers as tf
w, out = sys.argv[1], sys.argv[2]
m = tf.AutoModelForCausalLM.from_pretrained(w + "/m", dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
rows = []
for b in (1, 16):
    t = [json.loads(l) for l in open(f"{w}/t{b}.json")] if open(f"{w}/t{b}.json").read().strip() else []
    if not t:
        rows.append({"batch": b, "tandem": None}); continue
    n = t[0]["prompt_tokens"]
    ids = torch.randint(3, 200, (b, n), device="cuda")
    kw = dict(do_sample=False, max_new_tokens=64, min_new_tokens=64, pad_token_id=0)
    m.generate(ids, attention_mask=torch.ones_like(ids), **kw); torch.cuda.synchronize()
    t0 = time.time(); m.generate(ids, attention_mask=torch.ones_like(ids), **kw); torch.cuda.synchronize()
    hf = time.time() - t0
    td = t[0]["timing"]["prefill_s"] + t[0]["timing"]["decode_s"]
    toks = sum(len(x["tokens"]) for x in t)
    rows.append({"batch": b, "prompt_tokens": n, "tandem_s": td, "tandem_tokens": toks,
                 "kv_cache": t[0]["timing"]["kv_cache"], "transformers_s": hf, "transformers_tokens": 64 * b})
json.dump(rows, open(out, "w"), indent=1)
for r in rows: print("SPEED", json.dumps(r))
PY
echo
echo "== summary"
printf '%-44s %s\n' "fixtures (gen_golden.py)" "$([ $GEN = 0 ] && echo ok || echo "FAIL rc=$GEN")"
printf '%-44s %s\n' "test_generate CPU (all, golden included)" "$([ $CPU = 0 ] && echo PASS || echo "FAIL rc=$CPU")"
printf '%-44s %s\n' "test_generate CUDA golden (16 tokens bf16)" "$([ $CUDA = 0 ] && echo PASS || echo "FAIL rc=$CUDA")"
grep -h "GENERATE OK" "$OUT"/test_generate_c*.log | sed 's/^/  /'
[ -f "$OUT/speed.json" ] && python3 -c "import json,sys; [print(\"  SPEED\", json.dumps(r)) for r in json.load(open(sys.argv[1]))]" "$OUT/speed.json"
