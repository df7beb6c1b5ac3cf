#include "obs/trace.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "obs/clock.h"
#include "util/atomic_file.h"
#include "util/json_file.h"

#ifdef TANDEM_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

typedef struct trace_event {
    char name[64];
    char cat[32];
    int64_t ts_ns;  /* CLOCK_MONOTONIC */
    int64_t dur_ns; /* >= 0 */
    int32_t tid;
    json_t *args; /* owned; NULL for none */
} trace_event;

typedef struct open_span {
    bool used;
    char name[64];
    char cat[32];
    int64_t start_ns;
    int32_t tid;
} open_span;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint32_t session;  /* 0: closed; else the id of the open trace */
static uint32_t last_session;     /* guarded by mu */
static char *trace_path;          /* guarded by mu */
static char process_label[128];   /* guarded by mu; "" for none */
static trace_event *events;       /* (cap) guarded by mu */
static size_t n_events, cap_events, dropped;
static open_span open_spans[TDM_TRACE_MAX_OPEN];

/* gettid() is a system call (microseconds under some sandboxes), so each thread caches its id.
 * A forked child inherits the cache of the forking thread; the fork generation bumped by the
 * pthread_atfork child handler tells it to ask again. */
static _Atomic uint32_t fork_generation = 1;
static _Thread_local uint32_t tid_generation;
static _Thread_local int32_t tid_cached;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void after_fork_in_child(void)
{
    atomic_fetch_add(&fork_generation, 1);
}

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static int32_t current_tid(void)
{
    uint32_t gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    if (tid_generation != gen) {
        tid_cached = (int32_t)gettid();
        tid_generation = gen;
    }
    return tid_cached;
}

/* --- NVTX --------------------------------------------------------------------------------- */

#ifdef TANDEM_HAVE_CUDA
/* NVTX's own loader decides whether a tool is attached (NVTX_INJECTION64_PATH, a static injection);
 * without one every call below is a load of a null function pointer and a return. */
static pthread_once_t nvtx_once = PTHREAD_ONCE_INIT;
static nvtxDomainHandle_t nvtx_domain;

static void nvtx_init(void)
{
    nvtx_domain = nvtxDomainCreateA("tandem");
}

static void nvtx_begin(tdm_trace_span *s)
{
    pthread_once(&nvtx_once, nvtx_init);
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = s->name;
    s->nvtx_id = nvtxDomainRangeStartEx(nvtx_domain, &a);
    s->nvtx = true;
}

static void nvtx_end(tdm_trace_span *s)
{
    if (s->nvtx)
        nvtxDomainRangeEnd(nvtx_domain, s->nvtx_id);
    s->nvtx = false;
}
#else
static void nvtx_begin(tdm_trace_span *s)
{
    (void)s;
}

static void nvtx_end(tdm_trace_span *s)
{
    (void)s;
}
#endif

/* --- open / close ------------------------------------------------------------------------- */

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

static tdm_status check_dir_writable(const char *path, tdm_error *err)
{
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return tdm_fail(err, TDM_ERR_INVALID, "trace path too long: %s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot write trace %s: directory %s", path,
                              dir);
    if (!S_ISDIR(st.st_mode))
        return tdm_fail(err, TDM_ERR_IO, "cannot write trace %s: %s is not a directory", path, dir);
    if (access(dir, W_OK) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot write trace %s: directory %s", path,
                              dir);
    return TDM_OK;
}

tdm_status tdm_trace_open(const char *path, tdm_error *err)
{
    if (!path || !*path)
        return tdm_fail(err, TDM_ERR_INVALID, "trace path is empty");
    tdm_status st = check_dir_writable(path, err);
    if (st != TDM_OK)
        return st;
    pthread_mutex_lock(&mu);
    if (atomic_load(&session) != 0) {
        pthread_mutex_unlock(&mu);
        return tdm_fail(err, TDM_ERR_INVALID, "a trace is already open (%s)", trace_path);
    }
    trace_path = strdup(path);
    cap_events = 1024;
    events = malloc(cap_events * sizeof *events);
    if (!trace_path || !events) {
        free(trace_path);
        free(events);
        trace_path = NULL;
        events = NULL;
        pthread_mutex_unlock(&mu);
        return tdm_fail(err, TDM_ERR_NOMEM, "cannot allocate the trace buffer");
    }
    n_events = 0;
    dropped = 0;
    process_label[0] = '\0';
    memset(open_spans, 0, sizeof open_spans);
    pthread_once(&atfork_once, register_atfork);
    if (++last_session == 0)
        last_session = 1;
    atomic_store(&session, last_session);
    pthread_mutex_unlock(&mu);
    return TDM_OK;
}

