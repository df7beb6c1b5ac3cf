/* Unit tests of train/run_records: trainer_state.json has Trainer's fields and log_history
 * entries (and reads back), metadata.json's fields and perplexities, metrics.jsonl appends and
 * its resume truncation (torn last line dropped). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/run_records.h"
#include "util/atomic_file.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-rec-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_trainer_state(void **state)
{
    (void)state;
    tdm_trainer_state ts;
    tdm_error err = {0};
    assert_int_equal(tdm_trainer_state_init(&ts, &err), TDM_OK);
    ts.max_steps = 30;
    ts.num_train_epochs = 3;
    ts.logging_steps = 5;
    ts.eval_steps = 10;
    ts.save_steps = 10;
    ts.train_batch_size = 4;
    ts.global_step = 5;
    ts.epoch = 0.5;
    tdm_trainer_state_log_train(&ts, 2.345678, 1.9e-4, 0.75);
    ts.global_step = 10;
    ts.epoch = 1.0;
    assert_true(tdm_trainer_state_log_eval(&ts, 2.0, 0.5, 100.0, 25.0, "out/best"));
    ts.global_step = 20;
    ts.epoch = 2.0;
    assert_false(tdm_trainer_state_log_eval(&ts, 2.1, 0.5, 100.0, 25.0, "out/best"));
    tdm_trainer_state_log_end(&ts, 1.9, 12.3456789, 9.87654, 2.5);

    char path[300];
    snprintf(path, sizeof path, "%s/trainer_state.json", tmpdir);
    assert_int_equal(tdm_trainer_state_save(&ts, path, &err), TDM_OK);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    assert_non_null(o);
    static const char *const keys[] = {"best_global_step",
                                       "best_metric",
                                       "best_model_checkpoint",
                                       "epoch",
                                       "eval_steps",
                                       "global_step",
                                       "is_hyper_param_search",
                                       "is_local_process_zero",
                                       "is_world_process_zero",
                                       "log_history",
                                       "logging_steps",
                                       "max_steps",
                                       "num_input_tokens_seen",
                                       "num_train_epochs",
                                       "save_steps",
                                       "stateful_callbacks",
                                       "total_flos",
                                       "train_batch_size",
                                       "trial_name",
                                       "trial_params"};
    assert_int_equal(json_object_size(o), sizeof keys / sizeof *keys);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!json_object_get(o, keys[i])) fail_msg("trainer_state.json lacks %s", keys[i]);
    assert_int_equal(json_integer_value(json_object_get(o, "global_step")), 20);
    assert_true(json_real_value(json_object_get(o, "best_metric")) == 2.0);
    assert_int_equal(json_integer_value(json_object_get(o, "best_global_step")), 10);
    assert_string_equal(json_string_value(json_object_get(o, "best_model_checkpoint")), "out/best");
    json_t *lh = json_object_get(o, "log_history");
    assert_int_equal(json_array_size(lh), 4);
    json_t *e0 = json_array_get(lh, 0);
    assert_int_equal(json_object_size(e0), 5);
    assert_true(json_real_value(json_object_get(e0, "loss")) == 2.3457); /* rounded like Trainer */
    assert_true(json_real_value(json_object_get(e0, "learning_rate")) == 1.9e-4);
    assert_true(json_real_value(json_object_get(e0, "grad_norm")) == 0.75);
    assert_int_equal(json_integer_value(json_object_get(e0, "step")), 5);
    assert_true(json_real_value(json_object_get(e0, "epoch")) == 0.5);
    json_t *e1 = json_array_get(lh, 1);
    assert_true(json_real_value(json_object_get(e1, "eval_loss")) == 2.0);
    assert_non_null(json_object_get(e1, "eval_runtime"));
    assert_non_null(json_object_get(e1, "eval_samples_per_second"));
    assert_non_null(json_object_get(e1, "eval_steps_per_second"));
    json_t *e3 = json_array_get(lh, 3);
    assert_true(json_real_value(json_object_get(e3, "train_loss")) == 1.9);
    assert_true(json_real_value(json_object_get(e3, "train_runtime")) == 12.3457);
    assert_non_null(json_object_get(e3, "train_samples_per_second"));
    json_decref(o);

    /* keys sorted like json.dumps(sort_keys=True) */
    char *text;
    assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
    assert_true(strstr(text, "\"best_global_step\"") < strstr(text, "\"best_metric\""));
    assert_true(strstr(text, "\"trial_name\"") < strstr(text, "\"trial_params\""));
    free(text);

    tdm_trainer_state back;
    assert_int_equal(tdm_trainer_state_load(&back, path, &err), TDM_OK);
    assert_int_equal(back.global_step, 20);
    assert_true(back.epoch == 2.0 && back.has_best && back.best_metric == 2.0);
    assert_int_equal(back.best_global_step, 10);
    assert_int_equal(back.max_steps, 30);
    assert_true(json_equal(back.log_history, ts.log_history));
    tdm_trainer_state_free(&back);
    tdm_trainer_state_free(&ts);

    /* no eval yet: best_* are null */
    assert_int_equal(tdm_trainer_state_init(&ts, &err), TDM_OK);
    o = tdm_trainer_state_to_json(&ts);
    assert_true(json_is_null(json_object_get(o, "best_metric")));
    assert_true(json_is_null(json_object_get(o, "best_model_checkpoint")));
    json_decref(o);
    tdm_trainer_state_free(&ts);
}

