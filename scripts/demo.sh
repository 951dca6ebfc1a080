#!/usr/bin/env bash
# make demo: generate text from the default model (stories260K, from shared/).
set -euo pipefail
KVLLM=${1:-build/kvllm}
SHARED=${2:-../shared}
M="$SHARED/models/stories260K"
if [ ! -f "$M/stories260K.bin" ] || [ ! -f "$M/tok512.bin" ]; then
  cat >&2 <<MSG
demo: the default model is missing: expected $M/stories260K.bin and tok512.bin.
      It is Karpathy's TinyStories 260K model from the llama2.c project
      (huggingface.co/karpathy/tinyllamas, folder stories260K): put stories260K.bin
      and tok512.bin there, or run: $KVLLM run -m MODEL.gguf -p "..."
MSG
  exit 1
fi
echo "== kvllm run -m $M/stories260K.bin --tokenizer $M/tok512.bin -p 'Once upon a time' -n 200 --temp 0.8 --seed 42" >&2
"$KVLLM" run -m "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -p "Once upon a time" -n 200 --temp 0.8 --seed 42
