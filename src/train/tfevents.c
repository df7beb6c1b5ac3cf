#include "train/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/append_file.h"
#include "util/crc32c.h"
#include "util/mkdir_p.h"

uint32_t tdm_tfrecord_masked_crc(const void *data, size_t n)
{
    uint32_t c = tdm_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

size_t tdm_tfrecord_frame(const void *data, size_t n, unsigned char *out)
{
    put_le(out, (uint64_t)n, 8);
    put_le(out + 8, tdm_tfrecord_masked_crc(out, 8), 4);
    memcpy(out + 12, data, n);
    put_le(out + 12 + n, tdm_tfrecord_masked_crc(data, n), 4);
    return n + 16;
}

/* A protobuf message being encoded into a fixed buffer; ok turns false on overflow. */
typedef struct pb {
    unsigned char b[2048]; /* tandem's events are a few hundred bytes */
    size_t n;
    bool ok;
} pb;

static void pb_bytes(pb *m, const void *p, size_t n)
{
    if (!m->ok || n > sizeof m->b - m->n) {
        m->ok = false;
        return;
    }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void pb_varint(pb *m, uint64_t v)
{
    unsigned char t[10];
    int k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    pb_bytes(m, t, (size_t)k);
}

/* field number f, wire type w: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void pb_key(pb *m, unsigned f, unsigned w)
{
    pb_varint(m, (uint64_t)(f << 3 | w));
}

static void pb_len_delim(pb *m, unsigned f, const void *p, size_t n)
{
    pb_key(m, f, 2);
    pb_varint(m, n);
    pb_bytes(m, p, n);
}

static void pb_double(pb *m, unsigned f, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    unsigned char t[8];
    put_le(t, u, 8);
    pb_key(m, f, 1);
    pb_bytes(m, t, 8);
}

static void pb_float(pb *m, unsigned f, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    unsigned char t[4];
    put_le(t, u, 4);
    pb_key(m, f, 5);
    pb_bytes(m, t, 4);
}

/* Event header: wall_time (1) and step (2). */
static void event_head(pb *e, double wall_time, int64_t step)
{
    e->n = 0;
    e->ok = true;
    pb_double(e, 1, wall_time);
    pb_key(e, 2, 0);
    pb_varint(e, (uint64_t)step);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Appends the framed event e to frames (cap bytes, *len used). */
static bool add_frame(unsigned char *frames, size_t cap, size_t *len, const pb *e)
{
    if (!e->ok || e->n + 16 > cap - *len) return false;
    *len += tdm_tfrecord_frame(e->b, e->n, frames + *len);
    return true;
}

tdm_status tdm_tfevents_remove(const char *out_dir, tdm_error *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", out_dir, TDM_TFEVENTS_DIR);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return TDM_OK;
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open %s", dir);
    }
    tdm_status st = TDM_OK;
    struct dirent *de;
    while (st == TDM_OK && (de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, TDM_TFEVENTS_PREFIX, strlen(TDM_TFEVENTS_PREFIX)) != 0) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p) != 0 && errno != ENOENT)
            st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot remove %s", p);
    }
    closedir(d);
    return st;
}

tdm_status tdm_tfevents_open(tdm_tfevents *w, const char *out_dir, int64_t start_step,
                             tdm_error *err)
{
    w->path[0] = '\0';
    char dir[3584]; /* leaves room in path for the name */
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s", out_dir, TDM_TFEVENTS_DIR) >= sizeof dir)
        return tdm_fail(err, TDM_ERR_INVALID, "%s: path too long", out_dir);
    TDM_TRY(tdm_mkdir_p(dir, 0755, err));
    char host[256];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long secs = (long long)time(NULL);
    char path[4096];
    int fd = -1;
    for (int k = 0; k < 1000 && fd < 0; k++) {
        if (k == 0)
            snprintf(path, sizeof path, "%s/%s%lld.%s", dir, TDM_TFEVENTS_PREFIX, secs, host);
        else
            snprintf(path, sizeof path, "%s/%s%lld.%s.%d", dir, TDM_TFEVENTS_PREFIX, secs, host, k);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST)
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create %s", path);
    }
    if (fd < 0) return tdm_fail(err, TDM_ERR_IO, "cannot create an event file in %s", dir);
    close(fd);
    /* both opening records in one append */
    static const char version[] = TDM_TFEVENTS_VERSION;
    unsigned char frames[512];
    size_t len = 0;
    pb e;
    double wt = now_s();
    event_head(&e, wt, 0);
    pb_len_delim(&e, 3, version, strlen(version));
    add_frame(frames, sizeof frames, &len, &e);
    event_head(&e, wt, start_step);
    pb slog = {.ok = true};
    pb_key(&slog, 1, 0);
    pb_varint(&slog, 1); /* SessionLog.START */
    pb_len_delim(&e, 7, slog.b, slog.n); /* Event.session_log (6: deprecated log_message) */
    add_frame(frames, sizeof frames, &len, &e);
    tdm_status st = tdm_append_whole(path, frames, len, "tfevents", err);
    if (st != TDM_OK) {
        unlink(path);
        return st;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    return TDM_OK;
}

tdm_status tdm_tfevents_write(const tdm_tfevents *w, int64_t step, double wall_time,
                              const tdm_tfevents_value *values, int n, tdm_error *err)
{
    if (!w->path[0]) return tdm_fail(err, TDM_ERR_INVALID, "event file not open");
    pb summary, val, e;
    summary.n = 0;
    summary.ok = true;
    int written = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(values[i].value)) continue;
        size_t tl = strlen(values[i].tag);
        if (tl > 255) return tdm_fail(err, TDM_ERR_INVALID, "tag too long: %s", values[i].tag);
        val.n = 0;
        val.ok = true;
        pb_len_delim(&val, 1, values[i].tag, tl);
        pb_float(&val, 2, (float)values[i].value);
        pb_len_delim(&summary, 1, val.b, val.n);
        written++;
    }
    if (written == 0) return TDM_OK;
    event_head(&e, wall_time, step);
    pb_len_delim(&e, 5, summary.b, summary.n);
    if (!e.ok || !summary.ok) return tdm_fail(err, TDM_ERR_INVALID, "event too large");
    unsigned char *frame = malloc(e.n + 16);
    if (!frame) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    size_t len = tdm_tfrecord_frame(e.b, e.n, frame);
    tdm_status st = tdm_append_whole(w->path, frame, len, "tfevents", err);
    free(frame);
    return st;
}
