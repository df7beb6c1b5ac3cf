#!/bin/bash
# On the GPU machine's host CPU (the GPU unused): the f32 GEMM rate the CPU backend can reach
# there, against PyTorch's on the same cores (issue 20: is the 16-thread step bound by Debian's
# OpenBLAS, or by how tandem calls it?).
#   tandem: `bench_train --matmul N --device cpu` (Y = X W^T, N x N x N, through the CPU
#           backend's frozen-linear GEMM: tiles shared by OpenMP's threads, single-threaded
#           OpenBLAS on each; and TANDEM_CPU_GEMM=blas, one threaded OpenBLAS call per K block),
#           at 1 and 16 threads, with the OpenBLAS kernel set tandem itself picks there
#           (OPENBLAS_CORETYPE=SkylakeX on AVX-512 hosts, docs/engine.md).
#   PyTorch: torch.mm of the same f32 shapes (X @ W.T), torch.set_num_threads(1 | 16), and the
#           B4 x 256 step's products at 16 threads (1024 rows: 896 -> 896, 896 -> 4864,
#           4864 -> 896), the median of 10 after 3 untimed.
# Carry .device-pack (scripts/device/pack.sh). Writes $OUT/cpu-gemm-peak.log. About 1-2 minutes.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/cpu-gemm-peak-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/cpu-gemm-peak.log") 2>&1
. scripts/device/device-env.sh
export CUDA_VISIBLE_DEVICES=
CORE=
grep -q avx512f /proc/cpuinfo && CORE=SkylakeX
echo "# $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p'); OPENBLAS_CORETYPE=${CORE:-auto}"
for n in 1024 4096; do
    for t in 1 16; do
        for mode in tiles blas; do
            r=$(env LD_LIBRARY_PATH="$DEVICE_LD" ${CORE:+OPENBLAS_CORETYPE=$CORE} OMP_NUM_THREADS=$t \
                TANDEM_CPU_GEMM=$mode timeout 120 .device/bin/bench_train --matmul "$n" --device cpu |
                sed -n 's/.*: \([0-9.]*\) TFLOP.*/\1/p')
            echo "tandem $mode n=$n threads=$t ${r:-FAIL} TFLOP/s"
        done
    done
done
python3 - <<'EOF'
import time, torch
def rate(m, n, k, threads):
    torch.set_num_threads(threads)
    x = torch.randn(m, k); w = torch.randn(n, k)
    ts = []
    for i in range(13):
        t0 = time.perf_counter(); y = x @ w.T; ts.append(time.perf_counter() - t0)
    ts = sorted(ts[3:])
    return 2.0 * m * n * k / (0.5 * (ts[4] + ts[5])) / 1e12
print("# torch", torch.__version__, torch.__config__.show().count("MKL"), "MKL mentions")
for n in (1024, 4096):
    for t in (1, 16):
        print("torch n=%d threads=%d %.3f TFLOP/s" % (n, t, rate(n, n, n, t)))
for (m, n, k) in ((1024, 896, 896), (1024, 4864, 896), (1024, 896, 4864), (1024, 151936, 896)):
    print("torch step shape %dx%dx%d threads=16 %.3f TFLOP/s" % (m, n, k, rate(m, n, k, 16)))
EOF