void tdm_trace_set_label(const char *label)
{
    pthread_mutex_lock(&mu);
    if (atomic_load(&session) != 0)
        copy_str(process_label, sizeof process_label, label);
    pthread_mutex_unlock(&mu);
}

bool tdm_trace_active(void)
{
    return atomic_load_explicit(&session, memory_order_relaxed) != 0;
}

/* Appends one event; takes ownership of args. Caller holds mu. */
static void push_event(const char *name, const char *cat, int64_t ts_ns, int64_t dur_ns,
                       int32_t tid, json_t *args)
{
    if (n_events == cap_events) {
        size_t cap = cap_events * 2;
        if (cap > TDM_TRACE_MAX_EVENTS)
            cap = TDM_TRACE_MAX_EVENTS;
        trace_event *grown = cap > cap_events ? realloc(events, cap * sizeof *events) : NULL;
        if (!grown) {
            dropped++;
            json_decref(args);
            return;
        }
        events = grown;
        cap_events = cap;
    }
    trace_event *e = &events[n_events++];
    copy_str(e->name, sizeof e->name, name);
    copy_str(e->cat, sizeof e->cat, cat);
    e->ts_ns = ts_ns;
    e->dur_ns = dur_ns < 0 ? 0 : dur_ns;
    e->tid = tid;
    e->args = args;
}

/* Parents first: earlier start, then longer duration. */
static int event_cmp(const void *a, const void *b)
{
    const trace_event *x = a, *y = b;
    if (x->ts_ns != y->ts_ns)
        return x->ts_ns < y->ts_ns ? -1 : 1;
    if (x->dur_ns != y->dur_ns)
        return x->dur_ns > y->dur_ns ? -1 : 1;
    return 0;
}

