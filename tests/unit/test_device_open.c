/* test_device_open.c — what a run waiting for GPU memory says (src/run/device_open.c): the
 * budget, what is free, the ledger's holders, the processes outside the ledger (pid, name, MiB)
 * from the inventory (here the TANDEM_FAKE_GPUS seam), and that a budget above the reservable
 * capacity minus what those processes hold can only start when they exit. Also the --vram auto
 * arithmetic. */
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
    /* 4000 <= 8500 reservable - 3000 outside: it can start when the ledger's holders finish */
    assert_null(strstr(buf, "can only start when"));
    tdm_device_describe_wait(buf, sizeof buf, 6000, 61, &inv.gpus[0], &st);
    assert_non_null(strstr(buf, "still waiting for 6000 MiB"));
    assert_non_null(strstr(buf, "after 61 s"));
    assert_non_null(strstr(buf, "6000 MiB can only start when those processes outside the ledger "
                                "exit (reservable 8500 MiB - 3000 MiB they hold = 5500 MiB)"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_names_holders),
        cmocka_unit_test(test_reservation_mb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
