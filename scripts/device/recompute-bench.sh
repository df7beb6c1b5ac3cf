#!/bin/bash
# On the GPU machine (issue 19 items 2 and 6): gradient checkpointing that costs little.
#  1. Builds with CUDA (build-device/, Release, sm_90): tandem, test_backend_cuda, bench_train and
#     the dev/cuda kernel programs (in the background, for step 4).
#  2. test_backend_cuda: every CUDA op against the CPU backend, and the training step under every
#     recompute mode bit-identical to the step without checkpointing (test_model_step_recompute).
#  3. A random qwen2.5-7b (tandem init-model), QLoRA r16 q,v, batch 4, variable length (log-normal,
#     median 245, up to 2048 tokens), loaded once by bench_train: the bf16 matmul rate through the
#     engine's cuBLASLt GEMM (8192^3), then without checkpointing and with --grad-checkpoint under
#     --recompute layer, mlp and attn: tok/s, ratio to no checkpointing, MFU, the activation
#     workspace against the estimate, the backend's peak against the estimate, and whether every
#     step's loss equals the no-checkpointing loss bit for bit.
#  4. The dev/cuda validations (scripts/device/cuda-check.sh's programs, --quick), while the time
#     lasts (skipped past 200 s).
# Writes $OUT/recompute-bench.log, $OUT/bench-7b.txt, $OUT/test_backend_cuda.log; prints the table
# last. Budget: under 4 minutes on an H200 (the 7B init-model ~40 s, its load ~35 s).
#   usage: scripts/device/recompute-bench.sh [--steps N] [--no-kernels]
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/recompute-bench-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/recompute-bench.log") 2>&1
T0=$SECONDS
STEPS=10
KERNELS_TOO=1
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) STEPS=$2; shift ;;
    --no-kernels) KERNELS_TOO=0 ;;
    *) echo "unknown option $1"; exit 2 ;;
    esac
    shift
done
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
BD=build-device
DEVPID=
KERNELS="nf4_dequant attention lora adamw cross_entropy rmsnorm swiglu rope"
if [ -f .device-pack/device.tgz ]; then
    # the binaries scripts/device/pack.sh built on the build machine (the GPU image lacks the
    # Debian libraries tandem links)
    echo "== 1. unpacking .device-pack"
    source scripts/device/device-env.sh
    export LD_LIBRARY_PATH=$DEVICE_LD
    TANDEM=.device/tandem TEST_CUDA=.device/bin/test_backend_cuda BENCH=.device/bin/bench_train
    DEVBIN=.device/bin
else
    echo "== 1. building with CUDA ($BD/)"
    cmake -S . -B $BD -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90-real >"$OUT/cmake.log" 2>&1 &&
        cmake --build $BD -j 16 --target tandem test_backend_cuda bench_train >>"$OUT/cmake.log" 2>&1 ||
        { tail -n 30 "$OUT/cmake.log"; exit 1; }
    TANDEM=$BD/tandem TEST_CUDA=$BD/tests/test_backend_cuda BENCH=$BD/bench_train
    DEVBIN=$BD/dev/cuda
    if [ $KERNELS_TOO = 1 ]; then
        # shellcheck disable=SC2046,SC2086 # one target per kernel
        nice cmake --build $BD -j 8 --target $(printf 'dev_%s ' $KERNELS) >"$OUT/cmake-dev.log" 2>&1 &
        DEVPID=$!
    fi
fi
echo "ready in $((SECONDS - T0)) s"

echo "== 2. test_backend_cuda ($((SECONDS - T0)) s)"
timeout 150 $TEST_CUDA >"$OUT/test_backend_cuda.log" 2>&1
TRC=$?
grep -E '^\[  (PASSED|FAILED) \]|recompute|model .* loss gpu' "$OUT/test_backend_cuda.log"
echo "test_backend_cuda exit $TRC"

echo "== 3. 7B, batch 4, variable length ($((SECONDS - T0)) s)"
M=/tmp/recompute-bench-7b
if [ ! -f $M/.complete ]; then
    rm -rf $M
    $TANDEM init-model $M --preset qwen2.5-7b >"$OUT/init-model.log" 2>&1 || { tail "$OUT/init-model.log"; exit 1; }
    touch $M/.complete
    echo "init-model done ($((SECONDS - T0)) s)"
fi
$BENCH $M --device cuda --batch 4 --len var --median 245 --max-len 2048 \
    --warmup 3 --steps "$STEPS" --modes none,layer,mlp,attn --matmul 8192 | tee "$OUT/bench-7b.txt"
BRC=${PIPESTATUS[0]}
echo "bench_train exit $BRC ($((SECONDS - T0)) s)"

if [ $KERNELS_TOO = 1 ] && [ $((SECONDS - T0)) -lt 200 ]; then
    echo "== 4. dev/cuda validations ($((SECONDS - T0)) s)"
    [ -n "$DEVPID" ] && wait "$DEVPID"
    for k in $KERNELS; do
        exe=$DEVBIN/$k
        [ -x "$exe" ] || { echo "$k: not built (see $OUT/cmake-dev.log)"; continue; }
        [ $((SECONDS - T0)) -lt 225 ] || { echo "$k: skipped (time)"; continue; }
        timeout 30 "$exe" --quick >"$OUT/dev-$k.log" 2>&1
        echo "$k: exit $? $(grep -c '^RESULT.* ok$' "$OUT/dev-$k.log") ok $(grep -c '^RESULT.* FAIL$' "$OUT/dev-$k.log") FAIL"
    done
else
    echo "== 4. dev/cuda validations skipped"
    [ -n "$DEVPID" ] && kill "$DEVPID" 2>/dev/null
fi

echo
echo "================ recompute-bench ($((SECONDS - T0)) s) ================"
echo "test_backend_cuda exit $TRC: $(grep -E '^\[  (PASSED|FAILED) \]' "$OUT/test_backend_cuda.log" | tr '\n' ' ')"
grep -E '^  recompute' "$OUT/test_backend_cuda.log"
cat "$OUT/bench-7b.txt"
echo "target (issue 19 item 2): a --recompute mode at >= 0.90x the tok/s of none, 'same' yes everywhere"
