/* cluster_config.h — cluster.yaml: the machines `tandem submit` may place adapter jobs on.
 *
 * Format (docs/cluster-yaml.md has every field):
 *
 *     ssh_config: ~/.ssh/tandem_config        # optional, passed to ssh with -F
 *     nodes:
 *       - name: desk                           # [A-Za-z0-9._-]{1,64}, unique
 *         transport: ssh                       # ssh (default) | local
 *         host: 192.168.1.20                   # required for ssh
 *         user: ana                            # ssh only, optional
 *         port: 22                             # ssh only, optional, 1..65535
 *         identity_file: ~/.ssh/id_ed25519     # ssh only, optional
 *         workdir: /home/ana/tandem-work       # required, absolute
 *         tandem: /usr/local/bin/tandem        # optional, default "tandem" (found on PATH)
 *         gpus:
 *           - {uuid: GPU-8c2e..., type: RTX 4090, vram_mb: 24564, memory_type: discrete}
 *         cpu_cores: 16
 *         ram_mb: 65536
 *         max_adapters: 4                      # default 4, >= 1
 *         cpu_max_params: 350M                 # default 350M (integer, or with K/M/B suffix)
 *         env: {TANDEM_LEDGER_DIR: /srv/ledger} # optional: environment for commands on the node
 *
 * Parsed with libyaml; every error is "FILE:LINE:COLUMN: what is wrong" (1-based), from the
 * marks libyaml gives. Relative ssh_config and identity_file paths are resolved against the
 * directory of the cluster file ("~/" is left to ssh).
 */
#ifndef TANDEM_CLUSTER_CLUSTER_CONFIG_H
#define TANDEM_CLUSTER_CLUSTER_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/inventory.h"
#include "util/error.h"

#define TDM_CLUSTER_NAME_MAX 64
#define TDM_CLUSTER_DEFAULT_MAX_ADAPTERS 4
#define TDM_CLUSTER_DEFAULT_CPU_MAX_PARAMS 350000000LL

typedef enum tdm_transport_kind {
    TDM_TRANSPORT_SSH = 0,
    TDM_TRANSPORT_LOCAL = 1,
} tdm_transport_kind;

/* A GPU as cluster.yaml describes it (the live state comes from the node at run time). */
typedef struct tdm_cluster_gpu {
    char *uuid;                  /* required, unique over the whole file */
    char *type;                  /* "RTX 4090": picks the speed factor; NULL when unset */
    int64_t vram_mb;             /* MiB, > 0; 0 when unset */
    tdm_memory_type memory_type; /* default discrete */
    double speed;                /* explicit speed factor (> 0), 0 when unset (table decides) */
    uint32_t line, col;          /* of the GPU's mapping */
} tdm_cluster_gpu;

typedef struct tdm_cluster_node {
    char *name;
    tdm_transport_kind transport;
    char *host;          /* ssh: required; local: NULL */
    char *user;          /* NULL when unset */
    int port;            /* 0 when unset (ssh's default or ssh_config decides) */
    char *identity_file; /* NULL when unset; resolved against the cluster file's directory */
    char *workdir;       /* absolute path on the node */
    char *tandem;        /* path of tandem on the node; "tandem" when unset */
    tdm_cluster_gpu *gpus;
    size_t n_gpus;
    int cpu_cores;          /* 0 when unset */
    int64_t ram_mb;         /* MiB, 0 when unset */
    int max_adapters;       /* >= 1 */
    int64_t cpu_max_params; /* largest model (parameters) trained on this node's CPU */
    char **env;             /* (n_env) "NAME=VALUE" strings, file order */
    size_t n_env;
    uint32_t line, col; /* of the node's mapping */
} tdm_cluster_node;

typedef enum tdm_scheduler_kind {
    TDM_SCHEDULER_SSH = 0, /* tandem places adapters on the listed nodes itself */
    TDM_SCHEDULER_SLURM = 1,
} tdm_scheduler_kind;

