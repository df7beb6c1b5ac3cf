/* Unit tests of src/util: errors, fault points, atomic writes, RFC 3339, usable CPUs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/atomic_file.h"
#include "util/cgroup.h"
#include "util/cpu_count.h"
#include "util/error.h"
#include "util/fault.h"
#include "util/json_file.h"
#include "util/mkdir_p.h"
#include "util/timeutil.h"

static char tmpdir[256];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-util-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_error_prefix(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_fail(&err, TDM_ERR_PARSE, "line %d: bad", 3), TDM_ERR_PARSE);
    tdm_error_prefix(&err, "%s", "cfg.toml");
    assert_string_equal(err.message, "cfg.toml: line 3: bad");
    assert_string_equal(tdm_status_str(TDM_ERR_TIMEOUT), "timed out");
}

static void test_fault_points(void **state)
{
    unsetenv("TANDEM_FAULT_INJECT");
    assert_false(tdm_fault("a.b"));
    setenv("TANDEM_FAULT_INJECT", "x.y,a.b", 1);
    assert_true(tdm_fault("a.b"));
    assert_true(tdm_fault("x.y"));
    assert_false(tdm_fault("a"));
    assert_false(tdm_fault("a.bc"));
    unsetenv("TANDEM_FAULT_INJECT");
}

static void test_atomic_write_roundtrip_and_mode(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s/data.json", tmpdir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, "{\"a\":1}", 7, 0600, &err), TDM_OK);
    char *buf;
    size_t len;
    assert_int_equal(tdm_read_file(path, &buf, &len, &err), TDM_OK);
    assert_int_equal(len, 7);
    assert_string_equal(buf, "{\"a\":1}");
    free(buf);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
}

/* tdm_atomic_write_json writes exactly json_dumps(doc, flags) (plus "\n" when asked) with the
 * given mode, and a NULL document (a failed build of it) is an out-of-memory error naming the file.
 */
static void test_atomic_write_json_bytes_and_mode(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s/doc.json", tmpdir);
    json_t *doc = json_pack("{s:i,s:[s,f]}", "b", 1, "a", "x", 0.5);
    assert_non_null(doc);
    tdm_error err = {0};
    char *buf;
    size_t len;
    struct stat st;

    assert_int_equal(
        tdm_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER, true, 0640, &err),
        TDM_OK);
    assert_int_equal(tdm_read_file(path, &buf, &len, &err), TDM_OK);
    assert_string_equal(buf, "{\n  \"b\": 1,\n  \"a\": [\n    \"x\",\n    0.5\n  ]\n}\n");
    free(buf);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);

    assert_int_equal(
        tdm_atomic_write_json(path, doc, JSON_COMPACT | JSON_SORT_KEYS, false, 0600, &err), TDM_OK);
    assert_int_equal(tdm_read_file(path, &buf, &len, &err), TDM_OK);
    assert_string_equal(buf, "{\"a\":[\"x\",0.5],\"b\":1}");
    free(buf);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    char *line = tdm_json_dumps_line(doc, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(line, "{\"a\":[\"x\",0.5],\"b\":1}\n");
    free(line);
    json_decref(doc);

    assert_int_equal(tdm_atomic_write_json(path, NULL, JSON_COMPACT, false, 0600, &err),
                     TDM_ERR_NOMEM);
    assert_non_null(strstr(err.message, "doc.json"));
    assert_null(tdm_json_dumps_line(NULL, JSON_COMPACT));
}

/* A hard link planted at the temp name (".<name>.tmp-<pid>") is never truncated or written through
 * (it used to be: O_TRUNC without O_EXCL), and the write fails naming the temp file; a leftover of
 * ours (a regular file we own, one link) is replaced and the write succeeds. */
