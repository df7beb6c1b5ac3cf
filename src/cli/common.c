#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

const char *tdm_cli_program = "tandem";

void tdm_cli_print_commands(FILE *out, const char *prefix, const tdm_command *commands)
{
    fprintf(out, "usage: %s <command> [options]\n\ncommands:\n", prefix);
    for (const tdm_command *c = commands; c->name; c++)
        fprintf(out, "  %-12s %s\n", c->name, c->summary);
    fprintf(out, "\nRun '%s <command> --help' for the options of one command.\n", prefix);
}

int tdm_cli_dispatch(const char *prefix, const tdm_command *commands, int argc, char **argv)
{
    if (argc < 1) {
        tdm_cli_print_commands(stderr, prefix, commands);
        return TDM_EXIT_USAGE;
    }
    const char *name = argv[0];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        tdm_cli_print_commands(stdout, prefix, commands);
        return TDM_EXIT_OK;
    }
    for (const tdm_command *c = commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c->run(argc, argv);
    fprintf(stderr, "%s: unknown command '%s'\n\n", prefix, name);
    tdm_cli_print_commands(stderr, prefix, commands);
    return TDM_EXIT_USAGE;
}

int tdm_cli_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tandem: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int tdm_cli_fail_err(const tdm_error *err)
{
    int code = TDM_EXIT_FAILURE;
    if (err->status == TDM_ERR_TIMEOUT)
        code = TDM_EXIT_TIMEOUT;
    else if (err->status == TDM_ERR_INVALID)
        code = TDM_EXIT_USAGE;
    return tdm_cli_fail(code, "%s", err->message[0] ? err->message : tdm_status_str(err->status));
}

bool tdm_cli_parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool tdm_cli_parse_long(const char *s, long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

const char *tdm_cli_resume_suffix(const char *cmdline)
{
    return strstr(cmdline, " --resume") ? "" : " --resume";
}
