/* Unit tests of src/cluster: shell quoting (also round-tripped through a real /bin/sh), the
 * cluster.yaml parser's defaults and positions, speed factors, placement scoring, the validation
 * loss a leaderboard ranks by, a Slurm job array's script run by a real /bin/sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_config.h"
#include "cluster/coordinator.h"
#include "cluster/placement.h"
#include "cluster/shell_quote.h"
#include "cluster/slurm.h"
#include "cluster/spawn.h"
#include "cluster/speed.h"

static void test_quote(void **state)
{
    char *q = tdm_shell_quote("");
    assert_string_equal(q, "''");
    free(q);
    q = tdm_shell_quote("it's");
    assert_string_equal(q, "'it'\\''s'");
    free(q);
    q = tdm_shell_quote("$(x) `y` ; * \n");
    assert_string_equal(q, "'$(x) `y` ; * \n'");
    free(q);
    const char *argv[] = {"a b", "", "'"};
    char *j = tdm_shell_join(argv, 3);
    assert_string_equal(j, "'a b' '' ''\\'''");
    free(j);
}

/* The joined line, parsed by a real sh, gives back the exact arguments and runs nothing. */
static void test_quote_through_sh(void **state)
{
    const char *hostile[] = {"plain", "", "two words", "it's", "\"dq\"", "$(touch /tmp/tdm-canary-q)",
                             "`touch /tmp/tdm-canary-q`", "; touch /tmp/tdm-canary-q", "a\nb",
                             "*", "?[x]", "\\", "'''", "$HOME", "-n", "\t", "&|<>"};
    size_t n = sizeof hostile / sizeof *hostile;
    char *line = tdm_shell_join(hostile, n);
    assert_non_null(line);
    size_t len = strlen(line) + 64;
    char *script = malloc(len);
    snprintf(script, len, "printf '%%s\\0' %s", line);
    const char *argv[] = {"sh", "-c", script, NULL};
    tdm_spawn_result res;
    tdm_error err = {0};
    remove("/tmp/tdm-canary-q");
    assert_int_equal(tdm_spawn_run(argv, NULL, 0, 10000, &res, &err), TDM_OK);
    assert_int_equal(res.exit_code, 0);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(off + strlen(hostile[i]) < res.out_len + 1);
        assert_memory_equal(res.out + off, hostile[i], strlen(hostile[i]) + 1);
        off += strlen(hostile[i]) + 1;
    }
    assert_int_equal(off, res.out_len);
    assert_null(fopen("/tmp/tdm-canary-q", "r"));
    tdm_spawn_result_free(&res);
    free(script);
    free(line);
}

static void test_spawn_stdin_timeout_missing(void **state)
{
    const char *cat[] = {"cat", NULL};
    tdm_spawn_result res;
    tdm_error err = {0};
    assert_int_equal(tdm_spawn_run(cat, "abc", 3, 5000, &res, &err), TDM_OK);
    assert_string_equal(res.out, "abc");
    tdm_spawn_result_free(&res);
    const char *slow[] = {"sleep", "5", NULL};
    assert_int_equal(tdm_spawn_run(slow, NULL, 0, 100, &res, &err), TDM_OK);
    assert_true(res.timed_out);
    assert_int_equal(res.exit_code, 128 + 9);
    tdm_spawn_result_free(&res);
    const char *none[] = {"/nonexistent/program", NULL};
    assert_int_equal(tdm_spawn_run(none, NULL, 0, 1000, &res, &err), TDM_OK);
    assert_int_equal(res.exit_code, 127);
    tdm_spawn_result_free(&res);
    assert_string_equal(tdm_text_tail("a\nb\nc\n", 6, 2), "b\nc\n");
}

