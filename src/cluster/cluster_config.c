/* cluster_config.c — cluster.yaml through libyaml's document loader, then a schema walk. */
#include "cluster/cluster_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "util/atomic_file.h"
#include "util/suggest.h"

/* Inputs above this are refused before libyaml sees them (a cluster file is a few KiB). */
#define CLUSTER_MAX_INPUT (4u << 20)

typedef struct walk {
    yaml_document_t *doc;
    const char *file;
    char *dir; /* directory of file, for relative paths ("." when none) */
    tdm_error *err;
} walk;

static tdm_status at(walk *w, const yaml_node_t *n, tdm_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tdm_status at(walk *w, const yaml_node_t *n, tdm_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tdm_fail(w->err, st, "%s:%zu:%zu: %s", w->file, n->start_mark.line + 1,
                    n->start_mark.column + 1, msg);
}

static const char *node_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a scalar";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

/* The scalar's text, NUL-terminated by libyaml; refuses non-scalars and embedded NULs. */
static tdm_status scalar(walk *w, const yaml_node_t *n, const char *what, const char **out)
{
    *out = NULL; /* set on every path: -O3 cannot tell that at() never returns TDM_OK */
    if (n->type != YAML_SCALAR_NODE)
        return at(w, n, TDM_ERR_PARSE, "%s must be a single value, not %s", what, node_kind(n));
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length)
        return at(w, n, TDM_ERR_PARSE, "%s contains a NUL character", what);
    *out = s;
    return TDM_OK;
}

static tdm_status string_field(walk *w, const yaml_node_t *n, const char *what, char **out)
{
    const char *s;
    tdm_status st = scalar(w, n, what, &s);
    if (st != TDM_OK)
        return st;
    if (!*s)
        return at(w, n, TDM_ERR_INVALID, "%s must not be empty", what);
    free(*out);
    *out = strdup(s);
    return *out ? TDM_OK : tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
}

/* A plain decimal integer in [lo, hi]; with allow_suffix, K/M/B/G/T multipliers (1000-based)
 * and a decimal fraction before them ("1.5B"). */
static tdm_status int_field(walk *w, const yaml_node_t *n, const char *what, int64_t lo,
                            int64_t hi, bool allow_suffix, int64_t *out)
{
    const char *s;
    tdm_status st = scalar(w, n, what, &s);
    if (st != TDM_OK)
        return st;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE && !allow_suffix)
        return at(w, n, TDM_ERR_PARSE, "%s must be a number, not a quoted string", what);
    const char *p = s;
    if (*p == '+')
        p++;
    if (*p < '0' || *p > '9')
        return at(w, n, TDM_ERR_PARSE, "%s must be a whole number, got '%s'", what, s);
    long double v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 1e30L)
            return at(w, n, TDM_ERR_INVALID, "%s is too large", what);
        p++;
    }
    if (allow_suffix && *p == '.' && p[1] >= '0' && p[1] <= '9') {
        long double scale = 0.1L;
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            v += (*p - '0') * scale;
    }
    if (allow_suffix && *p) {
        long double mult = 0;
        switch (*p) {
        case 'k': case 'K': mult = 1e3L; break;
        case 'm': case 'M': mult = 1e6L; break;
        case 'b': case 'B': case 'g': case 'G': mult = 1e9L; break;
        case 't': case 'T': mult = 1e12L; break;
        default: break;
        }
        if (mult == 0 || p[1])
            return at(w, n, TDM_ERR_PARSE,
                      "%s must be a number of parameters such as 350000000, 350M or 1.5B, got '%s'",
                      what, s);
        v *= mult;
        p++;
    }
    if (*p)
        return at(w, n, TDM_ERR_PARSE, "%s must be a whole number, got '%s'", what, s);
    if (v < (long double)lo || v > (long double)hi)
        return at(w, n, TDM_ERR_INVALID, "%s must be between %lld and %lld, got '%s'", what,
                  (long long)lo, (long long)hi, s);
    *out = (int64_t)v;
    return TDM_OK;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > TDM_CLUSTER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* path, or dir/path when path is relative and does not start with "~". */
static tdm_status anchor_path(walk *w, char **path)
{
    if ((*path)[0] == '/' || (*path)[0] == '~')
        return TDM_OK;
    size_t n = strlen(w->dir) + strlen(*path) + 2;
    char *p = malloc(n);
    if (!p)
        return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
    snprintf(p, n, "%s/%s", w->dir, *path);
    free(*path);
    *path = p;
    return TDM_OK;
}

