#!/usr/bin/env python3
"""Tokenizer benchmark helpers (see bench/tokenizer_bench.sh).

    tokenizer_bench.py gen OUT.jsonl [--mb N]   deterministic mixed text, {"text": ...} per line
    tokenizer_bench.py hf TOKENIZER.json IN.jsonl
        times Hugging Face `tokenizers` encoding every line (one thread, encode() in a loop, and
        encode_batch() with its own thread pool) and prints tokens/s for each
    tokenizer_bench.py count OUT.jsonl          sums the ids of `tandem tokenize --file` output
"""
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures", "tokenizer"))


def gen(out, mb):
    import gen_fixtures  # the fixture texts: many scripts, code, emoji, whitespace, digits
    rng = random.Random(1234)
    pieces = gen_fixtures.all_texts()
    prose = ("Byte-level BPE tokenizers split text with a regular expression and then merge "
             "bytes by rank. This paragraph is ordinary English prose, which dominates most "
             "fine-tuning data sets, so the benchmark mixes plenty of it in. ")
    target = int(mb * 1024 * 1024)
    size = 0
    with open(out, "w", encoding="utf-8") as f:
        while size < target:
            doc = []
            for _ in range(rng.randrange(5, 40)):
                doc.append(prose if rng.random() < 0.6 else rng.choice(pieces))
            line = json.dumps({"text": " ".join(doc)}, ensure_ascii=False)
            f.write(line + "\n")
            size += len(line.encode()) + 1
    print(f"wrote {out} ({size} bytes)", file=sys.stderr)


def hf(tok_path, inp):
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(tok_path)
    texts = [json.loads(l)["text"] for l in open(inp, encoding="utf-8")]
    nbytes = sum(len(t.encode()) for t in texts)
    t0 = time.perf_counter()
    n = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    t1 = time.perf_counter()
    print(f"hf-tokenizers {tokenizers.__version__} encode (1 thread): {n} tokens, {nbytes} bytes, "
          f"{t1 - t0:.3f} s, {n / (t1 - t0):.0f} tokens/s, {nbytes / (t1 - t0) / 1e6:.2f} MB/s")
    t0 = time.perf_counter()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    t1 = time.perf_counter()
    nb = sum(len(e.ids) for e in enc)
    print(f"hf-tokenizers encode_batch ({os.cpu_count()} cpus): {nb} tokens, {t1 - t0:.3f} s, "
          f"{nb / (t1 - t0):.0f} tokens/s")


def count(path):
    print(sum(len(json.loads(l)["ids"]) for l in open(path)))


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["gen"]:
        mb = float(a[a.index("--mb") + 1]) if "--mb" in a else 20
        gen(a[1], mb)
    elif a[:1] == ["hf"]:
        hf(a[1], a[2])
    elif a[:1] == ["count"]:
        count(a[1])
    else:
        sys.exit(__doc__)
