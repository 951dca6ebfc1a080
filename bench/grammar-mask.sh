#!/bin/sh
# bench/grammar-mask.sh — what JSON-schema-constrained decoding adds per token: fill_mask + accept over
# the model's whole vocabulary (kvllm grammar --bench-mask, bench/grammar-mask/schema.json and a
# 194-token instance), against the unconstrained decode step (kvllm bench model -n 128), measured in
# the same run (the decode step before and after the mask timing, averaged) so that a loaded machine
# slows both.  Prints the figures and the ratios of the medians; docs/PERF.md records them.
# usage: bench/grammar-mask.sh [KVLLM_BIN] [MODEL] [THREADS] [REPS]
set -eu
BIN=${1:-build/kvllm}
MODEL=${2:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
T=${3:-2}
REPS=${4:-20}
D=$(dirname "$0")/grammar-mask
step() {
    "$BIN" bench model -m "$MODEL" -p 0 -n 128 -t "$T" -r 5 -o json 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["ms_per_token_median"])'
}
s1=$(step)
mask=$("$BIN" grammar --json-schema "$D/schema.json" --bench-mask "$MODEL" --text-file "$D/instance.json" --reps "$REPS")
s2=$(step)
echo "$mask"
echo "decode step (tg128, $T threads): $s1 ms before, $s2 ms after"
printf '%s\n' "$mask" | python3 -c '
import re, sys
step = (float(sys.argv[1]) + float(sys.argv[2])) / 2
for line in sys.stdin:
    m = re.match(r"(.*): mask\+accept per token: median ([0-9.]+) us, p90 ([0-9.]+) us, p99 ([0-9.]+) us, max [0-9.]+ us, mean ([0-9.]+) us", line)
    if m:
        what, med, p90, p99, mean = m.group(1), *map(float, m.groups()[1:])
        print(f"{what}: median {med:.1f} us = {100 * med / 1e3 / step:.2f} % of the {step:.2f} ms step; "
              f"mean {mean:.1f} us = {100 * mean / 1e3 / step:.2f} %; p99 {p99:.1f} us")
' "$s1" "$s2"
