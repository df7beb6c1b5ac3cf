/* Unit tests of src/gpu inventory: the TANDEM_FAKE_GPUS seam (every error it reports, the @file
 * form re-read at each query), CUDA_VISIBLE_DEVICES, /proc/meminfo parsing, find(), unified-name
 * detection and the no-NVML path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/fake_gpus.h"
#include "gpu/inventory.h"
#include "gpu/meminfo.h"
#include "gpu/nvml.h"
#include "gpu/visible_devices.h"
#include "util/atomic_file.h"

static char tmpdir[256];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-inventory-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    unsetenv("TANDEM_FAKE_GPUS");
    unsetenv("CUDA_VISIBLE_DEVICES");
    return 0;
}

static int teardown(void **state)
{
    unsetenv("TANDEM_FAKE_GPUS");
    unsetenv("CUDA_VISIBLE_DEVICES");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Four discrete GPUs whose UUIDs share prefixes in pairs, for the filter and find() tests. */
static const char *FOUR =
    "uuid=GPU-8c2e0000-aaaa,name=A,total_mb=1000;uuid=GPU-8c2e1111-bbbb,name=B,total_mb=2000;"
    "uuid=GPU-77aa,name=C,total_mb=3000;uuid=GPU-77bb,name=D,total_mb=4000";

static void query_ok(tdm_inventory *inv)
{
    tdm_error err = {0};
    tdm_status st = tdm_inventory_query(inv, &err);
    if (st != TDM_OK) fail_msg("query failed: %s", err.message);
}

static void test_fake_parse_full(void **state)
{
    setenv("TANDEM_FAKE_GPUS",
           "  uuid=GPU-sim-0 , name=RTX 4090,total_mb=24564,memory=discrete ;\n"
           "# a comment; with a semicolon, and = signs\n"
           "pid=1234,gpu=GPU-sim-0,used_mb=900\n"
           "\n"
           "pid=77,gpu=GPU-sim-1 ; pid=1235,gpu=GPU-sim-0,used_mb=100;"
           "uuid=GPU-sim-1,total_mb=16000,memory=unified,used_mb=6000,compute_mode=prohibited;"
           "uuid=GPU-sim-2,total_mb=8000,compute_mode=exclusive_process",
           1);
    tdm_inventory inv;
    query_ok(&inv);
    assert_string_equal(inv.source, "fake");
    assert_int_equal(inv.n_gpus, 3);

    const tdm_gpu *g0 = &inv.gpus[0];
    assert_string_equal(g0->uuid, "GPU-sim-0");
    assert_string_equal(g0->name, "RTX 4090");
    assert_int_equal(g0->index, 0);
    assert_int_equal(g0->memory_type, TDM_MEMORY_DISCRETE);
    assert_int_equal(g0->total_mb, 24564);
    assert_int_equal(g0->used_mb, 1000); /* no used_mb: its processes' sum (900 + 100) */
    assert_int_equal(g0->free_mb, 23564);
    assert_int_equal(g0->compute_mode, TDM_COMPUTE_DEFAULT);
    assert_int_equal(g0->n_processes, 2);
    assert_int_equal(tdm_gpu_process_used_mb(g0, 1234), 900);
    assert_int_equal(tdm_gpu_process_used_mb(g0, 1235), 100);
    assert_int_equal(tdm_gpu_process_used_mb(g0, 77), -1); /* on the other GPU */

    const tdm_gpu *g1 = &inv.gpus[1];
    assert_string_equal(g1->name, "Simulated GPU");
    assert_int_equal(g1->index, 1);
    assert_int_equal(g1->memory_type, TDM_MEMORY_UNIFIED);
    assert_int_equal(g1->total_mb, 16000); /* unified fakes take the spec, not /proc/meminfo */
    assert_int_equal(g1->used_mb, 6000);
    assert_int_equal(g1->free_mb, 10000);
    assert_int_equal(g1->compute_mode, TDM_COMPUTE_PROHIBITED);
    assert_int_equal(g1->n_processes, 1);
    assert_int_equal(g1->processes[0].pid, 77);
    assert_int_equal(g1->processes[0].used_mb, -1); /* not given: "NVML cannot tell" */

    const tdm_gpu *g2 = &inv.gpus[2];
    assert_int_equal(g2->used_mb, 0);
    assert_int_equal(g2->free_mb, 8000);
    assert_int_equal(g2->compute_mode, TDM_COMPUTE_EXCLUSIVE_PROCESS);
    assert_int_equal(g2->n_processes, 0);
    assert_string_equal(tdm_compute_mode_str(g2->compute_mode), "exclusive_process");
    assert_string_equal(tdm_memory_type_str(g1->memory_type), "unified");
    assert_string_equal(tdm_memory_type_str(g0->memory_type), "discrete");
    assert_string_equal(tdm_compute_mode_str(-1), "unknown");
    tdm_inventory_free(&inv);
}