static void test_atomic_write_refuses_planted_temp(void **state)
{
    char path[512], tmp[600], victim[512];
    snprintf(path, sizeof path, "%s/planted.json", tmpdir);
    snprintf(tmp, sizeof tmp, "%s/.planted.json.tmp-%ld", tmpdir, (long)getpid());
    snprintf(victim, sizeof victim, "%s/victim", tmpdir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(victim, "precious", 8, 0644, &err), TDM_OK);
    assert_int_equal(link(victim, tmp), 0);
    assert_int_equal(tdm_atomic_write(path, "new", 3, 0600, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, tmp));
    char *buf;
    assert_int_equal(tdm_read_file(victim, &buf, NULL, &err), TDM_OK);
    assert_string_equal(buf, "precious");
    free(buf);
    struct stat st;
    assert_int_equal(stat(victim, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(access(path, F_OK), -1);
    /* A symbolic link there is refused too. */
    assert_int_equal(unlink(tmp), 0);
    assert_int_equal(symlink(victim, tmp), 0);
    assert_int_equal(tdm_atomic_write(path, "new", 3, 0600, &err), TDM_ERR_IO);
    assert_int_equal(tdm_read_file(victim, &buf, NULL, &err), TDM_OK);
    assert_string_equal(buf, "precious");
    free(buf);
    /* Our own leftover (say, from a previous process with our pid that was killed) is replaced. */
    assert_int_equal(unlink(tmp), 0);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs("half a wri", f);
    fclose(f);
    assert_int_equal(tdm_atomic_write(path, "new", 3, 0600, &err), TDM_OK);
    assert_int_equal(tdm_read_file(path, &buf, NULL, &err), TDM_OK);
    assert_string_equal(buf, "new");
    free(buf);
    assert_int_equal(access(tmp, F_OK), -1);
}

/* Each injected failure leaves the old content intact and no temp file behind. */
static void test_atomic_write_failures_keep_old_content(void **state)
{
    const char *points[] = {"atomic_write.open", "atomic_write.write", "atomic_write.fsync",
                            "atomic_write.rename"};
    char path[512];
    snprintf(path, sizeof path, "%s/keep.json", tmpdir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, "old", 3, 0600, &err), TDM_OK);
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        setenv("TANDEM_FAULT_INJECT", points[i], 1);
        assert_int_equal(tdm_atomic_write(path, "new content", 11, 0600, &err), TDM_ERR_IO);
        assert_non_null(strstr(err.message, "Input/output error"));
        unsetenv("TANDEM_FAULT_INJECT");
        char *buf;
        assert_int_equal(tdm_read_file(path, &buf, NULL, &err), TDM_OK);
        assert_string_equal(buf, "old");
        free(buf);
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s/.keep.json.tmp-%ld", tmpdir, (long)getpid());
        assert_int_not_equal(access(tmp, F_OK), 0);
    }
}

static void test_read_missing_file(void **state)
{
    tdm_error err = {0};
    char *buf;
    assert_int_equal(tdm_read_file("/nonexistent/x", &buf, NULL, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "/nonexistent/x"));
}

static void test_rfc3339(void **state)
{
    char buf[32];
    tdm_format_rfc3339(1795987826, buf, sizeof buf);
    assert_string_equal(buf, "2026-11-29T21:30:26Z");
    time_t t;
    assert_true(tdm_parse_rfc3339(buf, &t));
    assert_int_equal(t, 1795987826);
    assert_true(tdm_parse_rfc3339("2026-11-29T21:30:26.123+00:00", &t));
    assert_int_equal(t, 1795987826);
    assert_false(tdm_parse_rfc3339("2026-11-29 21:30:26", &t));
    assert_false(tdm_parse_rfc3339("2026-11-29T21:30:26+02:00", &t));
}

/* mkdir -p: nested components created with the mode, existing ones fine, a component that is a
 * file named in the error, an over-long path refused. */
