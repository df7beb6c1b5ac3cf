/* merge.c — `tandem merge`: LoRA adapters merged into their base model, written as a Hugging Face
 * model directory (train/merge.h, docs/merge.md).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "train/merge.h"

enum { M_ADAPTER = 256, M_OUT, M_BASE, M_DTYPE, M_SHARD, M_FORCE, M_DQ, M_NODQ, M_QUIET, M_HELP };

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem merge MODEL_DIR --adapter DIR[:WEIGHT] [--adapter DIR[:WEIGHT] ...]\n"
        "                    --out OUT_DIR [--base dequantized|original] [--dtype bf16|f16|f32]\n"
        "                    [--max-shard-size SIZE] [--force] [--quiet]\n"
        "  --adapter DIR[:WEIGHT]  a PEFT adapter directory; several are merged linearly,\n"
        "                          W + sum WEIGHT * scale * B A (WEIGHT a finite number,\n"
        "                          default 1)\n"
        "  --out OUT_DIR           the merged model (a Hugging Face model directory)\n"
        "  --base                  dequantized: the NF4 weights a QLoRA adapter was trained\n"
        "                          against (the default for adapters tandem trained with\n"
        "                          --method qlora); original: the weights as stored (the\n"
        "                          default for --method lora and adapters made elsewhere)\n"
        "  --no-double-quant       with --base dequantized for an adapter that records no\n"
        "                          method: fp32 absmax blocks (training's --no-double-quant)\n"
        "  --dtype                 bf16, f16 or f32 for every float tensor (default: each\n"
        "                          tensor keeps its stored dtype); config.json's torch_dtype\n"
        "                          follows\n"
        "  --max-shard-size SIZE   largest shard, bytes or with KB/MB/GB (default 5GB)\n"
        "  --force                 replace a non-empty OUT_DIR such as an earlier merged\n"
        "                          model (atomically, once complete); never an adapter\n"
        "                          directory or a training run's OUT_DIR\n"
        "  --quiet                 no progress lines on stderr\n");
}

static void print_note(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: %s\n", line);
}

/* "DIR" or "DIR:WEIGHT": the last ':' starts the weight when a number follows it; otherwise the
 * whole argument is DIR when that exists (a directory whose name has a ':'). Returns
 * TDM_EXIT_OK, or TDM_EXIT_USAGE after printing why. */
static int parse_adapter(char *arg, tdm_merge_adapter *a)
{
    a->dir = arg;
    a->weight = 1;
    char *colon = strrchr(arg, ':');
    double w;
    struct stat sb;
    if (colon && tdm_cli_parse_double(colon + 1, &w)) {
        *colon = 0;
        a->weight = w;
    } else if (colon && stat(arg, &sb) != 0) {
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "merge: --adapter %s: the weight after ':' must be a finite number "
                            "(DIR:WEIGHT, such as %.*s:0.5), and no directory %s exists",
                            arg, (int)(colon - arg), arg, arg);
    }
    if (!*a->dir) return tdm_cli_fail(TDM_EXIT_USAGE, "merge: --adapter needs DIR[:WEIGHT]");
    return TDM_EXIT_OK;
}

/* "5GB", "200MB", "64KB", "1000" (decimal units, as transformers' max_shard_size). */
static bool parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 1)) return false;
    double mul = 1;
    if (!strcasecmp(end, "KB"))
        mul = 1e3;
    else if (!strcasecmp(end, "MB"))
        mul = 1e6;
    else if (!strcasecmp(end, "GB"))
        mul = 1e9;
    else if (*end && strcasecmp(end, "B"))
        return false;
    if (v * mul > 1e18) return false;
    *out = (uint64_t)(v * mul);
    return true;
}

