#!/bin/bash
# Slurm jobs of several GPUs (issue 17 part 1; docs/cluster.md, "Slurm"): with gpus_per_job 2 a
# job asks for --gres=gpu:2 and runs `tandem finetune ... --gpus all` (one fused process per GPU
# of the job), and takes twice the adapters one GPU's process fits. `submit --dry-run` only: no
# Slurm daemon needed (the real runs are integration.cluster_slurm's).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export XDG_STATE_HOME="$WORK/state"
unset TANDEM_FAKE_GPUS
three_adapters 8
SHARED="$WORK/shared"
mkdir -p "$SHARED"
yaml() { # yaml GPUS_PER_JOB VRAM_MB [MAX_ADAPTERS [ARRAY]]: one script per job unless ARRAY
    cat >"$WORK/cluster.yaml" <<Y
scheduler: slurm
slurm:
  partition: debug
  array: ${4:-false}
  gpus_per_job: $1
  gpu_vram_mb: $2
  max_adapters: ${3:-8}
  workdir: $SHARED
  tandem: $TANDEM
Y
}
SUBMIT=("$TANDEM" submit --cluster "$WORK/cluster.yaml" --model "$WORK/model"
        --adapters-config "$WORK/adapters.toml" --rank 4 --dry-run)

# the MiB of one adapter's process (max_adapters 1: one adapter per job)
yaml 1 24000 1
expect_exit 0 "${SUBMIT[@]}"
one=$(sed -n 's/.*slurm job 1 of 3: .*plan \([0-9]*\) MiB of gpu_vram_mb.*/\1/p' "$WORK/last.err" "$WORK/last.out" | head -1)
[ -n "$one" ] || fail "no plan figure: $(cat "$WORK/last.out" "$WORK/last.err")"
# a GPU that fits exactly one adapter's process (a second adds a few MiB): three one-GPU jobs
yaml 1 "$one"
expect_exit 0 "${SUBMIT[@]}"
[ "$(grep -c '^#SBATCH --gres=gpu:1$' "$WORK/last.out")" = 3 ] ||
    fail "one GPU per job, one adapter per GPU: three jobs: $(cat "$WORK/last.out" "$WORK/last.err")"
grep -q -- "--gpus all" "$WORK/last.out" && fail "a one-GPU job runs --gpus"

# two GPUs per job: two adapters per job (one per GPU), two jobs; --gres=gpu:2 and --gpus all
yaml 2 "$one"
expect_exit 0 "${SUBMIT[@]}"
[ "$(grep -c '^#SBATCH --gres=gpu:2$' "$WORK/last.out")" = 2 ] ||
    fail "two jobs of two GPUs: $(cat "$WORK/last.out" "$WORK/last.err")"
[ "$(grep -c -- "finetune .*--device cuda --no-join --resume --gpus all" "$WORK/last.out")" = 2 ] ||
    fail "the finetune line: $(grep finetune "$WORK/last.out")"
grep -q "one fused \`tandem finetune\` process per GPU (--gpus all)" "$WORK/last.out" ||
    fail "the script's comment"
grep -q "slurm job 1 of 2: a, c (2 adapter(s), --device cuda --gpus all, --gres=gpu:2, plan $one MiB of gpu_vram_mb $one per GPU)" \
    "$WORK/last.out" "$WORK/last.err" || fail "the grouping note: $(grep 'slurm job' "$WORK/last.out" "$WORK/last.err")"
# the same two jobs as one job array (their scripts differ only by index): one script
yaml 2 "$one" 8 true
expect_exit 0 "${SUBMIT[@]}"
[ "$(grep -c '^#SBATCH --gres=gpu:2$' "$WORK/last.out")" = 1 ] && grep -q '^#SBATCH --array=0-1$' "$WORK/last.out" ||
    fail "two two-GPU jobs as one array: $(cat "$WORK/last.out" "$WORK/last.err")"
[ -z "$(ls -A "$SHARED")" ] || fail "dry run wrote into the workdir"
finish
