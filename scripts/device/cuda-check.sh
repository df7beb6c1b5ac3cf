#!/usr/bin/env bash
# cuda-check.sh DIR [--full] — run on the GPU machine (CUDA 13 driver + toolkit, no internet).
# DIR is what scripts/device/cuda-pack.sh made on the build machine:
#   DIR/bin/test_backend_cuda       every CUDA backend op against the CPU backend (cmocka)
#   DIR/bin/{nf4_dequant,fp8,attention,lora,adamw,cross_entropy,rmsnorm,swiglu,rope}   dev/cuda kernel programs (validation + timing)
#   DIR/lib/                        Debian shared libraries the GPU image lacks
# A dev program missing from DIR/bin is compiled here from dev/cuda/ with nvcc (sm_90).
# KERNELS="nf4_dequant lora" runs only those dev programs (default: all of them).
# Prints the details as it goes and a short summary table last; full logs go to $OUT (or
# /tmp/cuda-check). Exit status: 0 when every test and validation passed. Budget: ~2-3 min
# (timings use --quick repetitions unless --full).
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: cuda-check.sh DIR [--full]}
QUICK=--quick
KERNELS=${KERNELS:-nf4_dequant fp8 attention lora adamw cross_entropy rmsnorm swiglu rope}
[ "${2:-}" = --full ] && QUICK=
LOG=${OUT:-/tmp/cuda-check}
mkdir -p "$LOG"
CUDA_LIB=
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && CUDA_LIB="$CUDA_LIB:$d"
done
export LD_LIBRARY_PATH="$PWD/$DIR/lib$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

echo "== device"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm --format=csv 2>&1 | tee "$LOG/device.txt"

status=0
declare -A RC

echo "== test_backend_cuda (CUDA backend vs CPU backend, every op)"
if [ -x "$DIR/bin/test_backend_cuda" ]; then
    timeout 240 "$DIR/bin/test_backend_cuda" 2>&1 | tee "$LOG/test_backend_cuda.log"
    RC[test_backend_cuda]=${PIPESTATUS[0]}
else
    echo "missing $DIR/bin/test_backend_cuda"
    RC[test_backend_cuda]=127
fi
[ "${RC[test_backend_cuda]}" = 0 ] || status=1

for k in $KERNELS; do
    echo "== dev/cuda/$k"
    exe="$DIR/bin/$k"
    if [ ! -x "$exe" ]; then
        exe="$LOG/$k"
        echo "(building $k with $NVCC)"
        "$NVCC" -O3 -std=c++17 -arch=sm_90 -I src -I dev/cuda "dev/cuda/$k.cu" -o "$exe" \
            >"$LOG/$k.build.log" 2>&1 || { cat "$LOG/$k.build.log"; RC[$k]=126; status=1; continue; }
    fi
    timeout 120 "$exe" $QUICK 2>&1 | tee "$LOG/$k.log"
    RC[$k]=${PIPESTATUS[0]}
    [ "${RC[$k]}" = 0 ] || status=1
done

# ---- summary table ----
{
    echo
    echo "================ cuda-check summary ================"
    grep -E '^\[  (PASSED|FAILED) \]|^SKIP' "$LOG/test_backend_cuda.log" 2>/dev/null | sed 's/^/test_backend_cuda: /'
    # max relative error per op family (first word of each check), and the count of checks
    grep -h 'max_rel_err' "$LOG/test_backend_cuda.log" 2>/dev/null | awk '
        { for (i = 1; i <= NF; i++) if ($i == "max_rel_err") { v = $(i + 1); tol = $(i + 3) } }
        { sub(")", "", tol); op = $1; n[op]++; if (!(op in worst) || v + 0 > worst[op] + 0 || v ~ /nan/) worst[op] = v; t[op] = tol }
        END { for (op in worst) printf "  %-22s checks %3d  max_rel_err %-10s (tol %s)\n", op, n[op], worst[op], t[op] }' | sort
    printf '%-14s %-9s %-40s %10s %14s %9s %s\n' kernel variant shape time_us rate err status
    # the fastest passing variant per (kernel, shape), plus every failure
    for k in $KERNELS; do cat "$LOG/$k.log"; done 2>/dev/null | awk '/^RESULT/ {
        k = $2 " " $4; t = $5; sub("time_us=", "", t)
        if ($8 == "FAIL") { print; next }
        if (!(k in best) || t + 0 < best[k] + 0) { best[k] = t; line[k] = $0 }
    } END { for (k in line) print line[k] }' | sort | awk '{
        printf "%-14s %-9s %-40s %10s %14s %9s %s\n", $2, $3, $4, substr($5, 9), $6, substr($7, 5), $8 }'
    for k in test_backend_cuda $KERNELS; do
        printf '%s=%s ' "$k" "${RC[$k]:-?}"
    done
    echo
    echo "overall: $([ $status = 0 ] && echo PASS || echo FAIL)  (logs: $LOG)"
} | tee "$LOG/summary.txt"
exit $status