static void test_mkdir_p(void **state)
{
    (void)state;
    char path[512], file[512];
    tdm_error err = {0};
    snprintf(path, sizeof path, "%s/mk/a/b/c", tmpdir);
    assert_int_equal(tdm_mkdir_p(path, 0700, &err), TDM_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(tdm_mkdir_p(path, 0700, &err), TDM_OK); /* again: fine */
    snprintf(file, sizeof file, "%s/mk/file", tmpdir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/mk/file/sub", tmpdir);
    assert_int_equal(tdm_mkdir_p(path, 0700, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, "cannot create directory"));
    assert_non_null(strstr(err.message, "/mk/file/sub"));
    char *huge = malloc(5000);
    memset(huge, 'a', 4999);
    huge[0] = '/';
    huge[4999] = 0;
    assert_int_equal(tdm_mkdir_p(huge, 0700, &err), TDM_ERR_INVALID);
    free(huge);
}

/* cgroup memory limits as their files hold them (v2 memory.max, v1 memory.limit_in_bytes). */
static void test_cgroup_memory_parse(void **state)
{
    assert_int_equal(tdm_cgroup_memory_parse("max\n"), 0);
    assert_int_equal(tdm_cgroup_memory_parse("1073741824\n"), 1073741824ULL);
    assert_int_equal(tdm_cgroup_memory_parse("9223372036854771712\n"), 0); /* v1: no limit */
    assert_int_equal(tdm_cgroup_memory_parse(""), 0);
    assert_int_equal(tdm_cgroup_memory_parse("0\n"), 0);
    assert_int_equal(tdm_cgroup_memory_parse("12ab"), 0);
    assert_int_equal(tdm_cgroup_memory_parse("-5"), 0);
    assert_int_equal(tdm_cgroup_memory_parse(NULL), 0);
    /* this process's: none, or a limit a process can live in */
    uint64_t lim = tdm_cgroup_memory_limit();
    assert_true(lim == 0 || lim >= (1u << 20));
}

/* cgroup CPU limits as their files hold them, and the affinity mask cutting the count. */
static void test_cpu_count(void **state)
{
    assert_int_equal(tdm_cpu_quota_parse("max 100000\n", NULL), 0);
    assert_int_equal(tdm_cpu_quota_parse("200000 100000\n", NULL), 2);
    assert_int_equal(tdm_cpu_quota_parse("150000 100000", NULL), 2); /* 1.5 CPUs: 2 threads */
    assert_int_equal(tdm_cpu_quota_parse("50000 100000", NULL), 1);
    assert_int_equal(tdm_cpu_quota_parse("-1\n", "100000\n"), 0); /* v1: no limit */
    assert_int_equal(tdm_cpu_quota_parse("400000\n", "100000\n"), 4);
    assert_int_equal(tdm_cpu_quota_parse("garbage", NULL), 0);
    assert_int_equal(tdm_cpu_quota_parse("100000 0", NULL), 0);
    tdm_cpu_count c = tdm_cpu_usable();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(c.usable >= 1 && c.affinity >= 1 && c.affinity <= online);
    assert_true(c.usable <= c.affinity && (c.quota == 0 || c.usable <= c.quota));
    /* one CPU in the mask: one thread, whatever the host has */
    cpu_set_t saved, one;
    assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
    int first = 0;
    while (!CPU_ISSET(first, &saved))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    tdm_cpu_count c1 = tdm_cpu_usable();
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    assert_int_equal(c1.affinity, 1);
    assert_int_equal(c1.usable, 1);
    printf("  usable CPUs %d (affinity %d, cgroup quota %d); with one CPU in the mask: %d\n",
           c.usable, c.affinity, c.quota, c1.usable);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_prefix),
        cmocka_unit_test(test_mkdir_p),
        cmocka_unit_test(test_fault_points),
        cmocka_unit_test(test_atomic_write_roundtrip_and_mode),
        cmocka_unit_test(test_atomic_write_json_bytes_and_mode),
        cmocka_unit_test(test_atomic_write_refuses_planted_temp),
        cmocka_unit_test(test_atomic_write_failures_keep_old_content),
        cmocka_unit_test(test_read_missing_file),
        cmocka_unit_test(test_rfc3339),
        cmocka_unit_test(test_cgroup_memory_parse),
        cmocka_unit_test(test_cpu_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
