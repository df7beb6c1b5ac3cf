/* Unit tests of the transport's remote-path guard (issue 13, item 1): every remote path a copy
 * is handed must be absolute, free of "..", and strictly inside the node's workdir; push and pull
 * refuse anything else before rsync, scp or cp runs. The push/pull cases use a real local-
 * transport node and real files: a refused copy must leave nothing behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/cluster_config.h"
#include "cluster/transport.h"

static tdm_cluster_node node_with_workdir(char *workdir)
{
    return (tdm_cluster_node){.name = "n1",
                              .transport = TDM_TRANSPORT_LOCAL,
                              .workdir = workdir,
                              .tandem = "tandem",
                              .max_adapters = 1};
}

static void expect_refused(const tdm_cluster_node *node, const char *path, const char *why)
{
    tdm_error err = {0};
    assert_int_equal(tdm_transport_check_remote_path(node, path, &err), TDM_ERR_INVALID);
    if (!strstr(err.message, why))
        fail_msg("'%s': message '%s' lacks '%s'", path ? path : "(null)", err.message, why);
    assert_non_null(strstr(err.message, "n1"));
}

static void expect_allowed(const tdm_cluster_node *node, const char *path)
{
    tdm_error err = {0};
    if (tdm_transport_check_remote_path(node, path, &err) != TDM_OK)
        fail_msg("'%s' refused: %s", path, err.message);
}

static void test_guard_rules(void **state)
{
    (void)state;
    tdm_cluster_node n = node_with_workdir("/home/ana/tandem-work");
    expect_refused(&n, NULL, "empty remote path");
    expect_refused(&n, "", "empty remote path");
    expect_refused(&n, "out/a", "relative remote path");
    expect_refused(&n, "./out/a", "relative remote path");
    expect_refused(&n, "~/tandem-work/out/a", "relative remote path");
    expect_refused(&n, "/home/ana/tandem-work/../.ssh", "'..'");
    expect_refused(&n, "/home/ana/tandem-work/out/../../x", "'..'");
    expect_refused(&n, "/home/ana/tandem-work/out/..", "'..'");
    expect_refused(&n, "/home/ana", "not inside the node's workdir");
    expect_refused(&n, "/home/ana/tandem-work", "not inside the node's workdir");
    expect_refused(&n, "/home/ana/tandem-work/", "not inside the node's workdir");
    expect_refused(&n, "/home/ana/tandem-work/.", "not inside the node's workdir");
    expect_refused(&n, "/home/ana/tandem-work2/out", "not inside the node's workdir");
    expect_refused(&n, "/home/ana/tandem-wor", "not inside the node's workdir");
    expect_refused(&n, "/tmp/absolute-out-c", "not inside the node's workdir");
    expect_refused(&n, "/", "not inside the node's workdir");
    expect_allowed(&n, "/home/ana/tandem-work/out/a");
    expect_allowed(&n, "/home/ana/tandem-work/jobs/n1-1/adapters.toml");
    expect_allowed(&n, "//home//ana/./tandem-work//out/a/");
    expect_allowed(&n, "/home/ana/tandem-work/..hidden"); /* a name, not a parent step */

    /* A workdir written with a trailing slash or "." compares the same. */
    tdm_cluster_node slash = node_with_workdir("/home/ana/tandem-work/./");
    expect_allowed(&slash, "/home/ana/tandem-work/out/a");
    expect_refused(&slash, "/home/ana/tandem-work", "not inside the node's workdir");

    /* A workdir of "/" would allow every path: no copy at all. */
    tdm_cluster_node root = node_with_workdir("/");
    expect_refused(&root, "/etc/passwd", "not inside the node's workdir");
}

/* push and pull through a real (local) transport: refused before cp runs, nothing copied. */
static void test_push_pull_refuse_before_copying(void **state)
{
    (void)state;
    char base[] = "/tmp/tdm-guard-XXXXXX";
    assert_non_null(mkdtemp(base));
    char workdir[64], secret[64], inside[128], dest[64], cmd[600];
    snprintf(workdir, sizeof workdir, "%s/work", base);
    snprintf(secret, sizeof secret, "%s/secret", base);
    snprintf(inside, sizeof inside, "%s/out-a", workdir);
    snprintf(dest, sizeof dest, "%s/dest", base);
    assert_int_equal(mkdir(workdir, 0700), 0);
    assert_int_equal(mkdir(secret, 0700), 0);
    assert_int_equal(mkdir(inside, 0700), 0);
    FILE *f = fopen(strcat(strcpy(cmd, secret), "/key"), "w");
    assert_non_null(f);
    fputs("private\n", f);
    fclose(f);
    f = fopen(strcat(strcpy(cmd, inside), "/adapter"), "w");
    assert_non_null(f);
    fputs("weights\n", f);
    fclose(f);

    tdm_cluster_node node = node_with_workdir(workdir);
    tdm_transport t;
    tdm_error err = {0};
    assert_int_equal(tdm_transport_init(&t, &node, NULL, &err), TDM_OK);
    struct stat st;
    const char *bad[] = {secret, "", "secret", workdir, "/tmp/../tmp"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char escape[300];
        snprintf(escape, sizeof escape, "%s/../secret", workdir);
        const char *path = i == 4 ? escape : bad[i];
        memset(&err, 0, sizeof err);
        assert_int_equal(tdm_transport_pull(&t, path, dest, &err), TDM_ERR_INVALID);
        if (stat(dest, &st) == 0) fail_msg("pull of '%s' copied something into %s", path, dest);
        memset(&err, 0, sizeof err);
        assert_int_equal(tdm_transport_push(&t, inside, path, &err), TDM_ERR_INVALID);
    }
    /* Nothing was pushed over the secret or next to it. */
    snprintf(cmd, sizeof cmd, "%s/adapter", secret);
    assert_int_not_equal(stat(cmd, &st), 0);

    /* Inside the workdir the copy happens. */
    memset(&err, 0, sizeof err);
    assert_int_equal(tdm_transport_pull(&t, inside, dest, &err), TDM_OK);
    snprintf(cmd, sizeof cmd, "%s/adapter", dest);
    assert_int_equal(stat(cmd, &st), 0);

    snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", base);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard_rules),
        cmocka_unit_test(test_push_pull_refuse_before_copying),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