static void test_fake_empty_spec(void **state)
{
    setenv("TANDEM_FAKE_GPUS", "", 1);
    tdm_inventory inv;
    query_ok(&inv);
    assert_string_equal(inv.source, "fake");
    assert_int_equal(inv.n_gpus, 0);
    assert_non_null(strstr(inv.note, "lists no GPU"));
    tdm_inventory_free(&inv);
}

/* Every malformed spec is TDM_ERR_INVALID, names the entry and says what is wrong. */
static void test_fake_errors(void **state)
{
    static const struct {
        const char *spec;
        const char *message; /* the whole expected message */
    } cases[] = {
        {"uuid=a,total_mb=10,colour=red",
         "TANDEM_FAKE_GPUS entry 1: unknown key 'colour' (a GPU entry takes uuid, name, total_mb, "
         "memory, used_mb, compute_mode)"},
        {"uuid=a,total_mb=10;pid=5,gpu=a,uuid=a",
         "TANDEM_FAKE_GPUS entry 2: unknown key 'uuid' (a process entry takes pid, gpu, used_mb)"},
        {"uuid=a,total_mb=10;name=x,total_mb=5",
         "TANDEM_FAKE_GPUS entry 2: GPU entry without uuid"},
        {"uuid=a", "TANDEM_FAKE_GPUS entry 1: GPU entry without total_mb"},
        {"uuid=a,total_mb=lots",
         "TANDEM_FAKE_GPUS entry 1: total_mb 'lots' is not a positive whole number of MiB"},
        {"uuid=a,total_mb=0",
         "TANDEM_FAKE_GPUS entry 1: total_mb '0' is not a positive whole number of MiB"},
        {"uuid=a,total_mb=-5",
         "TANDEM_FAKE_GPUS entry 1: total_mb '-5' is not a positive whole number of MiB"},
        {"uuid=a,total_mb=12x",
         "TANDEM_FAKE_GPUS entry 1: total_mb '12x' is not a positive whole number of MiB"},
        {"uuid=a,total_mb=99999999999999999999",
         "TANDEM_FAKE_GPUS entry 1: total_mb '99999999999999999999' is not a positive whole "
         "number of MiB"},
        {"uuid=a,total_mb=10,used_mb=1.5",
         "TANDEM_FAKE_GPUS entry 1: used_mb '1.5' is not a whole number of MiB"},
        {"uuid=a,total_mb=10,used_mb=11",
         "TANDEM_FAKE_GPUS entry 1: used_mb 11 exceeds total_mb 10"},
        {"uuid=a,total_mb=10;uuid=b,total_mb=10;uuid=a,total_mb=20",
         "TANDEM_FAKE_GPUS entry 3: duplicate uuid 'a' (also entry 1)"},
        {"uuid=a,total_mb=10;pid=9,gpu=b,used_mb=1",
         "TANDEM_FAKE_GPUS entry 2: process on unknown gpu 'b'"},
        {"uuid=a,total_mb=10,total_mb=10", "TANDEM_FAKE_GPUS entry 1: duplicate key 'total_mb'"},
        {"uuid=a,total_mb=10,memory=shared",
         "TANDEM_FAKE_GPUS entry 1: memory 'shared' must be discrete or unified"},
        {"uuid=a,total_mb=10,compute_mode=exclusive",
         "TANDEM_FAKE_GPUS entry 1: compute_mode 'exclusive' must be default, exclusive_process, "
         "exclusive_thread or prohibited"},
        {"uuid=a,total_mb", "TANDEM_FAKE_GPUS entry 1: field 'total_mb' is not key=value"},
        {"uuid=a,,total_mb=10", "TANDEM_FAKE_GPUS entry 1: empty field (a stray ',')"},
        {"uuid=a,total_mb=10,", "TANDEM_FAKE_GPUS entry 1: empty field (a stray ',')"},
        {"uuid=,total_mb=10", "TANDEM_FAKE_GPUS entry 1: empty uuid"},
        {"uuid=a,total_mb=10;pid=0,gpu=a",
         "TANDEM_FAKE_GPUS entry 2: pid '0' is not a positive whole number"},
        {"uuid=a,total_mb=10;pid=4294967296,gpu=a",
         "TANDEM_FAKE_GPUS entry 2: pid '4294967296' is not a positive whole number"},
        {"uuid=a,total_mb=10;pid=3", "TANDEM_FAKE_GPUS entry 2: process entry without gpu=UUID"},
        {"uuid=a,total_mb=10;pid=3,gpu=a,used_mb=x",
         "TANDEM_FAKE_GPUS entry 2: used_mb 'x' is not a whole number of MiB"},
        {"uuid=a,total_mb=10;pid=3,gpu=a;pid=3,gpu=a",
         "TANDEM_FAKE_GPUS entry 3: pid 3 is listed twice on gpu 'a'"},
        {"uuid=a,total_mb=10;pid=3,gpu=a,used_mb=6;pid=4,gpu=a,used_mb=5",
         "TANDEM_FAKE_GPUS entry 3: processes on gpu 'a' use 11 MiB, more than its total_mb 10"},
        {"pid=3,gpu=a,used_mb=6;uuid=a,total_mb=10,used_mb=5",
         "TANDEM_FAKE_GPUS entry 2: used_mb 5 is less than the 6 MiB its processes use"},
        {"uuid=a,total_mb=10\n\n  # comment\nuuid=b,total_mb=1,bogus=1",
         "TANDEM_FAKE_GPUS entry 2: unknown key 'bogus' (a GPU entry takes uuid, name, total_mb, "
         "memory, used_mb, compute_mode)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("TANDEM_FAKE_GPUS", cases[i].spec, 1);
        tdm_inventory inv;
        tdm_error err = {0};
        tdm_status st = tdm_inventory_query(&inv, &err);
        if (st != TDM_ERR_INVALID || strcmp(err.message, cases[i].message) != 0)
            fail_msg("spec '%s': status %d, message '%s', want '%s'", cases[i].spec, st,
                     err.message, cases[i].message);
        assert_int_equal(inv.n_gpus, 0); /* an error leaves an empty, freeable inventory */
        tdm_inventory_free(&inv);
    }

    /* Names and UUIDs longer than the struct holds are refused, not truncated. */
    char spec[400];
    snprintf(spec, sizeof spec, "uuid=GPU-%0120d,total_mb=1", 0);
    tdm_gpu *gpus;
    size_t n;
    tdm_error err = {0};
    assert_int_equal(tdm_fake_gpus_parse(spec, NULL, &gpus, &n, &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "TANDEM_FAKE_GPUS entry 1: uuid longer than 95 characters");
    assert_null(gpus);
    snprintf(spec, sizeof spec, "uuid=a,total_mb=1,name=%0120d", 0);
    assert_int_equal(tdm_fake_gpus_parse(spec, NULL, &gpus, &n, &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "TANDEM_FAKE_GPUS entry 1: name longer than 95 characters");
}

static void write_file(const char *path, const char *text)
{
    tdm_error err = {0};
    if (tdm_atomic_write(path, text, strlen(text), 0644, &err) != TDM_OK)
        fail_msg("%s", err.message);
}

/* "@file" is read at every query: a test changes the simulated world between two queries. */
static void test_fake_file_reread(void **state)
{
    char path[512], value[520];
    snprintf(path, sizeof path, "%s/gpus.txt", tmpdir);
    snprintf(value, sizeof value, "@%s", path);
    write_file(path, "# simulated box\nuuid=GPU-f0,name=Sim,total_mb=24000\n");
    setenv("TANDEM_FAKE_GPUS", value, 1);

    tdm_inventory inv;
    query_ok(&inv);
    assert_int_equal(inv.n_gpus, 1);
    assert_int_equal(inv.gpus[0].free_mb, 24000);
    tdm_inventory_free(&inv);

    /* A foreign program appears and takes 5000 MiB. */
    write_file(path, "uuid=GPU-f0,name=Sim,total_mb=24000\npid=4242,gpu=GPU-f0,used_mb=5000\n");
    query_ok(&inv);
    assert_int_equal(inv.gpus[0].free_mb, 19000);
    assert_int_equal(tdm_gpu_process_used_mb(&inv.gpus[0], 4242), 5000);
    tdm_inventory_free(&inv);

    /* Errors in the file name FILE:LINE as well as the entry. */
    write_file(path, "uuid=GPU-f0,total_mb=24000\n\n# c\npid=1,gpu=GPU-zz\n");
    tdm_error err = {0};
    assert_int_equal(tdm_inventory_query(&inv, &err), TDM_ERR_INVALID);
    char want[700];
    snprintf(want, sizeof want, "%s:4: TANDEM_FAKE_GPUS entry 2: process on unknown gpu 'GPU-zz'",
             path);
    assert_string_equal(err.message, want);
    tdm_inventory_free(&inv);

    /* A missing file is an error naming it. */
    unlink(path);
    assert_int_equal(tdm_inventory_query(&inv, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, path));
    tdm_inventory_free(&inv);
}

/* The uuids of the inventory, comma separated, for compact assertions. */
static const char *uuids(const tdm_inventory *inv)
{
    static char buf[512];
    buf[0] = '\0';
    for (size_t i = 0; i < inv->n_gpus; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? "," : "",
                 inv->gpus[i].uuid);
    return buf;
}

static void test_cuda_visible_devices(void **state)
{
    static const struct {
        const char *cvd;  /* NULL: unset */
        const char *want; /* uuids kept, in order */
        const char *note; /* substring of the note, "" for an empty note */
    } cases[] = {
        {NULL, "GPU-8c2e0000-aaaa,GPU-8c2e1111-bbbb,GPU-77aa,GPU-77bb", ""},
        {"2,0", "GPU-77aa,GPU-8c2e0000-aaaa", ""},
        {" 3 , 1 ", "GPU-77bb,GPU-8c2e1111-bbbb", ""},
        {"GPU-77bb,GPU-8c2e0000-aaaa", "GPU-77bb,GPU-8c2e0000-aaaa", ""},
        {"GPU-8c2e1,GPU-77a", "GPU-8c2e1111-bbbb,GPU-77aa", ""}, /* unique prefixes */
        {"1,GPU-8c2e,3", "GPU-8c2e1111-bbbb", "entry 2 ('GPU-8c2e') names no GPU"}, /* ambiguous */
        {"0,7,1", "GPU-8c2e0000-aaaa", "entry 2 ('7') names no GPU"},
        {"1,1,2", "GPU-8c2e1111-bbbb", "entry 2 ('1')"},
        {"0,,1", "GPU-8c2e0000-aaaa", "entry 2 ('')"},
        {"0,", "GPU-8c2e0000-aaaa", "entry 2 ('')"},
        {"-1", "", "entry 1 ('-1') names no GPU"},
        {"MIG-0000", "", "entry 1 ('MIG-0000')"},
        {"", "", "CUDA_VISIBLE_DEVICES is empty"},
    };
    setenv("TANDEM_FAKE_GPUS", FOUR, 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].cvd)
            setenv("CUDA_VISIBLE_DEVICES", cases[i].cvd, 1);
        else
            unsetenv("CUDA_VISIBLE_DEVICES");
        tdm_inventory inv;
        query_ok(&inv);
        if (strcmp(uuids(&inv), cases[i].want) != 0)
            fail_msg("CUDA_VISIBLE_DEVICES='%s': got '%s', want '%s'", cases[i].cvd, uuids(&inv),
                     cases[i].want);
        if (cases[i].note[0] ? !strstr(inv.note, cases[i].note) : inv.note[0] != '\0')
            fail_msg("CUDA_VISIBLE_DEVICES='%s': note '%s', want '%s'", cases[i].cvd, inv.note,
                     cases[i].note);
        tdm_inventory_free(&inv);
    }

    /* The displayed index stays the original one: GPU 2 is still "2" when listed first. */
    setenv("CUDA_VISIBLE_DEVICES", "2", 1);
    tdm_inventory inv;
    query_ok(&inv);
    assert_int_equal(inv.gpus[0].index, 2);
    assert_ptr_equal(tdm_inventory_find(&inv, "2"), &inv.gpus[0]);
    assert_null(tdm_inventory_find(&inv, "0"));
    tdm_inventory_free(&inv);

    /* The selector on its own: an unset variable keeps everything, even with no note buffer. */
    tdm_gpu two[2] = {{.uuid = "x", .index = 0}, {.uuid = "y", .index = 1}};
    size_t picked[2], n_picked;
    tdm_visible_devices_select(NULL, two, 2, picked, &n_picked, NULL, 0);
    assert_int_equal(n_picked, 2);
    tdm_visible_devices_select("y,x", two, 2, picked, &n_picked, NULL, 0);
    assert_int_equal(n_picked, 2);
    assert_int_equal(picked[0], 1);
    assert_int_equal(picked[1], 0);
}

static void test_find(void **state)
{
    setenv("TANDEM_FAKE_GPUS", FOUR, 1);
    tdm_inventory inv;
    query_ok(&inv);
    assert_ptr_equal(tdm_inventory_find(&inv, "GPU-77aa"), &inv.gpus[2]);
    assert_ptr_equal(tdm_inventory_find(&inv, "GPU-8c2e0"), &inv.gpus[0]); /* unique prefix */
    assert_ptr_equal(tdm_inventory_find(&inv, "GPU-77b"), &inv.gpus[3]);
    assert_null(tdm_inventory_find(&inv, "GPU-8c2e")); /* ambiguous */
    assert_null(tdm_inventory_find(&inv, "GPU-"));     /* ambiguous */
    assert_null(tdm_inventory_find(&inv, "GPU-99"));
    assert_ptr_equal(tdm_inventory_find(&inv, "0"), &inv.gpus[0]);
    assert_ptr_equal(tdm_inventory_find(&inv, "3"), &inv.gpus[3]);
    assert_null(tdm_inventory_find(&inv, "4"));
    assert_null(tdm_inventory_find(&inv, "99999999999999999999"));
    assert_null(tdm_inventory_find(&inv, ""));
    assert_null(tdm_inventory_find(&inv, NULL));
    tdm_inventory_free(&inv);

    /* An exact UUID wins over a longer one it prefixes. */
    setenv("TANDEM_FAKE_GPUS", "uuid=GPU-1,total_mb=1;uuid=GPU-10,total_mb=1", 1);
    query_ok(&inv);
    assert_ptr_equal(tdm_inventory_find(&inv, "GPU-1"), &inv.gpus[0]);
    assert_ptr_equal(tdm_inventory_find(&inv, "GPU-10"), &inv.gpus[1]);
    tdm_inventory_free(&inv);
}

static void test_meminfo_parse(void **state)
{
    int64_t total, avail;
    tdm_error err = {0};
    const char *good = "MemTotal:       16093724 kB\n"
                       "MemFree:         1234567 kB\n"
                       "MemAvailable:    9876543 kB\n"
                       "HugePages_Total:       0\n"
                       "Hugepagesize:       2048 kB\n";
    assert_int_equal(tdm_meminfo_parse(good, NULL, &total, &avail, &err), TDM_OK);
    assert_int_equal(total, 16093724 / 1024); /* kB (KiB) to MiB, rounded down */
    assert_int_equal(avail, 9876543 / 1024);

    /* No MemAvailable (kernel < 3.14): MemFree, order of lines irrelevant, no final newline. */
    assert_int_equal(
        tdm_meminfo_parse("MemFree: 2048 kB\nMemTotal: 4096 kB", NULL, &total, &avail, &err),
        TDM_OK);
    assert_int_equal(total, 4);
    assert_int_equal(avail, 2);

    assert_int_equal(tdm_meminfo_parse("MemFree: 2048 kB\n", "mi", &total, &avail, &err),
                     TDM_ERR_PARSE);
    assert_string_equal(err.message, "mi: no MemTotal line");
    assert_int_equal(tdm_meminfo_parse("MemTotal: 2048 kB\n", "mi", &total, &avail, &err),
                     TDM_ERR_PARSE);
    assert_string_equal(err.message, "mi: neither MemAvailable nor MemFree");
    assert_int_equal(
        tdm_meminfo_parse("MemTotal: 1 kB\nMemAvailable: 12 MB\n", "mi", &total, &avail, &err),
        TDM_ERR_PARSE);
    assert_string_equal(err.message, "mi:2: expected '<number> kB' after 'MemAvailable:'");
    assert_int_equal(tdm_meminfo_parse("MemTotal: lots kB\n", NULL, &total, &avail, &err),
                     TDM_ERR_PARSE);
    assert_string_equal(err.message, "meminfo:1: expected '<number> kB' after 'MemTotal:'");
    assert_int_equal(
        tdm_meminfo_parse("MemTotal: 99999999999999999999999 kB\n", NULL, &total, &avail, &err),
        TDM_ERR_PARSE);

    /* From a file (the seam unified-memory GPUs use), and the real one. */
    char path[512];
    snprintf(path, sizeof path, "%s/meminfo", tmpdir);
    write_file(path, good);
    assert_int_equal(tdm_meminfo_read(path, &total, &avail, &err), TDM_OK);
    assert_int_equal(total, 15716);
    assert_int_equal(avail, 9645);
    unlink(path);
    assert_int_equal(tdm_meminfo_read(path, &total, &avail, &err), TDM_ERR_NOT_FOUND);
    assert_int_equal(tdm_meminfo_read(NULL, &total, &avail, &err), TDM_OK);
    assert_true(total > 0);
    assert_true(avail > 0 && avail <= total);
}

static void test_unified_names(void **state)
{
    assert_true(tdm_gpu_name_is_unified("Orin (nvgpu)"));
    assert_true(tdm_gpu_name_is_unified("NVIDIA Jetson AGX Orin"));
    assert_true(tdm_gpu_name_is_unified("NVIDIA GB10"));
    assert_true(tdm_gpu_name_is_unified("nvidia tegra x1"));
    assert_true(tdm_gpu_name_is_unified("NVIDIA Jetson Xavier NX"));
    assert_false(tdm_gpu_name_is_unified("NVIDIA GB100"));
    assert_false(tdm_gpu_name_is_unified("NVIDIA GB200"));
    assert_false(tdm_gpu_name_is_unified("NVIDIA H200"));
    assert_false(tdm_gpu_name_is_unified("NVIDIA GeForce RTX 4090"));
    assert_false(tdm_gpu_name_is_unified("Morin")); /* whole words only */
    assert_false(tdm_gpu_name_is_unified(""));
}

/* Without TANDEM_FAKE_GPUS and without NVML: an empty inventory, source "none", a note, TDM_OK. */
static void test_no_nvml(void **state)
{
    tdm_inventory inv;
    tdm_error err = {0};
    tdm_inventory_options opts = {.nvml_library = "libtandem-test-no-such-nvml.so.1"};
    assert_int_equal(tdm_inventory_query_with(&inv, &opts, &err), TDM_OK);
    assert_int_equal(inv.n_gpus, 0);
    assert_null(inv.gpus);
    assert_string_equal(inv.source, "none");
    assert_non_null(strstr(inv.note, "libtandem-test-no-such-nvml.so.1 not found"));
    assert_string_equal(inv.driver_version, "");
    tdm_inventory_free(&inv);

    /* The real default path, on a machine that has no libnvidia-ml (like the build machine). */
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        dlclose(lib);
        return; /* NVML is here: test_inventory_nvml covers this machine */
    }
    assert_int_equal(tdm_inventory_query(&inv, &err), TDM_OK);
    assert_int_equal(inv.n_gpus, 0);
    assert_string_equal(inv.source, "none");
    assert_non_null(strstr(inv.note, "libnvidia-ml.so.1 not found"));
    tdm_inventory_free(&inv);
}

