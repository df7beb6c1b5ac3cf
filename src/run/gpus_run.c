/* gpus_run.c — the plan of `tandem finetune --gpus` (gpus_run.h). */
#include "run/gpus_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/speed.h"
#include "gpu/inventory.h"
#include "run/device_open.h"
#include "run/finetune_run.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

void tdm_gpus_plan_free(tdm_gpus_plan *p)
{
    for (int a = 0; a < p->n_adapters; a++) {
        if (p->labels) free(p->labels[a]);
        if (p->data) free(p->data[a]);
    }
    free(p->labels);
    free(p->data);
    free(p->work);
    free(p->n_train);
    free(p->gpus);
    tdm_split_plan_free(&p->split);
    memset(p, 0, sizeof *p);
}

static void take_gpu(tdm_gpus_plan *out, const tdm_inventory *inv, const int64_t *budget_mb,
                     size_t i)
{
    tdm_gpus_gpu *g = &out->gpus[out->n_gpus++];
    snprintf(g->uuid, sizeof g->uuid, "%s", inv->gpus[i].uuid);
    snprintf(g->name, sizeof g->name, "%s", inv->gpus[i].name);
    g->index = inv->gpus[i].index;
    g->budget_mb = budget_mb[i];
    g->speed = tdm_gpu_speed_factor(inv->gpus[i].name);
}

/* "GPU-a (name), GPU-b (name)": what is there, for the messages */
static void list_gpus(const tdm_inventory *inv, char *buf, size_t cap)
{
    size_t l = 0;
    buf[0] = 0;
    for (size_t i = 0; i < inv->n_gpus && l < cap; i++)
        l += (size_t)snprintf(buf + l, cap - l, "%s%d %s (%s)", i ? ", " : "", inv->gpus[i].index,
                              inv->gpus[i].uuid, inv->gpus[i].name);
}

tdm_status tdm_gpus_parse(const char *spec, const tdm_inventory *inv, const int64_t *budget_mb,
                          tdm_gpus_plan *out, tdm_error *err)
{
    out->n_gpus = 0;
    free(out->gpus);
    out->gpus = calloc(inv->n_gpus + 1, sizeof *out->gpus);
    if (!out->gpus) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    char there[2048];
    list_gpus(inv, there, sizeof there);
    if (!spec || !*spec)
        return tdm_fail(err, TDM_ERR_INVALID, "--gpus needs all, a count or a list of GPUs");
    if (!strcmp(spec, "all")) {
        for (size_t i = 0; i < inv->n_gpus; i++)
            take_gpu(out, inv, budget_mb, i);
        return TDM_OK;
    }
    size_t len = strlen(spec);
    if (strspn(spec, "0123456789") == len) {
        long n = len <= 6 ? atol(spec) : -1;
        if (n < 1 || (size_t)n > inv->n_gpus)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "--gpus %s: this host has %zu GPU(s) tandem may use (%s); give 1..%zu, "
                            "all, or a list of UUIDs",
                            spec, inv->n_gpus, there, inv->n_gpus);
        for (size_t i = 0; i < (size_t)n; i++)
            take_gpu(out, inv, budget_mb, i);
        return TDM_OK;
    }
    char *copy = strdup(spec);
    if (!copy) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = TDM_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const tdm_gpu *g = tdm_inventory_find(inv, tok);
        if (!g) {
            st = tdm_fail(err, TDM_ERR_INVALID,
                          "--gpus: no GPU '%s' here (a UUID, a unique UUID prefix or an index of: "
                          "%s; tandem gpu status lists them)",
                          tok, there[0] ? there : "none");
            break;
        }
        size_t i = (size_t)(g - inv->gpus);
        for (int k = 0; k < out->n_gpus && st == TDM_OK; k++)
            if (!strcmp(out->gpus[k].uuid, g->uuid))
                st =
                    tdm_fail(err, TDM_ERR_INVALID, "--gpus: %s (%s) is listed twice", tok, g->uuid);
        if (st != TDM_OK) break;
        take_gpu(out, inv, budget_mb, i);
    }
    if (st == TDM_OK && !out->n_gpus)
        st = tdm_fail(err, TDM_ERR_INVALID, "--gpus '%s' names no GPU", spec);
    free(copy);
    return st;
}

