#!/usr/bin/env bash
# cuda-pack.sh — run HERE (the build machine, CUDA toolkit installed, no GPU needed): builds the
# CUDA test and the dev/cuda kernel programs and packs them, with the Debian shared libraries
# they need that the GPU machine lacks, into DIR (default .device/cuda, git-ignored):
#   DIR/bin/test_backend_cuda  DIR/bin/{nf4_dequant,attention,lora,adamw,cross_entropy,rmsnorm,swiglu,rope}  DIR/lib/*.so*
# Then on the GPU machine: scripts/device/cuda-check.sh DIR   (carry: .device)
#   BUILD=build-cuda  build directory (configured with -DTANDEM_WERROR=ON if absent)
#   JOBS=1            parallel build jobs
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.device/cuda}
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-1}
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DTANDEM_WERROR=ON
KERNELS=(nf4_dequant attention lora adamw cross_entropy rmsnorm swiglu rope) # the dev/cuda programs
cmake --build "$BUILD" -j "$JOBS" --target test_backend_cuda "${KERNELS[@]/#/dev_}"
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
cp "$BUILD/tests/test_backend_cuda" "$DIR/bin/"
for k in "${KERNELS[@]}"; do cp "$BUILD/dev/cuda/$k" "$DIR/bin/"; done
# Shared libraries outside glibc / libstdc++ / CUDA (the GPU image has those).
ldd "$DIR"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | \
        ld-linux* | libcudart.so* | libcublas*.so*) ;;
    *) cp -L "$lib" "$DIR/lib/" ;;
    esac
done
du -sh "$DIR"
ls -la "$DIR/bin" "$DIR/lib"
