/* safetensors.h — read and write the safetensors format (Hugging Face).
 *
 * File layout (all integers little-endian):
 *   bytes [0, 8)        N: u64, the header length in bytes (tandem refuses N > 100 MB)
 *   bytes [8, 8+N)      header: one UTF-8 JSON object, possibly padded with trailing spaces
 *   bytes [8+N, EOF)    data section: the tensors' bytes, row-major, little-endian
 * Header: {"__metadata__": {"key": "string", ...},              (optional, string values only)
 *          "<tensor name>": {"dtype": "BF16", "shape": [rows, cols],
 *                            "data_offsets": [begin, end]}, ...}
 * data_offsets are relative to the start of the data section. As the reference implementation
 * requires, the tensors sorted by offset tile the data section exactly: no gap, no overlap, no
 * trailing byte, and end - begin == product(shape) * dtype size.
 *
 * The reader checks every one of these before touching any tensor byte, with overflow-checked
 * arithmetic, so a truncated or hostile file fails with a message naming the file and the
 * offending tensor (TDM_ERR_CORRUPT for inconsistent offsets and sizes, TDM_ERR_PARSE for bad
 * JSON or fields, TDM_ERR_UNSUPPORTED for an unknown dtype). The file is mapped read-only; a file
 * truncated by someone else *while* mapped can still raise SIGBUS (mmap's nature).
 * Tensor data pointers point into the mapping and may be unaligned: read them with memcpy or
 * through tdm_st_tensor_to_f32.
 *
 * The writer streams: it writes the header first, then takes the tensors' bytes in the order the
 * specs were given, in pieces of any size, so a 7B model never needs to sit in memory. It writes
 * "<dir>/.<name>.tmp-<pid>", fsyncs, renames over the target and fsyncs the directory (the
 * atomic_file recipe); abort or any failure removes the temp file. The header is padded with
 * spaces so the data section starts at a multiple of 8 bytes.
 * Fault points: safetensors.write, safetensors.fsync, safetensors.rename.
 */
#ifndef TANDEM_MODEL_SAFETENSORS_H
#define TANDEM_MODEL_SAFETENSORS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"
#include "util/error.h"

#define TDM_ST_MAX_RANK 8
#define TDM_ST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

typedef struct tdm_st_tensor {
    char *name;
    tdm_dtype dtype;
    int rank;
    int64_t shape[TDM_ST_MAX_RANK]; /* shape[0..rank) */
    int64_t numel;                  /* product of shape (1 for rank 0) */
    uint64_t offset;                /* from the start of the data section */
    uint64_t nbytes;                /* numel * dtype size */
    const void *data;               /* into the mapping, possibly unaligned */
} tdm_st_tensor;

typedef struct tdm_st_file {
    char *path;             /* as given (for messages) */
    void *map;              /* whole-file mapping when opened from a path, else NULL */
    size_t map_len;
    const uint8_t *data;    /* start of the data section */
    uint64_t data_len;
    tdm_st_tensor *tensors; /* sorted by offset */
    size_t n_tensors;
    char **meta_keys; /* __metadata__, in file order */
    char **meta_values;
    size_t n_meta;
} tdm_st_file;

/* Maps the file at path and validates it completely. On failure f is left closed (nothing to
 * free). Errors: TDM_ERR_NOT_FOUND, TDM_ERR_IO, TDM_ERR_PARSE, TDM_ERR_CORRUPT,
 * TDM_ERR_UNSUPPORTED, TDM_ERR_NOMEM; the message starts with the path. */
tdm_status tdm_st_open(tdm_st_file *f, const char *path, tdm_error *err);

/* Same validation over a caller-owned buffer of len bytes (the fuzz target and tests use it).
 * The buffer must outlive f. `name` is used in messages. */
tdm_status tdm_st_parse(tdm_st_file *f, const void *buf, size_t len, const char *name,
                        tdm_error *err);

/* Releases everything open or parse made; safe on a zeroed or already-closed f. */
void tdm_st_close(tdm_st_file *f);

/* The tensor of that name, or NULL. */
const tdm_st_tensor *tdm_st_find(const tdm_st_file *f, const char *name);

/* The __metadata__ value for key, or NULL. */
const char *tdm_st_metadata(const tdm_st_file *f, const char *key);

/* Converts a F32, F16 or BF16 tensor to f32 into out (numel floats). Other dtypes give
 * TDM_ERR_UNSUPPORTED. */
tdm_status tdm_st_tensor_to_f32(const tdm_st_tensor *t, float *out, tdm_error *err);

/* ---- writer ---- */

typedef struct tdm_st_spec {
    const char *name;
    tdm_dtype dtype;
    int rank;
    int64_t shape[TDM_ST_MAX_RANK];
} tdm_st_spec;

typedef struct tdm_st_writer tdm_st_writer;

/* Checks the specs (unique non-empty names other than "__metadata__", rank <= 8, non-negative
 * dims, no size overflow), creates the temp file and writes the header. meta is n_meta key/value
 * pairs (meta[2i] key, meta[2i+1] value), may be NULL. */
tdm_status tdm_st_writer_open(tdm_st_writer **out, const char *path, const tdm_st_spec *specs,
                              size_t n_specs, const char *const *meta, size_t n_meta,
                              tdm_error *err);

/* Appends len bytes of tensor data (the tensors' bytes back to back in spec order; a call may
 * cover part of a tensor or several). Writing more than the specs announce is an error. */
tdm_status tdm_st_writer_write(tdm_st_writer *w, const void *data, size_t len, tdm_error *err);

/* Bytes still expected before commit. */
uint64_t tdm_st_writer_remaining(const tdm_st_writer *w);

/* Checks every byte was written, then fsync, rename, fsync dir. Frees w whatever the outcome
 * (on failure the temp file is removed and the target untouched). */
tdm_status tdm_st_writer_commit(tdm_st_writer *w, tdm_error *err);

/* Removes the temp file and frees w. NULL is fine. */
void tdm_st_writer_abort(tdm_st_writer *w);

/* One-call save: data[i] holds spec i's bytes. */
tdm_status tdm_st_save(const char *path, const tdm_st_spec *specs, const void *const *data,
                       size_t n_specs, const char *const *meta, size_t n_meta, tdm_error *err);

/* Overflow-checked element count and byte size of a shape; false on overflow or a negative dim. */
bool tdm_st_shape_size(const int64_t *shape, int rank, tdm_dtype dtype, int64_t *numel,
                       uint64_t *nbytes);

#endif
