/* protocol.h — the co-training wire protocol between a host trainer and its joiners
 * (docs/co-training.md has every message and field).
 *
 * Framing: one JSON object per line (UTF-8, no embedded newline, at most TDM_COTRAIN_MSG_MAX
 * bytes before the '\n'). Every object carries "v" (protocol version, TDM_COTRAIN_PROTOCOL_VERSION)
 * and "type". Unknown fields are ignored, so a later version can add fields without breaking
 * this one; a different "v" is refused with TDM_ERR_UNSUPPORTED.
 *
 *     joiner -> host:  join, detach
 *     host -> joiner:  admitted | rejected | waiting, progress, done, heartbeat
 *
 * Parsing is strict about what it keeps: types, ranges (the same ranges as adapters.toml),
 * absolute paths, bounded lengths and counts. A message that fails here is hostile or from
 * another program: the receiver answers "rejected" (when it is the host) and closes the socket.
 */
#ifndef TANDEM_COTRAIN_PROTOCOL_H
#define TANDEM_COTRAIN_PROTOCOL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/lr_schedule.h"
#include "train/trainer.h"
#include "util/error.h"

#define TDM_COTRAIN_PROTOCOL_VERSION 1
#define TDM_COTRAIN_MSG_MAX (1u << 20) /* bytes of one message line, '\n' excluded */
#define TDM_COTRAIN_MAX_ADAPTERS 64    /* adapters in one join */
#define TDM_COTRAIN_PATH_MAX 4096      /* bytes of a path field, NUL included */
#define TDM_COTRAIN_TEXT_MAX 8192      /* bytes of a message/reason field, NUL included */

typedef enum tdm_cotrain_msg_type {
    TDM_COTRAIN_JOIN,      /* joiner -> host: train these adapters in your pass */
    TDM_COTRAIN_ADMITTED,  /* host -> joiner: the adapters train from the next step boundary */
    TDM_COTRAIN_REJECTED,  /* host -> joiner: not joined (status + FILE:LINE message); closes */
    TDM_COTRAIN_WAITING,   /* host -> joiner: accepted, waiting for something (memory) */
    TDM_COTRAIN_PROGRESS,  /* host -> joiner: one adapter's step / log / eval event */
    TDM_COTRAIN_DETACH,    /* joiner -> host: checkpoint my adapters and hand them back */
    TDM_COTRAIN_DONE,      /* host -> joiner: one adapter's outcome */
    TDM_COTRAIN_HEARTBEAT, /* host -> joiner: every TDM_COTRAIN_HEARTBEAT_MS */
    TDM_COTRAIN_MSG_TYPE_COUNT
} tdm_cotrain_msg_type;

/* "join", "admitted", ... as on the wire. */
const char *tdm_cotrain_msg_type_name(tdm_cotrain_msg_type t);

/* One adapter of a join: tdm_trainer_adapter with owned strings and every option resolved by the
 * joiner (its command-line defaults applied), paths absolute. */
typedef struct tdm_cotrain_adapter {
    char *data;         /* absolute path of the JSONL training data */
    char *output;       /* absolute OUT_DIR */
    char *label;        /* NULL or [A-Za-z0-9._-]{1,64} */
    char *init_adapter; /* NULL or absolute PEFT directory */
    int rank;           /* 1..TDM_ADAPTER_RANK_MAX */
    double alpha;       /* finite, > 0 */
    bool use_rslora;
    uint32_t targets;    /* tdm_adapter_target bits, non-zero */
    double lora_dropout; /* [0, 1) */
    double lr;           /* (0, 1] */
    int epochs;          /* 1..TDM_ADAPTER_EPOCHS_MAX */
    int batch_size;      /* 1..TDM_ADAPTER_BATCH_SIZE_MAX */
    int max_seq_len;     /* 1..TDM_ADAPTER_MAX_SEQ_LEN_MAX */
    double weight;       /* finite, > 0 */
    /* NULL: the join's training options (tdm_cotrain_join.opts); else this adapter's own (its
     * adapters.toml row set some), of which only the training options count (owned) */
    struct tdm_cotrain_run_opts *opts;
} tdm_cotrain_adapter;

/* The joiner's options: its adapters' training options (tdm_trainer_adapter's: those of its
 * first adapter, which the host applies to every joined adapter without opts of its own), and
 * its run-wide ones (tdm_trainer_opts'): the schedule, which must equal the host's
 * (tdm_cotrain_run_wide_diff), and resume/no_wait, the joiner's own. */
