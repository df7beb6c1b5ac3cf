/* main.c — the `tandem` command: a git-style table of subcommands (see src/cli/). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/cpu/blas_core.h"
#include "util/build_features.h"

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("tandem %s\nfeatures: %s\n", TANDEM_VERSION, tdm_build_features());
    return TDM_EXIT_OK;
}

static const tdm_command commands[] = {
    {"cluster", tdm_cmd_cluster, "nodes of cluster.yaml: status, run, watch, pull"},
    {"data", tdm_cmd_data, "check a JSONL training dataset"},
    {"eval", tdm_cmd_eval, "mean loss and perplexity of a model (+ adapter) on a dataset"},
    {"finetune", tdm_cmd_finetune, "train LoRA adapters, several at once on one frozen base"},
    {"generate", tdm_cmd_generate, "continue prompts with a model (+ adapters): greedy or sampled"},
    {"gpu", tdm_cmd_gpu, "share GPUs safely: status, run"},
    {"inspect", tdm_cmd_inspect, "show a model's architecture, sizes and tensors"},
    {"init-model", tdm_cmd_init_model, "write a random model in a real architecture's shapes"},
    {"merge", tdm_cmd_merge, "merge LoRA adapters into the base: a Hugging Face model directory"},
    {"report", tdm_cmd_report, "an HTML page of loss curves and a leaderboard of adapters"},
    {"submit", tdm_cmd_submit, "place adapters on cluster nodes and start them there"},
    {"tokenize", tdm_cmd_tokenize, "encode text with a model's tokenizer.json"},
    {"version", cmd_version, "print the version"},
    {NULL, NULL, NULL},
};

/* OpenBLAS chose its kernels when it loaded, before main; where it fell back to pre-AVX ones on a
 * CPU it did not recognize (engine/cpu/blas_core.h), run this same command again with
 * OPENBLAS_CORETYPE set. A user's own OPENBLAS_CORETYPE is never overridden, and the new process
 * has it set, so this happens at most once. If exec fails the command goes on as it is. */
static void reexec_with_better_blas_core(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *detected = openblas_get_corename();
    const char *core = tdm_blas_core_upgrade(detected, tdm_blas_cpu_features());
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv(TDM_BLAS_CORE_FROM_ENV, detected, 1);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(TDM_BLAS_CORE_FROM_ENV);
}

int main(int argc, char **argv)
{
    reexec_with_better_blas_core(argv);
    if (argv[0] && strchr(argv[0], '/')) tdm_cli_program = argv[0];
    if (argc >= 2 && !strcmp(argv[1], "--version")) return cmd_version(0, NULL);
    return tdm_cli_dispatch("tandem", commands, argc - 1, argv + 1);
}
