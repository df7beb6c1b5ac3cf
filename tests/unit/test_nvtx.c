/* Unit test of the NVTX ranges of src/obs/trace (CUDA builds): a counting NVTX tool, linked in
 * statically through nvtx3's InitializeInjectionNvtx2_fnptr hook, the way Nsight Systems attaches
 * through NVTX_INJECTION64_PATH. Checks that every span and obs phase becomes one range in the
 * domain "tandem", with its name, started and ended in pairs, with and without a trace file.
 * Without CUDA the test is a single skipped case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/obs.h"
#include "obs/trace.h"

#ifdef TANDEM_HAVE_CUDA
/* Only the types here: the NVTX implementation (and its weak InitializeInjectionNvtx2_fnptr,
 * which the strong definition below overrides at link time) lives in src/obs/trace.c. */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

/* --- the counting tool ------------------------------------------------------------------ */

#define MAX_RANGES 64
static int domains_created;
static char domain_name[64];
static nvtxDomainHandle_t the_domain = (nvtxDomainHandle_t)0x7a4d;
static struct {
    char name[64];
    bool ended;
    bool right_domain;
} ranges[MAX_RANGES];
static int n_ranges;
static int bad_ends;

static nvtxDomainHandle_t NVTX_API tool_domain_create(const char *name)
{
    domains_created++;
    snprintf(domain_name, sizeof domain_name, "%s", name);
    return the_domain;
}

static nvtxRangeId_t NVTX_API tool_range_start(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    if (n_ranges >= MAX_RANGES)
        return 0;
    int i = n_ranges++;
    snprintf(ranges[i].name, sizeof ranges[i].name, "%s",
             a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?");
    ranges[i].right_domain = d == the_domain;
    return (nvtxRangeId_t)(i + 1);
}

static void NVTX_API tool_range_end(nvtxDomainHandle_t d, nvtxRangeId_t id)
{
    if (id < 1 || id > (nvtxRangeId_t)n_ranges || ranges[id - 1].ended || d != the_domain) {
        bad_ends++;
        return;
    }
    ranges[id - 1].ended = true;
}

static int NVTX_API tool_init(NvtxGetExportTableFunc_t get_table)
{
    const NvtxExportTableCallbacks *cb =
        (const NvtxExportTableCallbacks *)get_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
        size <= NVTX_CBID_CORE2_DomainCreateA)
        return 0;
    *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)tool_domain_create;
    *table[NVTX_CBID_CORE2_DomainRangeStartEx] = (NvtxFunctionPointer)tool_range_start;
    *table[NVTX_CBID_CORE2_DomainRangeEnd] = (NvtxFunctionPointer)tool_range_end;
    return 1;
}

NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = tool_init;

/* --- tests ------------------------------------------------------------------------------ */

static void test_spans_become_nvtx_ranges(void **state)
{
    /* No trace file: NVTX ranges still go to the attached tool. */
    assert_false(tdm_trace_active());
    tdm_trace_span op = tdm_trace_span_begin("LedgerReserve", "gpu");
    tdm_obs_span o = tdm_obs_begin(TDM_PHASE_LOCK_ACQ);
    tdm_obs_end(&o, 0, NULL);
    tdm_trace_span_end(&op, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "granted")));

    assert_int_equal(domains_created, 1);
    assert_string_equal(domain_name, "tandem");
    assert_int_equal(n_ranges, 2);
    assert_string_equal(ranges[0].name, "LedgerReserve");
    assert_string_equal(ranges[1].name, "LockAcquire");

    /* With a trace file open as well: same ranges, and the domain is created only once. */
    char dir[] = "/tmp/tandem-test-nvtx-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/t.json", dir);
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    tdm_trace_span wait = tdm_trace_span_begin("WaitPoll", "gpu");
    tdm_trace_span_end(&wait, 0, NULL);
    tdm_trace_span open_at_close = tdm_trace_span_begin("LedgerRelease", "gpu");
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    tdm_trace_span_end(&open_at_close, 0, NULL); /* after close: the NVTX range still ends */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);

    assert_int_equal(domains_created, 1);
    assert_int_equal(n_ranges, 4);
    assert_string_equal(ranges[2].name, "WaitPoll");
    assert_string_equal(ranges[3].name, "LedgerRelease");
    for (int i = 0; i < n_ranges; i++) {
        assert_true(ranges[i].ended);
        assert_true(ranges[i].right_domain);
    }
    assert_int_equal(bad_ends, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spans_become_nvtx_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* !TANDEM_HAVE_CUDA */

static void test_skipped_without_cuda(void **state)
{
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skipped_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
