/* output_claim.h — one run writes an adapter's OUT_DIR at a time.
 *
 * A finetune writes checkpoints, best/, metrics and the final adapter into each adapter's
 * OUT_DIR, and swaps best/ whole. Two runs writing one OUT_DIR (two commands, or a command that
 * joined a running host) would interleave their metrics and leave one adapter; an OUT_DIR inside
 * another's (out/a and out/a/best) is deleted by the outer one's best/ swap. So before a finetune
 * joins or loads anything, the command that launched the adapters (a host for its own, a joiner
 * for the ones it sends, each --gpus child for its share) claims every OUT_DIR:
 *   - refused when two of its own OUT_DIRs are one inside the other;
 *   - a claim is a file in the ledger directory's `outputs/` (the ledger of `tandem gpu`:
 *     TANDEM_LEDGER_DIR, else ~/.cache/tandem), named by a hash of the resolved OUT_DIR and
 *     holding "PID<TAB>RESOLVED_PATH", locked (flock, exclusive) while the command lives;
 *   - refused when a held claim is for the same directory, one around it or one inside it,
 *     naming the pid of the command that holds it.
 * The claims are checked and taken under one registry lock, so two commands starting at once
 * cannot both pass. Nothing is written into OUT_DIR. A claim is removed (while still held) when
 * the command ends; one left by a killed process is not held, so it is ignored, and removed by
 * the next claim that finds it. Only runs that share a ledger directory see each other (one
 * machine; a GPU's users share it by design): two machines writing one OUT_DIR on a shared file
 * system are not detected.
 * Refusals are TDM_ERR_INVALID (exit 2: give the adapter another OUT_DIR).
 */
#ifndef TANDEM_RUN_OUTPUT_CLAIM_H
#define TANDEM_RUN_OUTPUT_CLAIM_H
#include "train/trainer.h"
#include "util/error.h"

typedef struct tdm_output_claims {
    int n;
    int *fd;     /* the locked claim file of each OUT_DIR (-1: none) */
    char **path; /* its path in the registry */
} tdm_output_claims;

/* Claims the OUT_DIRs of ads[0..n) (see above); on failure nothing stays claimed. When the
 * ledger directory cannot be opened the claims are skipped with a warning (the run goes on). */
tdm_status tdm_output_claims_take(tdm_output_claims *c, const tdm_trainer_adapter *ads, int n,
                                  tdm_error *err);

/* Releases every claim (NULL-safe, idempotent). */
void tdm_output_claims_release(tdm_output_claims *c);

#endif
