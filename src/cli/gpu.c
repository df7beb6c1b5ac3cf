/* tandem gpu — the GPU sharing commands. */
#include "cli/cli.h"

static const tdm_command gpu_commands[] = {
    {"status", tdm_cmd_gpu_status, "GPUs, their processes, reservations and the wait queue"},
    {"run", tdm_cmd_gpu_run, "reserve GPU memory (waiting in line if needed), then run a command"},
    {NULL, NULL, NULL},
};

int tdm_cmd_gpu(int argc, char **argv)
{
    return tdm_cli_dispatch("tandem gpu", gpu_commands, argc - 1, argv + 1);
}
