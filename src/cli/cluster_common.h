/* cluster_common.h — what `tandem cluster ...` and `tandem submit` share in the CLI layer:
 * finding and loading cluster.yaml, and printing the job table and leaderboard. */
#ifndef TANDEM_CLI_CLUSTER_COMMON_H
#define TANDEM_CLI_CLUSTER_COMMON_H
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>

#include "cluster/cluster_config.h"

/* Loads --cluster FILE (path may be NULL: the default path). Prints and returns an exit code
 * other than 0 on failure. */
int tdm_cli_load_cluster(const char *path, tdm_cluster_config *cfg);

/* --cluster FILE, which every `tandem cluster` command takes (docs/cluster-yaml.md); getopt
 * returns 'c' for it. */
#define TDM_CLI_CLUSTER_OPTION {"cluster", required_argument, NULL, 'c'}

/* --cluster FILE of a command that reaches its job's node through the registry record (logs,
 * cancel): the file is only checked, as status and run check it; NULL: nothing to check. Prints
 * and returns an exit code other than 0 when it does not load. */
int tdm_cli_check_cluster(const char *path);

/* The jobs table and the leaderboard of jobs (only `submission` when not NULL). */
void tdm_cli_print_jobs(FILE *out, json_t *jobs, const char *submission);
void tdm_cli_print_leaderboard(FILE *out, json_t *board);

/* The jobs of one submission (NULL: all), borrowed references in a new array. */
json_t *tdm_cli_filter_jobs(json_t *jobs, const char *submission);

/* tandem cluster logs JOB [--follow], tandem cluster cancel JOB (cluster_jobs.c). */
int tdm_cmd_cluster_logs(int argc, char **argv);
int tdm_cmd_cluster_cancel(int argc, char **argv);

#endif
