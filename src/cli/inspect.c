/* tandem inspect PATH [--json] — what a model directory or a .safetensors file holds. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/nf4.h"
#include "model/weights.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem inspect PATH [--json]\n\n"
                 "PATH is a model directory (config.json + model.safetensors or a sharded\n"
                 "model.safetensors.index.json) or a single .safetensors file. Prints the\n"
                 "architecture and sizes, RoPE, parameter count, every tensor, and the size the\n"
                 "base takes with its decoder projections in NF4 (other tensors counted as bf16).\n");
}

typedef struct sizes {
    int64_t params;        /* elements over all tensors in the files */
    uint64_t nf4_dq;       /* NF4 with double quantization + the rest in bf16 */
    uint64_t nf4_plain;    /* NF4 without double quantization + the rest in bf16 */
    size_t n_quantized;
} sizes;

static sizes measure(const tdm_weights *w)
{
    sizes s = {0};
    for (size_t i = 0; i < w->n_tensors; i++) {
        const tdm_st_tensor *t = w->tensors[i];
        s.params += t->numel;
        if (tdm_model_tensor_is_quantized(t->name, t->rank) && t->numel > 0) {
            s.nf4_dq += tdm_nf4_bytes(t->numel, true);
            s.nf4_plain += tdm_nf4_bytes(t->numel, false);
            s.n_quantized++;
        } else {
            s.nf4_dq += (uint64_t)t->numel * 2;
            s.nf4_plain += (uint64_t)t->numel * 2;
        }
    }
    return s;
}

static json_t *shape_json(const tdm_st_tensor *t)
{
    json_t *a = json_array();
    for (int d = 0; d < t->rank; d++)
        json_array_append_new(a, json_integer(t->shape[d]));
    return a;
}

static json_t *config_json(const tdm_model_config *c)
{
    json_t *rope = json_pack("{s:s, s:f}", "type", tdm_rope_type_name(c->rope.type), "theta",
                             c->rope.theta);
    if (c->rope.type != TDM_ROPE_DEFAULT)
        json_object_set_new(rope, "factor", json_real(c->rope.factor));
    if (c->rope.type == TDM_ROPE_LLAMA3) {
        json_object_set_new(rope, "low_freq_factor", json_real(c->rope.low_freq_factor));
        json_object_set_new(rope, "high_freq_factor", json_real(c->rope.high_freq_factor));
        json_object_set_new(rope, "original_max_position_embeddings",
                            json_integer(c->rope.original_max_position_embeddings));
    }
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:b, s:b, s:b, "
                     "s:b, s:o, s:I}",
                     "architecture", c->architecture, "model_type", c->model_type, "hidden_size",
                     (json_int_t)c->hidden_size, "intermediate_size",
                     (json_int_t)c->intermediate_size, "num_layers", (json_int_t)c->num_layers,
                     "num_heads", (json_int_t)c->num_heads, "num_kv_heads",
                     (json_int_t)c->num_kv_heads, "head_dim", (json_int_t)c->head_dim,
                     "vocab_size", (json_int_t)c->vocab_size, "max_position_embeddings",
                     (json_int_t)c->max_position_embeddings, "rms_norm_eps", c->rms_norm_eps,
                     "tie_word_embeddings", c->tie_word_embeddings, "qkv_bias", c->qkv_bias,
                     "o_bias", c->o_bias, "qk_norm", c->qk_norm, "rope", rope, "param_count",
                     (json_int_t)tdm_model_config_param_count(c));
}

static int print_json(const char *path, const tdm_model_config *cfg, const tdm_weights *w,
                      const sizes *s, size_t n_unused)
{
    json_t *files = json_array();
    for (size_t i = 0; i < w->n_files; i++)
        json_array_append_new(files, json_string(w->file_names[i]));
    json_t *tensors = json_array();
    for (size_t i = 0; i < w->n_tensors; i++) {
        const tdm_st_tensor *t = w->tensors[i];
        json_array_append_new(
            tensors, json_pack("{s:s, s:s, s:o, s:I, s:b}", "name", t->name, "dtype",
                               tdm_dtype_name(t->dtype), "shape", shape_json(t), "bytes",
                               (json_int_t)t->nbytes, "quantized",
                               tdm_model_tensor_is_quantized(t->name, t->rank)));
    }
    json_t *doc = json_pack("{s:s, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:o}", "path", path,
                            "config", cfg ? config_json(cfg) : json_null(), "files", files,
                            "parameters", (json_int_t)s->params, "data_bytes",
                            (json_int_t)tdm_weights_data_bytes(w), "nf4_bytes",
                            (json_int_t)s->nf4_dq, "nf4_bytes_no_double_quant",
                            (json_int_t)s->nf4_plain, "quantized_tensors",
                            (json_int_t)s->n_quantized, "tensors", tensors);
    if (cfg)
        json_object_set_new(doc, "unused_tensors", json_integer((json_int_t)n_unused));
    json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    fputc('\n', stdout);
    json_decref(doc);
    return TDM_EXIT_OK;
}

