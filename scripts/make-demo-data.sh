#!/bin/bash
# make-demo-data.sh OUT_DIR [N]: writes three small instruct datasets with learnable patterns,
# deterministically (no randomness beyond a fixed arithmetic sequence):
#   reverse.jsonl    {"instruction": "reverse: abcd", "response": "dcba"}
#   upper.jsonl      {"instruction": "upper: abcd",   "response": "ABCD"}
#   add.jsonl        {"instruction": "add 3 4",       "response": "7"}
# N (default 64) lines each; upper gets N/2 lines and add 3N/2 (different data sizes).
set -eu
out=$1
n=${2:-64}
mkdir -p "$out"
awk -v n="$n" -v out="$out" 'BEGIN {
    letters = "abcdefghij"
    s = 7
    for (i = 0; i < n * 2; i++) {
        len = 3 + i % 3; w = ""
        for (k = 0; k < len; k++) { s = (s * 1103515245 + 12345) % 2147483648; w = w substr(letters, 1 + int(s / 65536) % 10, 1) }
        r = ""; for (k = len; k >= 1; k--) r = r substr(w, k, 1)
        if (i < n) printf("{\"instruction\": \"reverse: %s\", \"response\": \"%s\"}\n", w, r) > (out "/reverse.jsonl")
        if (i < n / 2) printf("{\"instruction\": \"upper: %s\", \"response\": \"%s\"}\n", w, toupper(w)) > (out "/upper.jsonl")
    }
    for (i = 0; i < n * 3 / 2; i++) {
        a = (i * 7 + 3) % 10; b = (i * 3 + 1) % 10
        printf("{\"instruction\": \"add %d %d\", \"response\": \"%d\"}\n", a, b, a + b) > (out "/add.jsonl")
    }
}'