/* Replays the fuzz corpus (seeds and any crash the fuzzer found, saved there as a regression)
 * through the parser with the fuzz target's invariants, so fuzz findings stay fixed in the normal
 * build. */
static void test_fuzz_corpus(void **state)
{
    const char *dir_path = TANDEM_SOURCE_DIR "/tests/fuzz/corpus/fake_gpus";
    DIR *dir = opendir(dir_path);
    assert_non_null(dir);
    int replayed = 0;
    for (struct dirent *de; (de = readdir(dir));) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir_path, de->d_name);
        char *text;
        tdm_error err = {0};
        assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
        tdm_gpu *gpus;
        size_t n;
        tdm_status st = tdm_fake_gpus_parse(text, path, &gpus, &n, &err);
        if (st == TDM_OK) {
            for (size_t i = 0; i < n; i++) {
                assert_true(gpus[i].uuid[0] != '\0');
                assert_true(gpus[i].used_mb >= 0 && gpus[i].used_mb <= gpus[i].total_mb);
                assert_int_equal(gpus[i].free_mb, gpus[i].total_mb - gpus[i].used_mb);
            }
        } else {
            assert_int_equal(st, TDM_ERR_INVALID);
            assert_null(gpus);
            assert_true(err.message[0] != '\0');
        }
        tdm_gpu_list_free(gpus, n);
        free(text);
        replayed++;
    }
    closedir(dir);
    assert_true(replayed >= 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fake_parse_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_empty_spec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_file_reread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_visible_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meminfo_parse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unified_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_nvml, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fuzz_corpus, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
