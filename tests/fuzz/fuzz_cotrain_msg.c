/* fuzz_cotrain_msg.c — libFuzzer target for the co-training wire protocol (cotrain/protocol.h),
 * the parser every host runs on bytes from other processes.
 *
 * For every input it checks, beyond "no crash, no leak, no undefined behaviour":
 *   - a refusal leaves *out zeroed, has one of the documented statuses and a message that says
 *     "co-training";
 *   - an accepted message encodes (the encoder re-parses what it writes, so an accepted message
 *     that encodes to something the parser refuses fails here), as one line ending in '\n';
 *   - round trip: the encoding parses again and encodes to the same bytes;
 *   - a join has 1..64 adapters with absolute, distinct outputs and in-range fields, and its
 *     run options equal themselves.
 * The corpus test (tests/unit/test_fuzz_corpus_cotrain.c) includes this file and replays every
 * file of tests/fuzz/corpus/cotrain_msg/ in the normal build.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cotrain/protocol.h"
#include "train/adapters_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_cotrain_msg: check failed at %s:%d: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void check_join(const tdm_cotrain_join *j)
{
    CHECK(j->n_adapters >= 1 && j->n_adapters <= TDM_COTRAIN_MAX_ADAPTERS);
    CHECK(j->pid >= 1 && j->user && *j->user && j->identity && strlen(j->identity) == 71);
    CHECK(j->opts.grad_accum >= 1 && j->opts.log_every >= 1);
    CHECK(j->opts.val_split >= 0 && j->opts.val_split < 1);
    char buf[512];
    CHECK(tdm_cotrain_run_opts_diff(&j->opts, &j->opts, buf, sizeof buf) == 0);
    for (int i = 0; i < j->n_adapters; i++) {
        const tdm_cotrain_adapter *a = &j->adapters[i];
        CHECK(a->data[0] == '/' && a->output[0] == '/');
        CHECK(!a->init_adapter || a->init_adapter[0] == '/');
        CHECK(!a->label || (strlen(a->label) >= 1 && strlen(a->label) <= TDM_ADAPTER_LABEL_MAX));
        CHECK(a->rank >= 1 && a->rank <= TDM_ADAPTER_RANK_MAX);
        CHECK(a->alpha > 0 && a->lr > 0 && a->lr <= 1 && a->weight > 0);
        CHECK(a->lora_dropout >= 0 && a->lora_dropout < 1);
        CHECK(a->targets && !(a->targets & ~TDM_ADAPTER_TARGET_ALL));
        CHECK(a->epochs >= 1 && a->batch_size >= 1 && a->max_seq_len >= 1);
        for (int k = 0; k < i; k++)
            CHECK(strcmp(a->output, j->adapters[k].output) != 0);
        if (a->opts) { /* an adapter's own training options: the join's ranges */
            CHECK(a->opts->task && a->opts->grad_accum >= 1 && a->opts->log_every >= 1);
            CHECK(a->opts->val_split >= 0 && a->opts->val_split < 1);
            CHECK(a->opts->save_total_limit >= 0 && a->opts->save_total_limit <= 1000000);
        }
    }
    CHECK(j->opts.save_total_limit >= 0 && j->opts.save_total_limit <= 1000000);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_cotrain_msg m;
    tdm_error err = {0};
    tdm_status st = tdm_cotrain_msg_parse((const char *)data, size, &m, &err);
    if (st != TDM_OK) {
        tdm_cotrain_msg zero;
        memset(&zero, 0, sizeof zero);
        CHECK(memcmp(&m, &zero, sizeof m) == 0);
        CHECK(st == TDM_ERR_PARSE || st == TDM_ERR_INVALID || st == TDM_ERR_UNSUPPORTED ||
              st == TDM_ERR_NOMEM);
        CHECK(strstr(err.message, "co-training") || st == TDM_ERR_NOMEM);
        return 0;
    }
    CHECK(m.type < TDM_COTRAIN_MSG_TYPE_COUNT);
    if (m.type == TDM_COTRAIN_JOIN) check_join(&m.u.join);
    char *line = NULL, *again = NULL;
    size_t len = 0, again_len = 0;
    st = tdm_cotrain_msg_encode(&m, &line, &len, &err);
    if (st != TDM_OK) {
        fprintf(stderr, "fuzz_cotrain_msg: accepted message does not encode: %s\n", err.message);
        abort();
    }
    CHECK(len >= 2 && line[len - 1] == '\n' && !memchr(line, '\n', len - 1));
    tdm_cotrain_msg p;
    CHECK(tdm_cotrain_msg_parse(line, len - 1, &p, &err) == TDM_OK);
    CHECK(p.type == m.type);
    CHECK(tdm_cotrain_msg_encode(&p, &again, &again_len, &err) == TDM_OK);
    CHECK(again_len == len && memcmp(again, line, len) == 0);
    free(line);
    free(again);
    tdm_cotrain_msg_free(&p);
    tdm_cotrain_msg_free(&m);
    return 0;
}