int tdm_cmd_merge(int argc, char **argv)
{
    static const struct option longopts[] = {{"adapter", required_argument, NULL, M_ADAPTER},
                                             {"out", required_argument, NULL, M_OUT},
                                             {"base", required_argument, NULL, M_BASE},
                                             {"dtype", required_argument, NULL, M_DTYPE},
                                             {"max-shard-size", required_argument, NULL, M_SHARD},
                                             {"force", no_argument, NULL, M_FORCE},
                                             {"double-quant", no_argument, NULL, M_DQ},
                                             {"no-double-quant", no_argument, NULL, M_NODQ},
                                             {"quiet", no_argument, NULL, M_QUIET},
                                             {"help", no_argument, NULL, M_HELP},
                                             {NULL, 0, NULL, 0}};
    tdm_merge_adapter ads[64];
    tdm_merge_opts o = {
        .adapters = ads, .base = TDM_MERGE_BASE_AUTO, .double_quant = true, .note = print_note};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case M_ADAPTER: {
            if (o.n_adapters == 64)
                return tdm_cli_fail(TDM_EXIT_USAGE, "merge: at most 64 --adapter options");
            int code = parse_adapter(optarg, &ads[o.n_adapters++]);
            if (code != TDM_EXIT_OK) return code;
            break;
        }
        case M_OUT:
            o.out_dir = optarg;
            break;
        case M_BASE:
            if (!strcmp(optarg, "dequantized"))
                o.base = TDM_MERGE_BASE_DEQUANTIZED;
            else if (!strcmp(optarg, "original"))
                o.base = TDM_MERGE_BASE_ORIGINAL;
            else
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "merge: --base: '%s' is not dequantized or original", optarg);
            break;
        case M_DTYPE:
            o.has_dtype = true;
            if (!strcmp(optarg, "bf16") || !strcmp(optarg, "bfloat16"))
                o.dtype = TDM_DTYPE_BF16;
            else if (!strcmp(optarg, "f16") || !strcmp(optarg, "float16"))
                o.dtype = TDM_DTYPE_F16;
            else if (!strcmp(optarg, "f32") || !strcmp(optarg, "float32"))
                o.dtype = TDM_DTYPE_F32;
            else
                return tdm_cli_fail(TDM_EXIT_USAGE, "merge: --dtype: '%s' is not bf16, f16 or f32",
                                    optarg);
            break;
        case M_SHARD:
            if (!parse_size(optarg, &o.max_shard_bytes))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "merge: --max-shard-size: '%s' is not a size such as 5GB, "
                                    "500MB or 1000000",
                                    optarg);
            break;
        case M_FORCE:
            o.force = true;
            break;
        case M_DQ:
        case M_NODQ:
            o.double_quant = ch == M_DQ;
            o.double_quant_given = true;
            break;
        case M_QUIET:
            o.note = NULL;
            break;
        case M_HELP:
        case 'h':
            usage(stdout);
            return TDM_EXIT_OK;
        default:
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "merge: unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return tdm_cli_fail(TDM_EXIT_USAGE, "merge: expected exactly one MODEL_DIR");
    o.model_dir = argv[optind];
    if (!o.n_adapters)
        return tdm_cli_fail(TDM_EXIT_USAGE, "merge: give at least one --adapter DIR[:WEIGHT]");
    if (!o.out_dir) return tdm_cli_fail(TDM_EXIT_USAGE, "merge: --out OUT_DIR is required");
    if (o.double_quant_given && o.base == TDM_MERGE_BASE_ORIGINAL)
        return tdm_cli_fail(TDM_EXIT_USAGE, "merge: --%s only applies to --base dequantized",
                            o.double_quant ? "double-quant" : "no-double-quant");
    tdm_merge_result r;
    tdm_error err = {0};
    if (tdm_merge(&o, &r, &err) != TDM_OK) {
        if (err.status == TDM_ERR_INVALID)
            return tdm_cli_fail(TDM_EXIT_USAGE, "merge: %s", err.message);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "merge: %s", err.message);
    }
    printf("%s: %zu tensors (%zu projections merged from %zu adapter%s, base %s) in %zu shard%s, "
           "%.1f MB\n",
           o.out_dir, r.n_tensors, r.n_merged, o.n_adapters, o.n_adapters == 1 ? "" : "s",
           tdm_merge_base_name(r.base), r.n_shards, r.n_shards == 1 ? "" : "s",
           (double)r.total_size / 1e6);
    return TDM_EXIT_OK;
}
