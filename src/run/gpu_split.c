/* gpu_split.c — LPT split of a run's adapters over the GPUs of a host (gpu_split.h). */
#include "run/gpu_split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tdm_split_plan_free(tdm_split_plan *p)
{
    free(p->gpu_of);
    free(p->work);
    free(p->finish);
    free(p->mb);
    free(p->n_on);
    memset(p, 0, sizeof *p);
}

tdm_status tdm_split_plan_make(const double *work, int n_adapters, const tdm_split_gpu *gpus,
                               int n_gpus, tdm_split_fits_fn fits, void *user,
                               const char *const *labels, tdm_split_plan *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_adapters < 1 || n_gpus < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "a split needs adapters and GPUs");
    out->n_adapters = n_adapters;
    out->n_gpus = n_gpus;
    out->gpu_of = malloc((size_t)n_adapters * sizeof *out->gpu_of);
    out->work = calloc((size_t)n_gpus, sizeof *out->work);
    out->finish = calloc((size_t)n_gpus, sizeof *out->finish);
    out->mb = calloc((size_t)n_gpus, sizeof *out->mb);
    out->n_on = calloc((size_t)n_gpus, sizeof *out->n_on);
    int *order = malloc((size_t)n_adapters * sizeof *order);
    /* each GPU's group so far plus room for the candidate: the caller's fit takes a list */
    int *group = malloc((size_t)(n_adapters + 1) * sizeof *group);
    tdm_status st = TDM_OK;
    if (!out->gpu_of || !out->work || !out->finish || !out->mb || !out->n_on || !order || !group) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* the adapters in LPT order: the most work first, ties in file order (a stable insertion
     * sort: a run has tens of adapters, not thousands) */
    for (int a = 0; a < n_adapters; a++) {
        out->gpu_of[a] = -1;
        int k = a;
        for (; k > 0 && work[order[k - 1]] < work[a]; k--)
            order[k] = order[k - 1];
        order[k] = a;
    }
    for (int k = 0; k < n_adapters; k++) {
        int a = order[k];
        int best = -1;
        double best_finish = 0;
        int64_t best_mb = 0;
        for (int g = 0; g < n_gpus; g++) {
            double speed = gpus[g].speed > 0 ? gpus[g].speed : 1;
            double finish = (out->work[g] + work[a]) / speed;
            if (best >= 0 && !(finish < best_finish)) continue;
            /* the group in file order, the candidate in its place */
            int n = 0;
            for (int b = 0; b < n_adapters; b++)
                if (out->gpu_of[b] == g || b == a) group[n++] = b;
            int64_t mb = 0;
            tdm_error e = {0};
            if (!fits(group, n, g, user, &mb, &e)) {
                if (e.status != TDM_OK && e.status != TDM_ERR_NEVER_FITS) {
                    *err = e;
                    st = e.status;
                    goto out;
                }
                continue;
            }
            best = g;
            best_finish = finish;
            best_mb = mb;
        }
        if (best < 0) {
            char why[1024] = "";
            size_t l = 0;
            for (int g = 0; g < n_gpus && l < sizeof why; g++)
                l += (size_t)snprintf(why + l, sizeof why - l, "%s%s (%lld MiB, %d adapter(s))",
                                      g ? ", " : "", gpus[g].uuid ? gpus[g].uuid : "?",
                                      (long long)gpus[g].budget_mb, out->n_on[g]);
            st = tdm_fail(err, TDM_ERR_NEVER_FITS,
                          "--gpus: adapter %d (%s) fits on no GPU of the list, alone or with "
                          "the adapters already there: %s. Give more GPUs, or lower "
                          "--max-seq-len, --batch-size or --rank",
                          a + 1, labels && labels[a] ? labels[a] : "?", why);
            goto out;
        }
        out->gpu_of[a] = best;
        out->work[best] += work[a];
        out->finish[best] = best_finish;
        out->mb[best] = best_mb;
        out->n_on[best]++;
    }
out:
    free(order);
    free(group);
    return st;
}

int tdm_split_plan_list(const tdm_split_plan *p, int gpu, char *buf, size_t cap)
{
    int n = 0;
    size_t l = 0;
    if (cap) buf[0] = 0;
    for (int a = 0; a < p->n_adapters; a++) {
        if (p->gpu_of[a] != gpu) continue;
        if (l < cap) l += (size_t)snprintf(buf + l, cap - l, "%s%d", n ? "," : "", a);
        n++;
    }
    return n;
}