static tdm_status unknown_key(walk *w, const yaml_node_t *key, const char *where,
                              const char *const *known, size_t n_known)
{
    const char *k = (const char *)key->data.scalar.value;
    const char *s = tdm_suggest(k, known, n_known);
    if (s)
        return at(w, key, TDM_ERR_PARSE, "unknown key '%s' in %s (did you mean '%s'?)", k, where,
                  s);
    return at(w, key, TDM_ERR_PARSE, "unknown key '%s' in %s", k, where);
}

/* Checks that every key of mapping m is a scalar and appears once. */
static tdm_status check_keys(walk *w, const yaml_node_t *m)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        if (!k || k->type != YAML_SCALAR_NODE)
            return at(w, k ? k : m, TDM_ERR_PARSE, "keys must be plain names");
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *k2 = yaml_document_get_node(w->doc, q->key);
            if (k2 && k2->type == YAML_SCALAR_NODE &&
                k2->data.scalar.length == k->data.scalar.length &&
                !memcmp(k2->data.scalar.value, k->data.scalar.value, k->data.scalar.length))
                return at(w, k, TDM_ERR_PARSE, "duplicate key '%s' (first at line %zu)",
                          (const char *)k->data.scalar.value, k2->start_mark.line + 1);
        }
    }
    return TDM_OK;
}

static const char *const gpu_keys[] = {"uuid", "type", "vram_mb", "memory_type", "speed"};

static tdm_status parse_gpu(walk *w, const yaml_node_t *m, tdm_cluster_gpu *g)
{
    g->line = (uint32_t)m->start_mark.line + 1;
    g->col = (uint32_t)m->start_mark.column + 1;
    if (m->type != YAML_MAPPING_NODE)
        return at(w, m, TDM_ERR_PARSE, "each entry of gpus must be a mapping (uuid, type, ...)");
    tdm_status st = check_keys(w, m);
    if (st != TDM_OK)
        return st;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *key = (const char *)k->data.scalar.value;
        if (!strcmp(key, "uuid")) {
            st = string_field(w, v, "uuid", &g->uuid);
        } else if (!strcmp(key, "type")) {
            st = string_field(w, v, "type", &g->type);
        } else if (!strcmp(key, "vram_mb")) {
            st = int_field(w, v, "vram_mb", 1, INT64_C(1) << 40, false, &g->vram_mb);
        } else if (!strcmp(key, "memory_type")) {
            const char *s;
            st = scalar(w, v, "memory_type", &s);
            if (st == TDM_OK) {
                if (!strcmp(s, "discrete"))
                    g->memory_type = TDM_MEMORY_DISCRETE;
                else if (!strcmp(s, "unified"))
                    g->memory_type = TDM_MEMORY_UNIFIED;
                else
                    st = at(w, v, TDM_ERR_INVALID,
                            "memory_type must be 'discrete' or 'unified', got '%s'", s);
            }
        } else if (!strcmp(key, "speed")) {
            const char *s;
            st = scalar(w, v, "speed", &s);
            if (st == TDM_OK) {
                char *end;
                errno = 0;
                double d = strtod(s, &end);
                if (!*s || *end || errno || !(d > 0) || d > 1000)
                    st = at(w, v, TDM_ERR_INVALID,
                            "speed must be a number above 0 (RTX 4090 = 1.0), got '%s'", s);
                else
                    g->speed = d;
            }
        } else {
            st = unknown_key(w, k, "a GPU", gpu_keys, sizeof gpu_keys / sizeof *gpu_keys);
        }
        if (st != TDM_OK)
            return st;
    }
    if (!g->uuid)
        return at(w, m, TDM_ERR_INVALID, "this GPU has no uuid (see `tandem gpu status` on it)");
    return TDM_OK;
}

static const char *const node_keys[] = {
    "name",  "host", "transport", "user",      "port",    "identity_file",  "workdir",
    "tandem", "gpus", "cpu_cores", "ram_mb", "max_adapters", "cpu_max_params", "env"};

static tdm_status parse_env(walk *w, const yaml_node_t *m, char ***env, size_t *n_env)
{
    if (m->type != YAML_MAPPING_NODE)
        return at(w, m, TDM_ERR_PARSE, "env must be a mapping of NAME: value");
    tdm_status st = check_keys(w, m);
    if (st != TDM_OK)
        return st;
    size_t count = (size_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    *env = calloc(count ? count : 1, sizeof **env);
    if (!*env)
        return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *name = (const char *)k->data.scalar.value, *value;
        bool ok = name[0] && !(name[0] >= '0' && name[0] <= '9');
        for (const char *c = name; *c && ok; c++)
            ok = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
                 (*c >= '0' && *c <= '9') || *c == '_';
        if (!ok || strlen(name) != k->data.scalar.length)
            return at(w, k, TDM_ERR_INVALID,
                      "'%s' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", name);
        st = scalar(w, v, "an env value", &value);
        if (st != TDM_OK)
            return st;
        size_t len = strlen(name) + strlen(value) + 2;
        char *kv = malloc(len);
        if (!kv)
            return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
        snprintf(kv, len, "%s=%s", name, value);
        (*env)[(*n_env)++] = kv;
    }
    return TDM_OK;
}