static void test_config_defaults_and_paths(void **state)
{
    const char *y = "ssh_config: conf/ssh\n"
                    "nodes:\n"
                    "  - name: desk\n"
                    "    host: 10.0.0.2\n"
                    "    identity_file: keys/id\n"
                    "    workdir: /w\n"
                    "    gpus:\n"
                    "      - {uuid: GPU-1, type: RTX 4090, vram_mb: 24564, memory_type: unified}\n"
                    "    cpu_max_params: 1.5B\n"
                    "  - {name: box, transport: local, workdir: /b, cpu_max_params: 350000000}\n";
    tdm_cluster_config cfg;
    tdm_error err = {0};
    assert_int_equal(tdm_cluster_config_parse(y, strlen(y), "/etc/x/cluster.yaml", &cfg, &err),
                     TDM_OK);
    assert_int_equal(cfg.n_nodes, 2);
    assert_string_equal(cfg.ssh_config, "/etc/x/conf/ssh");
    assert_string_equal(cfg.nodes[0].identity_file, "/etc/x/keys/id");
    assert_string_equal(cfg.nodes[0].tandem, "tandem");
    assert_int_equal(cfg.nodes[0].max_adapters, TDM_CLUSTER_DEFAULT_MAX_ADAPTERS);
    assert_int_equal(cfg.nodes[0].cpu_max_params, 1500000000LL);
    assert_int_equal(cfg.nodes[0].gpus[0].memory_type, TDM_MEMORY_UNIFIED);
    assert_int_equal(cfg.nodes[0].gpus[0].line, 8);
    assert_int_equal(cfg.nodes[0].gpus[0].col, 9);
    assert_int_equal(cfg.nodes[1].transport, TDM_TRANSPORT_LOCAL);
    assert_null(cfg.nodes[1].host);
    assert_int_equal(cfg.nodes[1].cpu_max_params, 350000000LL);
    assert_non_null(tdm_cluster_config_find(&cfg, "box"));
    assert_null(tdm_cluster_config_find(&cfg, "nope"));
    tdm_cluster_config_free(&cfg);

    const char *bad = "nodes:\n  - name: a\n    host: h\n    workdir: /w\n    ram_mb: 0\n";
    assert_int_equal(tdm_cluster_config_parse(bad, strlen(bad), "c.yaml", &cfg, &err),
                     TDM_ERR_INVALID);
    assert_string_equal(err.message, "c.yaml:5:13: ram_mb must be between 1 and 1099511627776, got '0'");
    assert_null(cfg.nodes);
    const char *nul = "nodes: []\n\0";
    assert_int_equal(tdm_cluster_config_parse(nul, 11, "n.yaml", &cfg, &err), TDM_ERR_PARSE);
    assert_string_equal(err.message, "n.yaml:2:1: NUL byte in the file");
}

static void test_speed(void **state)
{
    assert_true(tdm_gpu_speed_factor("NVIDIA GeForce RTX 4090") == 1.0);
    assert_true(tdm_gpu_speed_factor("NVIDIA H200") > tdm_gpu_speed_factor("NVIDIA H100 80GB HBM3"));
    assert_true(tdm_gpu_speed_factor("Orin (nvgpu)") == 0.06);
    assert_true(tdm_gpu_speed_factor("NVIDIA A100-SXM4-80GB") == 1.5);
    assert_true(tdm_gpu_speed_factor("rtx 3090") == 0.55);
    assert_true(tdm_gpu_speed_factor("RTX 4080 SUPER") == 0.75);
    assert_true(tdm_gpu_speed_factor("Mystery GPU") == TDM_SPEED_UNKNOWN_GPU);
    assert_true(tdm_gpu_speed_factor(NULL) == TDM_SPEED_UNKNOWN_GPU);
}

/* a process with k adapters: 1000 + 200 (k - 1) MiB on a GPU, 800 + 200 (k - 1) on a CPU */
static const int64_t GPU_MB[] = {0, 1000, 1200, 1400, 1600};
static const int64_t CPU_MB[] = {0, 800, 1000, 1200, 1400};
static const tdm_place_budget B = {.gpu_mb = GPU_MB, .cpu_mb = CPU_MB};

static void test_place_score_formula(void **state)
{
    tdm_place_gpu g4090 = {"GPU-a", "RTX 4090", 1.0, 20000};
    tdm_place_gpu orin = {"GPU-b", "Orin", 0.06, 30000};
    tdm_place_node nodes[] = {
        {.name = "desk", .reachable = true, .gpus = &g4090, .n_gpus = 1, .max_adapters = 4,
         .active_adapters = 1},
        {.name = "jet", .reachable = true, .gpus = &orin, .n_gpus = 1, .max_adapters = 4},
    };
    tdm_place_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_place(nodes, 2, 1, &B, 1000, &p, &err), TDM_OK);
    /* desk: 20000/1000 x 1.0 x 1/2 = 10; jet: 30000/1000 x 0.06 = 1.8 */
    assert_true(fabs(p.evals[0].score - 10.0) < 1e-9);
    assert_true(fabs(p.evals[1].score - 1.8) < 1e-9);
    assert_int_equal(p.node_of[0], 0);
    tdm_place_plan_free(&p);
}

