#!/usr/bin/env bash
# pack.sh OUT [KVLLM ...] — kvllm and llama.cpp (llama-cpp-python) for a CPU comparison on another
# x86-64 machine that has neither our Debian libraries nor network (a device host, whose CPU may have
# what this one lacks, AMX say): each kvllm binary with every shared library it loads, the C library
# and its loader included (run.sh starts them through that loader, so the host's glibc version does
# not matter), and the llama_cpp package with its libraries and libomp.  Carry OUT (and the repo's
# bench/ and tests/python/ travel with the tree); run bench/remote-cpu/run.sh there.
#   LLAMACPP_VENV   the venv of bench/build-llamacpp.sh to take llama_cpp from
#                   (LLAMACPP_AMX=1 builds one with AMX kernels for a host that has them)
set -euo pipefail
out=${1:?usage: pack.sh OUT [KVLLM ...]}
shift
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(build/kvllm)
venv=${LLAMACPP_VENV:-/work/cache/llamacpp-venv}
site=$(echo "$venv"/lib/python3*/site-packages)
rm -rf "$out"
mkdir -p "$out/lib" "$out/py"
for i in "${!bins[@]}"; do
    cp "${bins[$i]}" "$out/kvllm$i.bin"
    ldd "${bins[$i]}" | awk '/=>/ { print $3 } /ld-linux/ { print $1 }' | while read -r lib; do
        cp -L "$lib" "$out/lib/"
    done
done
# llama_cpp: one copy of each library, under the names its loaders ask for
mkdir -p "$out/py/llama_cpp/lib"
(cd "$site/llama_cpp" && find . -name '*.py' -o -name 'py.typed') | while read -r f; do
    mkdir -p "$out/py/llama_cpp/$(dirname "$f")"
    cp "$site/llama_cpp/$f" "$out/py/llama_cpp/$f"
done
for so in libllama.so libggml.so libggml-base.so libggml-cpu.so libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
    cp -L "$site/llama_cpp/lib/$so" "$out/py/llama_cpp/lib/"
done
omp=$(ldd "$site/llama_cpp/lib/libggml-cpu.so" | awk '/libomp/ { print $3 }')
[ -z "$omp" ] || cp -L "$omp" "$out/py/llama_cpp/lib/"
cp -r "$site/diskcache" "$out/py/"
# gen-model's GGUF writer (the test venv's gguf package)
cp -r "$(echo .venv/lib/python3*/site-packages/gguf)" "$out/py/"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$out"
