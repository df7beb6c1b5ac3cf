/* tandem init-model OUT_DIR --preset NAME [--seed S] [--dtype bf16|f32] [--tokenizer PATH]
 * [--init-std X] [--layers N] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/init_model.h"
#include "model/presets.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem init-model OUT_DIR --preset NAME [--seed S] [--dtype bf16|f32]\n"
                 "                         [--tokenizer PATH] [--init-std X] [--layers N]\n\n"
                 "Writes config.json, model.safetensors (random weights, normal(0, X), X = 0.02\n"
                 "unless --init-std says otherwise, norms 1)\n"
                 "and a tokenizer (a built-in byte-level one unless --tokenizer names a\n"
                 "tokenizer.json or a directory holding one) in a real architecture's shapes.\n"
                 "--layers N keeps the first N decoder layers of the preset (the same tensors).\n\n"
                 "presets:\n");
    size_t n;
    const tdm_preset_info *p = tdm_presets(&n);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-14s %s\n", p[i].name, p[i].summary);
}

static void progress(uint64_t done, uint64_t total, void *user)
{
    int *last = user;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct != *last) {
        fprintf(stderr, "\rtandem: writing weights %3d%%", pct);
        if (pct == 100)
            fputc('\n', stderr);
        *last = pct;
    }
}

int tdm_cmd_init_model(int argc, char **argv)
{
    static const struct option opts[] = {
        {"preset", required_argument, NULL, 'p'}, {"seed", required_argument, NULL, 's'},
        {"dtype", required_argument, NULL, 'd'},  {"tokenizer", required_argument, NULL, 't'},
        {"init-std", required_argument, NULL, 'i'}, {"layers", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    tdm_init_model_opts o = {.dtype = TDM_DTYPE_BF16};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': o.preset = optarg; break;
        case 's': {
            char *end;
            if (!*optarg || *optarg == '-' ||
                (o.seed = strtoull(optarg, &end, 10), *end != '\0'))
                return tdm_cli_fail(TDM_EXIT_USAGE, "init-model: --seed wants a non-negative "
                                                    "integer, got '%s'",
                                    optarg);
            break;
        }
        case 'd':
            if (!strcmp(optarg, "bf16"))
                o.dtype = TDM_DTYPE_BF16;
            else if (!strcmp(optarg, "f32"))
                o.dtype = TDM_DTYPE_F32;
            else
                return tdm_cli_fail(TDM_EXIT_USAGE, "init-model: --dtype is bf16 or f32, not '%s'",
                                    optarg);
            break;
        case 't': o.tokenizer = optarg; break;
        case 'i':
            if (!tdm_cli_parse_double(optarg, &o.init_std) || !(o.init_std > 0 && o.init_std <= 1))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "init-model: --init-std wants a number in (0, 1], not '%s'",
                                    optarg);
            break;
        case 'l': {
            long n;
            if (!tdm_cli_parse_long(optarg, &n) || n < 1 || n > TDM_INIT_MODEL_MAX_LAYERS)
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "init-model: --layers wants an integer from 1 to %d, not '%s'",
                                    TDM_INIT_MODEL_MAX_LAYERS, optarg);
            o.layers = n;
            break;
        }
        case 'h': usage(stdout); return TDM_EXIT_OK;
        default:
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "init-model: unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (optind != argc - 1 || !o.preset) {
        usage(stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "init-model: needs OUT_DIR and --preset NAME");
    }
    const char *out = argv[optind];
    int last = -1;
    if (isatty(STDERR_FILENO)) {
        o.progress = progress;
        o.user = &last;
    }
    tdm_model_config cfg;
    tdm_error err = {0};
    tdm_status st = tdm_init_model(out, &o, &cfg, &err);
    if (st != TDM_OK)
        return tdm_cli_fail(st == TDM_ERR_NOT_FOUND && !o.tokenizer ? TDM_EXIT_USAGE
                                                                    : TDM_EXIT_FAILURE,
                            "init-model: %s", err.message);
    printf("wrote %s: preset %s (%s), %lld layers, %lld parameters, %s, seed %llu\n", out,
           o.preset, cfg.architecture, (long long)cfg.num_layers,
           (long long)tdm_model_config_param_count(&cfg),
           o.dtype == TDM_DTYPE_BF16 ? "bf16" : "f32", (unsigned long long)o.seed);
    return TDM_EXIT_OK;
}