static json_t *event_json(const trace_event *e, int pid)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "name", e->name, "cat", e->cat,
                          "ph", "X", "ts", e->ts_ns / 1000.0, "dur", e->dur_ns / 1000.0, "pid",
                          pid, "tid", (int)e->tid);
    if (o && e->args && json_object_set(o, "args", e->args) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *build_document(int pid)
{
    char pname[160];
    snprintf(pname, sizeof pname, "tandem%s%s", process_label[0] ? ": " : "", process_label);
    json_t *list = json_array();
    json_t *meta = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                             "pid", pid, "tid", pid, "args", "name", pname);
    if (!meta) /* a label that is not valid UTF-8 */
        meta = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                         "pid", pid, "tid", pid, "args", "name", "tandem");
    if (!list || !meta || json_array_append_new(list, meta) != 0) {
        json_decref(list);
        return NULL;
    }
    for (size_t i = 0; i < n_events; i++) {
        json_t *e = event_json(&events[i], pid);
        if (!e || json_array_append_new(list, e) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return json_pack("{s:o, s:s, s:{s:s, s:s, s:s, s:I}}", "traceEvents", list, "displayTimeUnit",
                     "ms", "otherData", "tool", "tandem", "version", TANDEM_VERSION, "clock",
                     "CLOCK_MONOTONIC", "dropped_events", (json_int_t)dropped);
}

tdm_status tdm_trace_close(tdm_error *err)
{
    pthread_mutex_lock(&mu);
    if (atomic_load(&session) == 0) {
        pthread_mutex_unlock(&mu);
        return TDM_OK;
    }
    atomic_store(&session, 0); /* spans ended from now on are not recorded */
    int64_t now = tdm_obs_now_ns();
    for (int i = 0; i < TDM_TRACE_MAX_OPEN; i++) {
        open_span *o = &open_spans[i];
        if (!o->used)
            continue;
        push_event(o->name, o->cat, o->start_ns, now - o->start_ns, o->tid,
                   json_pack("{s:b}", "unfinished", 1));
        o->used = false;
    }
    qsort(events, n_events, sizeof *events, event_cmp);

    tdm_status st = TDM_OK;
    json_t *doc = build_document((int)getpid());
    /* ts and dur are whole ns / 1000: 16 significant digits print them exactly (no 1e-14 noise)
     * while CLOCK_MONOTONIC stays below 1e15 ns (11 days of uptime), and to within 1 ns after. */
    st = tdm_atomic_write_json(trace_path, doc, JSON_COMPACT | JSON_REAL_PRECISION(16), false, 0644,
                               err);
    if (st == TDM_OK && dropped > 0)
        tdm_warn("trace %s: %zu events dropped (the cap is %d events)", trace_path, dropped,
                 TDM_TRACE_MAX_EVENTS);
    json_decref(doc);
    for (size_t i = 0; i < n_events; i++)
        json_decref(events[i].args);
    free(events);
    free(trace_path);
    events = NULL;
    trace_path = NULL;
    n_events = cap_events = dropped = 0;
    pthread_mutex_unlock(&mu);
    return st;
}

/* --- spans -------------------------------------------------------------------------------- */

tdm_trace_span tdm_trace_span_begin_at(const char *name, const char *cat, int64_t start_ns)
{
    tdm_trace_span s = {.slot = -1, .name = name, .cat = cat};
    nvtx_begin(&s);
    uint32_t id = atomic_load_explicit(&session, memory_order_relaxed);
    if (id == 0)
        return s;
    s.start_ns = start_ns;
    int32_t tid = current_tid();
    pthread_mutex_lock(&mu);
    if (atomic_load(&session) == id) {
        s.session = id;
        for (int i = 0; i < TDM_TRACE_MAX_OPEN; i++) {
            open_span *o = &open_spans[i];
            if (o->used)
                continue;
            o->used = true;
            copy_str(o->name, sizeof o->name, name);
            copy_str(o->cat, sizeof o->cat, cat);
            o->start_ns = start_ns;
            o->tid = tid;
            s.slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return s;
}

tdm_trace_span tdm_trace_span_begin(const char *name, const char *cat)
{
    if (!tdm_trace_active())
        return tdm_trace_span_begin_at(name, cat, 0);
    return tdm_trace_span_begin_at(name, cat, tdm_obs_now_ns());
}

static json_t *args_json(size_t n_args, const tdm_trace_arg *args)
{
    if (n_args == 0)
        return NULL;
    json_t *o = json_object();
    for (size_t i = 0; o && i < n_args; i++) {
        const tdm_trace_arg *a = &args[i];
        if (!a->key)
            continue;
        json_t *v = a->kind == TDM_TRACE_ARG_INT ? json_integer((json_int_t)a->num)
                    : a->str                     ? json_string(a->str)
                                                 : json_null();
        if (!v) /* not valid UTF-8: keep the span, mark the value */
            v = json_string("(invalid UTF-8)");
        json_object_set_new(o, a->key, v);
    }
    return o;
}

void tdm_trace_span_end_at(tdm_trace_span *span, int64_t end_ns, size_t n_args,
                           const tdm_trace_arg *args)
{
    nvtx_end(span);
    uint32_t id = span->session;
    span->session = 0;
    if (id == 0 || atomic_load_explicit(&session, memory_order_relaxed) != id)
        return;
    json_t *a = args_json(n_args, args);
    int32_t tid = span->slot >= 0 ? 0 : current_tid();
    pthread_mutex_lock(&mu);
    if (atomic_load(&session) == id) {
        if (span->slot >= 0) {
            open_spans[span->slot].used = false;
            tid = open_spans[span->slot].tid;
        }
        push_event(span->name, span->cat, span->start_ns, end_ns - span->start_ns, tid, a);
        a = NULL;
    }
    pthread_mutex_unlock(&mu);
    json_decref(a);
    span->slot = -1;
}

void tdm_trace_span_end(tdm_trace_span *span, size_t n_args, const tdm_trace_arg *args)
{
    if (span->session == 0 || !tdm_trace_active()) {
        tdm_trace_span_end_at(span, 0, 0, NULL);
        return;
    }
    tdm_trace_span_end_at(span, tdm_obs_now_ns(), n_args, args);
}
