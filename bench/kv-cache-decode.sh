#!/usr/bin/env bash
# What the KV cache buys: decode milliseconds per token at context positions
# 16, 256 and 1024 on a random-weight "110M" model (n_embd 768, 12 layers,
# 12 heads, ffn 2048, vocab 32000), with the cache and without it (every step
# recomputes the whole prefix).  Median of several runs; figures go to
# docs/PERF.md together with this command line.
#   usage: bench/kv-cache-decode.sh [THREADS] [TYPE]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
TYPE=${2:-f32}
MODEL=models/110M-$TYPE.gguf
[ -f "$MODEL" ] || .venv/bin/python bench/gen-model --shape 110M --type "$TYPE" -o "$MODEL"
echo "# $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') threads=$THREADS"
build/kvllm bench model -m "$MODEL" --pp 0 --tg 16 --depth 16,256,1024 --reps 5 -t "$THREADS"
build/kvllm bench model -m "$MODEL" --pp 0 --tg 2 --depth 16,256,1024 --reps 3 -t "$THREADS" --no-kv-cache