static void test_metadata(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_run_metadata m = {
        .task = "support",
        .label = "support",
        .adapter_index = 2,
        .epoch = 3,
        .train_loss = log(4.0),
        .val_loss = NAN,
        .learning_rate = 1e-4,
        .epoch_time_ms = 1234.5,
        .samples_per_sec = 56.7,
        .lora_rank = 16,
        .lora_alpha = 32,
        .data_hash = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        .base_model_identity =
            "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"};
    char path[300];
    snprintf(path, sizeof path, "%s/metadata.json", tmpdir);
    assert_int_equal(tdm_run_metadata_save(&m, path, &err), TDM_OK);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    assert_non_null(o);
    static const char *const keys[] = {"task",
                                       "epoch",
                                       "train_loss",
                                       "val_loss",
                                       "train_perplexity",
                                       "val_perplexity",
                                       "learning_rate",
                                       "epoch_time_ms",
                                       "samples_per_sec",
                                       "lora_rank",
                                       "lora_alpha",
                                       "data_hash",
                                       "base_model_identity",
                                       "adapter_index",
                                       "label"};
    assert_int_equal(json_object_size(o), sizeof keys / sizeof *keys);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!json_object_get(o, keys[i])) fail_msg("metadata.json lacks %s", keys[i]);
    assert_true(fabs(json_number_value(json_object_get(o, "train_perplexity")) - 4.0) < 1e-12);
    assert_true(json_is_null(json_object_get(o, "val_loss")));
    assert_true(json_is_null(json_object_get(o, "val_perplexity")));
    assert_int_equal(json_integer_value(json_object_get(o, "adapter_index")), 2);
    assert_int_equal(json_integer_value(json_object_get(o, "lora_rank")), 16);
    assert_string_equal(json_string_value(json_object_get(o, "data_hash")), m.data_hash);
    assert_string_equal(json_string_value(json_object_get(o, "base_model_identity")),
                        m.base_model_identity);
    assert_string_equal(json_string_value(json_object_get(o, "label")), "support");
    json_decref(o);
    /* with the method: three more keys, which tdm_adapter_run_record finds from the adapter's
     * directory, its best/ and its checkpoint-N/ (merge reads them), not from elsewhere */
    m.method = "qlora";
    m.double_quant = true;
    assert_int_equal(tdm_run_metadata_save(&m, path, &err), TDM_OK);
    char dir[300], found[400];
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s%s", tmpdir, i == 0 ? "" : i == 1 ? "/best/" : "/checkpoint-7");
        o = tdm_adapter_run_record(dir, found, sizeof found);
        if (!o) fail_msg("no run record found from %s", dir);
        assert_string_equal(found, path);
        assert_int_equal(json_object_size(o), sizeof keys / sizeof *keys + 3);
        assert_string_equal(json_string_value(json_object_get(o, "method")), "qlora");
        assert_true(json_is_true(json_object_get(o, "double_quant")));
        assert_int_equal(json_integer_value(json_object_get(o, "nf4_block_size")), 64);
        json_decref(o);
    }
    snprintf(dir, sizeof dir, "%s/other", tmpdir);
    assert_null(tdm_adapter_run_record(dir, found, sizeof found));
    m.method = "lora";
    assert_int_equal(tdm_run_metadata_save(&m, path, &err), TDM_OK);
    o = tdm_adapter_run_record(tmpdir, NULL, 0);
    assert_false(json_is_true(json_object_get(o, "double_quant")));
    assert_true(json_is_null(json_object_get(o, "nf4_block_size")));
    json_decref(o);
    unlink(path);
}