typedef struct fit_ctx {
    const tdm_trainer *tr;
    const tdm_gpus_plan *plan;
    int64_t vram_mb; /* --vram GB: what every process reserves; 0: auto */
} fit_ctx;

/* A GPU's group fits when the plan its process would choose fits the GPU's budget. */
static bool group_fits(const int *adapters, int n, int gpu, void *user, int64_t *mb, tdm_error *err)
{
    const fit_ctx *c = user;
    int64_t budget = c->plan->gpus[gpu].budget_mb;
    if (c->vram_mb > 0) {
        *mb = c->vram_mb;
        return c->vram_mb <= budget;
    }
    tdm_memory_fit fit;
    if (tdm_trainer_memory_fit_subset(c->tr, adapters, n, budget, TDM_CUDA_CONTEXT_MIB, &fit,
                                      err) != TDM_OK)
        return false;
    *mb = fit.chosen.mb;
    return fit.fits;
}

tdm_status tdm_gpus_plan_make(tdm_run_opts *o, tdm_gpus_plan *out, char **bad_lines, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    *bad_lines = NULL;
    if (o->device.device && !strcmp(o->device.device, "cpu"))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "--gpus trains on GPUs: leave out --device cpu (or --gpus)");
    if (o->device.gpu_share_given && !o->device.mps.enabled)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "finetune: --gpu-share only applies with --experimental-mps");
    tdm_inventory inv;
    int64_t *budget_mb = NULL;
    TDM_TRY(tdm_device_gpu_budgets(&inv, &budget_mb, err));
    tdm_status st = tdm_gpus_parse(o->gpus, &inv, budget_mb, out, err);
    tdm_inventory_free(&inv);
    free(budget_mb);
    if (st != TDM_OK) return st;

    tdm_run_adapters l;
    tdm_trainer *tr = NULL;
    if ((st = tdm_run_adapters_load(o, &l, err)) != TDM_OK) goto out;
    int n = l.n;
    out->n_adapters = n;
    out->labels = calloc((size_t)n, sizeof *out->labels);
    out->data = calloc((size_t)n, sizeof *out->data);
    out->work = calloc((size_t)n, sizeof *out->work);
    out->n_train = calloc((size_t)n, sizeof *out->n_train);
    if (!out->labels || !out->data || !out->work || !out->n_train) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int a = 0; a < n; a++) {
        out->labels[a] = strdup(l.ads[a].label ? l.ads[a].label : l.ads[a].output);
        out->data[a] = strdup(l.ads[a].data);
        if (!out->labels[a] || !out->data[a]) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    /* the data read and checked as the children will (bad lines are reported once, here) */
    tdm_trainer_opts topts = o->trainer;
    topts.progress = NULL;
    topts.stop_requested = NULL;
    if ((st = tdm_trainer_create(&tr, &topts, l.ads, n, bad_lines, err)) != TDM_OK) goto out;
    for (int a = 0; a < n; a++) {
        out->work[a] = tdm_trainer_adapter_work(tr, a);
        tdm_trainer_adapter_info(tr, a, &out->n_train[a], NULL, NULL);
    }
    tdm_split_gpu *sg = calloc((size_t)out->n_gpus, sizeof *sg);
    if (!sg) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int g = 0; g < out->n_gpus; g++)
        sg[g] = (tdm_split_gpu){.uuid = out->gpus[g].uuid,
                                .speed = out->gpus[g].speed,
                                .budget_mb = out->gpus[g].budget_mb};
    /* --vram GB: what each process reserves (device_open's rounding) */
    fit_ctx fc = {.tr = tr, .plan = out, .vram_mb = (int64_t)ceil(o->device.vram_gib * 1024.0)};
    st = tdm_split_plan_make(out->work, n, sg, out->n_gpus, group_fits, &fc,
                             (const char *const *)out->labels, &out->split, err);
    free(sg);
out:
    tdm_trainer_free(tr);
    tdm_run_adapters_free(&l);
    return st;
}
