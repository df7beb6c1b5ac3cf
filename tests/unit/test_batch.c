/* Unit tests of src/data/batch: epoch permutations (each sample once per epoch, seeded, file
 * order without shuffle, roughly uniform), packed batch invariants (segments contiguous and
 * covering every row in adapter order, cu_seqlens, positions restarting at 0, ids/labels copied,
 * targets shifted by one, per-adapter counted tokens), exact resume from serialized cursors, and
 * errors that leave cursors untouched. Also one batch from a file loaded with the tiny tokenizer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/batch.h"
#include "model/init_model.h"

/* A synthetic dataset: sample i has 2 + (i * 7) % 9 tokens, ids 1000 * (tag) + 10 * i + t, labels
 * -100 on the first third of the sample, else the id; all samples are "train". */
static void make_ds(tdm_dataset *ds, uint32_t n, int tag)
{
    memset(ds, 0, sizeof *ds);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += 2 + (i * 7) % 9;
    ds->ids = malloc((total ? total : 1) * sizeof *ds->ids);
    ds->labels = malloc((total ? total : 1) * sizeof *ds->labels);
    ds->samples = calloc(n ? n : 1, sizeof *ds->samples);
    ds->train = malloc((n ? n : 1) * sizeof *ds->train);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = 2 + (i * 7) % 9;
        tdm_data_sample *s = &ds->samples[i];
        s->offset = off;
        s->len = len;
        s->line = i + 1;
        for (uint32_t t = 0; t < len; t++) {
            ds->ids[off + t] = 100000 * tag + 10 * (int32_t)i + (int32_t)t;
            ds->labels[off + t] = t < len / 3 ? TDM_LABEL_IGNORE : ds->ids[off + t];
            if (t >= 1) s->counted += ds->labels[off + t] != TDM_LABEL_IGNORE;
        }
        off += len;
        ds->train[i] = i;
    }
    ds->n_tokens = total;
    ds->n_samples = ds->n_train = n;
}

static void test_cursor_permutations(void **state)
{
    enum { N = 37, EPOCHS = 5 };
    tdm_data_cursor a, b, c, fo;
    tdm_data_cursor_init(&a, N, 11, true);
    tdm_data_cursor_init(&b, N, 11, true);
    tdm_data_cursor_init(&c, N, 12, true);
    tdm_data_cursor_init(&fo, N, 11, false);
    tdm_error err = {0};
    uint32_t prev[N] = {0};
    int same_as_c = 0;
    for (int e = 0; e < EPOCHS; e++) {
        int seen[N] = {0}, identity = 1, same_as_prev = 1;
        uint32_t order[N];
        for (int i = 0; i < N; i++) {
            uint32_t x, y, z, w;
            assert_int_equal(a.epoch, (uint64_t)e);
            assert_int_equal(a.position, (uint64_t)i);
            assert_int_equal(tdm_data_cursor_next(&a, &x, &err), TDM_OK);
            assert_int_equal(tdm_data_cursor_next(&b, &y, &err), TDM_OK);
            assert_int_equal(tdm_data_cursor_next(&c, &z, &err), TDM_OK);
            assert_int_equal(tdm_data_cursor_next(&fo, &w, &err), TDM_OK);
            assert_true(x < N);
            assert_int_equal(x, y);           /* same seed, same order */
            assert_int_equal(w, (uint32_t)i); /* no shuffle: file order */
            seen[x]++;
            identity &= x == (uint32_t)i;
            same_as_prev &= x == prev[i];
            same_as_c += x == z;
            order[i] = x;
        }
        for (int i = 0; i < N; i++)
            assert_int_equal(seen[i], 1);
        assert_false(identity);
        if (e) assert_false(same_as_prev); /* a new order each epoch */
        memcpy(prev, order, sizeof prev);
    }
    assert_true(same_as_c < EPOCHS * N / 3); /* another seed, another order */
    assert_int_equal(a.epoch, EPOCHS);
    tdm_data_cursor_free(&a);
    tdm_data_cursor_free(&b);
    tdm_data_cursor_free(&c);
    tdm_data_cursor_free(&fo);

    /* roughly uniform: the first element of 4000 epochs of 4 samples */
    tdm_data_cursor u;
    tdm_data_cursor_init(&u, 4, 5, true);
    int first[4] = {0};
    for (int e = 0; e < 4000; e++)
        for (int i = 0; i < 4; i++) {
            uint32_t x;
            assert_int_equal(tdm_data_cursor_next(&u, &x, &err), TDM_OK);
            if (i == 0) first[x]++;
        }
    for (int i = 0; i < 4; i++)
        assert_true(first[i] > 850 && first[i] < 1150);
    tdm_data_cursor_free(&u);

    tdm_data_cursor z;
    tdm_data_cursor_init(&z, 0, 1, true);
    uint32_t x;
    assert_int_equal(tdm_data_cursor_next(&z, &x, &err), TDM_ERR_INVALID);
    tdm_data_cursor_free(&z);
}

