#!/bin/bash
# On the GPU machine (torch, transformers, peft): checks that `tandem init-model` output loads in
# transformers exactly as written, and generates the training golden fixtures. Outputs under $OUT.
set -u
OUT=${OUT:-/tmp/tandem-fixtures-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/fixtures-train.log") 2>&1
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
echo "== init-model output in transformers"
python3 tests/fixtures/model/check_init_model.py build/im/* && echo "CHECK init-model loads in transformers: PASS" || echo "CHECK init-model: FAIL"
echo "== training golden fixtures"
rm -rf /tmp/golden
python3 tests/fixtures/train/gen_golden.py --out /tmp/golden && echo "golden ok"
tar czf "$OUT/golden.tgz" -C /tmp/golden .
