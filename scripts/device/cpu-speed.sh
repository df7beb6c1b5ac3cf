#!/bin/bash
# On the GPU machine's host CPU (16 cores; the GPU is not used: tandem --device cpu, PyTorch with
# CUDA_VISIBLE_DEVICES=): issue 20's measurement, bench/cpu_vs_torch.sh with Qwen2.5-0.5B shapes
# (random weights), batch 4 x 256, r16 q_proj,v_proj:
#   PyTorch + PEFT fp32 at 16 threads (torch.set_num_threads), a --profile-ops run of tandem lora
#   at 16 threads (1 step), tandem lora at 16, 8, 4, 2, 1 threads and qlora at 16, PyTorch at 1
#   thread last if under 200 s have passed. One warm-up step, then 3 timed steps (2 at 4 threads,
#   1 at 2 and 1). No run starts after 250 s; one still going at 330 s is killed (its row FAIL).
# Before measuring, the CPU backend's bits on this CPU and its OpenBLAS kernels: test_cpu_gemm
# (GEMM rows alone == in a larger product, 1/2/3 threads, threaded calls vs tiles) and
# test_backend_ops (every op against double references, 1 vs 3 threads), test_cpu_panel_gemm
# (tandem's own kernels for the frozen projections: AVX-512 == AVX2, rows, threads); their logs under $OUT,
# their verdict in the log's first lines and last line.
# Built HERE first (the build machine), with or without CUDA:
#   make build ... && BUILD=build scripts/device/pack.sh     (writes .device-pack/device.tgz)
# then on the device: carry .device-pack, run `bash scripts/device/cpu-speed.sh`.
# Budget: under 7 minutes in all (BUDGET 250, HARD_LIMIT 330 seconds, then the threaded-calls run: 60 and
# 120; env overrides them).
# A/B against an earlier build in the same call: carry .device-pack/baseline.tgz too (a tarball
# of that build's `tandem` alone, e.g. `tar czf .device-pack/baseline.tgz -C OLD_BUILD tandem`,
# and optionally its bench_cpu_linears, which then runs beside this build's at LINEARS_THREADS;
# it runs with this pack's libraries): BASELINE_RUNS (default "lora:16 lora:8") then run with it,
# after the passes above, into table-baseline.md and rows-baseline.tsv.
# A variant of this build in the same call: EXTRA_ENV (e.g. "TANDEM_CPU_TILE_ROWS=256") with
# EXTRA_RUNS (default "lora:16 lora:8"), after the baseline, into table-extra.md and
# rows-extra.tsv; skipped unless EXTRA_ENV is set.
# PAIRS=N (with AFTER_BUDGET): N more rounds of PyTorch then tandem lora at 16 threads after the
# main runs, each pair's ratio and their median in pairs.md (the host's speed drifts between runs).
# Results under $OUT: table.md, rows.tsv, pairs.md, table-blas.md, rows-blas.tsv, profile.txt,
# cpu-speed.log, test_cpu_gemm.log, test_backend_ops.log, logs.tgz. The env of
# bench/cpu_vs_torch.sh (PRESET, RUNS, TORCH_THREADS, TORCH_AFTER, PROFILE, BUDGET) overrides the
# plan, e.g. for a smoke test here: PRESET=tiny RUNS=lora:2:1 TORCH_THREADS= TORCH_AFTER= PROFILE=.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cpu-speed-out}
mkdir -p "$OUT"
. scripts/device/device-env.sh
export LD_LIBRARY_PATH=$DEVICE_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDA_VISIBLE_DEVICES=
# The machine's own OPENBLAS_CORETYPE (the H100 machine's host had Haswell set on 2026-12-06, an
# AVX2 set on an AVX-512 CPU) would hold tandem to it, while PyTorch's MKL picks its kernels
# itself: it is unset here so both sides run what they choose on this CPU, unless
# KEEP_OPENBLAS_CORETYPE=1 (EXTRA_ENV="OPENBLAS_CORETYPE=Haswell" measures it beside).
echo "# OPENBLAS_CORETYPE in this environment: ${OPENBLAS_CORETYPE:-unset}$([ "${KEEP_OPENBLAS_CORETYPE:-0}" = 1 ] || echo ', unset for the runs')"
[ "${KEEP_OPENBLAS_CORETYPE:-0}" = 1 ] || unset OPENBLAS_CORETYPE
# the baseline build, when carried: unpacked once, for the linears bench and the runs below
rm -rf .device-baseline
[ -f .device-pack/baseline.tgz ] && mkdir -p .device-baseline &&
    tar xzf .device-pack/baseline.tgz -C .device-baseline
