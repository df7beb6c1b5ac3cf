# The OpenBLAS kernel set on a CPU OpenBLAS did not recognize (engine/cpu/blas_core.h): with
# tests/lib/fake_blas_corename.c preloaded, OpenBLAS reports its Prescott fallback; `tandem
# finetune --device cpu` re-executes itself with OPENBLAS_CORETYPE set to the kernels this CPU
# runs (SkylakeX with AVX-512, Haswell with AVX2, Sandybridge with AVX), says so in its thread
# note, and trains as usual; a user's own OPENBLAS_CORETYPE is kept, and where it names an AVX2
# set on an AVX-512 CPU the note says which faster set it keeps from being used.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
FAKE=$TANDEM_BINARY_DIR/tests/libfake_blas_corename.so
[ -f "$FAKE" ] || { echo "no $FAKE"; exit 1; }
grep -qw avx /proc/cpuinfo || { echo "skip: this CPU has no AVX, nothing better to force"; exit 77; }
want=Sandybridge
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && want=Haswell
for f in avx512f avx512cd avx512bw avx512dq avx512vl; do grep -qw $f /proc/cpuinfo || break
    [ $f = avx512vl ] && want=SkylakeX; done
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
# under AddressSanitizer (make test's ASan pass; gcc links libasan dynamically) a preloaded
# library comes before the ASan runtime, which it refuses unless told the order is fine
PRE=("ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" LD_PRELOAD="$FAKE")
F=(--device cpu --threads 1 --no-join --epochs 1 --max-seq-len 64 --batch-size 4 --val-split 0 --save-every 0)

expect_exit 0 env -u OPENBLAS_CORETYPE "${PRE[@]}" "$TANDEM" finetune "$M" \
    --adapter data/add.jsonl:out1/add "${F[@]}"
grep -q "^tandem: cpu: 1 threads .*; OpenBLAS core $want (forced: it picked Prescott on this CPU)" last.err ||
    fail "no forced $want core in the thread note: $(grep 'cpu:' last.err)"
[ -f out1/add/adapter_model.safetensors ] || fail "the re-executed finetune wrote no adapter"

# the user's own choice stands (no re-execution, no "forced"); with the same kernels as the
# forced run (OpenBLAS honours OPENBLAS_CORETYPE; the fake only answers the name) the same bytes
expect_exit 0 env "${PRE[@]}" OPENBLAS_CORETYPE=$want "$TANDEM" finetune "$M" \
    --adapter data/add.jsonl:out2/add "${F[@]}"
grep -q "^tandem: cpu: 1 threads .*; OpenBLAS core $want$" last.err ||
    fail "OPENBLAS_CORETYPE=$want not kept as it is: $(grep 'cpu:' last.err)"
cmp -s out1/add/adapter_model.safetensors out2/add/adapter_model.safetensors ||
    fail "the re-executed run trained a different adapter than OPENBLAS_CORETYPE=$want"

# an environment that holds this AVX-512 CPU to OpenBLAS's AVX2 kernels is kept, and the note
# names the faster set (no fake: the real OpenBLAS loads Haswell as told)
if [ $want = SkylakeX ]; then
    expect_exit 0 env OPENBLAS_CORETYPE=Haswell "$TANDEM" finetune "$M" \
        --adapter data/add.jsonl:out3/add "${F[@]}"
    grep -q "^tandem: cpu: 1 threads .*; OpenBLAS core Haswell (OPENBLAS_CORETYPE=Haswell in the environment; this CPU runs SkylakeX kernels, faster: unset it to use them)$" last.err ||
        fail "no note of the weaker core from the environment: $(grep 'cpu:' last.err)"
fi
finish