static int count_lines(const char *path)
{
    char *text;
    tdm_error err = {0};
    assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
    int n = 0;
    for (char *p = text; *p; p++)
        n += *p == '\n';
    free(text);
    return n;
}

static void test_metrics_jsonl(void **state)
{
    (void)state;
    tdm_error err = {0};
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tmpdir);
    for (int s = 1; s <= 6; s++) {
        tdm_metrics_line m = {.step = s,
                              .epoch = s / 3.0,
                              .loss = 3.0 - 0.1 * s,
                              .learning_rate = 2e-4,
                              .grad_norm = 0.5,
                              .tokens = 100 * s,
                              .tokens_per_sec = 1000,
                              .elapsed_ms = 10.0 * s,
                              .val_loss = s == 3 ? 2.5 : NAN,
                              .adapter_index = 0,
                              .label = "a"};
        assert_int_equal(tdm_metrics_append(path, &m, &err), TDM_OK);
    }
    assert_int_equal(count_lines(path), 6);
    /* each line is one object; val_loss only where evaluated */
    FILE *f = fopen(path, "r");
    char line[1024];
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        assert_non_null(o);
        i++;
        assert_int_equal(json_integer_value(json_object_get(o, "step")), i);
        assert_int_equal(json_object_get(o, "val_loss") != NULL, i == 3);
        assert_non_null(json_object_get(o, "loss"));
        assert_non_null(json_object_get(o, "tokens_per_sec"));
        json_decref(o);
    }
    fclose(f);
    /* a torn last line (crash mid-append) and a resume at step 4 */
    FILE *a = fopen(path, "a");
    fputs("{\"step\": 7, \"lo", a);
    fclose(a);
    int64_t kept;
    assert_int_equal(tdm_metrics_truncate_after(path, 4, &kept, &err), TDM_OK);
    assert_int_equal(kept, 4);
    assert_int_equal(count_lines(path), 4);
    char *text;
    assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
    assert_null(strstr(text, "\"step\":5"));
    assert_null(strstr(text, "\"step\": 7"));
    free(text);
    /* the line count a checkpoint recorded wins over the step: of the 4 lines of step <= 4,
     * keep the first 3 (an evaluation line of step 3 written after a checkpoint at step 3) */
    assert_int_equal(tdm_metrics_truncate_lines(path, 4, 3, &kept, &err), TDM_OK);
    assert_int_equal(kept, 3);
    assert_int_equal(count_lines(path), 3);
    assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
    assert_null(strstr(text, "\"step\":4"));
    assert_non_null(strstr(text, "\"step\":3"));
    free(text);
    char missing[320];
    snprintf(missing, sizeof missing, "%s/none.jsonl", tmpdir);
    assert_int_equal(tdm_metrics_truncate_after(missing, 4, &kept, &err), TDM_OK);
    assert_int_equal(kept, 0);
    setenv("TANDEM_FAULT_INJECT", "metrics.write", 1);
    tdm_metrics_line m = {.step = 5,
                          .loss = NAN,
                          .learning_rate = NAN,
                          .grad_norm = NAN,
                          .tokens_per_sec = NAN,
                          .elapsed_ms = NAN,
                          .val_loss = NAN};
    assert_int_equal(tdm_metrics_append(path, &m, &err), TDM_ERR_IO);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_int_equal(count_lines(path), 3);
}

