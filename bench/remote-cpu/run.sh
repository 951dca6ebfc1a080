#!/usr/bin/env bash
# run.sh PACK RESULTS — on the other machine, with PACK from pack.sh: the host's CPU (lscpu, flags, the
# kernel set kvllm picks), random-weight models of the dense shapes PERF.md compares (SmolLM2-135M's in
# Q4_1 with its embedding in Q8_0, and the families' 160 M shapes in Q8_0; bench/gen-model writes them
# there, into MODELS (/tmp/remote-cpu-models), since they are larger than what can be carried), then
# bench/vs-llamacpp over them at 2 threads (pp512, tg128, REPS alternating reps) and, when PACK holds a
# second kvllm, bench/ab-binaries of kvllm1 (A) against kvllm0 (B) on the SmolLM2 shape's pp512.
#   PYTHON   the interpreter (python3; needs numpy)      REPS   vs-llamacpp's reps (3)
set -u
pack=$(cd "${1:?usage: run.sh PACK RESULTS}" && pwd)
res=${2:?usage: run.sh PACK RESULTS}
mkdir -p "$res"
res=$(cd "$res" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
export PYTHONPATH=$pack/py LLAMACPP_VENV=/nonexistent
# each kvllm through the packed loader and libraries
for b in "$pack"/kvllm*.bin; do
    w=${b%.bin}
    printf '#!/bin/sh\nexec %s/lib/ld-linux-x86-64.so.2 --library-path %s/lib %s "$@"\n' "$pack" "$pack" "$b" >"$w"
    chmod +x "$w"
done
{
    date -u +%FT%TZ
    lscpu
    grep -m1 '^flags' /proc/cpuinfo
    ldd --version 2>&1 | head -1
    "$py" --version
    "$pack/kvllm0" --version
    "$py" -c 'import llama_cpp as L; print("llama-cpp-python", L.__version__); print(L.llama_print_system_info().decode())'
} >"$res/host.txt" 2>&1
m=${MODELS:-/tmp/remote-cpu-models}
mkdir -p "$m"
t0=$SECONDS
gen() { "$py" "$root/bench/gen-model" --shape tiny --n-ctx 4096 "$@" >>"$res/gen.log" 2>&1; }
gen --arch llama --type q4_1 --embd-type q8_0 --n-vocab 49152 --n-embd 576 --n-layer 30 --n-head 9 --n-head-kv 3 --n-ff 1536 \
    --tied --rope-theta 100000 --seed 5 -o "$m/smollm2-135m-shape-q4_1.gguf"
F="--type q8_0 --n-vocab 32000 --n-embd 1024 --n-layer 8 --n-head 8 --n-head-kv 4 --n-ff 2816 --seed 5"
gen $F --arch qwen3 --key-length 128 -o "$m/qwen3-q8_0.gguf"
gen $F --arch smollm3 -o "$m/smollm3-q8_0.gguf"
gen $F --arch phi3 -o "$m/phi3-q8_0.gguf"
gen $F --arch gemma2 --tied -o "$m/gemma2-q8_0.gguf"
echo "models: $((SECONDS - t0)) s" >>"$res/gen.log"
models=$(ls "$m"/*.gguf | tr '\n' ',' | sed 's/,$//')
"$py" "$root/bench/vs-llamacpp" -m "$models" --threads 2 --pp 512 --tg 128 --reps "${REPS:-3}" \
    --kvllm "$pack/kvllm0" >"$res/vs-llamacpp.md" 2>"$res/vs-llamacpp.err"
if [ -x "$pack/kvllm1" ]; then
    "$py" "$root/bench/ab-binaries" --a "$pack/kvllm1" --b "$pack/kvllm0" -m "$m/smollm2-135m-shape-q4_1.gguf" \
        --pp 512 --tg 0 --threads 2 --batch 1 --reps 5 >"$res/ab.md" 2>&1
fi
rm -rf "$m"
cat "$res/vs-llamacpp.md"