static void test_place_one_process_per_gpu_and_exclusions(void **state)
{
    tdm_place_gpu big[] = {{"GPU-0", "RTX 3090", 0.55, 5000}, {"GPU-1", "RTX 4090", 1.0, 3000}};
    tdm_place_gpu full = {"GPU-f", "RTX 4090", 1.0, 500};
    tdm_place_node nodes[] = {
        {.name = "two", .reachable = true, .gpus = big, .n_gpus = 2, .max_adapters = 2},
        {.name = "full", .reachable = true, .gpus = &full, .n_gpus = 1, .max_adapters = 8},
        {.name = "down", .reachable = false, .why_unreachable = "Connection refused"},
        {.name = "cpu", .reachable = true, .ram_free_mb = 8000, .max_adapters = 8,
         .cpu_max_params = 350000000},
    };
    tdm_place_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_place(nodes, 4, 3, &B, 100000000, &p, &err), TDM_OK);
    /* adapter 1: GPU-1 (3000/1000 x 1.0 = 3) beats GPU-0 (5 x 0.55 = 2.75) */
    assert_int_equal(p.node_of[0], 0);
    assert_int_equal(p.device_of_node[0], 1);
    assert_int_equal(p.gpu_of[0], 1);
    /* adapter 2: one process per GPU: joining GPU-1's scores (3000-1000)/1000 x 1 x 1/2 = 1.0,
     * a process of its own on GPU-0 5000/1000 x 0.55 x 1/2 = 1.375 (needing base + adapter),
     * both above the CPU node's 0.1 */
    assert_true(fabs(p.evals[1 * 4 + 0].score - 1.375) < 1e-9);
    assert_int_equal(p.evals[1 * 4 + 0].gpu, 0);
    assert_int_equal(p.evals[1 * 4 + 0].need_mb, 1000);
    assert_int_equal(p.node_of[1], 0);
    assert_int_equal(p.gpu_of[1], 0);
    assert_int_equal(p.device_of_node[0], 1); /* the node's first adapter's */
    /* adapter 3: "two" is at max_adapters; the CPU node takes it */
    assert_false(p.evals[2 * 4 + 0].eligible);
    assert_string_equal(p.evals[2 * 4 + 0].why, "max_adapters 2 reached (0 running, 2 planned)");
    assert_int_equal(p.node_of[2], 3);
    assert_int_equal(p.device_of_node[3], -1);
    assert_int_equal(p.gpu_of[2], -1);
    assert_true(fabs(p.evals[2 * 4 + 3].score - 8000.0 / 800 * 0.01) < 1e-9);
    assert_false(p.evals[0 * 4 + 1].eligible);
    assert_string_equal(p.evals[0 * 4 + 1].why,
                        "no GPU has room: the best has 500 MiB free, needs 1000 MiB");
    assert_string_equal(p.evals[0 * 4 + 2].why, "unreachable: Connection refused");
    assert_int_equal(p.adapters_on_node[0], 2);
    assert_int_equal(p.adapters_on_node[3], 1);
    tdm_place_plan_free(&p);

    /* Too big for the CPU node, and no GPU room anywhere: not placed, with reasons. */
    assert_int_equal(tdm_place(nodes + 1, 3, 1, &B, 7000000000LL, &p, &err), TDM_ERR_NEVER_FITS);
    assert_int_equal(p.node_of[0], -1);
    assert_non_null(strstr(p.evals[2].why, "exceed cpu_max_params 350000000"));
    assert_non_null(strstr(err.message, "adapter 1 fits on no node"));
    tdm_place_plan_free(&p);
}

/* With the smallest plans --vram auto may shrink to (gpu_min_mb), a GPU too small for the plan
 * as asked still takes the process, reserving the smallest plan; without them it is excluded. */