typedef enum tdm_slurm_device {
    TDM_SLURM_DEVICE_AUTO = 0, /* cuda when the job asks for GPUs, else cpu */
    TDM_SLURM_DEVICE_CUDA,
    TDM_SLURM_DEVICE_CPU,
} tdm_slurm_device;

#define TDM_SLURM_DEFAULT_SIGNAL_GRACE_S 120
#define TDM_SLURM_DEFAULT_MAX_ADAPTERS 4

/* The `slurm:` block (docs/cluster-yaml.md, "Slurm"). Strings are NULL when unset. */
typedef struct tdm_slurm_config {
    char *partition, *account, *qos;
    char *time;          /* sbatch --time, e.g. "2:00:00" or "1-00:00:00" */
    int gpus_per_job;    /* 0 (CPU-only jobs) or 1; default 1 */
    char *gpu_type;      /* --gres=gpu:TYPE:N */
    int64_t gpu_vram_mb; /* MiB one job may plan for on its GPU; required when gpus_per_job > 0 */
    int cpus_per_gpu;    /* 0 when unset */
    char *mem_per_gpu;   /* "32G": sbatch --mem-per-gpu */
    char *constraint;
    char **extra; /* (n_extra) further sbatch options, each starting with "--" */
    size_t n_extra;
    tdm_slurm_device device;
    int signal_grace_s; /* --signal=B:USR1@N: the checkpoint's head start before a time limit */
    int max_adapters;   /* most adapters in one job's fused process */
    bool array;         /* jobs whose scripts differ only by index go as one job array */
    int64_t cpu_max_params;
    /* The shared workdir as the submitting machine sees it (every compute node sees it at the
     * same path): a local node named "slurm" with workdir, tandem and env of the block. Staging,
     * job directories, status reads and `cluster pull` go through it. */
    tdm_cluster_node shared;
    uint32_t line, col; /* of the block */
} tdm_slurm_config;

typedef struct tdm_cluster_config {
    char *file;       /* the path given to load/parse (owned), for messages */
    char *ssh_config; /* NULL when unset; resolved against the cluster file's directory */
    tdm_scheduler_kind scheduler;
    tdm_cluster_node *nodes;
    size_t n_nodes;        /* >= 1 with scheduler ssh; 0 with slurm (Slurm picks nodes) */
    tdm_slurm_config slurm; /* scheduler slurm only */
} tdm_cluster_config;

/* Parses cluster.yaml text[0..len). filename names the file in messages and anchors relative
 * paths. On success *out owns everything; on failure *out is zeroed and err holds
 * "FILE:LINE:COLUMN: message" (TDM_ERR_PARSE for YAML syntax and wrong shapes or types,
 * TDM_ERR_INVALID for meaning: duplicates, ranges, fields that do not fit the transport). */
tdm_status tdm_cluster_config_parse(const char *text, size_t len, const char *filename,
                                    tdm_cluster_config *out, tdm_error *err);

/* Reads path and parses it; a missing file is TDM_ERR_NOT_FOUND saying how to create one. */
tdm_status tdm_cluster_config_load(const char *path, tdm_cluster_config *out, tdm_error *err);

/* ${XDG_CONFIG_HOME:-$HOME/.config}/tandem/cluster.yaml into buf; false when it does not fit or
 * neither variable is set. */
bool tdm_cluster_config_default_path(char *buf, size_t size);

/* The node called name, or NULL. */
const tdm_cluster_node *tdm_cluster_config_find(const tdm_cluster_config *cfg, const char *name);

/* Frees one node's fields and zeroes it. */
void tdm_cluster_node_free(tdm_cluster_node *n);

/* Frees what parse/load filled in and zeroes *cfg; a zeroed config is allowed. */
void tdm_cluster_config_free(tdm_cluster_config *cfg);

const char *tdm_transport_kind_str(tdm_transport_kind kind);

#endif