RES=/tmp/cpu-speed-res
rm -rf "$RES"
mkdir -p "$RES"
{
    for t in test_cpu_gemm test_backend_ops test_cpu_panel_gemm; do
        timeout 120 ".device/bin/$t" >"$OUT/$t.log" 2>&1
        echo "# $t: exit $?, $(grep -oE '\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/$t.log" | paste -sd' ' -) (log: $t.log)"
    done
    grep -E '^(OpenBLAS|[0-9]+ shapes|gemm |cross-entropy dH)' "$OUT/test_cpu_gemm.log" | sed 's/^/#   /'
    echo "# cores: nproc $(nproc), $(lscpu 2>/dev/null | grep -E '^(Model name|Socket|Thread|Core)' | tr -s ' ' | paste -sd';' -)"
    echo "# OpenBLAS in the pack: $(ls .device/lib | grep -i blas | paste -sd' ' -)"
    # the frozen projections' GEMMs alone at the step's shapes (1024 rows), tandem's kernels
    # against OpenBLAS's tiles, at 16 threads. bench_cpu_linears is not `tandem`, which
    # re-executes itself with the kernel set OpenBLAS should have picked (src/main.c): the set
    # is named here (on 2026-12-07 its OpenBLAS rows ran Prescott's, 5x slower)
    CORE=
    grep -qw avx512f /proc/cpuinfo && CORE=SkylakeX
    [ -z "$CORE" ] && grep -qw avx2 /proc/cpuinfo && CORE=Haswell
    # LINEARS_THREADS may list several thread counts (the kernels' own scaling), LINEARS_ROWS
    # several row counts ("64 1024": the rate rising with the rows puts the time in the
    # per-product layout of W, paid once a product whatever its rows); LINEARS_PANELS "1 0"
    # adds OpenBLAS's tiles; LINEARS_ARGS goes to every run (--nf4: the qlora weights); a
    # baseline.tgz holding bench_cpu_linears runs beside at each pair
    if [ -x .device/bin/bench_cpu_linears ]; then
        # the cores' f32 FMA ceiling (no memory traffic), what every GEMM rate here is set against
        for lt in 1 ${LINEARS_THREADS:-16}; do
            timeout 30 .device/bin/bench_cpu_linears --peak --threads "$lt" | sed 's/^/#   /'
        done
        for lt in ${LINEARS_THREADS:-16}; do
            for lr in ${LINEARS_ROWS:-1024}; do
                for v in ${LINEARS_PANELS:-1 0}; do
                    echo "#   this build, $lt threads, $lr rows, TANDEM_CPU_PANELS=$v:"
                    env ${CORE:+OPENBLAS_CORETYPE=$CORE} TANDEM_CPU_PANELS=$v timeout 60 .device/bin/bench_cpu_linears --threads "$lt" --rows "$lr" --reps 10 ${LINEARS_ARGS:-} | sed 's/^/#   /'
                done
                if [ -x .device-baseline/bench_cpu_linears ]; then
                    echo "#   baseline build, $lt threads, $lr rows:"
                    env ${CORE:+OPENBLAS_CORETYPE=$CORE} timeout 60 .device-baseline/bench_cpu_linears --threads "$lt" --rows "$lr" --reps 10 ${LINEARS_ARGS:-} | sed 's/^/#   /'
                fi
            done
        done
    fi
    BUDGET=${BUDGET:-250} HARD_LIMIT=${HARD_LIMIT:-330} PROFILE=${PROFILE-lora:16:1} TORCH_THREADS=${TORCH_THREADS-16} \
        TORCH_AFTER=${TORCH_AFTER-1:1} AFTER_BUDGET=${AFTER_BUDGET:-200} \
        RUNS=${RUNS-lora:16 qlora:16 lora:8 lora:4:2 lora:2:1 lora:1:1} \
        WORK=/tmp/cpu-speed-work OUT=$RES bash bench/cpu_vs_torch.sh .device/tandem
} 2>&1 | tee "$OUT/cpu-speed.log"
# The GEMM modes side by side: tandem lora at 16 threads again with TANDEM_CPU_GEMM=blas
# (threaded OpenBLAS calls; the default above runs single-threaded OpenBLAS on tiles shared by
# OpenMP's threads), the same model, about 50 s.
RES2=/tmp/cpu-speed-res-blas
rm -rf "$RES2"
mkdir -p "$RES2"
{
    echo "# TANDEM_CPU_GEMM=blas"
    TANDEM_CPU_GEMM=blas PAIRS=0 BUDGET=${BLAS_BUDGET:-60} HARD_LIMIT=${BLAS_HARD_LIMIT:-120} PROFILE= \
        TORCH_THREADS= TORCH_AFTER= RUNS=${BLAS_RUNS-lora:16} \
        WORK=/tmp/cpu-speed-work OUT=$RES2 bash bench/cpu_vs_torch.sh .device/tandem
} 2>&1 | tee -a "$OUT/cpu-speed.log"
# The baseline build, when carried (see the header).
RES3=/tmp/cpu-speed-res-baseline
rm -rf "$RES3"
if [ -f .device-pack/baseline.tgz ]; then
    mkdir -p "$RES3"
    {
        echo "# baseline build (.device-pack/baseline.tgz)"
        PAIRS=0 BUDGET=${BASELINE_BUDGET:-90} HARD_LIMIT=${BASELINE_HARD_LIMIT:-150} PROFILE= TORCH_THREADS= \
            TORCH_AFTER= RUNS=${BASELINE_RUNS-lora:16 lora:8} \
            WORK=/tmp/cpu-speed-work OUT=$RES3 bash bench/cpu_vs_torch.sh .device-baseline/tandem
    } 2>&1 | tee -a "$OUT/cpu-speed.log"
    cp "$RES3/table.md" "$OUT/table-baseline.md" 2>/dev/null
    cp "$RES3/rows.tsv" "$OUT/rows-baseline.tsv" 2>/dev/null
