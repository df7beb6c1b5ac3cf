/* train_cursor.h — the trainer's view of one adapter's data cursor (data/batch.h), behind an
 * opaque type. data/batch.h and engine/model.h both define a `tdm_batch`, so the trainer (which
 * builds the engine's fused batch itself) reaches the data layer's cursor only through here.
 * Semantics are exactly tdm_data_cursor's: epoch e visits the n samples in a seeded
 * Fisher-Yates order (or file order), and the whole state serialises to JSON.
 */
#ifndef TANDEM_TRAIN_TRAIN_CURSOR_H
#define TANDEM_TRAIN_TRAIN_CURSOR_H
#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_train_cursor tdm_train_cursor;

/* A cursor at epoch 0, position 0 over n samples (n > 0). */
tdm_status tdm_train_cursor_create(tdm_train_cursor **out, uint32_t n, uint64_t seed, bool shuffle,
                                   tdm_error *err);
void tdm_train_cursor_free(tdm_train_cursor *c);
/* Epoch of the next sample (0-based) and its index in that epoch's order. */
uint64_t tdm_train_cursor_epoch(const tdm_train_cursor *c);
uint64_t tdm_train_cursor_position(const tdm_train_cursor *c);
/* The next sample (an index in [0, n)), then advances (into the next epoch after the last). */
tdm_status tdm_train_cursor_next(tdm_train_cursor *c, uint32_t *index, tdm_error *err);
/* The state as compact JSON (malloc'd) and back (tdm_data_cursor_to_json / _from_json). */
tdm_status tdm_train_cursor_to_json(const tdm_train_cursor *c, char **out, tdm_error *err);
tdm_status tdm_train_cursor_from_json(tdm_train_cursor *c, const char *json, tdm_error *err);

#endif