static void test_place_smaller_plan(void **state)
{
    static const int64_t MIN_MB[] = {0, 700, 800, 900, 1000};
    const tdm_place_budget bm = {.gpu_mb = GPU_MB, .cpu_mb = CPU_MB, .gpu_min_mb = MIN_MB};
    tdm_place_gpu small = {"GPU-s", "RTX 4090", 1.0, 850};
    tdm_place_node node = {.name = "small", .reachable = true, .gpus = &small, .n_gpus = 1,
                           .max_adapters = 8};
    tdm_place_plan p;
    tdm_error err = {0};
    assert_int_equal(tdm_place(&node, 1, 1, &B, 1000, &p, &err), TDM_ERR_NEVER_FITS);
    tdm_place_plan_free(&p);
    /* 850 MiB: one adapter at its smallest plan (700), two (800) too; three (900) do not */
    assert_int_equal(tdm_place(&node, 1, 3, &bm, 1000, &p, &err), TDM_ERR_NEVER_FITS);
    assert_int_equal(p.node_of[0], 0);
    assert_int_equal(p.evals[0].need_mb, 700);
    assert_int_equal(p.node_of[1], 0);
    assert_int_equal(p.evals[1].need_mb, 100);
    assert_int_equal(p.node_of[2], -1);
    assert_string_equal(p.evals[2].why, "no GPU has room: the best has 50 MiB free, needs 200 MiB "
                                        "(a process of 3 adapter(s) at its smallest plan: 900 "
                                        "MiB)");
    tdm_place_plan_free(&p);
    /* a GPU with room for the plan as asked reserves it */
    small.free_mb = 5000;
    assert_int_equal(tdm_place(&node, 1, 2, &bm, 1000, &p, &err), TDM_OK);
    assert_int_equal(p.evals[0].need_mb, 1000);
    assert_int_equal(p.evals[1].need_mb, 200);
    tdm_place_plan_free(&p);
}

static void test_val_loss(void **state)
{
    double v = 0;
    assert_true(tdm_coord_val_loss("{\"epoch\": 2, \"val_loss\": 1.25}", NULL, &v));
    assert_true(v == 1.25);
    const char *ts = "{\"log_history\": [{\"eval_loss\": 2.0}, {\"loss\": 1.0}, {\"eval_loss\": 1.5}],"
                     " \"best_metric\": 1.4}";
    assert_true(tdm_coord_val_loss("{\"epoch\": 1}", ts, &v));
    assert_true(v == 1.5);
    assert_true(tdm_coord_val_loss(NULL, "{\"best_metric\": 0.9}", &v));
    assert_true(v == 0.9);
    assert_false(tdm_coord_val_loss("not json", "{}", &v));
}

static void test_leaderboard(void **state)
{
    json_t *jobs = json_loads(
        "[{\"id\": \"j1\", \"submission\": \"s\", \"state\": \"finished\", \"node\": {\"name\": \"a\"},"
        "  \"adapters\": [{\"index\": 0, \"label\": \"x\", \"val_loss\": 2.0},"
        "                 {\"index\": 1, \"label\": \"y\"}]},"
        " {\"id\": \"j2\", \"submission\": \"s\", \"state\": \"running\", \"node\": {\"name\": \"b\"},"
        "  \"adapters\": [{\"index\": 2, \"label\": \"z\", \"val_loss\": 1.0,"
        "                  \"metrics\": {\"epoch\": 3, \"train_loss\": 0.5}}]},"
        " {\"id\": \"j0\", \"submission\": \"old\", \"adapters\": [{\"index\": 0, \"val_loss\": 0.1}]}]",
        0, NULL);
    assert_non_null(jobs);
    json_t *b = tdm_coord_leaderboard(jobs, "s");
    assert_int_equal(json_array_size(b), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(b, 0), "label")), "z");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(b, 0), "epoch")), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(b, 1), "label")), "x");
    assert_string_equal(json_string_value(json_object_get(json_array_get(b, 2), "label")), "y");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(b, 2), "rank")), 3);
    json_decref(b);
    b = tdm_coord_leaderboard(jobs, NULL);
    assert_int_equal(json_array_size(b), 4);
    json_decref(b);
    assert_string_equal(tdm_coord_latest_submission(jobs), "old");
    json_decref(jobs);
}

/* slurm.array (default true, false, a wrong value with its position); the array script under a
 * real /bin/sh as Slurm would run task 2 of array 7 whose own SLURM_JOB_ID is 9: it picks
 * DIR_2, names itself 7_2, runs the finetune line (tandem: /bin/echo) and records its exit. */
