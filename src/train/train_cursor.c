/* train_cursor.c — see train_cursor.h. */
#include "train/train_cursor.h"

#include <stdlib.h>

#include "data/batch.h"

struct tdm_train_cursor {
    tdm_data_cursor c;
};

tdm_status tdm_train_cursor_create(tdm_train_cursor **out, uint32_t n, uint64_t seed, bool shuffle,
                                   tdm_error *err)
{
    *out = NULL;
    if (n == 0) return tdm_fail(err, TDM_ERR_INVALID, "data cursor over 0 samples");
    tdm_train_cursor *c = calloc(1, sizeof *c);
    if (!c) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory (data cursor)");
    tdm_data_cursor_init(&c->c, n, seed, shuffle);
    *out = c;
    return TDM_OK;
}

void tdm_train_cursor_free(tdm_train_cursor *c)
{
    if (!c) return;
    tdm_data_cursor_free(&c->c);
    free(c);
}

uint64_t tdm_train_cursor_epoch(const tdm_train_cursor *c)
{
    return c->c.epoch;
}
uint64_t tdm_train_cursor_position(const tdm_train_cursor *c)
{
    return c->c.position;
}

tdm_status tdm_train_cursor_next(tdm_train_cursor *c, uint32_t *index, tdm_error *err)
{
    return tdm_data_cursor_next(&c->c, index, err);
}

tdm_status tdm_train_cursor_to_json(const tdm_train_cursor *c, char **out, tdm_error *err)
{
    return tdm_data_cursor_to_json(&c->c, out, err);
}

tdm_status tdm_train_cursor_from_json(tdm_train_cursor *c, const char *json, tdm_error *err)
{
    return tdm_data_cursor_from_json(&c->c, json, c->c.n, err);
}