static tdm_status parse_node(walk *w, const yaml_node_t *m, tdm_cluster_node *n)
{
    n->line = (uint32_t)m->start_mark.line + 1;
    n->col = (uint32_t)m->start_mark.column + 1;
    n->max_adapters = TDM_CLUSTER_DEFAULT_MAX_ADAPTERS;
    n->cpu_max_params = TDM_CLUSTER_DEFAULT_CPU_MAX_PARAMS;
    if (m->type != YAML_MAPPING_NODE)
        return at(w, m, TDM_ERR_PARSE, "each entry of nodes must be a mapping (name, host, ...)");
    tdm_status st = check_keys(w, m);
    if (st != TDM_OK)
        return st;
    const yaml_node_t *k_transport = NULL, *k_host = NULL, *k_user = NULL, *k_port = NULL,
                      *k_identity = NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *key = (const char *)k->data.scalar.value;
        int64_t num;
        if (!strcmp(key, "name")) {
            st = string_field(w, v, "name", &n->name);
            if (st == TDM_OK && !valid_name(n->name))
                st = at(w, v, TDM_ERR_INVALID,
                        "node name '%s' must be 1 to %d of A-Z a-z 0-9 . _ -", n->name,
                        TDM_CLUSTER_NAME_MAX);
        } else if (!strcmp(key, "host")) {
            k_host = k;
            st = string_field(w, v, "host", &n->host);
            if (st == TDM_OK && (n->host[0] == '-' || strpbrk(n->host, " \t\r\n'\"\\")))
                st = at(w, v, TDM_ERR_INVALID,
                        "host '%s' must not start with '-' or contain spaces or quotes", n->host);
        } else if (!strcmp(key, "transport")) {
            k_transport = v;
            const char *s;
            st = scalar(w, v, "transport", &s);
            if (st == TDM_OK) {
                if (!strcmp(s, "ssh"))
                    n->transport = TDM_TRANSPORT_SSH;
                else if (!strcmp(s, "local"))
                    n->transport = TDM_TRANSPORT_LOCAL;
                else
                    st = at(w, v, TDM_ERR_INVALID, "transport must be 'ssh' or 'local', got '%s'",
                            s);
            }
        } else if (!strcmp(key, "user")) {
            k_user = k;
            st = string_field(w, v, "user", &n->user);
            if (st == TDM_OK && (n->user[0] == '-' || strpbrk(n->user, " \t\r\n'\"\\@:")))
                st = at(w, v, TDM_ERR_INVALID, "user '%s' is not a valid login name", n->user);
        } else if (!strcmp(key, "port")) {
            k_port = k;
            st = int_field(w, v, "port", 1, 65535, false, &num);
            n->port = (int)num;
        } else if (!strcmp(key, "identity_file")) {
            k_identity = k;
            st = string_field(w, v, "identity_file", &n->identity_file);
            if (st == TDM_OK)
                st = anchor_path(w, &n->identity_file);
        } else if (!strcmp(key, "workdir")) {
            st = string_field(w, v, "workdir", &n->workdir);
            if (st == TDM_OK && n->workdir[0] != '/')
                st = at(w, v, TDM_ERR_INVALID,
                        "workdir must be an absolute path on the node, got '%s'", n->workdir);
            if (st == TDM_OK && strchr(n->workdir, '\n'))
                st = at(w, v, TDM_ERR_INVALID, "workdir must not contain a newline");
        } else if (!strcmp(key, "tandem")) {
            st = string_field(w, v, "tandem", &n->tandem);
        } else if (!strcmp(key, "gpus")) {
            if (v->type != YAML_SEQUENCE_NODE) {
                st = at(w, v, TDM_ERR_PARSE, "gpus must be a list, not %s", node_kind(v));
            } else {
                size_t count = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
                n->gpus = calloc(count ? count : 1, sizeof *n->gpus);
                if (!n->gpus)
                    return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
                for (yaml_node_item_t *it = v->data.sequence.items.start;
                     it < v->data.sequence.items.top && st == TDM_OK; it++) {
                    st = parse_gpu(w, yaml_document_get_node(w->doc, *it), &n->gpus[n->n_gpus]);
                    n->n_gpus++;
                }
            }
        } else if (!strcmp(key, "cpu_cores")) {
            st = int_field(w, v, "cpu_cores", 1, 1 << 20, false, &num);
            n->cpu_cores = (int)num;
        } else if (!strcmp(key, "ram_mb")) {
            st = int_field(w, v, "ram_mb", 1, INT64_C(1) << 40, false, &n->ram_mb);
        } else if (!strcmp(key, "max_adapters")) {
            st = int_field(w, v, "max_adapters", 1, 4096, false, &num);
            n->max_adapters = (int)num;
        } else if (!strcmp(key, "cpu_max_params")) {
            st = int_field(w, v, "cpu_max_params", 0, INT64_C(1) << 50, true, &n->cpu_max_params);
        } else if (!strcmp(key, "env")) {
            if (n->env)
                st = at(w, v, TDM_ERR_PARSE, "duplicate env");
            else
                st = parse_env(w, v, &n->env, &n->n_env);
        } else {
            st = unknown_key(w, k, "a node", node_keys, sizeof node_keys / sizeof *node_keys);
        }
        if (st != TDM_OK)
            return st;
    }
    if (!n->name)
        return at(w, m, TDM_ERR_INVALID, "this node has no name");
    if (!n->workdir)
        return at(w, m, TDM_ERR_INVALID,
                  "node '%s' has no workdir (an absolute directory on the node for models, data "
                  "and job logs)",
                  n->name);
    if (n->transport == TDM_TRANSPORT_SSH && !n->host)
        return at(w, k_transport ? k_transport : m, TDM_ERR_INVALID,
                  "node '%s' uses transport ssh and needs a host (or set transport: local)",
                  n->name);
    if (n->transport == TDM_TRANSPORT_LOCAL) {
        const yaml_node_t *bad = k_host ? k_host : k_user ? k_user : k_port ? k_port : k_identity;
        if (bad)
            return at(w, bad, TDM_ERR_INVALID, "'%s' is for transport ssh; node '%s' is local",
                      (const char *)bad->data.scalar.value, n->name);
    }
    if (!n->tandem) {
        n->tandem = strdup("tandem");
        if (!n->tandem)
            return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
    }
    return TDM_OK;
}