/* Checks every invariant of b against the sources. */
static void check_batch(const tdm_batch *b, const tdm_batch_source *src, int32_t n_adapters)
{
    assert_int_equal(b->n_adapters, n_adapters);
    assert_int_equal(b->cu_seqlens[0], 0);
    assert_int_equal(b->cu_seqlens[b->n_seqs], b->n_rows);
    int32_t row = 0, seq = 0, k = 0;
    for (int32_t a = 0; a < n_adapters; a++) {
        if (src[a].batch_size == 0) {
            assert_int_equal(b->counted[a], 0);
            continue;
        }
        assert_true(k < b->n_segs);
        const tdm_batch_seg *sg = &b->segs[k++];
        assert_int_equal(sg->adapter, a);
        assert_int_equal(sg->row_begin, row); /* contiguous, in adapter order */
        assert_int_equal(sg->seq_begin, seq);
        assert_int_equal(sg->seq_end - sg->seq_begin, (int32_t)src[a].batch_size);
        int64_t counted = 0;
        for (int32_t s = sg->seq_begin; s < sg->seq_end; s++) {
            assert_int_equal(b->seq_adapter[s], a);
            assert_int_equal(b->cu_seqlens[s], row);
            const tdm_data_sample *sm = &src[a].ds->samples[b->seq_sample[s]];
            assert_int_equal(b->cu_seqlens[s + 1] - b->cu_seqlens[s], (int32_t)sm->len);
            for (uint32_t t = 0; t < sm->len; t++, row++) {
                assert_int_equal(b->positions[row], (int32_t)t);
                assert_int_equal(b->input_ids[row], src[a].ds->ids[sm->offset + t]);
                assert_int_equal(b->labels[row], src[a].ds->labels[sm->offset + t]);
                int32_t want =
                    t + 1 < sm->len ? src[a].ds->labels[sm->offset + t + 1] : TDM_LABEL_IGNORE;
                assert_int_equal(b->targets[row], want);
            }
            counted += sm->counted;
        }
        assert_int_equal(sg->row_end, row);
        assert_int_equal(b->counted[a], counted);
        int64_t direct = 0;
        for (int32_t r = sg->row_begin; r < sg->row_end; r++)
            direct += b->targets[r] != TDM_LABEL_IGNORE;
        assert_int_equal(direct, counted);
        seq = sg->seq_end;
    }
    assert_int_equal(k, b->n_segs);
    assert_int_equal(row, b->n_rows);
    assert_int_equal(seq, b->n_seqs);
}

static void test_batch_invariants(void **state)
{
    tdm_dataset ds[3];
    make_ds(&ds[0], 10, 1);
    make_ds(&ds[1], 4, 2);
    make_ds(&ds[2], 23, 3);
    tdm_batch_source src[3] = {
        {&ds[0], ds[0].train, ds[0].n_train, 3},
        {&ds[1], ds[1].train, ds[1].n_train, 0},
        {&ds[2], ds[2].train, ds[2].n_train, 5},
    };
    tdm_data_cursor cur[3];
    for (int a = 0; a < 3; a++)
        tdm_data_cursor_init(&cur[a], src[a].n, 100 + (uint64_t)a, true);
    tdm_batch b = {0};
    tdm_error err = {0};
    int uses0[10] = {0};
    for (int step = 0; step < 20; step++) {
        assert_int_equal(tdm_batch_next(&b, src, cur, 3, &err), TDM_OK);
        assert_int_equal(b.n_segs, 2);
        assert_int_equal(b.n_seqs, 8);
        check_batch(&b, src, 3);
        for (int32_t s = b.segs[0].seq_begin; s < b.segs[0].seq_end; s++)
            uses0[b.seq_sample[s]]++;
    }
    /* 60 draws over 10 samples = 6 full epochs: each sample exactly 6 times */
    for (int i = 0; i < 10; i++)
        assert_int_equal(uses0[i], 6);
    assert_int_equal(cur[0].epoch, 6);
    assert_int_equal(cur[0].position, 0);
    assert_int_equal(cur[1].epoch, 0);
    assert_int_equal(cur[2].epoch, 100 / 23);
    assert_int_equal(cur[2].position, 100 % 23);
    tdm_batch_free(&b);
    for (int a = 0; a < 3; a++) {
        tdm_data_cursor_free(&cur[a]);
        tdm_dataset_free(&ds[a]);
    }
}

