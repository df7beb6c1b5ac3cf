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
# init_model_once DIR PRESET LOG: a random model of PRESET (the pack's tandem init-model) in DIR
# unless a run before on this machine finished one there (DIR/.complete); its output in LOG.
DEVICE_TANDEM=$PWD/.device/tandem
init_model_once() {
    [ -f "$1/.complete" ] && return 0
    rm -rf "$1"
    "$DEVICE_TANDEM" init-model "$1" --preset "$2" >"$3" 2>&1 || { tail "$3"; return 1; }
    touch "$1/.complete"
}