/* ---- the slurm: block ---------------------------------------------------------------------- */

static const char *const slurm_keys[] = {
    "partition", "account",     "qos",    "time",   "gpus_per_job", "gpu_type",
    "gpu_vram_mb", "cpus_per_gpu", "mem_per_gpu", "constraint", "extra", "workdir",
    "tandem",    "env",         "device", "signal_grace", "max_adapters", "cpu_max_params",
    "array"};

/* Characters a Slurm name (partition, account, qos, GPU type, constraint) may hold: sbatch gets
 * it as one argument, and the batch script's #SBATCH line must not be able to carry more. */
static bool slurm_word(const char *s, const char *also)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.' || strchr(also, *s)))
            return false;
    return true;
}

static tdm_status slurm_word_field(walk *w, const yaml_node_t *v, const char *what,
                                   const char *also, char **out)
{
    tdm_status st = string_field(w, v, what, out);
    if (st == TDM_OK && !slurm_word(*out, also))
        st = at(w, v, TDM_ERR_INVALID,
                "%s '%s' may hold only letters, digits and _-.%s (one Slurm name)", what, *out,
                also);
    return st;
}

/* --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch(1)); digits, ':' and one '-'. */
static bool slurm_time_ok(const char *s)
{
    int colons = 0, dashes = 0, digits = 0;
    for (const char *c = s; *c; c++) {
        if (*c >= '0' && *c <= '9') digits++;
        else if (*c == ':') colons++;
        else if (*c == '-' && !colons && digits) dashes++;
        else return false;
    }
    return digits && colons <= 2 && dashes <= 1 && s[strlen(s) - 1] != ':';
}

/* Seconds of a time slurm_time_ok accepted: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS. */
static int64_t slurm_time_seconds(const char *s)
{
    int64_t f[3] = {0, 0, 0}, days = 0;
    int n = 0;
    const char *dash = strchr(s, '-');
    if (dash) days = strtoll(s, NULL, 10), s = dash + 1;
    for (const char *c = s; n < 3;) {
        f[n++] = strtoll(c, NULL, 10);
        c = strchr(c, ':');
        if (!c) break;
        c++;
    }
    if (dash) /* D-HH[:MM[:SS]] */
        return days * 86400 + f[0] * 3600 + f[1] * 60 + f[2];
    if (n == 1) return f[0] * 60;              /* MM */
    if (n == 2) return f[0] * 60 + f[1];       /* MM:SS */
    return f[0] * 3600 + f[1] * 60 + f[2];     /* HH:MM:SS */
}

