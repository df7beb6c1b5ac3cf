/* test_gpu_split.c — the split of `finetune --gpus` (run/gpu_split.h, run/gpus_run.h):
 * longest-processing-time first on estimated tokens, hand-computed on a small case and checked
 * against the brute-force optimum on many random ones (LPT's bound 4/3 - 1/(3m)); GPU speed;
 * ties in file order; the memory callback (a GPU too small is skipped, an adapter fitting
 * nowhere fails naming it, the callback's own error stops the plan); the --gpus value against
 * an inventory (all, a count, a list in its order, repeats, unknown GPUs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/inventory.h"
#include "run/gpu_split.h"
#include "run/gpus_run.h"

static bool always(const int *adapters, int n, int gpu, void *user, int64_t *mb, tdm_error *err)
{
    (void)adapters, (void)gpu, (void)user, (void)err;
    *mb = 100 * n;
    return true;
}

static void gpus_equal(tdm_split_gpu *g, int n)
{
    static const char *names[] = {"GPU-0", "GPU-1", "GPU-2", "GPU-3"};
    for (int i = 0; i < n; i++)
        g[i] = (tdm_split_gpu){.uuid = names[i], .speed = 1, .budget_mb = 1000};
}

static void test_lpt_by_hand(void **state)
{
    (void)state;
    /* 7 -> 0; 5 -> 1; 4 -> 1 (9 < 11); 3 -> 0 (10 < 12); 3 -> 1 (12 < 13); 2 -> 0 (12 < 14) */
    double work[] = {3, 7, 2, 5, 3, 4};
    tdm_split_gpu g[2];
    gpus_equal(g, 2);
    tdm_split_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_split_plan_make(work, 6, g, 2, always, NULL, NULL, &p, &err), TDM_OK);
    /* adapters by work: 1 (7) -> 0, 3 (5) -> 1, 5 (4) -> 1, 0 (3) -> 0, 4 (3) -> 1, 2 (2) -> 0 */
    int want[] = {0, 0, 0, 1, 1, 1};
    for (int a = 0; a < 6; a++)
        assert_int_equal(p.gpu_of[a], want[a]);
    assert_true(p.work[0] == 12 && p.work[1] == 12);
    assert_int_equal(p.n_on[0], 3);
    assert_int_equal(p.mb[1], 300);
    char list[64];
    assert_int_equal(tdm_split_plan_list(&p, 0, list, sizeof list), 3);
    assert_string_equal(list, "0,1,2");
    assert_int_equal(tdm_split_plan_list(&p, 1, list, sizeof list), 3);
    assert_string_equal(list, "3,4,5");
    tdm_split_plan_free(&p);
}

/* the best makespan over every assignment of n adapters to m GPUs */
static double optimum(const double *w, int n, int m)
{
    double best = 1e300;
    int total = 1;
    for (int i = 0; i < n; i++)
        total *= m;
    for (int code = 0; code < total; code++) {
        double load[4] = {0};
        int c = code;
        for (int i = 0; i < n; i++, c /= m)
            load[c % m] += w[i];
        double mk = 0;
        for (int g = 0; g < m; g++)
            if (load[g] > mk) mk = load[g];
        if (mk < best) best = mk;
    }
    return best;
}

static void test_lpt_bound(void **state)
{
    (void)state;
    srand(17);
    for (int trial = 0; trial < 300; trial++) {
        int m = 2 + trial % 3, n = 3 + rand() % 6;
        double w[8];
        for (int i = 0; i < n; i++)
            w[i] = 1 + rand() % 1000;
        tdm_split_gpu g[4];
        gpus_equal(g, m);
        tdm_split_plan p;
        tdm_error err = {0};
        assert_int_equal(tdm_split_plan_make(w, n, g, m, always, NULL, NULL, &p, &err), TDM_OK);
        double mk = 0, sum = 0;
        for (int k = 0; k < m; k++) {
            if (p.work[k] > mk) mk = p.work[k];
            sum += p.work[k];
        }
        double tot = 0;
        for (int i = 0; i < n; i++)
            tot += w[i];
        assert_true(sum == tot); /* every adapter placed once */
        double opt = optimum(w, n, m);
        assert_true(mk <= (4.0 / 3.0 - 1.0 / (3.0 * m)) * opt + 1e-9);
        tdm_split_plan_free(&p);
    }
}

