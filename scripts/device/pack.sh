#!/usr/bin/env bash
# pack.sh — run HERE (the build machine): packs the built tandem binary, the CUDA op test, the
# CPU backend's op and GEMM determinism tests (test_backend_ops, test_cpu_gemm, test_cpu_panel_gemm), bench_train (the engine benchmark and its cuBLASLt matmul rate), bench_cpu_linears, the
# dev/cuda kernel programs and the Debian shared libraries the GPU machine lacks into
# .device-pack/device.tgz (git-ignored), to carry to the GPU machine, where
#   rm -rf .device && mkdir -p .device && tar xzf .device-pack/device.tgz -C .device
#   export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
# gives .device/tandem, .device/bin/* and .device/lib/*.
#   BUILD=build   the (CUDA-enabled) build directory
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" .device-pack
cp "$BUILD/tandem" "$STAGE/tandem"
cp "$BUILD/tests/test_backend_cuda" "$STAGE/bin/" 2>/dev/null || true
cp "$BUILD/tests/test_generate" "$STAGE/bin/" 2>/dev/null || true
cp "$BUILD/tests/test_backend_ops" "$BUILD/tests/test_cpu_gemm" "$BUILD/tests/test_cpu_panel_gemm" "$STAGE/bin/"
cp "$BUILD/bench_train" "$BUILD/bench_cpu_linears" "$STAGE/bin/" 2>/dev/null || true
for p in "$BUILD"/dev/cuda/*; do [ -x "$p" ] && [ -f "$p" ] && cp "$p" "$STAGE/bin/"; done
strip "$STAGE/tandem" "$STAGE"/bin/* 2>/dev/null || true
# Shared libraries outside glibc / libstdc++ / CUDA (the GPU image has those): among them the
# OpenBLAS the binary was linked against (the OpenMP build, found through its run path) and
# libgomp, whose one pool OpenBLAS's threads then are.
ldd "$STAGE/tandem" "$STAGE"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | \
        ld-linux* | libcudart.so* | libcublas*.so*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
    esac
done
for lib in libopenblas.so.0 libgomp.so.1; do
    [ -f "$STAGE/lib/$lib" ] || { echo "pack.sh: $lib is not among the binary's libraries" >&2; exit 1; }
done
if ! grep -qa USE_OPENMP "$STAGE/lib/libopenblas.so.0"; then
    echo "pack.sh: warning: the packed OpenBLAS is not its OpenMP build (the CPU backend runs tiles);" \
        "install libopenblas-openmp-dev (scripts/install-deps.sh) and rebuild" >&2
fi
tar czf .device-pack/device.tgz -C "$STAGE" .
ls -la .device-pack/device.tgz