/* The file ends with a newline and has no byte after the last one. */
static void assert_ends_with_whole_line(const char *path)
{
    char *text;
    size_t len;
    tdm_error err = {0};
    assert_int_equal(tdm_read_file(path, &text, &len, &err), TDM_OK);
    assert_true(len > 0);
    assert_int_equal(text[len - 1], '\n');
    free(text);
}

static tdm_metrics_line sample_line(int64_t step)
{
    return (tdm_metrics_line){.step = step,
                              .epoch = 1,
                              .loss = 2.5,
                              .learning_rate = 2e-4,
                              .grad_norm = 0.5,
                              .tokens = 100,
                              .tokens_per_sec = 1000,
                              .elapsed_ms = 10,
                              .val_loss = NAN,
                              .adapter_index = 0,
                              .label = "a long label that makes the line a few hundred bytes long, "
                                       "so that a full disk cuts it in the middle"};
}

/* A disk that fills up in the middle of a line (the fault point writes half the line for real,
 * then fails with ENOSPC): the error says ENOSPC and names the file, and the half line is taken
 * back. Before the fix the file kept half a line and the error read "Input/output error". */
static void test_metrics_enospc_fault(void **state)
{
    (void)state;
    tdm_error err = {0};
    char path[300];
    snprintf(path, sizeof path, "%s/enospc.jsonl", tmpdir);
    tdm_metrics_line m = sample_line(1);
    assert_int_equal(tdm_metrics_append(path, &m, &err), TDM_OK);
    setenv("TANDEM_FAULT_INJECT", "metrics.enospc", 1);
    m.step = 2;
    tdm_status st = tdm_metrics_append(path, &m, &err);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_int_equal(st, TDM_ERR_IO);
    assert_non_null(strstr(err.message, "No space left on device"));
    assert_non_null(strstr(err.message, path));
    assert_int_equal(count_lines(path), 1);
    assert_ends_with_whole_line(path);
    /* the next append (space freed) continues the file with whole lines */
    m.step = 3;
    assert_int_equal(tdm_metrics_append(path, &m, &err), TDM_OK);
    assert_int_equal(count_lines(path), 2);
    assert_ends_with_whole_line(path);
}

/* The same on a real full file system: a 64 KiB tmpfs in a private mount namespace (root only;
 * skipped otherwise), filled up so that only part of the next line fits. */
static void test_metrics_enospc_tmpfs(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("skipped: mounting a tmpfs needs root\n");
        skip();
    }
    char mnt[300];
    snprintf(mnt, sizeof mnt, "%s/small-fs", tmpdir);
    assert_int_equal(mkdir(mnt, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* exit codes: 0 pass, 77 cannot mount here, else the failed check's number */
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("tmpfs", mnt, "tmpfs", 0, "size=64k") != 0)
            _exit(77);
        char path[400], filler[400];
        snprintf(path, sizeof path, "%s/metrics.jsonl", mnt);
        snprintf(filler, sizeof filler, "%s/filler", mnt);
        tdm_error err = {0};
        tdm_metrics_line m = sample_line(1);
        if (tdm_metrics_append(path, &m, &err) != TDM_OK) _exit(1);
        /* fill the file system; metrics.jsonl's first page keeps room for a part of a line */
        int fd = open(filler, O_WRONLY | O_CREAT, 0644);
        char block[512];
        memset(block, 'x', sizeof block);
        while (write(fd, block, sizeof block) > 0) {
        }
        close(fd);
        tdm_status st = TDM_OK;
        for (int64_t s = 2; s < 100 && st == TDM_OK; s++) {
            m.step = s;
            st = tdm_metrics_append(path, &m, &err);
        }
        if (st != TDM_ERR_IO) _exit(2);
        if (!strstr(err.message, "No space left on device") || !strstr(err.message, path)) _exit(3);
        char *text;
        size_t len;
        if (tdm_read_file(path, &text, &len, &err) != TDM_OK) _exit(4);
        if (len == 0 || text[len - 1] != '\n') _exit(5);
        free(text);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        print_message("skipped: cannot mount a tmpfs in a private mount namespace here\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainer_state),        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_metrics_jsonl),        cmocka_unit_test(test_metrics_enospc_fault),
        cmocka_unit_test(test_metrics_enospc_tmpfs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
