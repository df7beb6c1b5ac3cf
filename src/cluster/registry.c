/* registry.c — job records as JSON files. */
#include "cluster/registry.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/atomic_file.h"
#include "util/json_file.h"
#include "util/mkdir_p.h"

tdm_status tdm_registry_dir(char *buf, size_t size, tdm_error *err)
{
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/tandem/jobs", xdg);
    else if (home && *home)
        n = snprintf(buf, size, "%s/.local/state/tandem/jobs", home);
    else
        return tdm_fail(err, TDM_ERR_INVALID, "set XDG_STATE_HOME or HOME for the job registry");
    if (n < 0 || (size_t)n >= size)
        return tdm_fail(err, TDM_ERR_INVALID, "job registry path too long");
    return tdm_mkdir_p(buf, 0700, err);
}

static bool valid_id(const char *id)
{
    if (!id || !*id || strlen(id) > 200 || id[0] == '.')
        return false;
    for (const char *c = id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '.' || *c == '_' || *c == '-'))
            return false;
    return true;
}

tdm_status tdm_registry_save(const char *dir, json_t *job, tdm_error *err)
{
    const char *id = json_string_value(json_object_get(job, "id"));
    if (!valid_id(id))
        return tdm_fail(err, TDM_ERR_INVALID, "job record without a valid id");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.json", dir, id) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "job registry path too long");
    return tdm_atomic_write_json(path, job, JSON_INDENT(2) | JSON_PRESERVE_ORDER, false, 0600, err);
}

static int by_submitted(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *sx = json_string_value(json_object_get(x, "submitted"));
    const char *sy = json_string_value(json_object_get(y, "submitted"));
    int c = strcmp(sx ? sx : "", sy ? sy : "");
    if (c)
        return c;
    const char *ix = json_string_value(json_object_get(x, "id"));
    const char *iy = json_string_value(json_object_get(y, "id"));
    return strcmp(ix ? ix : "", iy ? iy : "");
}

tdm_status tdm_registry_load(const char *dir, json_t **jobs, tdm_error *err)
{
    *jobs = NULL;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *jobs = json_array();
            return *jobs ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        }
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "%s", dir);
    }
    json_t **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len < 6 || strcmp(de->d_name + len - 5, ".json"))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        json_error_t je;
        json_t *job = json_load_file(path, 0, &je);
        if (!job || !json_is_object(job) || !valid_id(json_string_value(json_object_get(job, "id")))) {
            tdm_warn("%s: not a job record (%s), skipped", path, job ? "no id" : je.text);
            json_decref(job);
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            json_t **grown = realloc(v, cap * sizeof *v);
            if (!grown) {
                json_decref(job);
                break;
            }
            v = grown;
        }
        v[n++] = job;
    }
    closedir(d);
    if (n)
        qsort(v, n, sizeof *v, by_submitted);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
    if (!arr)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    *jobs = arr;
    return TDM_OK;
}

void tdm_registry_new_id(const char *prefix, char *buf, size_t size)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    unsigned char r[3] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
        unsigned x = (unsigned)getpid() ^ (unsigned)now ^ (unsigned)clock();
        r[0] = (unsigned char)x, r[1] = (unsigned char)(x >> 8), r[2] = (unsigned char)(x >> 16);
    }
    if (fd >= 0)
        close(fd);
    snprintf(buf, size, "%s%s%s-%02x%02x%02x", stamp, prefix ? "-" : "", prefix ? prefix : "",
             r[0], r[1], r[2]);
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

json_t *tdm_node_to_json(const tdm_cluster_node *n, const char *ssh_config)
{
    json_t *env = json_object();
    for (size_t i = 0; i < n->n_env; i++) {
        const char *eq = strchr(n->env[i], '=');
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - n->env[i]), n->env[i]);
        json_object_set_new(env, name, json_string(eq + 1));
    }
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(n->name));
    json_object_set_new(o, "transport", json_string(tdm_transport_kind_str(n->transport)));
    json_object_set_new(o, "host", str_or_null(n->host));
    json_object_set_new(o, "user", str_or_null(n->user));
    json_object_set_new(o, "port", n->port ? json_integer(n->port) : json_null());
    json_object_set_new(o, "identity_file", str_or_null(n->identity_file));
    json_object_set_new(o, "workdir", json_string(n->workdir));
    json_object_set_new(o, "tandem", json_string(n->tandem));
    json_object_set_new(o, "env", env);
    json_object_set_new(o, "ssh_config", str_or_null(ssh_config));
    return o;
}

static char *dup_field(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? strdup(s) : NULL;
}

tdm_status tdm_node_from_json(json_t *o, tdm_cluster_node *n, char **ssh_config, tdm_error *err)
{
    memset(n, 0, sizeof *n);
    *ssh_config = NULL;
    if (!json_is_object(o))
        return tdm_fail(err, TDM_ERR_CORRUPT, "job record: no node");
    n->name = dup_field(o, "name");
    const char *tr = json_string_value(json_object_get(o, "transport"));
    n->transport = tr && !strcmp(tr, "local") ? TDM_TRANSPORT_LOCAL : TDM_TRANSPORT_SSH;
    n->host = dup_field(o, "host");
    n->user = dup_field(o, "user");
    n->port = (int)json_integer_value(json_object_get(o, "port"));
    n->identity_file = dup_field(o, "identity_file");
    n->workdir = dup_field(o, "workdir");
    n->tandem = dup_field(o, "tandem");
    n->max_adapters = 1;
    *ssh_config = dup_field(o, "ssh_config");
    json_t *env = json_object_get(o, "env");
    size_t count = json_object_size(env);
    n->env = calloc(count ? count : 1, sizeof *n->env);
    const char *k;
    json_t *v;
    json_object_foreach(env, k, v)
    {
        const char *s = json_string_value(v);
        if (!s || !n->env)
            continue;
        size_t len = strlen(k) + strlen(s) + 2;
        char *kv = malloc(len);
        if (kv) {
            snprintf(kv, len, "%s=%s", k, s);
            n->env[n->n_env++] = kv;
        }
    }
    if (!n->name || !n->workdir || !n->tandem || !n->env ||
        (n->transport == TDM_TRANSPORT_SSH && !n->host)) {
        tdm_cluster_node_free(n);
        free(*ssh_config);
        *ssh_config = NULL;
        return tdm_fail(err, TDM_ERR_CORRUPT, "job record: incomplete node");
    }
    return TDM_OK;
}
