#!/bin/bash
# varlen-data.sh N SEED FILE — N JSONL samples of random token ids (0..255), each 64..512 tokens
# long (uniform), from awk's srand(SEED): the variable-length data of the co-training and
# small-model benchmarks (cotrain-gpu.sh, small-model-profile.sh).
awk -v n="$1" -v seed="$2" 'BEGIN { srand(seed)
    for (i = 0; i < n; i++) { L = 64 + int(rand() * 449); printf "{\"input_ids\": ["
        for (k = 0; k < L; k++) printf "%s%d", (k ? "," : ""), int(rand() * 256); print "]}" } }' >"$3"
