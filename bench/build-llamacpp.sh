#!/usr/bin/env bash
# Build llama.cpp through the PyPI package llama-cpp-python (compiled from
# source by pip) into a venv OUTSIDE the repo, for the comparison tools in
# bench/ and scripts/golden-tok-llamacpp.py. Never part of CI.
#
#   bench/build-llamacpp.sh            # venv in /work/cache/llamacpp-venv
#   LLAMACPP_VENV=/some/dir bench/build-llamacpp.sh
#   FORCE=1 bench/build-llamacpp.sh    # rebuild even if already installed
#   LLAMACPP_AMX=1 LLAMACPP_VENV=/work/cache/llamacpp-amx-venv bench/build-llamacpp.sh
#                                      # AMX kernels in, for a machine with AMX other than this one
#
# Idempotent: when the venv already holds the pinned version it does nothing.
# Flags: clang, -DGGML_NATIVE=ON (tuned for this CPU: -march=native), no
# examples/tests/tools/mtmd. The issue asks for -D__AMX_INT8__=1
# -D__AMX_TILE__=1 to enable ggml's AMX kernels; those flags make the build
# emit AMX instructions, which crash (SIGILL) on a CPU without AMX, so they
# are added ONLY when /proc/cpuinfo lists amx_int8 (and amx_tile).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/requirements.txt"
venv="${LLAMACPP_VENV:-/work/cache/llamacpp-venv}"
python="${PYTHON:-python3}"

want="$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$req")"
[ -n "$want" ] || { echo "no pinned llama-cpp-python in $req" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi

have="$("$venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)"
if [ "$have" = "$want" ] && [ -z "${FORCE:-}" ]; then
    echo "llama-cpp-python $have already in $venv"
    exit 0
fi

cmake_args="-DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release"
cmake_args+=" -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"
cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
cmake_args+=" -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_CURL=OFF"
if [ -n "${LLAMACPP_AMX:-}" ]; then
    # for another machine that has AMX (a device host): the tile instructions by flag, as -march=native
    # would give them there; this build then runs only on a CPU with AMX
    echo "LLAMACPP_AMX set: ggml AMX kernels built in (-mamx-tile -mamx-int8)"
    cmake_args+=" -DCMAKE_C_FLAGS='-mamx-tile -mamx-int8 -D__AMX_INT8__=1 -D__AMX_TILE__=1'"
    cmake_args+=" -DCMAKE_CXX_FLAGS='-mamx-tile -mamx-int8 -D__AMX_INT8__=1 -D__AMX_TILE__=1'"
elif grep -qw amx_int8 /proc/cpuinfo && grep -qw amx_tile /proc/cpuinfo; then
    echo "CPU has AMX: enabling ggml AMX kernels"
    cmake_args+=" -DCMAKE_C_FLAGS='-D__AMX_INT8__=1 -D__AMX_TILE__=1'"
    cmake_args+=" -DCMAKE_CXX_FLAGS='-D__AMX_INT8__=1 -D__AMX_TILE__=1'"
else
    echo "CPU has no AMX (no amx_int8 in /proc/cpuinfo): AMX flags left out"
fi
echo "CMAKE_ARGS=$cmake_args"

"$venv/bin/python" -m pip install --upgrade pip >/dev/null
CC="${CC:-clang}" CXX="${CXX:-clang++}" \
CMAKE_ARGS="$cmake_args" \
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
nice -n 19 "$venv/bin/python" -m pip install -v \
    --no-binary llama-cpp-python --no-cache-dir -r "$req"

"$venv/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "OK")'