static void test_speed_and_ties(void **state)
{
    (void)state;
    /* a GPU twice as fast takes two of three equal adapters: 0 -> fast (2 < 4), 1 -> fast (tie
     * 4 = 4: the first GPU of the list), 2 -> slow (4 < 6) */
    double w[] = {4, 4, 4};
    tdm_split_gpu g[2] = {{.uuid = "GPU-fast", .speed = 2, .budget_mb = 1000},
                          {.uuid = "GPU-slow", .speed = 1, .budget_mb = 1000}};
    tdm_split_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_split_plan_make(w, 3, g, 2, always, NULL, NULL, &p, &err), TDM_OK);
    assert_int_equal(p.gpu_of[0], 0);
    assert_int_equal(p.gpu_of[1], 0);
    assert_int_equal(p.gpu_of[2], 1);
    tdm_split_plan_free(&p);
    /* equal work on equal GPUs: file order, round robin */
    double e[] = {1, 1, 1, 1, 1};
    gpus_equal(g, 2);
    assert_int_equal(tdm_split_plan_make(e, 5, g, 2, always, NULL, NULL, &p, &err), TDM_OK);
    for (int a = 0; a < 5; a++)
        assert_int_equal(p.gpu_of[a], a % 2);
    tdm_split_plan_free(&p);
}

/* memory: a process holds a base of 500 MiB plus each adapter's mb[a]; the GPU's budget bounds
 * it */
static const int64_t adapter_mb[] = {300, 300, 300, 900};
static int calls;
static bool by_memory(const int *adapters, int n, int gpu, void *user, int64_t *mb, tdm_error *err)
{
    const tdm_split_gpu *g = user;
    calls++;
    int64_t need = 500;
    for (int i = 0; i < n; i++)
        need += adapter_mb[adapters[i]];
    *mb = need;
    if (g[gpu].budget_mb < 0) { /* a failing estimate */
        tdm_fail(err, TDM_ERR_INVALID, "estimate failed");
        return false;
    }
    return need <= g[gpu].budget_mb;
}

static void test_memory(void **state)
{
    (void)state;
    /* GPU-0 takes 500 + 2 x 300 at most; GPU-1 500 + 900; GPU-2 nothing (400 < any process) */
    tdm_split_gpu g[3] = {{.uuid = "GPU-0", .speed = 1, .budget_mb = 1100},
                          {.uuid = "GPU-1", .speed = 1, .budget_mb = 1400},
                          {.uuid = "GPU-2", .speed = 1, .budget_mb = 400}};
    double w[] = {30, 20, 10, 5}; /* by work, adapter 0 first; adapter 3 is small but big in
                                     memory */
    tdm_split_plan p;
    tdm_error err = {0};
    const char *labels[] = {"a", "b", "c", "huge"};
    assert_int_equal(tdm_split_plan_make(w, 3, g, 3, by_memory, g, labels, &p, &err), TDM_OK);
    /* 0 -> GPU-0; 1 -> GPU-1 (20 < 50); 2 -> GPU-1 (30) or GPU-2 (10, does not fit): GPU-1 */
    assert_int_equal(p.gpu_of[0], 0);
    assert_int_equal(p.gpu_of[1], 1);
    assert_int_equal(p.gpu_of[2], 1);
    assert_int_equal(p.n_on[2], 0);
    assert_int_equal(p.mb[1], 1100);
    tdm_split_plan_free(&p);
    /* four: huge (900) fits only GPU-1 alone; it comes last (least work) and GPU-1 has b and c:
     * nowhere */
    assert_int_equal(tdm_split_plan_make(w, 4, g, 3, by_memory, g, labels, &p, &err),
                     TDM_ERR_NEVER_FITS);
    assert_non_null(strstr(err.message, "adapter 4 (huge) fits on no GPU"));
    assert_non_null(strstr(err.message, "GPU-2 (400 MiB, 0 adapter(s))"));
    tdm_split_plan_free(&p);
    /* the huge one with the most work goes first and gets GPU-1 alone; the rest fit GPU-0 (two)
     * and no more: the third fits nowhere */
    double w2[] = {30, 20, 10, 50};
    assert_int_equal(tdm_split_plan_make(w2, 4, g, 3, by_memory, g, labels, &p, &err),
                     TDM_ERR_NEVER_FITS);
    assert_non_null(strstr(err.message, "adapter 3 (c)"));
    tdm_split_plan_free(&p);
    /* GPU-1's estimate fails (asked for adapter 0, the second placed): the error stops the
     * plan */
    double w3[] = {30, 20, 50};
    g[1].budget_mb = -1;
    calls = 0;
    assert_int_equal(tdm_split_plan_make(w3, 3, g, 3, by_memory, g, labels, &p, &err),
                     TDM_ERR_INVALID);
    assert_string_equal(err.message, "estimate failed");
    assert_int_equal(calls, 3); /* adapter 2 on GPU-0; adapter 0 on GPU-0, then GPU-1 */
    tdm_split_plan_free(&p);
}

