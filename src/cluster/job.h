/* job.h — a detached process on a node: start it, and later ask how it is doing.
 *
 * Layout on the node, in the job directory (WORKDIR/jobs/ID):
 *     log        stdout and stderr of the command
 *     pid        "PID STARTTIME" (STARTTIME: field 22 of /proc/PID/stat, so a recycled PID is
 *                not mistaken for the job)
 *     exit_code  the command's exit status, written when it ends (absent while it runs, and
 *                absent for good when the job was killed together with its wrapper)
 * The command runs under `setsid sh -c WRAPPER` started in the background with stdin from
 * /dev/null and output to the log, so it outlives the SSH session that started it and never holds
 * the session open. Its working directory is the node's workdir.
 */
#ifndef TANDEM_CLUSTER_JOB_H
#define TANDEM_CLUSTER_JOB_H
#include <stdbool.h>
#include <stddef.h>

#include "cluster/transport.h"
#include "util/error.h"

/* Lines of the log kept with a poll. */
#define TDM_JOB_LOG_TAIL_LINES 20

typedef enum tdm_job_state {
    TDM_JOB_RUNNING,
    TDM_JOB_FINISHED, /* exit code 0 */
    TDM_JOB_FAILED,   /* non-zero exit code, or gone without one */
    TDM_JOB_UNKNOWN,  /* the node did not answer */
} tdm_job_state;

const char *tdm_job_state_str(tdm_job_state s);
/* Inverse of tdm_job_state_str; TDM_JOB_UNKNOWN for anything else. */
tdm_job_state tdm_job_state_parse(const char *s);

/* Starts argv[0..argc) detached on the node in job_dir (created; must not hold a previous job)
 * and returns the PID of its wrapper. TDM_ERR_IO when the node is unreachable or the start
 * fails (message says why). */
tdm_status tdm_job_launch(tdm_transport *t, const char *job_dir, const char *const *argv,
                          size_t argc, long *pid, tdm_error *err);

typedef struct tdm_job_poll {
    tdm_job_state state;
    char why[512];  /* unknown: why the node did not answer; failed: what happened */
    int exit_code;  /* -1 when none was written */
    long pid;       /* 0 when the pid file is missing */
    char *log_tail; /* last TDM_JOB_LOG_TAIL_LINES lines of the log (owned) */
    char **files;   /* (n_files) contents of the requested files, NULL where absent (owned) */
    size_t n_files;
} tdm_job_poll;

/* Asks the node about the job in job_dir and reads files[0..n_files) (absolute paths on the
 * node, e.g. each adapter's metadata.json) in the same round trip. */
tdm_status tdm_job_poll_once(tdm_transport *t, const char *job_dir, const char *const *files,
                             size_t n_files, tdm_job_poll *out, tdm_error *err);

void tdm_job_poll_free(tdm_job_poll *p);

/* At most this many bytes of the log per tdm_job_log_read. */
#define TDM_JOB_LOG_CHUNK (8 << 20)
#define TDM_JOB_LOG_CHUNK_TEXT "8388608"

/* The job's log from byte offset on (at most TDM_JOB_LOG_CHUNK bytes) into a malloc'd,
 * NUL-terminated *out of *len bytes, and whether its process was alive just before the read:
 * when *alive is false the log is complete once read to its end. TDM_ERR_IO when the node is
 * unreachable or the job directory does not exist. */
tdm_status tdm_job_log_read(tdm_transport *t, const char *job_dir, int64_t offset, char **out,
                            size_t *len, bool *alive, tdm_error *err);

/* Sends signal sig ("TERM", "INT", "USR1") to the job's command: the processes whose parent is
 * the job's wrapper, never the wrapper itself, which stays to record the command's exit code.
 * pids receives their pids ("4243"). TDM_ERR_NOT_FOUND when the job is not running. */
tdm_status tdm_job_signal(tdm_transport *t, const char *job_dir, const char *sig, char *pids,
                          size_t pids_size, tdm_error *err);

#endif
