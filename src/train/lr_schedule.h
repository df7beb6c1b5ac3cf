/* lr_schedule.h — learning-rate schedules with linear warmup, exactly as Hugging Face
 * transformers' get_cosine_schedule_with_warmup (num_cycles 0.5),
 * get_linear_schedule_with_warmup and get_constant_schedule_with_warmup.
 *
 * With W = warmup steps, T = total optimizer steps and s = the number of optimizer steps already
 * taken (the LambdaLR's current step: the first update uses s = 0), the factor is
 *     s < W:     s / max(1, W)                                        (all three)
 *     cosine:    p = (s - W) / max(1, T - W);  max(0, 0.5 * (1 + cos(pi * 0.5 * 2 * p)))
 *     linear:    max(0, (T - s) / max(1, T - W))
 *     constant:  1
 * and lr = peak_lr * factor (double). So with W > 0 the very first update has lr 0, as in HF.
 */
#ifndef TANDEM_TRAIN_LR_SCHEDULE_H
#define TANDEM_TRAIN_LR_SCHEDULE_H
#include <stdint.h>

#include "util/error.h"

typedef enum tdm_lr_kind {
    TDM_LR_COSINE,
    TDM_LR_LINEAR,
    TDM_LR_CONSTANT,
} tdm_lr_kind;

typedef struct tdm_lr_schedule {
    tdm_lr_kind kind;
    double peak_lr;       /* --lr */
    int64_t warmup_steps; /* W >= 0 */
    int64_t total_steps;  /* T >= 0: the optimizer steps the run will take */
} tdm_lr_schedule;

/* "cosine", "linear", "constant". */
const char *tdm_lr_kind_name(tdm_lr_kind kind);
/* Parses one of those names; TDM_ERR_INVALID (with the list) otherwise. */
tdm_status tdm_lr_kind_parse(const char *name, tdm_lr_kind *kind, tdm_error *err);

/* Checks peak_lr finite and > 0, W >= 0, T >= 0. */
tdm_status tdm_lr_schedule_check(const tdm_lr_schedule *s, tdm_error *err);

/* The multiplier at step (steps already taken, >= 0). */
double tdm_lr_factor(const tdm_lr_schedule *s, int64_t step);

/* peak_lr * tdm_lr_factor(s, step). */
double tdm_lr_at(const tdm_lr_schedule *s, int64_t step);

#endif
