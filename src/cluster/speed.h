/* speed.h — how fast a GPU trains QLoRA adapters relative to an RTX 4090 (= 1.0), for placement.
 *
 * Matched case-insensitively against the GPU's name, first match wins (docs/cluster.md has the
 * table): H200 2.8, H100 2.5, A100 1.5, RTX 4090 1.0, RTX 4080 0.75, RTX 3090 0.55,
 * Jetson Orin / Orin 0.06, anything else 0.5. A node's CPU counts 0.01.
 * The numbers are rough ratios of bf16 tensor throughput and memory bandwidth, not measurements.
 */
#ifndef TANDEM_CLUSTER_SPEED_H
#define TANDEM_CLUSTER_SPEED_H

#define TDM_SPEED_UNKNOWN_GPU 0.5
#define TDM_SPEED_CPU 0.01

/* The speed factor for a GPU called name (NULL or "" is unknown). */
double tdm_gpu_speed_factor(const char *name);

#endif
