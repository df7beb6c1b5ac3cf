#!/bin/bash
# make run: the main job, in two parts. scripts/demo-adapters.sh trains three LoRA adapters fused
# on the CPU and shows each one answering prompts it never saw beside the bare base model;
# scripts/demo-gpu-sharing.sh shows `tandem gpu run` jobs sharing one simulated GPU.
set -eu
TANDEM=${1:-build/tandem}
here=$(cd "$(dirname "$0")" && pwd)
"$here/demo-adapters.sh" "$TANDEM"
echo
"$here/demo-gpu-sharing.sh" "$TANDEM"
