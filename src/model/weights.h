/* weights.h — the tensors of a model: one .safetensors file, or a Hugging Face model directory
 * holding either model.safetensors or a sharded set listed by model.safetensors.index.json.
 *
 * Index format (Hugging Face):
 *   {"metadata": {"total_size": BYTES}, "weight_map": {"<tensor name>": "<shard file>", ...}}
 * Shard file names must be plain names inside the model directory (no '/', not starting with
 * '.'). tandem requires the index and the shards to agree exactly: every indexed tensor is in
 * the shard the index names, and every tensor of every shard is indexed; a tensor present in two
 * shards is an error. Each shard is validated like any safetensors file (safetensors.h).
 */
#ifndef TANDEM_MODEL_WEIGHTS_H
#define TANDEM_MODEL_WEIGHTS_H
#include <stddef.h>

#include "model/safetensors.h"
#include "util/error.h"

typedef struct tdm_weights {
    tdm_st_file *files; /* one per shard, in index order of first appearance */
    char **file_names;  /* their paths */
    size_t n_files;
    const tdm_st_tensor **tensors; /* all tensors, sorted by name */
    size_t *tensor_file;           /* tensors[i] lives in files[tensor_file[i]] */
    size_t n_tensors;
    char *index_path; /* the index file when sharded, else NULL */
} tdm_weights;

/* Opens path: a .safetensors file, or a directory (model.safetensors.index.json first, then
 * model.safetensors). TDM_ERR_NOT_FOUND when a directory holds neither. On failure w is left
 * closed. */
tdm_status tdm_weights_open(tdm_weights *w, const char *path, tdm_error *err);
void tdm_weights_close(tdm_weights *w);

/* The tensor of that name (binary search), or NULL. */
const tdm_st_tensor *tdm_weights_find(const tdm_weights *w, const char *name);

/* Total bytes of tensor data over all shards. */
uint64_t tdm_weights_data_bytes(const tdm_weights *w);

#endif