static tdm_status parse_slurm(walk *w, const yaml_node_t *m, tdm_slurm_config *sl)
{
    sl->line = (uint32_t)m->start_mark.line + 1;
    sl->col = (uint32_t)m->start_mark.column + 1;
    sl->gpus_per_job = 1;
    sl->signal_grace_s = TDM_SLURM_DEFAULT_SIGNAL_GRACE_S;
    sl->max_adapters = TDM_SLURM_DEFAULT_MAX_ADAPTERS;
    sl->array = true;
    sl->cpu_max_params = TDM_CLUSTER_DEFAULT_CPU_MAX_PARAMS;
    if (m->type != YAML_MAPPING_NODE)
        return at(w, m, TDM_ERR_PARSE, "slurm must be a mapping (partition, workdir, ...)");
    tdm_status st = check_keys(w, m);
    tdm_cluster_node *sh = &sl->shared;
    bool vram_given = false;
    const yaml_node_t *time_node = NULL, *grace_node = NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start;
         st == TDM_OK && p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *key = (const char *)k->data.scalar.value, *text;
        int64_t num;
        if (!strcmp(key, "partition")) {
            st = slurm_word_field(w, v, "slurm.partition", ",", &sl->partition);
        } else if (!strcmp(key, "account")) {
            st = slurm_word_field(w, v, "slurm.account", "", &sl->account);
        } else if (!strcmp(key, "qos")) {
            st = slurm_word_field(w, v, "slurm.qos", "", &sl->qos);
        } else if (!strcmp(key, "gpu_type")) {
            st = slurm_word_field(w, v, "slurm.gpu_type", "", &sl->gpu_type);
        } else if (!strcmp(key, "constraint")) {
            st = slurm_word_field(w, v, "slurm.constraint", "&|[]*:,", &sl->constraint);
        } else if (!strcmp(key, "time")) {
            time_node = v;
            st = string_field(w, v, "slurm.time", &sl->time);
            if (st == TDM_OK && !slurm_time_ok(sl->time))
                st = at(w, v, TDM_ERR_INVALID,
                        "slurm.time '%s' is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)",
                        sl->time);
        } else if (!strcmp(key, "mem_per_gpu")) {
            st = slurm_word_field(w, v, "slurm.mem_per_gpu", "", &sl->mem_per_gpu);
            size_t len = st == TDM_OK ? strlen(sl->mem_per_gpu) : 0;
            size_t ndig = st == TDM_OK ? strspn(sl->mem_per_gpu, "0123456789") : 0;
            if (st == TDM_OK && (!ndig || (len > ndig + 1) ||
                                 (len == ndig + 1 && !strchr("KMGT", sl->mem_per_gpu[ndig]))))
                st = at(w, v, TDM_ERR_INVALID,
                        "slurm.mem_per_gpu '%s' must be a size such as 32G or 16000M",
                        sl->mem_per_gpu);
        } else if (!strcmp(key, "gpus_per_job")) {
            if ((st = int_field(w, v, "slurm.gpus_per_job", 0, 64, false, &num)) == TDM_OK)
                sl->gpus_per_job = (int)num;
        } else if (!strcmp(key, "gpu_vram_mb")) {
            vram_given = true;
            if ((st = int_field(w, v, "slurm.gpu_vram_mb", 1, INT64_C(1) << 40, false, &num)) ==
                TDM_OK)
                sl->gpu_vram_mb = num;
        } else if (!strcmp(key, "cpus_per_gpu")) {
            if ((st = int_field(w, v, "slurm.cpus_per_gpu", 1, 1 << 20, false, &num)) == TDM_OK)
                sl->cpus_per_gpu = (int)num;
        } else if (!strcmp(key, "signal_grace")) {
            grace_node = v;
            if ((st = int_field(w, v, "slurm.signal_grace", 1, 65535, false, &num)) == TDM_OK)
                sl->signal_grace_s = (int)num;
        } else if (!strcmp(key, "max_adapters")) {
            if ((st = int_field(w, v, "slurm.max_adapters", 1, 64, false, &num)) == TDM_OK)
                sl->max_adapters = (int)num;
        } else if (!strcmp(key, "cpu_max_params")) {
            st = int_field(w, v, "slurm.cpu_max_params", 1, INT64_C(1) << 50, true,
                           &sl->cpu_max_params);
        } else if (!strcmp(key, "array")) {
            if ((st = scalar(w, v, "slurm.array", &text)) == TDM_OK) {
                if (!strcmp(text, "true")) sl->array = true;
                else if (!strcmp(text, "false")) sl->array = false;
                else st = at(w, v, TDM_ERR_INVALID, "slurm.array must be true or false, not '%s'", text);
            }
        } else if (!strcmp(key, "device")) {
            if ((st = scalar(w, v, "slurm.device", &text)) == TDM_OK) {
                if (!strcmp(text, "auto")) sl->device = TDM_SLURM_DEVICE_AUTO;
                else if (!strcmp(text, "cuda")) sl->device = TDM_SLURM_DEVICE_CUDA;
                else if (!strcmp(text, "cpu")) sl->device = TDM_SLURM_DEVICE_CPU;
                else st = at(w, v, TDM_ERR_INVALID, "slurm.device must be auto, cuda or cpu, not '%s'", text);
            }
        } else if (!strcmp(key, "extra")) {
            if (v->type != YAML_SEQUENCE_NODE) {
                st = at(w, v, TDM_ERR_PARSE, "slurm.extra must be a list of sbatch options");
                continue;
            }
            size_t count = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
            sl->extra = calloc(count ? count : 1, sizeof *sl->extra);
            if (!sl->extra)
                return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 st == TDM_OK && it < v->data.sequence.items.top; it++) {
                const yaml_node_t *e = yaml_document_get_node(w->doc, *it);
                char *opt = NULL;
                st = string_field(w, e, "an entry of slurm.extra", &opt);
                if (st == TDM_OK && (strncmp(opt, "--", 2) || strpbrk(opt, "\n\r")))
                    st = at(w, e, TDM_ERR_INVALID,
                            "slurm.extra entries are sbatch long options such as --exclusive or "
                            "--nice=10, one per entry; got '%s'",
                            opt);
                if (st == TDM_OK) sl->extra[sl->n_extra++] = opt;
                else free(opt);
            }
        } else if (!strcmp(key, "workdir")) {
            st = string_field(w, v, "slurm.workdir", &sh->workdir);
            if (st == TDM_OK && (sh->workdir[0] != '/' || strpbrk(sh->workdir, "\n\r")))
                st = at(w, v, TDM_ERR_INVALID,
                        "slurm.workdir must be an absolute path that every node sees (a shared "
                        "file system), got '%s'",
                        sh->workdir);
        } else if (!strcmp(key, "tandem")) {
            st = string_field(w, v, "slurm.tandem", &sh->tandem);
        } else if (!strcmp(key, "env")) {
            st = sh->env ? at(w, v, TDM_ERR_PARSE, "duplicate env")
                         : parse_env(w, v, &sh->env, &sh->n_env);
        } else {
            st = unknown_key(w, k, "slurm", slurm_keys, sizeof slurm_keys / sizeof *slurm_keys);
        }
    }
    if (st != TDM_OK)
        return st;
    if (!sh->workdir)
        return at(w, m, TDM_ERR_INVALID,
                  "slurm needs `workdir:`, a directory every node sees at the same path");
    if (sl->gpus_per_job > 0 && !vram_given)
        return at(w, m, TDM_ERR_INVALID,
                  "slurm needs `gpu_vram_mb:` (the GPU memory one job may plan for, MiB) when "
                  "gpus_per_job is not 0");
    if (sl->gpus_per_job == 0 && sl->device == TDM_SLURM_DEVICE_CUDA)
        return at(w, m, TDM_ERR_INVALID, "slurm.device cuda needs gpus_per_job 1 or more");
    /* USR1 comes signal_grace seconds before the limit: at or past the job's start, every run
     * would checkpoint and requeue before it trained (a load alone can take that long) */
    int64_t limit = sl->time ? slurm_time_seconds(sl->time) : 0;
    if (limit > 0 && sl->signal_grace_s >= limit)
        return at(w, grace_node ? grace_node : time_node, TDM_ERR_INVALID,
                  "slurm.signal_grace %d s%s is not shorter than slurm.time '%s' (%lld s): the "
                  "checkpoint signal would come as the job starts and every run would requeue "
                  "before training; give signal_grace well under the time limit, or a longer time",
                  sl->signal_grace_s, grace_node ? "" : " (the default)", sl->time,
                  (long long)limit);
    sh->name = strdup("slurm");
    sh->transport = TDM_TRANSPORT_LOCAL;
    if (!sh->tandem) sh->tandem = strdup("tandem");
    sh->max_adapters = sl->max_adapters;
    sh->cpu_max_params = sl->cpu_max_params;
    sh->line = sl->line;
    sh->col = sl->col;
    if (!sh->name || !sh->tandem)
        return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
    return TDM_OK;
}