static void test_slurm_array_script(void **state)
{
    char dir[] = "/tmp/tandem-unit-array-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char y[512];
    snprintf(y, sizeof y,
             "scheduler: slurm\nslurm:\n  workdir: %s\n  gpu_vram_mb: 100\n  tandem: /bin/echo\n",
             dir);
    tdm_cluster_config cfg;
    tdm_error err = {0};
    assert_int_equal(tdm_cluster_config_parse(y, strlen(y), "c.yaml", &cfg, &err), TDM_OK);
    assert_true(cfg.slurm.array);
    char job_dir[200], task_dir[300], path[400], cmd[4000];
    snprintf(job_dir, sizeof job_dir, "%s/jobs/X", dir);
    snprintf(task_dir, sizeof task_dir, "%s_2", job_dir);
    tdm_slurm_job j = {.id = "X", .job_dir = job_dir, .model_dir = "/m", .n_adapters = 1,
                       .array_n = 3};
    char *text = NULL;
    assert_int_equal(tdm_slurm_script(&cfg.slurm, &j, &text, &err), TDM_OK);
    assert_non_null(strstr(text, "\n#SBATCH --array=0-2\n"));
    snprintf(path, sizeof path, "\n#SBATCH --output=%s_%%a/log\n", job_dir);
    assert_non_null(strstr(text, path));
    snprintf(path, sizeof path, "%s/job.sh", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    char mk[400];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", task_dir);
    assert_int_equal(system(mk), 0);
    snprintf(cmd, sizeof cmd,
             "env -u SLURM_RESTART_COUNT SLURM_ARRAY_JOB_ID=7 SLURM_ARRAY_TASK_ID=2 SLURM_JOB_ID=9 "
             "sh '%s' >'%s/out' 2>&1 && grep -q '^== .* slurm job 7_2 on ' '%s/out' && "
             "grep -q '^finetune /m --adapters-config %s/adapters.toml ' '%s/out' && "
             "[ \"$(cat '%s/exit_code')\" = 0 ]",
             path, dir, dir, task_dir, dir, task_dir);
    assert_int_equal(system(cmd), 0);
    tdm_cluster_config_free(&cfg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);

    const char *off = "scheduler: slurm\nslurm:\n  workdir: /w\n  gpu_vram_mb: 1\n  array: false\n";
    assert_int_equal(tdm_cluster_config_parse(off, strlen(off), "c.yaml", &cfg, &err), TDM_OK);
    assert_false(cfg.slurm.array);
    tdm_cluster_config_free(&cfg);
    const char *bad = "scheduler: slurm\nslurm:\n  workdir: /w\n  gpu_vram_mb: 1\n  array: yes\n";
    assert_int_equal(tdm_cluster_config_parse(bad, strlen(bad), "c.yaml", &cfg, &err),
                     TDM_ERR_INVALID);
    assert_string_equal(err.message, "c.yaml:5:10: slurm.array must be true or false, not 'yes'");
}

/* slurm.signal_grace must be shorter than slurm.time, in every form of the time (MM, MM:SS,
 * HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), whichever key comes first; the default grace (120 s)
 * counts too. The message names the grace's position (the time's when the grace is default). */
static void test_slurm_signal_grace_within_time(void **state)
{
    (void)state;
    static const struct {
        const char *time;
        int grace; /* 0: not given */
        bool ok;
    } cases[] = {
        {"10", 600, false},   {"10", 599, true},       {"1", 0, false},      {"3", 0, true},
        {"1:30", 90, false},  {"1:30", 89, true},      {"0:10:00", 600, false},
        {"0:10:01", 600, true}, {"1-0", 65535, true},  {"0-0:01", 60, false},
        {"0-0:01:01", 60, true}, {"0-01", 3600, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char yaml[256], grace[64] = "";
        if (cases[i].grace) snprintf(grace, sizeof grace, "  signal_grace: %d\n", cases[i].grace);
        snprintf(yaml, sizeof yaml,
                 "scheduler: slurm\nslurm:\n%s  workdir: /w\n  gpu_vram_mb: 1\n  time: \"%s\"\n",
                 grace, cases[i].time);
        tdm_cluster_config cfg;
        tdm_error err = {0};
        tdm_status st = tdm_cluster_config_parse(yaml, strlen(yaml), "c.yaml", &cfg, &err);
        if (cases[i].ok) {
            if (st != TDM_OK) fail_msg("time %s grace %d: %s", cases[i].time, cases[i].grace, err.message);
            tdm_cluster_config_free(&cfg);
            continue;
        }
        assert_int_equal(st, TDM_ERR_INVALID);
        assert_non_null(strstr(err.message, "is not shorter than slurm.time"));
        assert_non_null(strstr(err.message, cases[i].grace ? "c.yaml:3:17: " : "c.yaml:5:9: "));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote),
        cmocka_unit_test(test_quote_through_sh),
        cmocka_unit_test(test_spawn_stdin_timeout_missing),
        cmocka_unit_test(test_config_defaults_and_paths),
        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_place_score_formula),
        cmocka_unit_test(test_place_one_process_per_gpu_and_exclusions),
        cmocka_unit_test(test_place_smaller_plan),
        cmocka_unit_test(test_val_loss),
        cmocka_unit_test(test_leaderboard),
        cmocka_unit_test(test_slurm_array_script),
        cmocka_unit_test(test_slurm_signal_grace_within_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
