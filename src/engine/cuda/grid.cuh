/* grid.cuh — 1-D launch grids for grid-stride kernels (host code; the CUDA backend and the
 * kernel headers it shares with dev/cuda use it). */
#ifndef TANDEM_ENGINE_CUDA_GRID_CUH
#define TANDEM_ENGINE_CUDA_GRID_CUH
#include <stdint.h>

/* 1-D grid size for n items at `per_block` items per block, capped for grid-stride loops. */
static inline unsigned cuda_blocks(int64_t n, int64_t per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

#endif
