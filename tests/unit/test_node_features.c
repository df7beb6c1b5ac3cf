/* Unit tests of build features in the cluster layer (issue 13, item 18): `tandem --version`'s
 * "features:" line as the node probe reads it, and placement excluding a node with GPUs whose
 * tandem has no CUDA backend, with the reason the plan prints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cluster/node_probe.h"
#include "cluster/placement.h"
#include "util/build_features.h"

static void test_parse_version(void **state)
{
    (void)state;
    tdm_node_state s;
    memset(&s, 0, sizeof s);
    tdm_node_parse_version("tandem 0.1.0\nfeatures: cuda\n", &s);
    assert_string_equal(s.version, "0.1.0");
    assert_string_equal(s.features, "cuda");
    assert_int_equal(s.cuda, 1);

    tdm_node_parse_version("tandem 0.1.0\nfeatures: cpu-only\n", &s);
    assert_string_equal(s.version, "0.1.0");
    assert_string_equal(s.features, "cpu-only");
    assert_int_equal(s.cuda, 0);

    /* Several words, commas, CRLF; "cudart" is not "cuda". */
    tdm_node_parse_version("tandem 0.2.0\r\nfeatures: nvtx, cuda\r\n", &s);
    assert_string_equal(s.version, "0.2.0");
    assert_string_equal(s.features, "nvtx, cuda");
    assert_int_equal(s.cuda, 1);
    tdm_node_parse_version("tandem 0.2.0\nfeatures: cudart\n", &s);
    assert_int_equal(s.cuda, 0);

    /* An older tandem prints no features line: unknown, not "no CUDA". */
    tdm_node_parse_version("tandem 0.0.9\n", &s);
    assert_string_equal(s.version, "0.0.9");
    assert_string_equal(s.features, "");
    assert_int_equal(s.cuda, -1);
    tdm_node_parse_version("", &s);
    assert_string_equal(s.version, "");
    assert_int_equal(s.cuda, -1);
}

/* What this binary says about itself is what its build has. */
static void test_build_features(void **state)
{
    (void)state;
#ifdef TANDEM_HAVE_CUDA
    assert_string_equal(tdm_build_features(), "cuda");
#else
    assert_string_equal(tdm_build_features(), "cpu-only");
#endif
}

static void test_place_excludes_gpu_node_without_cuda(void **state)
{
    (void)state;
    /* a process with k adapters: 1000 + 100 (k - 1) MiB on a GPU, 800 + 100 (k - 1) on a CPU */
    static const int64_t gpu_mb[] = {0, 1000, 1100, 1200, 1300};
    static const int64_t cpu_mb[] = {0, 800, 900, 1000, 1100};
    const tdm_place_budget b = {.gpu_mb = gpu_mb, .cpu_mb = cpu_mb};
    tdm_place_gpu fast = {"GPU-a", "RTX 4090", 1.0, 20000};
    tdm_place_gpu slow = {"GPU-b", "RTX 3060", 0.3, 8000};
    tdm_place_node nodes[] = {
        {.name = "nocuda",
         .reachable = true,
         .gpus = &fast,
         .n_gpus = 1,
         .max_adapters = 4,
         .why_no_cuda = "has GPUs, but its tandem (tandem) was built without CUDA"},
        {.name = "cuda", .reachable = true, .gpus = &slow, .n_gpus = 1, .max_adapters = 4},
    };
    tdm_place_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_place(nodes, 2, 2, &b, 1000000, &p, &err), TDM_OK);
    for (size_t a = 0; a < 2; a++) {
        assert_int_equal(p.node_of[a], 1);
        assert_false(p.evals[a * 2 + 0].eligible);
        assert_string_equal(p.evals[a * 2 + 0].why,
                            "has GPUs, but its tandem (tandem) was built without CUDA");
    }
    tdm_place_plan_free(&p);

    /* Without the reason (CUDA build or unknown) the faster GPU wins as before. */
    nodes[0].why_no_cuda = NULL;
    assert_int_equal(tdm_place(nodes, 2, 1, &b, 1000000, &p, &err), TDM_OK);
    assert_int_equal(p.node_of[0], 0);
    tdm_place_plan_free(&p);

    /* The only GPU node has no CUDA: nothing fits, and the message says why. */
    nodes[0].why_no_cuda = "has GPUs, but its tandem (tandem) was built without CUDA";
    assert_int_equal(tdm_place(nodes, 1, 1, &b, 1000000, &p, &err), TDM_ERR_NEVER_FITS);
    assert_int_equal(p.node_of[0], -1);
    assert_non_null(strstr(err.message, "built without CUDA"));
    tdm_place_plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_version),
        cmocka_unit_test(test_build_features),
        cmocka_unit_test(test_place_excludes_gpu_node_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
