#!/usr/bin/env bash
# The CPU speed figures of docs/PERF.md in one run: read bandwidth, then kvllm against llama.cpp
# (bench/vs-llamacpp, alternating rep by rep) on the TinyLlama-1.1B shape in F16 / Q8_0 / Q4_0 / Q4_K_M
# and on SmolLM2-135M Q4_1:
#   main   pp512 + tg128, 2 threads, every file
#   one    pp512, 1 thread, every file (prefill scaling = main / one)
#   depth  tg32 at depth 0 and 2048, Q8_0 and Q4_K_M, 2 threads (kept fraction = depth 2048 / depth 0)
#   batch  batched decode of 1, 4, 8, 16 sequences (tg32 each), Q4_K_M and Q8_0, 2 threads
# kvllm runs its default path (KVLLM_ACT unset: 8-bit activations for the quantized types).
# Needs the llama.cpp venv (bench/build-llamacpp.sh) and the models, in $TINY (default models/):
#   .venv/bin/python bench/gen-model --shape tinyllama-1.1B --type f16 --seed 1 -o $TINY/tinyllama-f16.gguf
#   (likewise q8_0 and q4_0; Q4_K_M: build/kvllm quantize $TINY/tinyllama-f16.gguf $TINY/tinyllama-q4_k_m.gguf Q4_K_M)
#   scripts/fetch-smollm2.sh   (SmolLM2-135M-Instruct Q4_1)
# About 35 minutes on 2 cores with REPS=3; REPS and PARTS (default "main one depth batch") trim it.
# Output: one markdown table per part.  Run it on a quiet machine: it is the machine's whole capacity.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${LLAMACPP_VENV:-/work/cache/llamacpp-venv}/bin/python"
reps="${REPS:-3}"
parts="${PARTS:-main one depth batch}"
d="${TINY:-models}"
tiny="$d/tinyllama-f16.gguf,$d/tinyllama-q8_0.gguf,$d/tinyllama-q4_0.gguf,$d/tinyllama-q4_k_m.gguf"
smol="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
unset KVLLM_ACT KVLLM_CPU

echo "# $(date -u +%F\ %T) commit $(git rev-parse --short HEAD), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx_vnni|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512_fp16|amx_tile|amx_int8|amx_bf16)$' | tr '\n' ' ')"
echo "# kvllm: $(build/kvllm info "$smol" 2>&1 | grep -m1 "placed bytes" || true)"
build/kvllm bench membw
for part in $parts; do
    case "$part" in
    main)  echo "## pp512 / tg128, 2 threads"
           "$py" bench/vs-llamacpp -m "$tiny,$smol" --pp 512 --tg 128 --threads 2 --reps "$reps" ;;
    one)   echo "## pp512, 1 thread"
           "$py" bench/vs-llamacpp -m "$tiny,$smol" --pp 512 --tg 0 --threads 1 --reps "$reps" ;;
    depth) echo "## decode at depth, TinyLlama Q8_0 and Q4_K_M, 2 threads"
           "$py" bench/vs-llamacpp -m "$d/tinyllama-q8_0.gguf,$d/tinyllama-q4_k_m.gguf" --pp 0 --tg 32 \
               --depth 0,2048 --threads 2 --reps "$reps" ;;
    batch) echo "## batched decode, TinyLlama Q4_K_M and Q8_0, 2 threads"
           "$py" bench/vs-llamacpp -m "$d/tinyllama-q4_k_m.gguf,$d/tinyllama-q8_0.gguf" --pp 0 --tg 32 \
               --batch 1,4,8,16 --threads 2 --reps "$reps" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done
