/* wait_queue.h — strict arrival order for jobs waiting for GPU memory.
 *
 * Each waiter holds a ticket (ledger.h). Per GPU, tickets are admitted in ticket order: a ticket
 * may start on GPU g only when no earlier ticket that targets g (pinned to g, or "any GPU") and
 * could ever fit on g is still waiting. So a stream of small jobs can never starve a large one:
 * the small ones queue behind it. A ticket pinned to another GPU, or too large to ever fit on g,
 * does not hold g's line.
 */
#ifndef TANDEM_GPU_WAIT_QUEUE_H
#define TANDEM_GPU_WAIT_QUEUE_H
#include <stdbool.h>

#include "gpu/guard.h"
#include "gpu/inventory.h"
#include "gpu/ledger.h"

/* True when the ticket targets gpu (pinned to it, or any GPU). */
bool tdm_queue_targets(const tdm_ticket *t, const tdm_gpu *gpu);

/* Number of tickets ahead of `ticket` (a ticket number; INT64_MAX for a newcomer without one) in
 * gpu's line. 0 means it is at the head. */
int tdm_queue_ahead(const tdm_ledger_state *s, int64_t ticket, const tdm_gpu *gpu);

/* Picks the GPU for a request: among candidates (the pinned GPU, or every GPU), those where the
 * request is at the head of the line and fits now; of these, the one with the most memory left
 * after admission. Returns the GPU's position in inv, or -1 when none qualifies. */
int tdm_queue_choose_gpu(const tdm_inventory *inv, const tdm_ledger_state *s, int64_t ticket,
                         const char *pinned_uuid, int64_t budget_mb);

#endif
