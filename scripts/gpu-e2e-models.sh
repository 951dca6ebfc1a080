#!/usr/bin/env bash
# gpu-e2e-models.sh [OUT_DIR] — small random-weight GGUF files of the families and quantized types the
# CUDA backend's end-to-end step should cover (scripts/gpu-check.sh, E2E_MODELS): Gemma 3 with sliding
# windows in Q4_K_M, Phi-3 in Q5_K_M, and two mixture-of-experts files (Qwen3-MoE Q8_0, gpt-oss), 19 MB
# together, so they travel to a GPU machine as one carried folder (default models/gpu-e2e).  Needs
# build/kvllm (the K types go through `kvllm quantize`) and the test venv's numpy.
set -eu
OUT=${1:-models/gpu-e2e}
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
c="--shape tiny --n-vocab 4096 --n-embd 256 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 512 --n-ctx 1024 --seed 7"
moe="--n-expert 4 --n-expert-used 2 --n-ff-exp 256"
# shellcheck disable=SC2086
{
    "$PY" bench/gen-model $c --arch gemma3 --type q4_k_m --sliding-window 32 --tied -o "$OUT/gemma3-q4_k_m.gguf"
    "$PY" bench/gen-model $c --arch phi3 --type q5_k_m -o "$OUT/phi3-q5_k_m.gguf"
    "$PY" bench/gen-model $c --arch qwen3moe --type q8_0 --key-length 64 $moe -o "$OUT/qwen3moe-q8_0.gguf"
    "$PY" bench/gen-model $c --arch gpt-oss --type q8_0 --sliding-window 32 $moe -o "$OUT/gpt-oss.gguf"
}
