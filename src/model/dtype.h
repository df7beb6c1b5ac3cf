/* dtype.h — the element types tensors are stored in (the safetensors dtype names).
 *
 * Sizes are in bytes per element. BOOL is one byte per element. The F8 types are recognised
 * (so a file holding them can be listed) but nothing converts them.
 */
#ifndef TANDEM_MODEL_DTYPE_H
#define TANDEM_MODEL_DTYPE_H
#include <stdbool.h>
#include <stddef.h>

typedef enum tdm_dtype {
    TDM_DTYPE_F64,
    TDM_DTYPE_F32,
    TDM_DTYPE_F16,
    TDM_DTYPE_BF16,
    TDM_DTYPE_I64,
    TDM_DTYPE_I32,
    TDM_DTYPE_I16,
    TDM_DTYPE_I8,
    TDM_DTYPE_U64,
    TDM_DTYPE_U32,
    TDM_DTYPE_U16,
    TDM_DTYPE_U8,
    TDM_DTYPE_BOOL,
    TDM_DTYPE_F8_E4M3,
    TDM_DTYPE_F8_E5M2,
    TDM_DTYPE_COUNT
} tdm_dtype;

/* "F32", "BF16", ... exactly as safetensors spells them. */
const char *tdm_dtype_name(tdm_dtype dtype);
/* Bytes per element (1, 2, 4 or 8). */
size_t tdm_dtype_size(tdm_dtype dtype);
/* Parses a safetensors dtype name (case-sensitive); false when unknown. */
bool tdm_dtype_parse(const char *name, tdm_dtype *out);

#endif
