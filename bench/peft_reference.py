#!/usr/bin/env python3
"""The PyTorch side of bench/gpu_vs_peft.sh (Python only because the baseline lives there).

Two modes, each printing one JSON object on its last stdout line (and into --json FILE):

  peft_reference.py matmul [--n 8192] [--runs 10]
      The card's bf16 matrix rate: torch.matmul of two bf16 n x n matrices (fp32 accumulation,
      cuBLAS), 3 untimed calls, then `runs` calls timed one by one with CUDA events; the median
      in TFLOP/s, counting 2*n^3 FLOPs per product.

  peft_reference.py train --model DIR --data FILE.jsonl --batch B [--warmup K] [--steps T]
      Hugging Face transformers + PEFT LoRA on the same shapes tandem trains: the bf16 base loaded
      from DIR (dtype bfloat16, attn_implementation "sdpa", no gradient checkpointing), LoRA r=16
      alpha=32 dropout 0 on q_proj,v_proj, AdamW lr 2e-4 (betas 0.9/0.999, eps 1e-8, no weight
      decay), clip_grad_norm_ 1.0 (tandem's default --max-grad-norm), labels = input ids. The
      token ids are the ones tandem trains on: the first `input_ids` lists of FILE (tandem's
      `tokens` format), each exactly --seq long, batch rows taken in file order, cycling.
      K warm-up steps, then T steps between two torch.cuda.synchronize(): tokens/s =
      T * B * seq / time. --barrier DIR --barrier-n N: after warm-up, wait until N processes
      have reached the barrier (three PEFT processes at once time the same window); the JSON
      then carries wall-clock t_start/t_end so the caller can compute the joint rate.
      --device cpu [--threads N] [--dtype float32] (bench/cpu_vs_torch.sh): the same on the
      host CPU, torch.set_num_threads(N), the base in float32 (the CPU reference of issue 20);
      no synchronisation is needed there and the memory fields are null.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def emit(obj, path):
    line = json.dumps(obj, sort_keys=True)
    print(line, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


def matmul(args):
    import torch

    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(args.runs):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1000.0)  # seconds
    rates = [2.0 * n * n * n / t / 1e12 for t in times]
    emit({"mode": "matmul", "n": n, "runs": args.runs, "tflops_median": statistics.median(rates),
          "tflops_min": min(rates), "tflops_max": max(rates),
          "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, args.json)


def read_tokens(path, seq, need):
    rows = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            ids = json.loads(line)["input_ids"]
            if len(ids) != seq:
                sys.exit(f"{path}:{ln}: {len(ids)} tokens, expected exactly {seq} (regenerate the "
                         "data with bench/gpu_vs_peft.sh)")
            rows.append(ids)
            if len(rows) >= need:
                break
    if not rows:
        sys.exit(f"{path}: no input_ids lines")
    return rows


def train(args):
    import torch
    import transformers
    import peft
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model

    t_load = time.time()
    dev = args.device
    cuda = dev == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    kw = {"dtype": getattr(torch, args.dtype), "attn_implementation": "sdpa"}
    if not cuda:
        model = AutoModelForCausalLM.from_pretrained(args.model, **kw)
    else:
        try:  # straight onto the GPU (needs accelerate); else through host memory
            model = AutoModelForCausalLM.from_pretrained(args.model, device_map="cuda", **kw)
        except (ImportError, ValueError, RuntimeError) as e:
            print(f"peft_reference: note: device_map='cuda' failed ({e}); loading on the host",
                  file=sys.stderr)
            model = AutoModelForCausalLM.from_pretrained(args.model, **kw).to("cuda")
    model.config.use_cache = False
    tok_ok = None
    try:  # the directory must be a complete Hugging Face model: the tokenizer loads too
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained(args.model)
        tok_ok = True
    except Exception as e:  # reported, not fatal: the benchmark feeds token ids
        print(f"peft_reference: note: AutoTokenizer failed on {args.model}: {e}", file=sys.stderr)
        tok_ok = False
    cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                     target_modules=args.targets.split(","), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_lora = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    rows = read_tokens(args.data, args.seq, args.batch * (args.warmup + args.steps))
    data = torch.tensor(rows, dtype=torch.long, device=dev)  # [n_rows, seq]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    load_s = time.time() - t_load

    cursor = [0]

    def step():
        idx = [(cursor[0] + i) % data.shape[0] for i in range(args.batch)]
        cursor[0] += args.batch
        x = data[idx]  # [batch, seq]
        out = model(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    for _ in range(args.warmup):
        step()
    sync()
    if args.barrier:
        os.makedirs(args.barrier, exist_ok=True)
        open(os.path.join(args.barrier, str(os.getpid())), "w").close()
        # A process that died before the barrier must not hold the others for long: after
        # --barrier-timeout seconds they time alone (barrier_met false in the JSON).
        deadline = time.time() + args.barrier_timeout
        while len(os.listdir(args.barrier)) < args.barrier_n and time.time() < deadline:
            time.sleep(0.005)
    barrier_met = not args.barrier or len(os.listdir(args.barrier)) >= args.barrier_n
    t_start = time.time()
    t0 = time.perf_counter()
    loss = None
    for _ in range(args.steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    t_end = time.time()
    tokens = args.steps * args.batch * args.seq
    emit({"mode": "train", "model": args.model, "batch": args.batch, "seq": args.seq,
          "warmup": args.warmup, "steps": args.steps, "tokens": tokens, "seconds": dt,
          "tok_s": tokens / dt, "t_start": t_start, "t_end": t_end, "load_s": load_s,
          "final_loss": float(loss.item()) if loss is not None else None,
          "lora_params": n_lora, "tokenizer_loaded": tok_ok, "barrier_met": barrier_met,
          "max_memory_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
          "max_memory_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if cuda else None,
          # the process's peak resident memory (Linux: KiB), what a CPU run's memory is
          "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "gpu": torch.cuda.get_device_name(0) if cuda else None, "device": dev,
          "threads": torch.get_num_threads(), "dtype": args.dtype, "torch": torch.__version__,
          "transformers": transformers.__version__, "peft": peft.__version__}, args.json)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("matmul")
    m.add_argument("--n", type=int, default=8192)
    m.add_argument("--runs", type=int, default=10)
    m.add_argument("--json")
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--seq", type=int, default=512)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--alpha", type=int, default=32)
    t.add_argument("--targets", default="q_proj,v_proj")
    t.add_argument("--lr", type=float, default=2e-4)
    t.add_argument("--barrier")
    t.add_argument("--barrier-n", type=int, default=1)
    t.add_argument("--barrier-timeout", type=float, default=120.0)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    t.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    t.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    t.add_argument("--json")
    args = ap.parse_args()
    matmul(args) if args.mode == "matmul" else train(args)


if __name__ == "__main__":
    main()
