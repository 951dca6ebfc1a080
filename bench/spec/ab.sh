#!/bin/bash
# bench/spec/ab.sh — prompt lookup on a copy-heavy task (docs/PERF.md): SmolLM2 rewrites a code block,
# one sequence, greedy, with and without --spec-ngram, reps alternated so that load drifts hit both.
# usage: bench/spec/ab.sh [REPS] [extra kvllm run options...]   (KVLLM_ACT etc. from the environment)
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-5}; shift || true
bin=${KVLLM_BIN:-build/kvllm}
model=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
for r in $(seq "$reps"); do
  for mode in plain spec; do
    flags=(); [ "$mode" = spec ] && flags=(--spec-ngram)
    "$bin" run -m "$model" -sys "You are a helpful assistant." -f bench/spec/copy-code.txt -n 200 --temp 0 \
      "${flags[@]}" "$@" 2>&1 >/dev/null | \
      sed -nE "s/.*generation ([0-9]+) tokens in ([0-9.]+) ms \(([0-9.]+) tok\/s.*/$mode rep $r: \3 tok\/s (\1 tokens)/p; s/.*speculation .*: ([0-9]+) of ([0-9]+) drafts accepted \(([0-9.]+) %\).*/$mode rep $r: accepted \1 of \2 (\3 %)/p"
  done
done
