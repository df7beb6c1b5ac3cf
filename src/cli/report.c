/* tandem report OUT_DIR... [-o report.html] — one self-contained HTML page of loss curves and a
 * leaderboard over adapters' run records (docs/report.md). */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "report/report.h"
#include "util/atomic_file.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem report OUT_DIR... [-o report.html]\n\n"
            "Writes one self-contained HTML file (inline SVG, no network, no script): train and\n"
            "validation loss of every adapter on shared axes with its best checkpoint marked,\n"
            "learning rate, tokens/s, and a leaderboard. Each OUT_DIR is an adapter's output\n"
            "folder (metrics.jsonl, trainer_state.json), or a folder holding several (a\n"
            "finetune's parent folder, `tandem cluster pull --all` DEST).\n"
            "  -o, --output FILE   where to write it (default: report.html)\n");
}

int tdm_cmd_report(int argc, char **argv)
{
    static const struct option longs[] = {
        {"output", required_argument, NULL, 'o'}, {"help", no_argument, NULL, 'h'}, {0}};
    const char *out = "report.html";
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'h':
            usage(stdout);
            return TDM_EXIT_OK;
        default:
            usage(stderr);
            return TDM_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "report: give at least one OUT_DIR");
    }
    struct stat sb;
    size_t out_len = strlen(out);
    bool slash = out_len && out[out_len - 1] == '/';
    if (slash || (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "-o %s is a directory: give the HTML file's name, e.g. %s%sreport.html",
                            out, out, slash ? "" : "/");
    tdm_error err = {0};
    tdm_report_run *runs;
    int n;
    if (tdm_report_load(argv + optind, argc - optind, &runs, &n, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    char *html = tdm_report_html(runs, n);
    int code = TDM_EXIT_OK;
    if (!html) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
    } else if (tdm_atomic_write(out, html, strlen(html), 0644, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
    } else {
        printf("report: %s (%d adapter%s)\n", out, n, n == 1 ? "" : "s");
    }
    free(html);
    tdm_report_runs_free(runs, n);
    return code;
}