fi
# The variant, when asked for (see the header).
RES4=/tmp/cpu-speed-res-extra
rm -rf "$RES4"
if [ -n "${EXTRA_ENV:-}" ]; then
    mkdir -p "$RES4"
    {
        echo "# this build with $EXTRA_ENV"
        env $EXTRA_ENV PAIRS=0 BUDGET=${EXTRA_BUDGET:-90} HARD_LIMIT=${EXTRA_HARD_LIMIT:-150} PROFILE= \
            TORCH_THREADS= TORCH_AFTER= RUNS="${EXTRA_RUNS-lora:16 lora:8}" \
            WORK=/tmp/cpu-speed-work OUT=$RES4 bash bench/cpu_vs_torch.sh .device/tandem
    } 2>&1 | tee -a "$OUT/cpu-speed.log"
    cp "$RES4/table.md" "$OUT/table-extra.md" 2>/dev/null
    cp "$RES4/rows.tsv" "$OUT/rows-extra.tsv" 2>/dev/null
fi
cp "$RES2/table.md" "$OUT/table-blas.md" 2>/dev/null
cp "$RES2/rows.tsv" "$OUT/rows-blas.tsv" 2>/dev/null
cp "$RES/table.md" "$RES/rows.tsv" "$OUT/" 2>/dev/null
cp "$RES/pairs.md" "$RES/rows-pairs.tsv" "$OUT/" 2>/dev/null
cp "$RES"/profile*.txt "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp cpu-speed-res cpu-speed-res-blas $([ -d "$RES3" ] && echo cpu-speed-res-baseline) \
    $([ -d "$RES4" ] && echo cpu-speed-res-extra) 2>/dev/null
echo
echo "rows (side method threads tok/s s/step steps wall note max-RSS-MiB):"
if command -v column >/dev/null; then tail -n +2 "$RES/rows.tsv" | column -t -s $'\t'; else tail -n +2 "$RES/rows.tsv"; fi
cat "$RES/table.md"
echo "TANDEM_CPU_GEMM=blas:"
tail -n +2 "$RES2/rows.tsv" 2>/dev/null
[ -f "$RES3/rows.tsv" ] && { echo "baseline build:"; tail -n +2 "$RES3/rows.tsv"; }
[ -f "$RES4/rows.tsv" ] && { echo "this build with $EXTRA_ENV:"; tail -n +2 "$RES4/rows.tsv"; }
DET=PASS
for t in test_cpu_gemm test_backend_ops test_cpu_panel_gemm; do
    grep -q 'PASSED  \]' "$OUT/$t.log" && ! grep -q 'FAILED  \]' "$OUT/$t.log" || DET=FAIL
done
echo "CPU backend determinism tests (test_cpu_gemm, test_backend_ops, test_cpu_panel_gemm): $DET"
