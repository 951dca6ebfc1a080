#!/usr/bin/env bash
# The CPU-speed issue's figures in one run (docs/PERF.md): read bandwidth,
# then kvllm against llama.cpp (bench/vs-llamacpp, alternating rep by rep) on
# the TinyLlama-1.1B shape in F16 / Q8_0 / Q4_0 / Q4_K and on SmolLM2:
# pp512 + tg128 at 2 and 1 threads, decode at depths 0..2048 and batched
# decode of 1..16 sequences.  Needs the llama.cpp venv (bench/build-llamacpp.sh)
# and the models:
#   .venv/bin/python bench/gen-model --shape tinyllama-1.1B --type q8_0 --seed 1 -o models/tinyllama-q8_0.gguf
#   (likewise f16, q4_0; Q4_K: build/kvllm quantize models/tinyllama-f16.gguf models/tinyllama-q4_k.gguf Q4_K)
#   scripts/fetch-smollm2.sh   (SmolLM2-135M-Instruct Q4_1)
# About 40 minutes on 2 cores; REPS (default 3) and PARTS (default
# "main depth batch one") trim it.  Output: one markdown table per part.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${LLAMACPP_VENV:-/work/cache/llamacpp-venv}/bin/python"
reps="${REPS:-3}"
parts="${PARTS:-main depth batch one}"
tiny="models/tinyllama-f16.gguf,models/tinyllama-q8_0.gguf,models/tinyllama-q4_0.gguf,models/tinyllama-q4_k.gguf"
smol="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

echo "# $(date -u +%F\ %T) commit $(git rev-parse --short HEAD), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
build/kvllm bench membw
for part in $parts; do
    case "$part" in
    main)  echo "## pp512 / tg128, 2 threads"
           "$py" bench/vs-llamacpp -m "$tiny,$smol" --pp 512 --tg 128 --threads 2 --reps "$reps" ;;
    depth) echo "## decode at depth, TinyLlama Q8_0, 2 threads"
           "$py" bench/vs-llamacpp -m models/tinyllama-q8_0.gguf --pp 0 --tg 32 --depth 0,512,1024,2048 \
               --threads 2 --reps "$reps" ;;
    batch) echo "## batched decode, TinyLlama Q8_0, 2 threads"
           "$py" bench/vs-llamacpp -m models/tinyllama-q8_0.gguf --pp 0 --tg 32 --batch 1,4,8,16 \
               --threads 2 --reps "$reps" ;;
    one)   echo "## pp512 / tg128, 1 thread"
           "$py" bench/vs-llamacpp -m "$tiny,$smol" --pp 512 --tg 128 --threads 1 --reps "$reps" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done
