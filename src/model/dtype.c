#include "model/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[TDM_DTYPE_COUNT] = {
    [TDM_DTYPE_F64] = {"F64", 8},         [TDM_DTYPE_F32] = {"F32", 4},
    [TDM_DTYPE_F16] = {"F16", 2},         [TDM_DTYPE_BF16] = {"BF16", 2},
    [TDM_DTYPE_I64] = {"I64", 8},         [TDM_DTYPE_I32] = {"I32", 4},
    [TDM_DTYPE_I16] = {"I16", 2},         [TDM_DTYPE_I8] = {"I8", 1},
    [TDM_DTYPE_U64] = {"U64", 8},         [TDM_DTYPE_U32] = {"U32", 4},
    [TDM_DTYPE_U16] = {"U16", 2},         [TDM_DTYPE_U8] = {"U8", 1},
    [TDM_DTYPE_BOOL] = {"BOOL", 1},       [TDM_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [TDM_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

const char *tdm_dtype_name(tdm_dtype dtype)
{
    return (unsigned)dtype < TDM_DTYPE_COUNT ? dtypes[dtype].name : "?";
}

size_t tdm_dtype_size(tdm_dtype dtype)
{
    return (unsigned)dtype < TDM_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

bool tdm_dtype_parse(const char *name, tdm_dtype *out)
{
    for (int i = 0; i < TDM_DTYPE_COUNT; i++)
        if (!strcmp(dtypes[i].name, name)) {
            *out = (tdm_dtype)i;
            return true;
        }
    return false;
}