static const char *const top_keys[] = {"ssh_config", "nodes", "scheduler", "slurm"};

static tdm_status parse_root(walk *w, tdm_cluster_config *cfg)
{
    yaml_node_t *root = yaml_document_get_root_node(w->doc);
    if (!root)
        return tdm_fail(w->err, TDM_ERR_PARSE,
                        "%s:1:1: the file is empty; it needs a `nodes:` list (docs/cluster-yaml.md)",
                        w->file);
    if (root->type != YAML_MAPPING_NODE)
        return at(w, root, TDM_ERR_PARSE, "the top level must be a mapping with `nodes:`, not %s",
                  node_kind(root));
    tdm_status st = check_keys(w, root);
    if (st != TDM_OK)
        return st;
    const yaml_node_t *nodes = NULL, *slurm = NULL, *scheduler_node = root;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *key = (const char *)k->data.scalar.value;
        if (!strcmp(key, "ssh_config")) {
            st = string_field(w, v, "ssh_config", &cfg->ssh_config);
            if (st == TDM_OK)
                st = anchor_path(w, &cfg->ssh_config);
        } else if (!strcmp(key, "nodes")) {
            nodes = v;
        } else if (!strcmp(key, "scheduler")) {
            const char *text;
            if ((st = scalar(w, v, "scheduler", &text)) == TDM_OK) {
                scheduler_node = v;
                if (!strcmp(text, "ssh")) cfg->scheduler = TDM_SCHEDULER_SSH;
                else if (!strcmp(text, "slurm")) cfg->scheduler = TDM_SCHEDULER_SLURM;
                else st = at(w, v, TDM_ERR_INVALID, "scheduler must be ssh or slurm, not '%s'", text);
            }
        } else if (!strcmp(key, "slurm")) {
            slurm = v;
        } else {
            st = unknown_key(w, k, "the top level", top_keys, sizeof top_keys / sizeof *top_keys);
        }
        if (st != TDM_OK)
            return st;
    }
    if (cfg->scheduler == TDM_SCHEDULER_SLURM) {
        if (nodes)
            return at(w, nodes, TDM_ERR_INVALID,
                      "with scheduler: slurm, Slurm picks the nodes: remove `nodes:` (or use "
                      "scheduler: ssh)");
        if (!slurm)
            return at(w, scheduler_node, TDM_ERR_INVALID,
                      "scheduler: slurm needs a `slurm:` block (partition, workdir, ...)");
        return parse_slurm(w, slurm, &cfg->slurm);
    }
    if (slurm)
        return at(w, slurm, TDM_ERR_INVALID, "a `slurm:` block needs `scheduler: slurm`");
    if (!nodes)
        return at(w, root, TDM_ERR_INVALID, "no `nodes:` list");
    if (nodes->type != YAML_SEQUENCE_NODE)
        return at(w, nodes, TDM_ERR_PARSE, "nodes must be a list, not %s", node_kind(nodes));
    size_t count = (size_t)(nodes->data.sequence.items.top - nodes->data.sequence.items.start);
    if (count == 0)
        return at(w, nodes, TDM_ERR_INVALID, "nodes is empty; describe at least one machine");
    cfg->nodes = calloc(count, sizeof *cfg->nodes);
    if (!cfg->nodes)
        return tdm_fail(w->err, TDM_ERR_NOMEM, "out of memory");
    for (yaml_node_item_t *it = nodes->data.sequence.items.start;
         it < nodes->data.sequence.items.top; it++) {
        const yaml_node_t *m = yaml_document_get_node(w->doc, *it);
        tdm_cluster_node *n = &cfg->nodes[cfg->n_nodes++];
        st = parse_node(w, m, n);
        if (st != TDM_OK)
            return st;
        for (size_t j = 0; j + 1 < cfg->n_nodes; j++)
            if (!strcmp(cfg->nodes[j].name, n->name))
                return at(w, m, TDM_ERR_INVALID, "duplicate node name '%s' (first at line %u)",
                          n->name, cfg->nodes[j].line);
    }
    /* GPU UUIDs are unique over the whole file. */
    for (size_t a = 0; a < cfg->n_nodes; a++)
        for (size_t i = 0; i < cfg->nodes[a].n_gpus; i++)
            for (size_t b = 0; b <= a; b++)
                for (size_t j = 0; j < (b == a ? i : cfg->nodes[b].n_gpus); j++)
                    if (!strcmp(cfg->nodes[a].gpus[i].uuid, cfg->nodes[b].gpus[j].uuid))
                        return tdm_fail(w->err, TDM_ERR_INVALID,
                                        "%s:%u:%u: duplicate GPU uuid '%s' (first at line %u)",
                                        w->file, cfg->nodes[a].gpus[i].line,
                                        cfg->nodes[a].gpus[i].col, cfg->nodes[a].gpus[i].uuid,
                                        cfg->nodes[b].gpus[j].line);
    return TDM_OK;
}

