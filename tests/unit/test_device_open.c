/* test_device_open.c — what a run waiting for GPU memory says (src/run/device_open.c): the
 * budget, what is free, the ledger's holders, the processes outside the ledger (pid, name, MiB)
 * from the inventory (here the TANDEM_FAKE_GPUS seam), and that a budget above what a run alone
 * can get (tdm_device_alone_mb: min(reservable, total - held outside the ledger)) can only start
 * when that memory is freed. Also the --vram auto arithmetic, and the budget a run can get on a
 * 24 GiB card, a simulated one (an H200 with a holder process) and a GPU whose processes NVML
 * does not list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "run/device_open.h"

static void with_world(tdm_inventory *inv, tdm_ledger_state *st)
{
    /* pid 1 (init: a real process with a name) holds 3000 MiB outside the ledger; pid 424242
     * holds a 2000 MiB reservation. */
    setenv("TANDEM_FAKE_GPUS",
           "uuid=GPU-sim-0,name=Sim 10G,total_mb=10000,memory=discrete,used_mb=5000;"
           "pid=1,gpu=GPU-sim-0,used_mb=3000;pid=424242,gpu=GPU-sim-0,used_mb=2000",
           1);
    tdm_error err = {0};
    assert_int_equal(tdm_inventory_query(inv, &err), TDM_OK);
    assert_int_equal(inv->n_gpus, 1);
    tdm_ledger_state_init(st);
    tdm_reservation r = {.n_holders = 1, .budget_mb = 2000, .actual_mb = -1};
    r.holders[0].pid = 424242;
    snprintf(r.id, sizeof r.id, "res-1");
    snprintf(r.gpu_uuid, sizeof r.gpu_uuid, "GPU-sim-0");
    snprintf(r.task, sizeof r.task, "finetune");
    snprintf(r.user, sizeof r.user, "alice");
    snprintf(r.host, sizeof r.host, "box");
    assert_int_equal(tdm_ledger_state_add_reservation(st, &r, &err), TDM_OK);
}

static void test_wait_names_holders(void **state)
{
    (void)state;
    tdm_inventory inv;
    tdm_ledger_state st;
    with_world(&inv, &st);
    char buf[1536];
    tdm_device_describe_wait(buf, sizeof buf, 4000, 0, &inv.gpus[0], &st);
    assert_non_null(strstr(buf, "waiting for 4000 MiB of GPU memory on GPU-sim-0 (Sim 10G)"));
    assert_non_null(strstr(buf, "5000 MiB free"));
    assert_non_null(strstr(buf, "held in the ledger by finetune (pid 424242, alice@box) 2000 MiB"));
    assert_non_null(strstr(buf, "outside the ledger: pid 1 "));
    assert_non_null(strstr(buf, " 3000 MiB"));
    assert_null(strstr(buf, "424242 ?")); /* the ledger's holder is not listed as outside */
    /* 6000 <= min(8500 reservable, 10000 - 3000 outside): it can start when the ledger's
     * holders finish (the guard then admits it: 6000 <= 8500 and 6000 <= 7000 free) */
    assert_null(strstr(buf, "can only start when"));
    tdm_device_describe_wait(buf, sizeof buf, 6000, 0, &inv.gpus[0], &st);
    assert_null(strstr(buf, "can only start when"));
    tdm_device_describe_wait(buf, sizeof buf, 7500, 61, &inv.gpus[0], &st);
    assert_non_null(strstr(buf, "still waiting for 7500 MiB"));
    assert_non_null(strstr(buf, "after 61 s"));
    assert_non_null(strstr(buf, "7500 MiB can only start when memory held outside the ledger is "
                                "freed (at most 7000 MiB while it is held: total 10000 MiB - "
                                "3000 MiB outside the ledger, reservable 8500 MiB)"));
    tdm_ledger_state_free(&st);
    tdm_inventory_free(&inv);
}

static void test_reservation_mb(void **state)
{
    (void)state;
    tdm_model_mem m = {.weights = 1u << 20, .activations = 1, .adapters = 0, .backend_scratch = 0};
    /* every owner together rounded up to MiB, plus the CUDA context */
    assert_int_equal(tdm_device_reservation_mb(&m), 2 + TDM_CUDA_CONTEXT_MIB);
}

static int64_t alone_in(const char *spec, const tdm_ledger_state *st, int64_t *outside)
{
    setenv("TANDEM_FAKE_GPUS", spec, 1);
    tdm_inventory inv;
    tdm_error err = {0};
    assert_int_equal(tdm_inventory_query(&inv, &err), TDM_OK);
    assert_int_equal(inv.n_gpus, 1);
    int64_t mb = tdm_device_alone_mb(&inv.gpus[0], st, outside);
    tdm_inventory_free(&inv);
    return mb;
}

static void test_alone_budget(void **state)
{
    (void)state;
    tdm_inventory inv;
    tdm_ledger_state st;
    int64_t outside;
    with_world(&inv, &st);
    /* the ledger's 2000 MiB will come back, the 3000 of pid 1 will not */
    assert_int_equal(tdm_device_alone_mb(&inv.gpus[0], &st, &outside), 7000);
    assert_int_equal(outside, 3000);
    tdm_inventory_free(&inv);
    /* the simulated 24 GiB card: an H200 with a holder leaving 24 GiB */
    assert_int_equal(alone_in("uuid=GPU-h200,name=NVIDIA H200,total_mb=143771,memory=discrete;"
                              "pid=1,gpu=GPU-h200,used_mb=119195",
                              NULL, &outside),
                     24576);
    assert_int_equal(outside, 119195);
    /* a real 24 GB card: the reserve factor is the bound */
    assert_int_equal(alone_in("uuid=GPU-4090,name=RTX 4090,total_mb=24564,memory=discrete;"
                              "pid=1,gpu=GPU-4090,used_mb=300",
                              NULL, &outside),
                     20879);
    /* NVML lists no process: the reservation's recorded actual use is what comes back */
    tdm_ledger_state_free(&st);
    tdm_ledger_state_init(&st);
    tdm_reservation r = {.n_holders = 1, .budget_mb = 2500, .actual_mb = 2000};
    r.holders[0].pid = 424242;
    snprintf(r.id, sizeof r.id, "res-2");
    snprintf(r.gpu_uuid, sizeof r.gpu_uuid, "GPU-quiet");
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_state_add_reservation(&st, &r, &err), TDM_OK);
    assert_int_equal(alone_in("uuid=GPU-quiet,name=Quiet,total_mb=10000,memory=discrete,"
                              "used_mb=5000",
                              &st, &outside),
                     7000);
    assert_int_equal(outside, 3000);
    tdm_ledger_state_free(&st);
    unsetenv("TANDEM_FAKE_GPUS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_budget),
        cmocka_unit_test(test_wait_names_holders),
        cmocka_unit_test(test_reservation_mb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
