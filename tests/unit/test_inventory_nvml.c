/* The real NVML path, checked against nvidia-smi (an independent reader of the same driver).
 *
 * Skipped where NVML cannot be loaded (the build machine). On a GPU machine it prints every GPU
 * the inventory sees, checks the basic invariants, and compares with
 *     nvidia-smi --query-gpu=uuid,memory.total,memory.used --format=csv,noheader,nounits
 * per UUID: total must match exactly and used within 5% (at least 16 MiB, as both read a live GPU
 * a few milliseconds apart). Unified-memory GPUs are not compared: their numbers come from
 * /proc/meminfo and nvidia-smi prints [N/A] for them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/inventory.h"

typedef struct smi_row {
    char uuid[96];
    long long total_mb;
    long long used_mb;
} smi_row;

/* Runs nvidia-smi; returns the number of rows read (0 when it is absent or prints nothing). */
static size_t read_smi(smi_row *rows, size_t cap)
{
    FILE *p = popen("nvidia-smi --query-gpu=uuid,memory.total,memory.used "
                    "--format=csv,noheader,nounits 2>/dev/null",
                    "r");
    if (!p) return 0;
    size_t n = 0;
    char line[512];
    while (n < cap && fgets(line, sizeof line, p)) {
        smi_row r = {0};
        /* "GPU-8c2e..., 143771, 0"; [N/A] fields fail the numeric parse and read as -1. */
        char total[64] = "", used[64] = "";
        if (sscanf(line, " %95[^,], %63[^,], %63s", r.uuid, total, used) != 3) continue;
        char *end;
        r.total_mb = strtoll(total, &end, 10);
        if (end == total) r.total_mb = -1;
        r.used_mb = strtoll(used, &end, 10);
        if (end == used) r.used_mb = -1;
        rows[n++] = r;
    }
    pclose(p);
    return n;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void test_nvml_matches_nvidia_smi(void **state)
{
    unsetenv("TANDEM_FAKE_GPUS");
    unsetenv("CUDA_VISIBLE_DEVICES");
    tdm_inventory inv;
    tdm_error err = {0};
    double t0 = now_ms();
    tdm_status st = tdm_inventory_query(&inv, &err);
    double first_ms = now_ms() - t0;
    if (st != TDM_OK) fail_msg("query failed: %s", err.message);
    if (strcmp(inv.source, "nvml") != 0) {
        printf("NVML not usable here (%s): skipped\n", inv.note);
        tdm_inventory_free(&inv);
        skip();
    }
    printf("driver %s, %zu GPU(s), first query %.1f ms%s%s\n", inv.driver_version, inv.n_gpus,
           first_ms, inv.note[0] ? ", note: " : "", inv.note);
    for (size_t i = 0; i < inv.n_gpus; i++) {
        const tdm_gpu *g = &inv.gpus[i];
        printf("gpu %d %s \"%s\" %s total=%lld used=%lld free=%lld MiB mode=%s processes=%zu\n",
               g->index, g->uuid, g->name, tdm_memory_type_str(g->memory_type),
               (long long)g->total_mb, (long long)g->used_mb, (long long)g->free_mb,
               tdm_compute_mode_str(g->compute_mode), g->n_processes);
        for (size_t k = 0; k < g->n_processes; k++)
            printf("    pid %u used=%lld MiB\n", g->processes[k].pid,
                   (long long)g->processes[k].used_mb);
        assert_true(g->uuid[0] != '\0');
        assert_true(g->total_mb > 0);
        assert_true(g->used_mb >= 0 && g->free_mb >= 0);
        assert_true(g->used_mb + g->free_mb <= g->total_mb);
        assert_ptr_equal(tdm_inventory_find(&inv, g->uuid), g);
    }

    /* A second query reuses the loaded NVML: it must work, and is expected to be fast. */
    tdm_inventory again;
    t0 = now_ms();
    assert_int_equal(tdm_inventory_query(&again, &err), TDM_OK);
    printf("second query %.1f ms\n", now_ms() - t0);
    assert_int_equal(again.n_gpus, inv.n_gpus);
    tdm_inventory_free(&again);

    smi_row rows[64];
    size_t n_rows = read_smi(rows, 64);
    if (n_rows == 0) {
        printf("nvidia-smi absent or silent: comparison skipped\n");
        tdm_inventory_free(&inv);
        return;
    }
    assert_int_equal(n_rows, inv.n_gpus);
    for (size_t i = 0; i < inv.n_gpus; i++) {
        const tdm_gpu *g = &inv.gpus[i];
        const smi_row *r = NULL;
        for (size_t k = 0; k < n_rows && !r; k++)
            if (strcmp(rows[k].uuid, g->uuid) == 0) r = &rows[k];
        if (!r) fail_msg("%s: not in nvidia-smi's list", g->uuid);
        printf("nvidia-smi %s total=%lld used=%lld MiB\n", r->uuid, r->total_mb, r->used_mb);
        if (g->memory_type == TDM_MEMORY_UNIFIED) continue;
        if (g->total_mb != r->total_mb)
            fail_msg("%s: total %lld MiB, nvidia-smi says %lld", g->uuid, (long long)g->total_mb,
                     r->total_mb);
        long long tolerance = r->used_mb * 5 / 100;
        if (tolerance < 16) tolerance = 16;
        long long diff = (long long)g->used_mb - r->used_mb;
        if (diff < -tolerance || diff > tolerance)
            fail_msg("%s: used %lld MiB, nvidia-smi says %lld (tolerance %lld)", g->uuid,
                     (long long)g->used_mb, r->used_mb, tolerance);
    }
    tdm_inventory_free(&inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvml_matches_nvidia_smi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