tdm_status tdm_cluster_config_parse(const char *text, size_t len, const char *filename,
                                    tdm_cluster_config *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!filename)
        filename = "<input>";
    if (len > CLUSTER_MAX_INPUT)
        return tdm_fail(err, TDM_ERR_PARSE, "%s:1:1: the file is larger than %u bytes", filename,
                        CLUSTER_MAX_INPUT);
    if (memchr(text, '\0', len)) {
        size_t off = (size_t)((const char *)memchr(text, '\0', len) - text);
        size_t line = 1, col = 1;
        for (size_t i = 0; i < off; i++, col++)
            if (text[i] == '\n')
                line++, col = 0;
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%zu:%zu: NUL byte in the file", filename, line,
                        col);
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        const yaml_mark_t *mk = &parser.problem_mark;
        tdm_status st;
        if (parser.error == YAML_MEMORY_ERROR)
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        else if (parser.context)
            st = tdm_fail(err, TDM_ERR_PARSE, "%s:%zu:%zu: %s (%s at line %zu)", filename,
                          mk->line + 1, mk->column + 1,
                          parser.problem ? parser.problem : "YAML syntax error", parser.context,
                          parser.context_mark.line + 1);
        else
            st = tdm_fail(err, TDM_ERR_PARSE, "%s:%zu:%zu: %s", filename, mk->line + 1,
                          mk->column + 1, parser.problem ? parser.problem : "YAML syntax error");
        yaml_parser_delete(&parser);
        return st;
    }
    /* One document only: a second one is most likely a mistake. */
    yaml_event_t ev;
    bool extra = false;
    yaml_mark_t extra_mark = {0};
    if (yaml_document_get_root_node(&doc)) {
        if (yaml_parser_parse(&parser, &ev)) {
            if (ev.type == YAML_DOCUMENT_START_EVENT) {
                extra = true;
                extra_mark = ev.start_mark;
            }
            yaml_event_delete(&ev);
        }
    }
    yaml_parser_delete(&parser);
    if (extra) {
        yaml_document_delete(&doc);
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s:%zu:%zu: a second YAML document; cluster.yaml holds one", filename,
                        extra_mark.line + 1, extra_mark.column + 1);
    }

    walk w = {.doc = &doc, .file = filename, .err = err};
    const char *slash = strrchr(filename, '/');
    w.dir = slash ? strndup(filename, (size_t)(slash - filename) + (slash == filename))
                  : strdup(".");
    out->file = strdup(filename);
    tdm_status st = (!w.dir || !out->file) ? tdm_fail(err, TDM_ERR_NOMEM, "out of memory")
                                           : parse_root(&w, out);
    free(w.dir);
    yaml_document_delete(&doc);
    if (st != TDM_OK)
        tdm_cluster_config_free(out);
    return st;
}