/* A copy of a batch's arrays, to compare two runs. */
static char *batch_blob(const tdm_batch *b, size_t *len)
{
    char *buf = NULL;
    FILE *m = open_memstream(&buf, len);
    fwrite(&b->n_rows, sizeof b->n_rows, 1, m);
    fwrite(&b->n_seqs, sizeof b->n_seqs, 1, m);
    fwrite(b->input_ids, sizeof(int32_t), (size_t)b->n_rows, m);
    fwrite(b->labels, sizeof(int32_t), (size_t)b->n_rows, m);
    fwrite(b->targets, sizeof(int32_t), (size_t)b->n_rows, m);
    fwrite(b->positions, sizeof(int32_t), (size_t)b->n_rows, m);
    fwrite(b->cu_seqlens, sizeof(int32_t), (size_t)b->n_seqs + 1, m);
    fwrite(b->seq_sample, sizeof(uint32_t), (size_t)b->n_seqs, m);
    fwrite(b->seq_epoch, sizeof(uint64_t), (size_t)b->n_seqs, m);
    fwrite(b->segs, sizeof(tdm_batch_seg), (size_t)b->n_segs, m);
    fwrite(b->counted, sizeof(int64_t), (size_t)b->n_adapters, m);
    fclose(m);
    return buf;
}

static void test_resume_from_serialized_cursor(void **state)
{
    enum { A = 2, BEFORE = 7, AFTER = 12 };
    tdm_dataset ds[A];
    make_ds(&ds[0], 9, 1);
    make_ds(&ds[1], 14, 2);
    tdm_batch_source src[A] = {
        {&ds[0], ds[0].train, 9, 4},
        {&ds[1], ds[1].train, 14, 3},
    };
    tdm_data_cursor cur[A], res[A];
    tdm_data_cursor_init(&cur[0], 9, UINT64_MAX - 3, true); /* a seed past int64 */
    tdm_data_cursor_init(&cur[1], 14, 77, false);
    tdm_batch b = {0}, r = {0};
    tdm_error err = {0};
    for (int i = 0; i < BEFORE; i++)
        assert_int_equal(tdm_batch_next(&b, src, cur, A, &err), TDM_OK);
    char *saved[A];
    for (int a = 0; a < A; a++) {
        assert_int_equal(tdm_data_cursor_to_json(&cur[a], &saved[a], &err), TDM_OK);
        memset(&res[a], 0, sizeof res[a]);
        assert_int_equal(tdm_data_cursor_from_json(&res[a], saved[a], src[a].n, &err), TDM_OK);
    }
    assert_string_equal(saved[0], "{\"epoch\":3,\"position\":1,\"samples\":9,\"seed\":"
                                  "\"18446744073709551612\",\"shuffle\":true}");
    for (int i = 0; i < AFTER; i++) {
        assert_int_equal(tdm_batch_next(&b, src, cur, A, &err), TDM_OK);
        assert_int_equal(tdm_batch_next(&r, src, res, A, &err), TDM_OK);
        size_t lb, lr;
        char *xb = batch_blob(&b, &lb), *xr = batch_blob(&r, &lr);
        assert_int_equal(lb, lr);
        assert_memory_equal(xb, xr, lb);
        free(xb);
        free(xr);
    }

    /* restoring into the wrong data, or from broken text, fails and leaves the cursor alone */
    tdm_data_cursor keep = res[0];
    assert_int_equal(tdm_data_cursor_from_json(&res[0], saved[0], 10, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "9 samples"));
    assert_int_equal(tdm_data_cursor_from_json(&res[0], "{\"epoch\": 1}", 9, &err), TDM_ERR_PARSE);
    assert_int_equal(tdm_data_cursor_from_json(&res[0], "nope", 9, &err), TDM_ERR_PARSE);
    assert_int_equal(
        tdm_data_cursor_from_json(
            &res[0], "{\"epoch\":0,\"position\":9,\"samples\":9,\"seed\":\"1\",\"shuffle\":true}",
            9, &err),
        TDM_ERR_INVALID);
    assert_int_equal(
        tdm_data_cursor_from_json(
            &res[0], "{\"epoch\":0,\"position\":0,\"samples\":9,\"seed\":\"-1\",\"shuffle\":true}",
            9, &err),
        TDM_ERR_PARSE);
    assert_memory_equal(&keep, &res[0], sizeof keep);

    for (int a = 0; a < A; a++) {
        free(saved[a]);
        tdm_data_cursor_free(&cur[a]);
        tdm_data_cursor_free(&res[a]);
        tdm_dataset_free(&ds[a]);
    }
    tdm_batch_free(&b);
    tdm_batch_free(&r);
}

