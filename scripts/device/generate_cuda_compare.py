#!/usr/bin/env python3
"""Rounding or a bug? `tandem generate --device cuda` (bf16) against transformers, per fixture
prompt (run by scripts/device/generate-cuda-golden.sh; docs/generate.md, "CPU and CUDA").

    generate_cuda_compare.py FIXTURES_DIR TANDEM_DIR REPORT.json [NAME=DIR ...]

FIXTURES_DIR holds expected.json (float32 transformers, the committed fixtures) and the
expected-bf16-{sdpa,eager}.json made beside it; TANDEM_DIR/CASE.jsonl is `tandem generate --json
--top-logits V` over the case's prompts (one line per prompt, in order). For each prompt:

- the first position k where tandem's tokens leave the float32 ones (and where transformers'
  own bf16 runs leave them);
- the float32 model's lead at k: its best logit minus its second, on the context both share
  (the prompt and the k tokens before) — what rounding has to overcome to flip the argmax;
- tandem's lead at k: its logit of its own token minus its logit of float32's token;
- the logit error on a shared context: tandem's logits at every step against the float32 model's
  logits on tandem's own sequence (teacher forced, so every step compares like with like), and
  the same for transformers bf16 (sdpa) on that sequence: max |error| over the steps up to k.

Verdict per mismatch: "rounding" when float32's lead at k is below twice the larger of the two
bf16 errors at k (a lead that bf16's own noise covers) and tandem's error is within 3x of
transformers bf16's; "BUG?" otherwise (a large lead flipped, or tandem's logits much further from
float32 than transformers bf16's are).

Each NAME=DIR is another tandem run over the same prompts (DIR/CASE.jsonl): the report says
whether its tokens equal TANDEM_DIR's (e.g. --no-cache, --batch-size 1), or, for a NAME starting
with "cpu", the float32 fixtures', and NAME_gap, the largest |logit| difference between the two
runs over the steps they share (up to and including their first differing token): for --no-cache
the KV-cache decode kernel against the training attention recomputing everything.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures", "generate"))
from gen_golden import load  # noqa: E402  (the fixtures' models and adapters, as made there)


@torch.no_grad()
def step_logits(m, prompt, tokens):
    """Logits (steps, V) float64 of each generated position: the forward of prompt + tokens,
    rows len(prompt) - 1 .. len(prompt) + len(tokens) - 1 (one more than tokens: the next)."""
    ids = torch.tensor([prompt + tokens], device=m.device)
    out = m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].double().cpu()
    return out[len(prompt) - 1:]


def first_diff(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return min(len(a), len(b)) if len(a) != len(b) else None


def main():
    fix, tdir, report = sys.argv[1], sys.argv[2], sys.argv[3]
    also = [a.split("=", 1) for a in sys.argv[4:]]
    torch.set_num_threads(4)
    ref = json.load(open(os.path.join(fix, "expected.json")))
    bf = {}
    for attn in ("sdpa", "eager"):
        p = os.path.join(fix, f"expected-bf16-{attn}.json")
        if os.path.exists(p):
            bf[attn] = {c["name"]: c for c in json.load(open(p))["cases"]}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for c in ref["cases"]:
        path = os.path.join(tdir, c["name"] + ".jsonl")
        got = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
        if len(got) != len(c["prompts"]):
            rows.append({"case": c["name"], "error": f"{path}: {len(got)} answers"})
            continue
        others = {}
        for name, d in also:
            q = os.path.join(d, c["name"] + ".jsonl")
            others[name] = [json.loads(l) for l in open(q)] if os.path.exists(q) else []
        m32 = load(c["model"], c["adapter"], torch.float32, "eager", "cpu")
        m16 = load(c["model"], c["adapter"], torch.bfloat16, "sdpa", dev)
        for i, (p, want, g) in enumerate(zip(c["prompts"], c["tokens"], got)):
            t = g["tokens"]
            V = m32.config.vocab_size if hasattr(m32, "config") else 256
            full = torch.full((len(g["top"]), V), float("nan"), dtype=torch.float64)
            for s, step in enumerate(g["top"]):
                for tid, val in step:
                    full[s, tid] = val
            k = first_diff(t, want)
            row = {"case": c["name"], "prompt": i, "prompt_tokens": len(p), "tandem_equal": k is None,
                   "first_diff": k}
            for name, runs in others.items():
                base = want if name.startswith("cpu") else t
                o = runs[i] if i < len(runs) else None
                row[f"{name}_same"] = o is not None and o["tokens"] == base
                if o is not None and "top" in o and not name.startswith("cpu"):
                    n = first_diff(o["tokens"], t)
                    n = min(len(o["top"]), full.shape[0]) if n is None else n + 1
                    gap = 0.0
                    for s_, step in enumerate(o["top"][:n]):
                        for tid, val in step:
                            gap = max(gap, abs(val - float(full[s_, tid])))
                    row[f"{name}_gap"] = gap
            for attn, cases in bf.items():
                row[f"hf_bf16_{attn}_first_diff"] = first_diff(cases[c["name"]]["tokens"][i], want)
            # errors on tandem's own sequence (teacher forced), every step tandem took
            ref32 = step_logits(m32, p, t)[: full.shape[0]]
            hf16 = step_logits(m16, p, t)[: full.shape[0]]
            err_t = (full - ref32).abs().nan_to_num(0).amax(dim=1)
            err_h = (hf16 - ref32).abs().amax(dim=1)
            row["tandem_err_max"] = float(err_t.max())
            row["hf_bf16_err_max"] = float(err_h.max())
            row["logit_scale"] = float(ref32.abs().amax())
            # against test_generate.c's BF16_REACH (1/64): the error relative to the best logit
            best = ref32.amax(dim=1).abs().clamp_min(1e-9)
            row["tandem_err_rel"] = float((err_t / best).max())
            row["hf_bf16_err_rel"] = float((err_h / best).max())
            if k is not None and k < full.shape[0]:
                l32 = step_logits(m32, p, want[:k])[k]
                top2 = l32.topk(2)
                row["fp32_lead"] = float(top2.values[0] - top2.values[1])
                alt = want[k] if k < len(want) else c["eos_token_id"]
                own = t[k] if k < len(t) else c["eos_token_id"]
                row["fp32_token"], row["tandem_token"] = alt, own
                row["tandem_lead"] = float(full[k, own] - full[k, alt])
                row["fp32_margin_own"] = float(l32[alt] - l32[own])
                et, eh = float(err_t[: k + 1].max()), float(err_h[: k + 1].max())
                row["tandem_err_to_k"], row["hf_bf16_err_to_k"] = et, eh
                rounding = row["fp32_margin_own"] < 2 * max(et, eh) and et <= 3 * max(eh, 1e-9)
                row["verdict"] = "rounding" if rounding else "BUG?"
            rows.append(row)
    json.dump(rows, open(report, "w"), indent=1)
    hdr = (f"{'case':20s} {'p':>2s} {'n':>3s} {'diff@':>5s} {'sdpa@':>5s} {'eagr@':>5s} "
           f"{'fp32 lead':>9s} {'fp32 own-alt':>12s} {'td lead':>8s} {'td err':>8s} "
           f"{'hf16 err':>8s} {'td rel':>7s} {'hf rel':>7s} {'verdict':>8s}"
           + "".join(f"{n[:8]:>9s}" for n, _ in also) + "  logit gaps to other runs")
    print(hdr)
    fmt = lambda v, w, f: (f"{v:{w}{f}}" if v is not None else f"{'-':>{w}s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:20s} ERROR {r['error']}")
            continue
        print(f"{r['case']:20s} {r['prompt']:2d} {r['prompt_tokens']:3d} "
              f"{fmt(r['first_diff'], 5, 'd')} {fmt(r.get('hf_bf16_sdpa_first_diff'), 5, 'd')} "
              f"{fmt(r.get('hf_bf16_eager_first_diff'), 5, 'd')} "
              f"{fmt(r.get('fp32_lead'), 9, '.4f')} {fmt(r.get('fp32_margin_own'), 12, '.4f')} "
              f"{fmt(r.get('tandem_lead'), 8, '.4f')} {fmt(r['tandem_err_max'], 8, '.4f')} "
              f"{fmt(r['hf_bf16_err_max'], 8, '.4f')} {fmt(r['tandem_err_rel'], 7, '.4f')} "
              f"{fmt(r['hf_bf16_err_rel'], 7, '.4f')} {r.get('verdict', 'equal'):>8s}"
              + "".join(f"{('same' if r.get(n + '_same') else 'DIFF'):>9s}" for n, _ in also)
              + "".join(f" {n[:3]} gap {fmt(r.get(n + '_gap'), 6, '.4f')}" for n, _ in also
                        if not n.startswith("cpu")))


if __name__ == "__main__":
    main()