tdm_status tdm_cluster_config_load(const char *path, tdm_cluster_config *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st != TDM_OK) {
        if (st == TDM_ERR_NOT_FOUND || errno == ENOENT)
            return tdm_fail(err, TDM_ERR_NOT_FOUND,
                            "%s: no such file; describe your machines there (docs/cluster-yaml.md) "
                            "or pass --cluster FILE",
                            path);
        return st;
    }
    st = tdm_cluster_config_parse(text, len, path, out, err);
    free(text);
    return st;
}

bool tdm_cluster_config_default_path(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CONFIG_HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/tandem/cluster.yaml", xdg);
    else if (getenv("HOME"))
        n = snprintf(buf, size, "%s/.config/tandem/cluster.yaml", getenv("HOME"));
    else
        return false;
    return n > 0 && (size_t)n < size;
}

const tdm_cluster_node *tdm_cluster_config_find(const tdm_cluster_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_nodes; i++)
        if (!strcmp(cfg->nodes[i].name, name))
            return &cfg->nodes[i];
    return NULL;
}

void tdm_cluster_node_free(tdm_cluster_node *n)
{
    free(n->name);
    free(n->host);
    free(n->user);
    free(n->identity_file);
    free(n->workdir);
    free(n->tandem);
    for (size_t g = 0; g < n->n_gpus; g++) {
        free(n->gpus[g].uuid);
        free(n->gpus[g].type);
    }
    free(n->gpus);
    for (size_t e = 0; e < n->n_env; e++)
        free(n->env[e]);
    free(n->env);
    memset(n, 0, sizeof *n);
}

void tdm_cluster_config_free(tdm_cluster_config *cfg)
{
    for (size_t i = 0; i < cfg->n_nodes; i++)
        tdm_cluster_node_free(&cfg->nodes[i]);
    free(cfg->nodes);
    tdm_slurm_config *sl = &cfg->slurm;
    free(sl->partition);
    free(sl->account);
    free(sl->qos);
    free(sl->time);
    free(sl->gpu_type);
    free(sl->mem_per_gpu);
    free(sl->constraint);
    for (size_t e = 0; e < sl->n_extra; e++)
        free(sl->extra[e]);
    free(sl->extra);
    tdm_cluster_node_free(&sl->shared);
    free(cfg->file);
    free(cfg->ssh_config);
    memset(cfg, 0, sizeof *cfg);
}

const char *tdm_transport_kind_str(tdm_transport_kind kind)
{
    return kind == TDM_TRANSPORT_LOCAL ? "local" : "ssh";
}
