/* device_open.c — inventory, reservation, environment, backend: the device of a run
 * (device_open.h). The sequence moved here from `tandem finetune` unchanged; eval uses it too. */
#include "run/device_open.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/backend.h"
#include "gpu/guard.h"
#include "gpu/meminfo.h"
#include "util/cgroup.h"
#include "util/cpu_count.h"
#include "train/memory_plan.h"

static int64_t mib_up(uint64_t bytes)
{
    return (int64_t)((bytes + (1u << 20) - 1) >> 20);
}

int64_t tdm_device_reservation_mb(const tdm_model_mem *e)
{
    return tdm_memory_plan_mb(e, TDM_CUDA_CONTEXT_MIB);
}

int64_t tdm_device_cpu_need_mb(const tdm_model_mem *e)
{
    return tdm_memory_plan_mb(e, TDM_CPU_PROCESS_MIB);
}

static void note(const tdm_device_request *req, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(const tdm_device_request *req, const char *fmt, ...)
{
    if (!req->note) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    req->note(line, req->note_user);
}

/* ---- who holds the memory a waiting run needs ---------------------------------------------- */

/* The command name of pid (/proc/PID/comm), "?" when it is gone or not on this machine (a
 * simulated process of TANDEM_FAKE_GPUS). */
static void process_name(uint32_t pid, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    snprintf(buf, cap, "?");
    if (!f) return;
    if (fgets(buf, (int)cap, f)) buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

static bool pid_in_ledger(const tdm_ledger_state *s, const char *gpu_uuid, uint32_t pid)
{
    for (size_t r = 0; s && r < s->n_reservations; r++) {
        if (strcmp(s->reservations[r].gpu_uuid, gpu_uuid)) continue;
        for (int h = 0; h < s->reservations[r].n_holders; h++)
            if ((uint32_t)s->reservations[r].holders[h].pid == pid) return true;
    }
    return false;
}

/* ---- the budget a run can get ---------------------------------------------------------------- */

int64_t tdm_device_alone_mb(const tdm_gpu *gpu, const tdm_ledger_state *ledger, int64_t *outside_mb)
{
    tdm_ledger_state none;
    tdm_ledger_state_init(&none);
    tdm_guard_view v;
    tdm_guard_view_of(gpu, ledger ? ledger : &none, &v);
    /* what the ledger's holders hold: each reservation's holders as the GPU lists them, else
     * its recorded actual use (none yet: its memory is still free) */
    int64_t held = 0;
    for (size_t r = 0; ledger && r < ledger->n_reservations; r++) {
        const tdm_reservation *res = &ledger->reservations[r];
        if (strcmp(res->gpu_uuid, gpu->uuid)) continue;
        int64_t listed = 0;
        bool any = false;
        for (int h = 0; h < res->n_holders; h++) {
            int64_t mb = tdm_gpu_process_used_mb(gpu, (uint32_t)res->holders[h].pid);
            if (mb >= 0) {
                listed += mb;
                any = true;
            }
        }
        held += any ? listed : (res->actual_mb > 0 ? res->actual_mb : 0);
    }
    int64_t used = gpu->used_mb > 0 ? gpu->used_mb : 0;
    int64_t outside = used - held > 0 ? used - held : 0;
    if (outside_mb) *outside_mb = outside;
    int64_t alone = gpu->total_mb - outside;
    if (alone > v.capacity_mb) alone = v.capacity_mb;
    return alone > 0 ? alone : 0;
}

#define APPEND(...)                                                                                \
    do {                                                                                           \
        if (used < cap) used += (size_t)snprintf(buf + used, cap - used, __VA_ARGS__);             \
    } while (0)

void tdm_device_describe_wait(char *buf, size_t cap, int64_t budget_mb, double elapsed_sec,
                              const tdm_gpu *gpu, const tdm_ledger_state *ledger)
{
    size_t used = 0;
    if (!cap) return;
    buf[0] = 0;
    tdm_ledger_state none;
    tdm_ledger_state_init(&none);
    tdm_guard_view v;
    tdm_guard_view_of(gpu, ledger ? ledger : &none, &v);
    APPEND("%s %lld MiB of GPU memory on %s (%s)",
           elapsed_sec < 0.5 ? "waiting for" : "still waiting for", (long long)budget_mb, gpu->uuid,
           gpu->name);
    if (elapsed_sec >= 0.5) APPEND(" after %.0f s", elapsed_sec);
    APPEND(": %lld MiB free, %lld MiB admissible now (reservable %lld MiB, %lld MiB reserved)",
           (long long)gpu->free_mb, (long long)v.available_mb, (long long)v.capacity_mb,
           (long long)v.committed_mb);
    int n_held = 0;
    for (size_t r = 0; ledger && r < ledger->n_reservations; r++) {
        const tdm_reservation *res = &ledger->reservations[r];
        if (strcmp(res->gpu_uuid, gpu->uuid)) continue;
        APPEND("%s %s (pid %d, %s@%s) %lld MiB", n_held++ ? "," : "; held in the ledger by",
               res->task[0] ? res->task : res->id, res->n_holders ? res->holders[0].pid : 0,
               res->user, res->host,
               (long long)(res->actual_mb > res->budget_mb ? res->actual_mb : res->budget_mb));
    }
    int n_out = 0;
    for (size_t p = 0; p < gpu->n_processes; p++) {
        const tdm_gpu_process *gp = &gpu->processes[p];
        if (gp->pid == (uint32_t)getpid() || pid_in_ledger(ledger, gpu->uuid, gp->pid)) continue;
        char name[64];
        process_name(gp->pid, name, sizeof name);
        APPEND("%s pid %u %s %lld MiB", n_out++ ? "," : "; outside the ledger:", gp->pid, name,
               (long long)gp->used_mb);
    }
    if (!n_held && !n_out) APPEND("; no process holds it that tandem can see");
    /* the most the ledger admits once its own reservations end: what a run alone can get */
    int64_t outside_mb;
    int64_t alone_mb = tdm_device_alone_mb(gpu, ledger, &outside_mb);
    if (outside_mb > 0 && budget_mb > alone_mb && budget_mb <= v.capacity_mb)
        APPEND(". %lld MiB can only start when memory held outside the ledger is freed (at most "
               "%lld MiB while it is held: total %lld MiB - %lld MiB outside the ledger, "
               "reservable %lld MiB)",
               (long long)budget_mb, (long long)alone_mb, (long long)gpu->total_mb,
               (long long)outside_mb, (long long)v.capacity_mb);
}

#undef APPEND

/* The ledger's live reservations now (st initialised by the caller); false when it cannot be
 * read (no directory yet: nothing is reserved). */
static bool ledger_now(tdm_ledger_state *st)
{
    tdm_ledger ledger;
    tdm_error e = {0};
    char dir[4096];
    const char *env = getenv("TANDEM_LEDGER_DIR");
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else if (tdm_ledger_default_dir(dir, sizeof dir, &e) != TDM_OK)
        return false;
    return tdm_ledger_open(&ledger, dir, &e) == TDM_OK &&
           tdm_ledger_snapshot(&ledger, st, &e) == TDM_OK;
}

/* The wait report callback of the reservation: asks the inventory and the ledger afresh. */
static void report_wait(const tdm_wait_report *r, void *user)
{
    const tdm_device_request *req = user;
    tdm_inventory inv;
    tdm_error e = {0};
    if (tdm_inventory_query(&inv, &e) != TDM_OK) return;
    const tdm_gpu *g = tdm_inventory_find(&inv, r->gpu_uuid);
    if (!g && inv.n_gpus) g = &inv.gpus[0];
    tdm_ledger_state st;
    tdm_ledger_state_init(&st);
    bool have = ledger_now(&st);
    if (g) {
        char line[1536];
        tdm_device_describe_wait(line, sizeof line, r->needed_mb, r->elapsed_sec, g,
                                 have ? &st : NULL);
        note(req, "%s; position %d in the queue", line, r->position);
    }
    tdm_ledger_state_free(&st);
    tdm_inventory_free(&inv);
}

/* ---- open / close ---------------------------------------------------------------------------- */

tdm_status tdm_device_sim_compute(bool *on, tdm_error *err)
{
    *on = false;
    const char *v = getenv(TDM_SIM_GPU_COMPUTE_ENV);
    if (!v || !*v) return TDM_OK;
    if (strcmp(v, "cpu") != 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s='%s': the only value is 'cpu' (a test seam for simulated GPUs; unset "
                        "it for real runs)",
                        TDM_SIM_GPU_COMPUTE_ENV, v);
    if (!getenv("TANDEM_FAKE_GPUS"))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s=cpu is a test seam for simulated GPUs and needs TANDEM_FAKE_GPUS; "
                        "this run would use real GPUs: unset %s",
                        TDM_SIM_GPU_COMPUTE_ENV, TDM_SIM_GPU_COMPUTE_ENV);
    *on = true;
    return TDM_OK;
}

/* Whether a GPU is there is asked of the inventory (NVML, no CUDA context), never by creating the
 * backend, whose context alone takes hundreds of MiB the ledger would not know about yet. sim:
 * the seam above (a simulated GPU is usable in any build). */
static bool can_use_cuda(bool sim, tdm_error *why)
{
#ifndef TANDEM_HAVE_CUDA
    if (!sim) {
        snprintf(why->message, sizeof why->message, "this tandem was built without CUDA");
        return false;
    }
#endif
    tdm_inventory inv;
    bool ok = false;
    if (tdm_inventory_query(&inv, why) == TDM_OK) {
        ok = inv.n_gpus > 0;
        if (!ok)
            snprintf(why->message, sizeof why->message, "no GPU found%s%s", inv.note[0] ? ": " : "",
                     inv.note);
        tdm_inventory_free(&inv);
    }
    return ok;
}

typedef struct ranked_gpu {
    size_t pos;
    int64_t available_mb;
} ranked_gpu;

static int cmp_ranked(const void *x, const void *y)
{
    const ranked_gpu *a = x, *b = y;
    if (a->available_mb != b->available_mb) return a->available_mb > b->available_mb ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

tdm_status tdm_device_candidates_list(const tdm_device_request *req, tdm_device_candidates *out,
                                      tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->compute_dtype = "f32";
    const char *device = req->device ? req->device : "auto";
    bool sim = false;
    if (!strcmp(device, "cpu")) {
        out->cpu = true;
        return TDM_OK;
    }
    TDM_TRY(tdm_device_sim_compute(&sim, err));
    tdm_error why = {0};
    if (!can_use_cuda(sim, &why)) {
        out->cpu = strcmp(device, "cuda") != 0;
        return TDM_OK;
    }
    out->compute_dtype = sim ? "f32" : req->base_fp8 ? "fp8" : "bf16";
    tdm_inventory inv;
    TDM_TRY(tdm_inventory_query(&inv, err));
    tdm_ledger_state st;
    tdm_ledger_state_init(&st);
    bool have = ledger_now(&st);
    ranked_gpu *r = calloc(inv.n_gpus + 1, sizeof *r);
    out->uuid = calloc(inv.n_gpus + 1, sizeof *out->uuid);
    tdm_status rc = TDM_OK;
    if (!r || !out->uuid) {
        rc = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *adopted = getenv("TANDEM_RESERVATION_ID");
    size_t n = 0;
    for (size_t g = 0; g < inv.n_gpus; g++) {
        const tdm_gpu *gpu = &inv.gpus[g];
        if (adopted && *adopted) {
            /* inside `tandem gpu run`: the GPU of its reservation, nothing else */
            tdm_reservation *res = have ? tdm_ledger_state_find_reservation(&st, adopted) : NULL;
            if (!res || strcmp(res->gpu_uuid, gpu->uuid)) continue;
        }
        tdm_guard_view v;
        tdm_guard_view_of(gpu, &st, &v); /* empty when unread */
        r[n++] = (ranked_gpu){.pos = g, .available_mb = v.available_mb};
    }
    qsort(r, n, sizeof *r, cmp_ranked);
    for (size_t i = 0; i < n; i++)
        snprintf(out->uuid[i], sizeof out->uuid[i], "%s", inv.gpus[r[i].pos].uuid);
    out->n = n;
done:
    free(r);
    tdm_ledger_state_free(&st);
    tdm_inventory_free(&inv);
    if (rc != TDM_OK) tdm_device_candidates_free(out);
    return rc;
}

void tdm_device_candidates_free(tdm_device_candidates *c)
{
    free(c->uuid);
    c->uuid = NULL;
    c->n = 0;
}

tdm_status tdm_device_budget_query(const tdm_device_request *req, tdm_device_budget *out,
                                   tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->budget_mb = out->capacity_mb = -1;
    if (req->device && !strcmp(req->device, "cpu")) return TDM_OK;
    bool sim = false;
    TDM_TRY(tdm_device_sim_compute(&sim, err));
    tdm_error why = {0};
    if (!can_use_cuda(sim, &why)) {
        if (req->device && !strcmp(req->device, "cuda"))
            return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                            "--device cuda: %s (this tandem has no usable CUDA backend; use "
                            "--device cpu)",
                            why.message);
        return TDM_OK;
    }
    out->gpu = true;
    tdm_inventory inv;
    TDM_TRY(tdm_inventory_query(&inv, err));
    tdm_ledger_state st;
    tdm_ledger_state_init(&st);
    bool have = ledger_now(&st);
    const char *adopted = getenv("TANDEM_RESERVATION_ID");
    if (adopted && *adopted) {
        /* under tandem gpu run: the reservation it holds is all this run gets */
        out->adopted = true;
        for (size_t r = 0; have && r < st.n_reservations; r++) {
            const tdm_reservation *res = &st.reservations[r];
            if (strcmp(res->id, adopted)) continue;
            out->budget_mb = out->capacity_mb = res->budget_mb;
            snprintf(out->gpu_uuid, sizeof out->gpu_uuid, "%s", res->gpu_uuid);
            const tdm_gpu *g = tdm_inventory_find(&inv, res->gpu_uuid);
            snprintf(out->gpu_name, sizeof out->gpu_name, "%s", g ? g->name : "?");
        }
    } else {
        for (size_t i = 0; i < inv.n_gpus; i++) {
            const tdm_gpu *g = &inv.gpus[i];
            tdm_guard_view v;
            tdm_guard_view_of(g, &st, &v);
            int64_t outside;
            int64_t alone = tdm_device_alone_mb(g, &st, &outside);
            if (v.capacity_mb > out->capacity_mb) {
                out->capacity_mb = v.capacity_mb;
                out->capacity_total_mb = g->total_mb;
                out->reserve_factor = v.reserve_factor;
                snprintf(out->capacity_gpu, sizeof out->capacity_gpu, "%s (%s)", g->uuid, g->name);
            }
            if (alone > out->budget_mb) {
                out->budget_mb = alone;
                out->outside_mb = outside;
                snprintf(out->gpu_uuid, sizeof out->gpu_uuid, "%s", g->uuid);
                snprintf(out->gpu_name, sizeof out->gpu_name, "%s", g->name);
            }
        }
    }
    tdm_ledger_state_free(&st);
    tdm_inventory_free(&inv);
    return TDM_OK;
}

int64_t tdm_device_growable_mb(const tdm_gpu *gpu, const tdm_ledger_state *ledger,
                               const char *own_id)
{
    int64_t mb = tdm_device_alone_mb(gpu, ledger, NULL);
    for (size_t r = 0; ledger && r < ledger->n_reservations; r++) {
        const tdm_reservation *res = &ledger->reservations[r];
        if (strcmp(res->gpu_uuid, gpu->uuid) || (own_id && !strcmp(res->id, own_id))) continue;
        mb -= res->budget_mb > res->actual_mb ? res->budget_mb : res->actual_mb;
    }
    return mb > 0 ? mb : 0;
}

tdm_status tdm_device_growth_budget(const tdm_device *dev, int64_t *growable_mb,
                                    int64_t *capacity_mb, tdm_error *err)
{
    *growable_mb = *capacity_mb = -1;
    if (!dev->gpu) return TDM_OK;
    if (!dev->lease.held) { /* tandem gpu run's reservation: what it is */
        *growable_mb = dev->budget_mb;
        return TDM_OK;
    }
    tdm_inventory inv;
    TDM_TRY(tdm_inventory_query(&inv, err));
    const tdm_gpu *g = tdm_inventory_find(&inv, dev->lease.gpu_uuid);
    if (g) {
        tdm_ledger_state st;
        tdm_ledger_state_init(&st);
        bool have = ledger_now(&st);
        tdm_guard_view v;
        tdm_guard_view_of(g, &st, &v);
        *growable_mb = tdm_device_growable_mb(g, have ? &st : NULL, dev->lease.id);
        *capacity_mb = v.capacity_mb;
        tdm_ledger_state_free(&st);
    }
    tdm_inventory_free(&inv);
    return TDM_OK;
}

tdm_status tdm_device_gpu_budgets(tdm_inventory *inv, int64_t **budget_mb, tdm_error *err)
{
    memset(inv, 0, sizeof *inv);
    *budget_mb = NULL;
    bool sim = false;
    TDM_TRY(tdm_device_sim_compute(&sim, err));
    tdm_error why = {0};
    if (!can_use_cuda(sim, &why))
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "--gpus: %s (this tandem has no usable CUDA backend)", why.message);
    TDM_TRY(tdm_inventory_query(inv, err));
    *budget_mb = calloc(inv->n_gpus + 1, sizeof **budget_mb);
    if (!*budget_mb) {
        tdm_inventory_free(inv);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    tdm_ledger_state st;
    tdm_ledger_state_init(&st);
    ledger_now(&st); /* no ledger yet: nothing reserved */
    for (size_t i = 0; i < inv->n_gpus; i++)
        (*budget_mb)[i] = tdm_device_alone_mb(&inv->gpus[i], &st, NULL);
    tdm_ledger_state_free(&st);
    return TDM_OK;
}

tdm_status tdm_device_cpu_memory_limit(tdm_cpu_memory *out, tdm_error *err)
{
    const char *path = getenv("TANDEM_MEMINFO");
    if (!path || !*path) path = "/proc/meminfo";
    TDM_TRY(tdm_meminfo_read(path, &out->limit_mb, &out->avail_mb, err));
    /* a container's or a Slurm job's cgroup limit binds before the machine's memory does */
    int64_t cg_mb = (int64_t)(tdm_cgroup_memory_limit() >> 20);
    if (cg_mb > 0 && cg_mb < out->limit_mb) {
        snprintf(out->where, sizeof out->where, "this process's cgroup memory limit of %lld MiB",
                 (long long)cg_mb);
        out->limit_mb = cg_mb;
        if (out->avail_mb > cg_mb) out->avail_mb = cg_mb;
    } else {
        snprintf(out->where, sizeof out->where, "this machine's %lld MiB of memory (%s)",
                 (long long)out->limit_mb, path);
    }
    return TDM_OK;
}

void tdm_device_cpu_memory_note(const tdm_device_request *req, const tdm_cpu_memory *m,
                                const char *unknown_why, const tdm_model_mem *est)
{
    int64_t need = tdm_device_cpu_need_mb(est);
    if (!m) {
        note(req, "note: the machine's memory is unknown (%s); not checked against the %lld MiB "
                  "this run needs", unknown_why, (long long)need);
        return;
    }
    char parts[256];
    snprintf(parts, sizeof parts,
             "weights %lld + activations %lld + adapters %lld + backend scratch %lld + process %d",
             (long long)mib_up(est->weights), (long long)mib_up(est->activations),
             (long long)mib_up(est->adapters), (long long)mib_up(est->backend_scratch),
             TDM_CPU_PROCESS_MIB);
    if (need > m->avail_mb)
        note(req,
             "warning: this run needs about %lld MiB (%s), more than the %lld MiB available now "
             "of %s: it may swap or be killed for memory",
             (long long)need, parts, (long long)m->avail_mb, m->where);
    else
        note(req, "cpu memory: about %lld MiB (%s) of %lld MiB available", (long long)need, parts,
             (long long)m->avail_mb);
}

void tdm_device_cpu_memory_end_note(const tdm_device_request *req, tdm_backend *be)
{
    tdm_be_mem_info mi;
    tdm_error ignored = {0};
    struct rusage ru;
    if (tdm_be_memory(be, &mi, &ignored) != TDM_OK || getrusage(RUSAGE_SELF, &ru) != 0) return;
    note(req, "cpu memory: peak %lld MiB (backend), peak resident %lld MiB (the process)",
         (long long)mib_up(mi.peak_bytes),
         (long long)mib_up((uint64_t)ru.ru_maxrss * 1024)); /* ru_maxrss: KiB on Linux */
}

/* Reserves the plan's memory (or adopts gpu run's reservation) and points CUDA at that GPU. */
static tdm_status reserve(tdm_device *dev, const tdm_device_request *req, const tdm_model_mem *est,
                          tdm_error *err)
{
    int64_t need_mb = est ? tdm_device_reservation_mb(est) : TDM_CUDA_CONTEXT_MIB;
    if (req->vram_gib > 0) {
        need_mb = (int64_t)ceil(req->vram_gib * 1024.0);
    } else if (est) {
        note(req,
             "--vram auto: %lld MiB = weights %lld + activations %lld + adapters %lld + backend "
             "scratch %lld + CUDA context %d (MiB)",
             (long long)need_mb, (long long)mib_up(est->weights),
             (long long)mib_up(est->activations), (long long)mib_up(est->adapters),
             (long long)mib_up(est->backend_scratch), TDM_CUDA_CONTEXT_MIB);
        if (est->host_activations > 0) /* not in the reservation: host, not device, memory */
            note(req,
                 "--offload-activations: %lld MiB of layer inputs in page-locked host memory",
                 (long long)mib_up(est->host_activations));
    }
    dev->budget_mb = need_mb;
    const char *adopted = getenv("TANDEM_RESERVATION_ID");
    if (adopted && *adopted) {
        note(req, "using the reservation %s of tandem gpu run", adopted);
        return TDM_OK;
    }
    tdm_acquire_opts ao = tdm_acquire_defaults();
    ao.budget_mb = need_mb;
    ao.task = req->task ? req->task : "finetune";
    ao.wait = !req->no_wait;
    ao.timeout_sec = req->timeout_sec;
    ao.report = report_wait;
    ao.report_user = (void *)req;
    ao.report_interval_sec = req->wait_report_sec > 0 ? req->wait_report_sec : 60;
    tdm_status st = tdm_reservation_acquire(&dev->lease, &ao, err);
    if (st != TDM_OK) return st;
    tdm_reservation_release_at_exit(&dev->lease);
    /* a run lasts longer than one lease, and a quarantined ledger must see it again at once */
    tdm_error kerr = {0};
    if (tdm_lease_keeper_start(&dev->keeper, &dev->lease, &kerr) != TDM_OK)
        note(req, "warning: %s; the reservation is not renewed while this run lasts", kerr.message);
    /* CUDA is not initialised yet in this process: this makes the reserved GPU the one the
     * backend opens. */
    setenv("CUDA_VISIBLE_DEVICES", dev->lease.gpu_uuid, 1);
    note(req, "reserved %lld MiB on %s", (long long)dev->lease.budget_mb, dev->lease.gpu_uuid);
    if (req->mps.enabled) {
        char env[512];
        int len = tdm_mps_child_env(&req->mps, dev->lease.gpu_uuid, dev->lease.budget_mb, env,
                                    sizeof env);
        for (int i = 0; len > 0 && i < len; i += (int)strlen(env + i) + 1)
            putenv(strdup(env + i));
    }
    return TDM_OK;
}

/* The CPU backend's thread count, said once in a note: --threads, else OMP_NUM_THREADS when it
 * is a plain positive number, else the CPUs this process may use (util/cpu_count.h); 0 for a
 * GPU run (its backend has no threads to set). */
static int cpu_threads(const tdm_device_request *req, bool gpu)
{
    if (gpu) return 0;
    if (req->threads > 0) {
        note(req, "cpu: %d threads (--threads); %s", req->threads, tdm_cpu_gemm_mode());
        return req->threads;
    }
    const char *env = getenv("OMP_NUM_THREADS");
    char *end;
    long n = env ? strtol(env, &end, 10) : 0;
    if (env && *env && !*end && n > 0 && n <= 4096) {
        note(req, "cpu: %ld threads (OMP_NUM_THREADS; --threads N to change); %s", n,
             tdm_cpu_gemm_mode());
        return (int)n;
    }
    tdm_cpu_count c = tdm_cpu_usable();
    char quota[64] = "no cgroup CPU limit";
    if (c.quota > 0) snprintf(quota, sizeof quota, "cgroup CPU limit %d", c.quota);
    note(req,
         "cpu: %d threads (the CPUs this process may use: affinity %d, %s; --threads N "
         "to change); %s",
         c.usable, c.affinity, quota, tdm_cpu_gemm_mode());
    return c.usable;
}

tdm_status tdm_device_open(tdm_device *dev, const tdm_device_request *req, const tdm_model_mem *est,
                           tdm_error *err)
{
    memset(dev, 0, sizeof *dev);
    dev->base_fp8 = req->base_fp8;
    const char *device = req->device ? req->device : "auto";
    const char *doing = !req->task                       ? "training"
                        : !strcmp(req->task, "eval")     ? "evaluating"
                        : !strcmp(req->task, "generate") ? "generating"
                                                         : "training";
    bool sim = false;
    if (strcmp(device, "cpu")) {
        TDM_TRY(tdm_device_sim_compute(&sim, err));
        dev->run_context = tdm_run_context_for(&req->mps);
        tdm_error why = {0};
        if (!can_use_cuda(sim, &why)) {
            if (!strcmp(device, "cuda"))
                return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                                "--device cuda: %s (this tandem has no usable CUDA backend; use "
                                "--device cpu)",
                                why.message);
            note(req, "note: no CUDA backend (%s); %s on the CPU", why.message, doing);
        } else {
            dev->gpu = true;
            tdm_status st = reserve(dev, req, est, err);
            if (st != TDM_OK) return st;
            if (sim) {
                dev->simulated = true;
                note(req, "simulated GPU %s: computing on the CPU backend (%s=cpu, a test seam)",
                     dev->lease.held ? dev->lease.gpu_uuid : "(adopted)", TDM_SIM_GPU_COMPUTE_ENV);
            }
        }
    }
    tdm_backend_opts bo = {.n_threads = cpu_threads(req, dev->gpu && !dev->simulated),
                           .base_fp8 = req->base_fp8};
    if (dev->simulated) {
        tdm_status st = tdm_backend_create(&dev->be, "cpu", &bo, err);
        if (st != TDM_OK) tdm_device_close(dev);
        return st;
    }
    tdm_status st = tdm_backend_create(&dev->be, dev->gpu ? "cuda" : "cpu", &bo, err);
    if (st == TDM_OK) return TDM_OK;
    if (!dev->gpu || strcmp(device, "auto") != 0) {
        tdm_device_close(dev);
        return st;
    }
    /* --device auto: a GPU is listed but CUDA cannot use it (an old driver, a simulated
     * inventory): give the reservation back and run on the CPU. */
    note(req, "note: %s; %s on the CPU", err->message, doing);
    tdm_error rerr = {0};
    tdm_lease_keeper_stop(dev->keeper);
    dev->keeper = NULL;
    if (dev->lease.held) tdm_reservation_release(&dev->lease, &rerr);
    dev->gpu = false;
    bo.n_threads = cpu_threads(req, false);
    st = tdm_backend_create(&dev->be, "cpu", &bo, err);
    if (st != TDM_OK) tdm_device_close(dev);
    return st;
}

/* This process's memory on the GPU it uses, as NVML reports it (MiB), or -1 when no GPU lists
 * it (no NVML, a simulated inventory). The CUDA backend never shrinks during training, so at the
 * end of a run this is the run's peak. */
static int64_t process_gpu_mb(void)
{
    tdm_inventory inv;
    tdm_error e = {0};
    int64_t mb = -1;
    if (tdm_inventory_query(&inv, &e) != TDM_OK) return -1;
    for (size_t g = 0; g < inv.n_gpus && mb < 0; g++)
        mb = tdm_gpu_process_used_mb(&inv.gpus[g], (uint32_t)getpid());
    tdm_inventory_free(&inv);
    return mb;
}

void tdm_device_record_actual(tdm_device *dev, bool use_peak, int64_t *process_mb,
                              int64_t *backend_mb)
{
    if (process_mb) *process_mb = -1;
    if (backend_mb) *backend_mb = -1;
    if (!dev->gpu || !dev->be || dev->simulated) return; /* the CPU backend's use is no GPU's */
    tdm_be_mem_info mi;
    tdm_error e = {0};
    if (tdm_be_memory(dev->be, &mi, &e) != TDM_OK) return;
    int64_t be_mb = (int64_t)((use_peak ? mi.peak_bytes : mi.used_bytes) >> 20);
    int64_t proc_mb = process_gpu_mb();
    if (process_mb) *process_mb = proc_mb;
    if (backend_mb) *backend_mb = be_mb;
    int64_t actual_mb = proc_mb > 0 ? proc_mb : be_mb + TDM_CUDA_CONTEXT_MIB;
    if (dev->keeper)
        tdm_lease_keeper_update_actual(dev->keeper, actual_mb, &e);
    else if (dev->lease.held)
        tdm_reservation_update_actual(&dev->lease, actual_mb, &e);
}

const char *tdm_device_name(const tdm_device *dev)
{
    if (!dev->gpu) return "cpu";
    if (dev->lease.held) return dev->lease.gpu_uuid;
    const char *v = getenv("CUDA_VISIBLE_DEVICES"); /* gpu run set it to its reserved GPU */
    return v && *v ? v : "cuda";
}

const char *tdm_device_compute_dtype(const tdm_device *dev)
{
    return dev->gpu && !dev->simulated ? (dev->base_fp8 ? "fp8" : "bf16") : "f32";
}

tdm_status tdm_device_resize(tdm_device *dev, int64_t budget_mb, bool wait, int64_t *ticket,
                             bool *granted, tdm_wait_report *report, tdm_error *err)
{
    *granted = false;
    if (!dev->gpu || (!dev->lease.held && budget_mb <= dev->budget_mb)) {
        if (dev->gpu) dev->budget_mb = budget_mb;
        *granted = true;
        return TDM_OK;
    }
    if (!dev->lease.held)
        return tdm_fail(err, TDM_ERR_BUSY,
                        "this finetune runs in the reservation %s of tandem gpu run, which it "
                        "cannot grow by %lld MiB",
                        getenv("TANDEM_RESERVATION_ID") ? getenv("TANDEM_RESERVATION_ID") : "?",
                        (long long)(budget_mb - dev->budget_mb));
    tdm_status st = dev->keeper ? tdm_lease_keeper_resize(dev->keeper, budget_mb, wait, ticket,
                                                          granted, report, err)
                                : tdm_reservation_resize(&dev->lease, budget_mb, wait, ticket,
                                                         granted, report, err);
    if (st == TDM_OK && *granted) dev->budget_mb = budget_mb;
    return st;
}

void tdm_device_resize_cancel(tdm_device *dev, int64_t *ticket)
{
    if (*ticket && dev->keeper)
        tdm_lease_keeper_resize_cancel(dev->keeper, ticket);
    else if (*ticket && dev->lease.held)
        tdm_reservation_resize_cancel(&dev->lease, ticket);
    *ticket = 0;
}

void tdm_device_close(tdm_device *dev)
{
    tdm_backend_free(dev->be);
    dev->be = NULL;
    tdm_error e = {0};
    tdm_lease_keeper_stop(dev->keeper);
    dev->keeper = NULL;
    if (dev->lease.held) tdm_reservation_release(&dev->lease, &e);
}
