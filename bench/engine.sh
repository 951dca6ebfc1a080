#!/usr/bin/env bash
# The engine's figures for docs/PERF.md (paged KV / continuous batching):
#   1. continuous vs static batching, output lengths 16..256 (stories260K)
#   2. KV waste with block size 16 (stories260K 128:384 / 32:128), also with a
#      pool small enough to force preemption
#   3. time to first token with 90 % of a 1024-token prompt cached vs cold (110M F16)
#   4. quantized KV accuracy (bench/kv-accuracy.py)
# The TinyLlama-1.1B-shape waste runs are separate (slow): see docs/PERF.md.
#   usage: bench/engine.sh [DATA]   (the test data folder, default tests/data)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-tests/data}
K=build/kvllm
ST=models/stories260K.gguf
mkdir -p models
[ -f $ST ] || $K convert "$SHARED/models/stories260K/stories260K.bin" --tokenizer "$SHARED/models/stories260K/tok512.bin" -o $ST 2>/dev/null
[ -f models/110M-f16.gguf ] || .venv/bin/python bench/gen-model --shape 110M --type f16 -o models/110M-f16.gguf
echo "# $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "## 1. continuous vs static (stories260K, 200 requests, prompts 32:128, outputs 16:256)"
for mode in "" --static; do
  $K bench throughput -m $ST --requests 200 --prompt-len 32:128 --gen-len 16:256 $mode | tail -1
done
echo "## 2. KV waste, block size 16 (stories260K, prompts 128:384, outputs 32:128)"
$K bench throughput -m $ST --requests 100 --prompt-len 128:384 --gen-len 32:128 | tail -1
$K bench throughput -m $ST --requests 100 --prompt-len 128:384 --gen-len 32:128 --kv-tokens 2048 | tail -1
echo "## 3. TTFT, 90 % of a 1024-token prompt cached vs cold (110M F16)"
$K bench prefix -m models/110M-f16.gguf --prompt-len 1024 --cached-pct 90 --reps 5 | tail -1
echo "## 4. quantized KV accuracy"
.venv/bin/python bench/kv-accuracy.py --kvllm $K --shared "$SHARED" | tail -n +3