static void print_bytes(uint64_t b)
{
    double gib = (double)b / (1024.0 * 1024 * 1024);
    if (gib >= 1.0)
        printf("%llu bytes (%.2f GiB)", (unsigned long long)b, gib);
    else
        printf("%llu bytes (%.2f MiB)", (unsigned long long)b, (double)b / (1024.0 * 1024));
}

static int print_text(const char *path, const tdm_model_config *c, const tdm_weights *w,
                      const sizes *s, size_t n_unused)
{
    printf("path:          %s\n", path);
    if (c) {
        printf("architecture:  %s (%s)\n", c->architecture, c->model_type);
        printf("sizes:         hidden %lld, intermediate %lld, layers %lld, heads %lld, "
               "kv heads %lld, head_dim %lld, vocab %lld\n",
               (long long)c->hidden_size, (long long)c->intermediate_size,
               (long long)c->num_layers, (long long)c->num_heads, (long long)c->num_kv_heads,
               (long long)c->head_dim, (long long)c->vocab_size);
        printf("               rms_norm_eps %g, max positions %lld, tied embeddings %s, "
               "biases %s, q/k norm %s\n",
               c->rms_norm_eps, (long long)c->max_position_embeddings,
               c->tie_word_embeddings ? "yes" : "no",
               c->qkv_bias ? (c->o_bias ? "q/k/v/o" : "q/k/v") : "none",
               c->qk_norm ? "yes" : "no");
        printf("rope:          %s, theta %.15g", tdm_rope_type_name(c->rope.type), c->rope.theta);
        if (c->rope.type == TDM_ROPE_LINEAR)
            printf(", factor %g", c->rope.factor);
        if (c->rope.type == TDM_ROPE_LLAMA3)
            printf(", factor %g, low_freq_factor %g, high_freq_factor %g, original max "
                   "positions %lld",
                   c->rope.factor, c->rope.low_freq_factor, c->rope.high_freq_factor,
                   (long long)c->rope.original_max_position_embeddings);
        printf("\n");
    } else {
        printf("architecture:  (no config.json: tensors only)\n");
    }
    printf("parameters:    %lld\n", (long long)s->params);
    printf("files:         %zu, ", w->n_files);
    print_bytes(tdm_weights_data_bytes(w));
    printf(" of tensor data\n");
    printf("nf4 base:      ");
    print_bytes(s->nf4_dq);
    printf(" with double quantization, ");
    print_bytes(s->nf4_plain);
    printf(" without (%zu projections in NF4, the rest in bf16)\n", s->n_quantized);
    if (c && n_unused)
        printf("unused:        %zu tensors the config does not use\n", n_unused);
    printf("tensors:       %zu\n", w->n_tensors);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const tdm_st_tensor *t = w->tensors[i];
        char shape[160] = "[";
        for (int d = 0; d < t->rank; d++) {
            size_t len = strlen(shape);
            snprintf(shape + len, sizeof shape - len, "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        }
        strcat(shape, "]");
        printf("  %-52s %-5s %-16s%s\n", t->name, tdm_dtype_name(t->dtype), shape,
               tdm_model_tensor_is_quantized(t->name, t->rank) ? " nf4" : "");
    }
    return TDM_EXIT_OK;
}

int tdm_cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return TDM_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "inspect: unknown option '%s'", argv[i]);
        } else if (path) {
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "inspect: one PATH only");
        } else
            path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "inspect: needs PATH");
    }
    tdm_error err = {0};
    tdm_model_config cfg, *cfgp = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return tdm_cli_fail(TDM_EXIT_FAILURE, "inspect: cannot open %s: %s", path,
                            strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        char cfg_path[PATH_MAX + 16];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path);
        if (stat(cfg_path, &sb) == 0) {
            if (tdm_model_config_load(&cfg, path, &err) != TDM_OK)
                return tdm_cli_fail(TDM_EXIT_FAILURE, "inspect: %s", err.message);
            cfgp = &cfg;
        }
    }
    tdm_weights w;
    if (tdm_weights_open(&w, path, &err) != TDM_OK)
        return tdm_cli_fail(TDM_EXIT_FAILURE, "inspect: %s", err.message);
    size_t n_unused = 0;
    if (cfgp && tdm_model_check_weights(cfgp, &w, &n_unused, &err) != TDM_OK) {
        tdm_weights_close(&w);
        /* the message starts with the weights file it is about */
        return tdm_cli_fail(TDM_EXIT_FAILURE, "inspect: %s", err.message);
    }
    sizes s = measure(&w);
    int rc = json ? print_json(path, cfgp, &w, &s, n_unused)
                  : print_text(path, cfgp, &w, &s, n_unused);
    tdm_weights_close(&w);
    return rc;
}
