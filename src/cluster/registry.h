/* registry.h — the local record of jobs started on cluster nodes:
 * ${XDG_STATE_HOME:-$HOME/.local/state}/tandem/jobs/<ID>.json, one JSON document per job,
 * replaced atomically (util/atomic_file.h) on every change. Fields (docs/cluster.md):
 *
 *   {"version": 1, "id": "20260102T030405Z-desk-1a2b3c", "submission": "20260102T030405Z-9f8e7d",
 *    "kind": "finetune" | "command", "submitted": RFC 3339, "cluster_file": path or null,
 *    "node": {name, transport, host, user, port, identity_file, workdir, tandem, env,
 *             ssh_config},                                 (enough to reach the node again)
 *    "job_dir": path on the node, "pid": wrapper PID, "argv": [...],
 *    "state": "running" | "finished" | "failed", "exit_code": int or null, "why": text or null,
 *    "log_tail": text or null, "updated": RFC 3339,
 *    "adapters": [{"index", "label", "data", "output", "metrics": metadata.json or null,
 *                  "trainer_state_eval_loss": number or null}]}
 */
#ifndef TANDEM_CLUSTER_REGISTRY_H
#define TANDEM_CLUSTER_REGISTRY_H
#include <jansson.h>
#include <stddef.h>

#include "cluster/cluster_config.h"
#include "util/error.h"

/* The jobs directory (created with its parents, mode 0700) into buf. */
tdm_status tdm_registry_dir(char *buf, size_t size, tdm_error *err);

/* Writes job (which must have a string "id" of [A-Za-z0-9._-]) as dir/<id>.json atomically. */
tdm_status tdm_registry_save(const char *dir, json_t *job, tdm_error *err);

/* Every dir/<ID>.json as a JSON array ordered by (submitted, id). Unreadable or malformed records
 * are skipped with a warning (tdm_warn), never fatal. */
tdm_status tdm_registry_load(const char *dir, json_t **jobs, tdm_error *err);

/* "PREFIX-<UTC compact time>-<6 random hex>" (prefix may be NULL) into buf (>= 96 bytes). */
void tdm_registry_new_id(const char *prefix, char *buf, size_t size);

/* A node's connection settings as JSON and back (the copy jobs keep of their node). */
json_t *tdm_node_to_json(const tdm_cluster_node *n, const char *ssh_config);
tdm_status tdm_node_from_json(json_t *o, tdm_cluster_node *n, char **ssh_config,
                              tdm_error *err);

#endif