static void test_errors_leave_cursors(void **state)
{
    tdm_dataset ds[2];
    make_ds(&ds[0], 5, 1);
    make_ds(&ds[1], 0, 2);
    tdm_batch_source src[2] = {{&ds[0], ds[0].train, 5, 2}, {&ds[1], ds[1].train, 0, 1}};
    tdm_data_cursor cur[2];
    tdm_data_cursor_init(&cur[0], 5, 1, true);
    tdm_data_cursor_init(&cur[1], 0, 1, true);
    tdm_batch b = {0};
    tdm_error err = {0};
    assert_int_equal(tdm_batch_next(&b, src, cur, 2, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "adapter 1"));
    assert_int_equal(cur[0].position, 0);
    /* batch_size 0 for the empty adapter: fine */
    src[1].batch_size = 0;
    assert_int_equal(tdm_batch_next(&b, src, cur, 2, &err), TDM_OK);
    assert_int_equal(b.n_segs, 1);
    assert_int_equal(cur[0].position, 2);
    /* a cursor made for other data */
    tdm_data_cursor_free(&cur[0]);
    tdm_data_cursor_init(&cur[0], 6, 1, true);
    assert_int_equal(tdm_batch_next(&b, src, cur, 2, &err), TDM_ERR_INVALID);
    assert_int_equal(cur[0].position, 0);
    tdm_batch_free(&b);
    for (int a = 0; a < 2; a++) {
        tdm_data_cursor_free(&cur[a]);
        tdm_dataset_free(&ds[a]);
    }
}

/* A real file through the tiny tokenizer: the batch holds exactly the rendered samples. */
static void test_batch_from_loaded_dataset(void **state)
{
    char dir[] = "/tmp/tandem-test-batch-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char model[300], path[300];
    snprintf(model, sizeof model, "%s/tiny", dir);
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    tdm_init_model_opts io = {.preset = "tiny", .seed = 1, .dtype = TDM_DTYPE_BF16};
    tdm_error err = {0};
    if (tdm_init_model(model, &io, NULL, &err) != TDM_OK) fail_msg("%s", err.message);
    tdm_tokenizer tok;
    if (tdm_tokenizer_load(&tok, model, &err) != TDM_OK) fail_msg("%s", err.message);
    FILE *f = fopen(path, "w");
    fputs("{\"text\": \"ab\"}\n{\"instruction\": \"Q\", \"output\": \"A\"}\n", f);
    fclose(f);
    tdm_dataset_opts o;
    tdm_dataset_opts_default(&o);
    o.chat_template = TDM_CHAT_CHATML;
    o.eos_id = tdm_data_find_eos(&tok, model);
    o.val_split = 0;
    tdm_dataset ds;
    assert_int_equal(tdm_dataset_load(&ds, path, &tok, &o, NULL, &err), TDM_OK);
    tdm_batch_source src = {&ds, ds.train, ds.n_train, 2};
    tdm_data_cursor cur;
    tdm_data_cursor_init(&cur, ds.n_train, 0, false);
    tdm_batch b = {0};
    assert_int_equal(tdm_batch_next(&b, &src, &cur, 1, &err), TDM_OK);
    check_batch(&b, &src, 1);
    /* "ab" <|im_end|>: rows a b EOS; targets b EOS -100 */
    assert_int_equal(b.cu_seqlens[1], 3);
    static const int32_t want_targets[3] = {'b', 258, TDM_LABEL_IGNORE};
    assert_memory_equal(b.targets, want_targets, sizeof want_targets);
    /* the chat sample counts "A" and <|im_end|> */
    assert_int_equal(b.counted[0], 2 + 2);
    assert_int_equal(b.positions[3], 0);
    tdm_batch_free(&b);
    tdm_data_cursor_free(&cur);
    tdm_dataset_free(&ds);
    tdm_tokenizer_free(&tok);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cursor_permutations),
        cmocka_unit_test(test_batch_invariants),
        cmocka_unit_test(test_resume_from_serialized_cursor),
        cmocka_unit_test(test_errors_leave_cursors),
        cmocka_unit_test(test_batch_from_loaded_dataset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
