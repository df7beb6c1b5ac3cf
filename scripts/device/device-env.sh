# device-env.sh — sourced (not run) by the scripts/device/ scripts that run on the GPU machine over
# the tarball scripts/device/pack.sh made on the build machine (the call carries .device-pack):
#   unpacks it into .device (tandem, bin/test_backend_cuda, bin/<dev/cuda program>, lib/);
#   DEVICE_LD  the library path tandem and those programs need (.device/lib, then CUDA's). Not
#              exported: PyTorch processes must not load .device/lib (bench/gpu_vs_peft.sh strips
#              it for them), so each script exports it or prefixes its own commands;
#   gpu_line   prints the GPU: name, driver, memory total and used, one line.
# Sourced from the repository root.
rm -rf .device && mkdir -p .device && tar xzf .device-pack/device.tgz -C .device || exit 1
DEVICE_LD=$PWD/.device/lib:/usr/local/cuda/lib64
gpu_line() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
}
