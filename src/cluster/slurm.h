/* slurm.h — tandem's jobs as Slurm batch jobs: the batch script, sbatch, the job's state and
 * cancelling it. tandem never picks nodes or queues work itself under Slurm: it writes a batch
 * script per job and hands it to sbatch; Slurm's own commands (sbatch, scontrol, sacct, scancel,
 * found on PATH) do the rest (docs/cluster.md, "Slurm").
 *
 * The batch script (WORKDIR/jobs/ID/job.sh) carries every sbatch option as an #SBATCH line, so
 * it is readable and can be resubmitted by hand, then runs `tandem finetune ... --resume` in the
 * background and waits for it:
 *   - USR1 from Slurm (--signal=B:USR1@GRACE before the time limit, or `cluster cancel`) is passed
 *     on to finetune, which checkpoints every unfinished adapter and exits 0; the script then
 *     requeues the job (`scontrol requeue`), and the requeued run resumes from the checkpoints
 *     (--resume without checkpoints starts from scratch, so the first run passes it too). When
 *     the job directory holds a `cancel` file (written by `cluster cancel` first) it does not
 *     requeue.
 *   - the finetune's exit status goes to JOB_DIR/exit_code (temp + rename) when the job ends
 *     without a requeue: the record of last resort once Slurm has forgotten the job.
 *
 * A job array (array_n > 0): jobs of one submission whose scripts differ only by their job
 * directory go as one `sbatch --array=0-(N-1)` script in WORKDIR/jobs/ID/job.sh; task i is
 * tandem job ID_i, its directory WORKDIR/jobs/ID_i (picked by SLURM_ARRAY_TASK_ID), its Slurm
 * id ARRAYID_i. A task requeues itself by that id: its own SLURM_JOB_ID may be the array's id,
 * and `scontrol requeue ARRAYID` would requeue every task.
 */
#ifndef TANDEM_CLUSTER_SLURM_H
#define TANDEM_CLUSTER_SLURM_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster_config.h"
#include "util/error.h"

/* One job to write: the adapters are already in job_dir/adapters.toml. */
typedef struct tdm_slurm_job {
    const char *id;           /* tandem's job id: --job-name tandem-<id> */
    const char *job_dir;      /* WORKDIR/jobs/<id>, created by the caller; of an array: the
                                 script's directory, the tasks' are job_dir_<task> */
    const char *model_dir;    /* the staged model, inside the workdir */
    int n_adapters;           /* for the script's comment (not in an array's) */
    int array_n;              /* > 0: a job array of this many tasks (--array=0-(N-1)) */
    int64_t cpu_mem_mb;       /* CPU-only job: --mem (the placement estimate); 0: not given */
    const char *const *pass;  /* (n_pass) the finetune flags submit passes on */
    size_t n_pass;
} tdm_slurm_job;

/* The device the job's finetune uses: cuda when the job asks for a GPU and device is auto. */
const char *tdm_slurm_job_device(const tdm_slurm_config *sl);

/* The batch script's text (malloc'd) for job j under sl. TDM_ERR_NOMEM only. */
tdm_status tdm_slurm_script(const tdm_slurm_config *sl, const tdm_slurm_job *j, char **out,
                            tdm_error *err);

/* `sbatch --parsable SCRIPT` (run in the workdir); *slurm_id receives the job id Slurm gave
 * ("123", or "123;cluster" cut at ';'). TDM_ERR_UNSUPPORTED when sbatch is not on PATH,
 * TDM_ERR_IO with sbatch's message when it refuses the job. */
tdm_status tdm_slurm_sbatch(const char *script, const char *workdir, char *slurm_id, size_t cap,
                            tdm_error *err);

/* What Slurm says of a job. */
typedef struct tdm_slurm_state {
    bool known;         /* false: neither scontrol nor sacct knows the job (purged, no accounting) */
    char state[32];     /* Slurm's JobState: PENDING, RUNNING, COMPLETED, TIMEOUT, ... */
    char reason[128];   /* Reason= (a pending job's: Resources, Priority, ...), "" when None */
    int exit_code;      /* ExitCode's first number, -1 when not given */
    int restarts;       /* RestartCnt */
    const char *source; /* "scontrol" or "sacct" */
} tdm_slurm_state;

/* Asks `scontrol show job -o ID`, then `sacct -n -P -X -j ID -o State,ExitCode` (accounting or
 * jobcomp) when scontrol no longer knows the job. Never fails because Slurm does not know the
 * job (known = false); TDM_ERR_UNSUPPORTED when scontrol is not on PATH. */
tdm_status tdm_slurm_query(const char *slurm_id, tdm_slurm_state *out, tdm_error *err);

/* tandem's job state ("running", "finished", "failed") for a Slurm state: pending, running,
 * requeued, suspended and completing jobs are running. */
const char *tdm_slurm_state_to_job_state(const char *slurm_state);

/* scancel [--signal=SIG --batch] ID. sig NULL: cancel outright. */
tdm_status tdm_slurm_cancel(const char *slurm_id, const char *sig, tdm_error *err);

#endif
