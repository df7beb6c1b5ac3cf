#!/bin/bash
# tensorboard-check.sh — on the GPU machine (it has PyTorch's Python; maybe the `tensorboard`
# package): reads tandem's TensorBoard event files (docs/tensorboard.md) with TensorBoard's own
# EventAccumulator and prints their scalars side by side with metrics.jsonl.
# Trains two tiny adapters on the CPU (about a minute), then simulates a crash after checkpoint-3
# (later checkpoints removed) and resumes, so the accumulator's purge of orphaned points after a
# SessionLog START is exercised too. Without `tensorboard` it says so and falls back to
# TensorFlow's summary_iterator (no purge: only the first run's file is compared); without either
# it says so and exits 0 having checked nothing.
# Carry .device-pack (scripts/device/pack.sh on the build machine). Output: $OUT/tensorboard.log,
# $OUT/side-by-side.tsv; a summary table last. Exit 0 when every value matched.
set -u
OUT=${OUT:-/tmp/tandem-tensorboard-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/tensorboard.log") 2>&1
source scripts/device/device-env.sh
T=$PWD/.device/tandem
R=$PWD
export TANDEM_LEDGER_DIR=/tmp/tandem-ledger-tb
W=/tmp/tb-check; rm -rf $W; mkdir -p $W; cd $W || exit 1
LD_LIBRARY_PATH=$DEVICE_LD "$T" init-model m --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$R/scripts/make-demo-data.sh" data 8 >/dev/null
ARGS=(m --adapter data/reverse.jsonl:o/rev --adapter data/add.jsonl:o/add --batch-size 2 --epochs 2
      --val-split 0.25 --log-every 1 --eval-every 2 --save-every 3 --max-seq-len 48 --seed 7
      --device cpu --no-join)
LD_LIBRARY_PATH=$DEVICE_LD "$T" finetune "${ARGS[@]}" >train1.log 2>&1 || { tail train1.log; exit 1; }
mkdir -p first/rev first/add
cp o/rev/runs/* first/rev/; cp o/add/runs/* first/add/
cp o/rev/metrics.jsonl first/rev/; cp o/add/metrics.jsonl first/add/
for a in rev add; do for c in o/$a/checkpoint-*; do [ "${c##*-}" -gt 3 ] && rm -rf "$c"; done; done
sleep 1
LD_LIBRARY_PATH=$DEVICE_LD "$T" finetune "${ARGS[@]}" --resume >train2.log 2>&1 || { tail train2.log; exit 1; }
ls -l o/*/runs

python3 - "$R/tests/lib" "$OUT/side-by-side.tsv" <<'PY'
import glob, os, sys
sys.path.insert(0, sys.argv[1])
from tfevents_read import expected  # what metrics.jsonl says the files hold
tsv = open(sys.argv[2], "w")
tsv.write("adapter\ttag\tstep\tmetrics.jsonl(f32)\treader\tequal\n")
try:
    from tensorboard.backend.event_processing import event_accumulator
    import tensorboard
    reader = "tensorboard %s EventAccumulator" % tensorboard.__version__
    def scalars(out_dir):
        acc = event_accumulator.EventAccumulator(os.path.join(out_dir, "runs"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        return {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    dirs = ["o/rev", "o/add"]
except ImportError as e:
    print("no tensorboard package here (%s); falling back to TensorFlow's summary_iterator" % e)
    try:
        import tensorflow as tf
    except ImportError as e2:
        print("no tensorflow either (%s): SKIPPED, nothing checked" % e2)
        sys.exit(0)
    reader = "tensorflow %s summary_iterator (first run only, no purge)" % tf.__version__
    def scalars(out_dir):
        got = {}
        for f in sorted(glob.glob(os.path.join(out_dir, "events.out.tfevents.*"))):
            for ev in tf.compat.v1.train.summary_iterator(f):
                for v in ev.summary.value:
                    got.setdefault(v.tag, []).append([ev.step, v.simple_value])
        return got
    dirs = ["first/rev", "first/add"]
rows = []
for d in dirs:
    got = scalars(d)
    want = expected(os.path.join(d, "metrics.jsonl"))
    n = bad = 0
    for tag in sorted(set(got) | set(want)):
        g, w = got.get(tag, []), want.get(tag, [])
        for i in range(max(len(g), len(w))):
            gs = g[i] if i < len(g) else [None, None]
            ws = w[i] if i < len(w) else [None, None]
            eq = gs == ws
            n += 1; bad += not eq
            tsv.write("%s\t%s\t%s\t%r\t%r\t%s\n" % (d, tag, ws[0] if ws[0] is not None else gs[0], ws[1], gs[1], eq))
            if i < 3 or not eq:
                print("%-10s %-22s step %-3s metrics.jsonl %-12.7g %s %-12.7g %s" % (d, tag, ws[0], ws[1] or 0, "events", gs[1] or 0, "ok" if eq else "DIFFERENT"))
    rows.append((d, n, bad))
print()
print("reader:", reader)
print("| adapter | points | different |")
print("|---|---|---|")
for d, n, bad in rows:
    print("| %s | %d | %d |" % (d, n, bad))
sys.exit(1 if any(b for _, _, b in rows) else 0)
PY
