#!/bin/sh
# bench/mm/ggml-run.sh GGML_INCLUDE_DIR [K M REPS TYPES]: build ggml-mm.c against llama-cpp-python's libggml
# (the venv of bench/build-llamacpp.sh; LLAMACPP_VENV overrides) and run it.  GGML_INCLUDE_DIR: ggml/include
# of the llama.cpp source that venv was built from (llama-cpp-python's vendor/llama.cpp/ggml/include).
set -e
here=$(cd "$(dirname "$0")" && pwd); inc=${1:?GGML_INCLUDE_DIR}; shift
lib=$(ls -d "${LLAMACPP_VENV:-/work/cache/llamacpp-venv}"/lib/python3*/site-packages/llama_cpp/lib | head -1)
out=${TMPDIR:-/tmp}/ggml-mm
cc -O2 -std=gnu11 -I"$inc" "$here/ggml-mm.c" -o "$out" -L"$lib" -lggml-base -lggml-cpu -lggml -Wl,-rpath,"$lib"
exec "$out" "$@"
