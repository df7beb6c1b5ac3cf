/* batch.h — per-adapter data cursors and the packed, fused batch of one training step
 * (the data layout of /work/shared/ENGINE.md "Fusing adapters" and "Sequences and attention").
 *
 * Cursor: each adapter walks its own samples epoch by epoch. Epoch e visits them in the order
 *   shuffle:    a Fisher-Yates permutation (i = n-1 down to 1: swap i with j uniform in [0, i],
 *               drawn without modulo bias) driven by xoshiro256** seeded with
 *               splitmix64(seed ^ (e * 0x9e3779b97f4a7c15))   (util/rng.h)
 *   no shuffle: file order.
 * The cursor's whole state is (seed, shuffle, epoch, position, n): the RNG state of an epoch is a
 * function of seed and epoch, so saving those five numbers (tdm_data_cursor_to_json) and restoring
 * them gives exactly the batches an uninterrupted run would have seen.
 *
 * Batch: for one step, each adapter a (in order 0..n_adapters-1) with batch_size > 0 takes its next
 * batch_size samples (crossing into the next epoch when needed). Their sequences are packed back
 * to back, no padding, adapter after adapter, so adapter a owns one contiguous segment of rows:
 *   segs[k] = {adapter, row_begin, row_end, seq_begin, seq_end}
 *   cu_seqlens[s] .. cu_seqlens[s+1]   rows of sequence s (cu_seqlens[0] = 0, last = n_rows)
 *   positions[r]                       r - cu_seqlens[s] (restarts at 0 in every sequence)
 *   input_ids[r], labels[r]            the sample's ids and Hugging Face labels (aligned)
 *   targets[r]                         labels[r+1] inside the sequence, -100 on its last row: what
 *                                      the logits of row r are scored against (the shift by one)
 *   counted[a]                         rows of adapter a with targets != -100 (the N_a of its loss)
 */
#ifndef TANDEM_DATA_BATCH_H
#define TANDEM_DATA_BATCH_H
#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "util/error.h"

typedef struct tdm_data_cursor {
    uint64_t seed;
    bool shuffle;      // false: file order every epoch
    uint64_t epoch;    // epoch of the next sample (0-based)
    uint64_t position; // index of the next sample in that epoch's order, in [0, n)
    uint32_t n;        // samples walked (a restore checks it)
    /* cache of the current epoch's order (not state) */
    uint32_t *perm; // (n)
    uint64_t perm_epoch;
    bool perm_valid;
} tdm_data_cursor;

/* A cursor at epoch 0, position 0 over n samples. */
void tdm_data_cursor_init(tdm_data_cursor *c, uint32_t n, uint64_t seed, bool shuffle);
void tdm_data_cursor_free(tdm_data_cursor *c);
/* The next sample (an index in [0, n)), then advances. TDM_ERR_INVALID when n is 0. */
tdm_status tdm_data_cursor_next(tdm_data_cursor *c, uint32_t *index, tdm_error *err);

/* Serialises the state as one compact JSON object (malloc'd):
 * {"epoch":E,"position":P,"samples":N,"seed":"S","shuffle":true}; seed is a decimal string
 * (it may exceed JSON's safe integers). */
tdm_status tdm_data_cursor_to_json(const tdm_data_cursor *c, char **out, tdm_error *err);
/* Restores a state written by tdm_data_cursor_to_json into c (initialised or not; c is
 * re-initialised). TDM_ERR_PARSE for malformed text, TDM_ERR_INVALID when "samples" is not n
 * (the data changed) or position is out of range. On error c is untouched. */
tdm_status tdm_data_cursor_from_json(tdm_data_cursor *c, const char *json, uint32_t n,
                                     tdm_error *err);

/* What one adapter trains on. */
typedef struct tdm_batch_source {
    const tdm_dataset *ds;
    const uint32_t *indices; // (n) the samples of ds it walks, e.g. ds->train
    uint32_t n;
    uint32_t batch_size; // sequences per step (0: no rows this step)
} tdm_batch_source;

typedef struct tdm_batch_seg {
    int32_t adapter;
    int32_t row_begin, row_end; // rows [row_begin, row_end)
    int32_t seq_begin, seq_end; // sequences [seq_begin, seq_end)
} tdm_batch_seg;

typedef struct tdm_batch {
    int32_t n_adapters;
    int32_t n_rows, n_seqs, n_segs;
    int32_t *input_ids;   // (n_rows)
    int32_t *labels;      // (n_rows) aligned with input_ids, -100 = ignored
    int32_t *targets;     // (n_rows) labels shifted by one inside each sequence
    int32_t *positions;   // (n_rows)
    int32_t *cu_seqlens;  // (n_seqs + 1)
    int32_t *seq_adapter; // (n_seqs)
    uint32_t *seq_sample; // (n_seqs) index into its adapter's ds->samples
    uint64_t *seq_epoch;  // (n_seqs) the epoch the sequence was drawn in
    tdm_batch_seg *segs;  // (n_segs) one per adapter with rows, in adapter order
    int64_t *counted;     // (n_adapters)
    /* capacities (buffers are reused from step to step) */
    int32_t cap_rows, cap_seqs, cap_adapters;
} tdm_batch;

/* Fills b (zero-initialise it before the first call; it is reused) with the next step's batch of
 * n_adapters adapters, advancing cursors[a] over src[a]. Errors: TDM_ERR_INVALID (an adapter with
 * batch_size > 0 and no samples, a cursor whose n is not src[a].n, more than INT32_MAX rows),
 * TDM_ERR_NOMEM. On error every cursor is left where it was. */
tdm_status tdm_batch_next(tdm_batch *b, const tdm_batch_source *src, tdm_data_cursor *cursors,
                          int32_t n_adapters, tdm_error *err);
void tdm_batch_free(tdm_batch *b);

#endif