static void test_parse(void **state)
{
    (void)state;
    tdm_gpu gpus[3] = {{.uuid = "GPU-aaa", .name = "A", .index = 0, .total_mb = 1000},
                       {.uuid = "GPU-bbb", .name = "NVIDIA H200", .index = 1, .total_mb = 1000},
                       {.uuid = "GPU-abc", .name = "C", .index = 2, .total_mb = 1000}};
    tdm_inventory inv = {.gpus = gpus, .n_gpus = 3, .source = "fake"};
    int64_t budget[3] = {850, 800, 700};
    tdm_gpus_plan p = {0};
    tdm_error err = {0};
    assert_int_equal(tdm_gpus_parse("all", &inv, budget, &p, &err), TDM_OK);
    assert_int_equal(p.n_gpus, 3);
    assert_string_equal(p.gpus[1].uuid, "GPU-bbb");
    assert_true(p.gpus[1].budget_mb == 800 && p.gpus[1].speed == 2.8);
    assert_int_equal(tdm_gpus_parse("2", &inv, budget, &p, &err), TDM_OK);
    assert_int_equal(p.n_gpus, 2);
    assert_string_equal(p.gpus[1].uuid, "GPU-bbb");
    /* a list keeps its order; UUIDs, unique prefixes and indices */
    assert_int_equal(tdm_gpus_parse("GPU-abc,GPU-b,0", &inv, budget, &p, &err), TDM_OK);
    assert_int_equal(p.n_gpus, 3);
    assert_string_equal(p.gpus[0].uuid, "GPU-abc");
    assert_string_equal(p.gpus[1].uuid, "GPU-bbb");
    assert_string_equal(p.gpus[2].uuid, "GPU-aaa");
    assert_int_equal(p.gpus[0].budget_mb, 700);
    assert_int_equal(tdm_gpus_parse("4", &inv, budget, &p, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "this host has 3 GPU(s)"));
    assert_int_equal(tdm_gpus_parse("0", &inv, budget, &p, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpus_parse("GPU-a", &inv, budget, &p, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "no GPU 'GPU-a' here")); /* two match the prefix */
    assert_int_equal(tdm_gpus_parse("GPU-aaa,0", &inv, budget, &p, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "listed twice"));
    assert_int_equal(tdm_gpus_parse("", &inv, budget, &p, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpus_parse(",", &inv, budget, &p, &err), TDM_ERR_INVALID);
    tdm_gpus_plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lpt_by_hand),    cmocka_unit_test(test_lpt_bound),
        cmocka_unit_test(test_speed_and_ties), cmocka_unit_test(test_memory),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
