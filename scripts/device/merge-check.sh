#!/bin/bash
# merge-check.sh — on the GPU machine (torch, transformers, peft; issue 16 part 2): loads what
# `tandem merge` writes with transformers' AutoModelForCausalLM and compares its logits with
# transformers' base model + the PEFT adapter (PeftModel.from_pretrained), for --base original:
#   - the PEFT-made golden fixtures (tests/fixtures/train/golden): Llama + all-target r8 adapter,
#     Qwen2 (biases, tied embeddings) + q/v r4 rsLoRA adapter;
#   - an adapter tandem trains here on the CPU (--method lora, a few steps) on a tiny Qwen2-shaped
#     model from `tandem init-model`;
# and, for the default --base dequantized of a QLoRA adapter tandem trains here (double quant),
# against base + PEFT adapter where transformers' base has every projection replaced by its NF4
# round trip from the NumPy reimplementation of bitsandbytes (tests/fixtures/model/gen_fixtures.py);
# each merged to f32 and to bf16. Also: loading reports no missing or unexpected keys, and the
# merged weights match PEFT's merge_and_unload() (max |dW|).
# tandem: .device-pack/device.tgz when carried (scripts/device/pack.sh on the build machine),
# else built here with cmake (merge is CPU code; CUDA is not needed for it).
# Output: $OUT/merge-check.log, $OUT/merge-check.json; a table last. Budget < 3 min.
set -u
OUT=${OUT:-/tmp/tandem-merge-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/merge-check.log") 2>&1
R=$PWD
if [ -f .device-pack/device.tgz ]; then
    source scripts/device/device-env.sh
    T=$R/.device/tandem
else
    echo "== building tandem (no .device-pack)"
    cmake -S . -B /tmp/merge-build -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF >/tmp/merge-cmake.log 2>&1 &&
        cmake --build /tmp/merge-build -j 16 --target tandem >>/tmp/merge-cmake.log 2>&1 ||
        { tail -n 30 /tmp/merge-cmake.log; exit 1; }
    T=/tmp/merge-build/tandem
    DEVICE_LD=${LD_LIBRARY_PATH:-}
fi
tdm() { LD_LIBRARY_PATH=$DEVICE_LD "$T" "$@"; }
tdm version | head -1 || exit 1
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-merge
W=/tmp/merge-check; rm -rf $W; mkdir -p $W
G=$R/tests/fixtures/train/golden
echo "== tandem: train a --method lora adapter on a tiny model (CPU)"
tdm init-model $W/tiny --preset tiny --init-std 0.1 --dtype f32 >/dev/null || exit 1
for i in $(seq 1 16); do echo "{\"instruction\": \"w$i\", \"response\": \"hi there $i!\"}"; done >$W/d.jsonl
tdm finetune $W/tiny --adapter $W/d.jsonl:$W/ad --method lora --device cpu --epochs 2 --batch-size 8 \
    --lr 3e-2 --rank 8 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
    --chat-template none --save-every 0 --val-split 0 --no-join >$W/train.log 2>&1 || { tail $W/train.log; exit 1; }
tdm finetune $W/tiny --adapter $W/d.jsonl:$W/adq --method qlora --device cpu --epochs 2 --batch-size 8 \
    --lr 3e-2 --rank 8 --targets q_proj,v_proj,down_proj --chat-template none --save-every 0 \
    --val-split 0 --no-join >$W/trainq.log 2>&1 || { tail $W/trainq.log; exit 1; }
echo "== tandem merge"
CASES=""
for c in "llama $G/llama $G/llama_all_r8/adapter original" \
         "qwen2_rslora $G/qwen2 $G/qwen2_qv_r4_rslora/adapter original" \
         "tandem_lora $W/tiny $W/ad original" "tandem_qlora $W/tiny $W/adq dequantized"; do
    set -- $c
    for dt in f32 bf16; do
        tdm merge "$2" --adapter "$3" --out $W/m_$1_$dt --dtype $dt --quiet >/dev/null || { echo "merge $1 $dt failed"; exit 1; }
        grep -q "\"base\": \"$4\"" $W/m_$1_$dt/tandem_merge.json || { echo "$1: base is not $4"; exit 1; }
        CASES="$CASES $1:$2:$3:$W/m_$1_$dt:$dt:$4"
    done
done
echo "== transformers: merged model vs base + PEFT adapter"
timeout 150 python3 - "$OUT/merge-check.json" $CASES <<'PY'
import importlib.util, json, os, re, sys, torch, transformers as tf
from peft import PeftModel
torch.manual_seed(0)
out, cases = sys.argv[1], sys.argv[2:]
# the NumPy reimplementation of bitsandbytes' NF4 the NF4 golden tests use
spec = importlib.util.spec_from_file_location("gen_fixtures", "tests/fixtures/model/gen_fixtures.py")
nf4 = importlib.util.module_from_spec(spec); spec.loader.exec_module(nf4)
PROJ = re.compile(r"layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
rows = []
for c in cases:
    name, base_dir, ad_dir, merged_dir, dt, base_kind = c.split(":")
    base = tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    if base_kind == "dequantized":  # what a QLoRA adapter saw: every projection NF4 round-tripped
        rec = json.load(open(merged_dir + "/tandem_merge.json"))
        dmap = nf4.dynamic_map() if rec["double_quant"] else None
        with torch.no_grad():
            for n, p in base.named_parameters():
                if PROJ.search(n):
                    w = p.detach().float().numpy()
                    p.copy_(torch.from_numpy(nf4.quantize_nf4(w, rec["double_quant"], dmap)["dequant"].reshape(w.shape)))
    V = base.config.vocab_size
    ids = torch.randint(0, V, (3, 24))
    ref = PeftModel.from_pretrained(base, ad_dir).eval()
    with torch.no_grad():
        want = ref(input_ids=ids).logits.double()
        merged_ref = ref.merge_and_unload().state_dict()
    m, info = tf.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, output_loading_info=True)
    m.eval()
    with torch.no_grad():
        got = m(input_ids=ids).logits.double()
    sd = m.state_dict()
    dw = max((sd[k].double() - v.double()).abs().max().item() for k, v in merged_ref.items() if k in sd)
    cfg = json.load(open(merged_dir + "/config.json"))
    rows.append({"case": name, "dtype": dt, "base": base_kind, "max_abs_dlogits": (got - want).abs().max().item(),
                 "max_abs_logit": want.abs().max().item(), "max_abs_dW_vs_merge_and_unload": dw,
                 "missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"]),
                 "config_dtype": cfg.get("dtype", cfg.get("torch_dtype"))})
json.dump(rows, open(out, "w"), indent=1)
print(f"{'case':<14} {'dtype':<5} {'base':<11} {'max|dlogits|':>13} {'max|logit|':>11} {'max|dW|':>10} {'miss/unexp':>10}  config  verdict")
ok = True
for r in rows:
    lim = 1e-4 if r["dtype"] == "f32" else 5e-2 * max(1.0, r["max_abs_logit"])
    good = r["max_abs_dlogits"] <= lim and r["missing"] == 0 and r["unexpected"] == 0
    ok &= good
    print(f"{r['case']:<14} {r['dtype']:<5} {r['base']:<11} {r['max_abs_dlogits']:13.3e} {r['max_abs_logit']:11.3f} "
          f"{r['max_abs_dW_vs_merge_and_unload']:10.3e} {r['missing']:>4}/{r['unexpected']:<5}  {str(r['config_dtype']):<8} "
          f"{'PASS' if good else 'FAIL'} (limit {lim:.1e})")
sys.exit(0 if ok else 1)
PY
RC=$?
echo
echo "== summary: merge-check $([ $RC = 0 ] && echo PASS || echo "FAIL rc=$RC") (table above; $OUT/merge-check.json)"
exit $RC