typedef struct tdm_cotrain_run_opts {
    char *task; /* "instruct" */
    bool chat_template_given;
    tdm_chat_template chat_template;
    bool train_on_prompt;
    bool skip_bad_lines;
    double weight_decay;
    double max_grad_norm;
    tdm_lr_kind lr_kind;
    int64_t warmup_steps;
    int grad_accum; /* >= 1 */
    uint64_t seed;
    bool shuffle;
    double val_split; /* [0, 1) */
    int64_t eval_every, save_every, log_every;
    int save_total_limit; /* 0..1000000; absent on the wire: 0 */
    tdm_train_schedule schedule;
    bool resume;
    bool no_wait; /* --no-wait-gpu: fail instead of waiting for memory */
} tdm_cotrain_run_opts;

typedef struct tdm_cotrain_join {
    int32_t pid;    /* as the joiner claims; the host trusts SO_PEERCRED, not this */
    uint32_t uid;   /* idem */
    char *user;     /* user name, for the host's display */
    char *identity; /* "sha256:<64 hex>" base identity (cotrain/base_identity.h) */
    tdm_cotrain_run_opts opts;
    tdm_cotrain_adapter *adapters; /* (n_adapters), 1..TDM_COTRAIN_MAX_ADAPTERS */
    int n_adapters;
} tdm_cotrain_join;

typedef struct tdm_cotrain_progress_msg {
    int adapter; /* index in the joiner's adapter list */
    tdm_trainer_event event;
    int64_t global_step, step, total_steps;
    double epoch;
    int epochs;
    double loss, learning_rate, grad_norm;
    double val_loss; /* NaN before the first evaluation (null on the wire) */
    double tokens_per_sec, eta_sec;
} tdm_cotrain_progress_msg;

typedef enum tdm_cotrain_outcome {
    TDM_COTRAIN_FINISHED, /* trained to the end, final adapter written */
    TDM_COTRAIN_FAILED,   /* stopped with an error (message says why) */
    TDM_COTRAIN_DETACHED, /* checkpointed and handed back (detach, or the host is stopping) */
} tdm_cotrain_outcome;

typedef struct tdm_cotrain_msg {
    tdm_cotrain_msg_type type;
    union {
        tdm_cotrain_join join;
        struct {
            int32_t host_pid;
            int n_adapters;
        } admitted;
        struct {
            tdm_status status; /* why, as a tdm_status */
            char *message;     /* "FILE:LINE: reason" or another complete sentence */
        } rejected;
        struct {
            char *reason;     /* "gpu-memory", ... */
            uint64_t need_mb; /* 0 when not about memory */
            char *message;
        } waiting;
        tdm_cotrain_progress_msg progress;
        struct {
            int adapter;
            tdm_cotrain_outcome outcome;
            int64_t step;  /* optimizer steps done (the checkpoint's step when detached) */
            char *message; /* NULL, or why it failed / how to resume */
        } done;
        struct {
            int64_t global_step;
        } heartbeat;
    } u;
} tdm_cotrain_msg;

/* Parses one message line (without its '\n'; len bytes, not NUL-terminated). On success *out owns
 * its strings (tdm_cotrain_msg_free). On failure *out is zeroed and the status is TDM_ERR_PARSE
 * (not JSON), TDM_ERR_INVALID (a field is missing, of the wrong type or out of range; the message
 * names the field), TDM_ERR_UNSUPPORTED (another protocol version) or TDM_ERR_NOMEM. */
tdm_status tdm_cotrain_msg_parse(const char *line, size_t len, tdm_cotrain_msg *out,
                                 tdm_error *err);

/* Writes msg as one line with its '\n' into a malloc'd *line of *len bytes (NUL-terminated
 * beyond len). TDM_ERR_INVALID when msg would not parse back (checked by parsing it). */
tdm_status tdm_cotrain_msg_encode(const tdm_cotrain_msg *msg, char **line, size_t *len,
                                  tdm_error *err);

/* Frees the strings of msg and zeroes it; a zeroed msg is allowed. */
void tdm_cotrain_msg_free(tdm_cotrain_msg *msg);

/* The names of the options that differ between a and b, comma-separated, into buf ("" when
 * none; resume and no_wait are the joiner's own and never differ). Returns the count. */
int tdm_cotrain_run_opts_diff(const tdm_cotrain_run_opts *a, const tdm_cotrain_run_opts *b,
                              char *buf, size_t size);
/* The same for the options one fused trainer holds once, which a host and its joiner must
 * share: the schedule. */
int tdm_cotrain_run_wide_diff(const tdm_cotrain_run_opts *a, const tdm_cotrain_run_opts *b,
                              char *buf, size_t size);

/* Wire names of statuses and outcomes ("invalid", "parse", ...; "finished", ...). */
const char *tdm_cotrain_status_name(tdm_status s);
const char *tdm_cotrain_outcome_name(tdm_cotrain_outcome o);

#endif
