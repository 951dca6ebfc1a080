#!/usr/bin/env bash
# Build llama.cpp's `llama-server` binary from the llama.cpp source that the
# pinned PyPI package llama-cpp-python ships in its sdist (vendor/llama.cpp),
# so our server can be benchmarked against llama.cpp's server built from the
# very same llama.cpp revision the Python reference (bench/build-llamacpp.sh)
# uses. Everything lives in a cache dir OUTSIDE the repo. Never part of CI.
#
#   bench/build-llama-server.sh              # in /work/cache/llama-server
#   LLAMA_SERVER_DIR=/some/dir bench/build-llama-server.sh
#   FORCE=1 bench/build-llama-server.sh      # re-extract and rebuild
#   bin="$(bench/build-llama-server.sh)"     # stdout = binary path only
#
# Idempotent: when the binary for the pinned version already exists it only
# prints its path. Progress and build logs go to stderr; the only line on
# stdout is the path of the binary.
#
# Steps: pip download the sdist (no deps, no wheels), extract it, configure
# vendor/llama.cpp with cmake and build only the llama-server target
# (nice -n 19, parallel level = nproc).
# Flags as in bench/build-llamacpp.sh: clang, -DGGML_NATIVE=ON, Release, no
# examples/tests; AMX flags (-D__AMX_INT8__=1 -D__AMX_TILE__=1) ONLY when
# /proc/cpuinfo lists amx_int8 and amx_tile (else SIGILL on non-AMX CPUs).
# Server-specific: tools + server ON, the unified app OFF, no curl/openssl
# (HTTPS model download is not needed), and no web UI: the UI is either
# built with npm or downloaded from Hugging Face at build time, neither of
# which works offline, so the server is built without the embedded UI (the
# HTTP API is unaffected). The llama.cpp commit is read from the sdist's
# CHANGELOG.md and passed as LLAMA_BUILD_COMMIT so `llama-server --version`
# shows it (the sdist has no .git).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/requirements.txt"
dir="${LLAMA_SERVER_DIR:-/work/cache/llama-server}"
python="${PYTHON:-python3}"

log() { echo "build-llama-server: $*" >&2; }

want="$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$req")"
[ -n "$want" ] || { echo "no pinned llama-cpp-python in $req" >&2; exit 1; }

sdist_dir="$dir/sdist"
src="$dir/src/llama_cpp_python-$want"
build="$dir/build-$want"
bin="$build/bin/llama-server"

if [ -x "$bin" ] && [ -z "${FORCE:-}" ]; then
    log "llama-server (llama-cpp-python $want) already built"
    echo "$bin"
    exit 0
fi

# 1. download the sdist (kept across FORCE rebuilds)
mkdir -p "$sdist_dir"
tarball="$sdist_dir/llama_cpp_python-$want.tar.gz"
if [ ! -s "$tarball" ]; then
    log "downloading llama-cpp-python==$want sdist"
    "$python" -m pip download --no-binary :all: --no-deps \
        "llama-cpp-python==$want" -d "$sdist_dir" >&2
fi
[ -s "$tarball" ] || { echo "sdist not found: $tarball" >&2; exit 1; }

# 2. extract (into a temp dir first, so an interrupted run leaves no half tree)
if [ -n "${FORCE:-}" ]; then
    rm -rf "$src" "$build"
fi
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    log "extracting $tarball"
    rm -rf "$src" "$src.tmp"
    mkdir -p "$src.tmp"
    tar -xzf "$tarball" -C "$src.tmp" --strip-components=1
    mv "$src.tmp" "$src"
fi
llama="$src/vendor/llama.cpp"
[ -f "$llama/tools/server/CMakeLists.txt" ] \
    || { echo "no tools/server in $llama" >&2; exit 1; }

commit="$(awk -v v="[$want]" '
    $1 == "##" && $2 == v { f = 1; next }
    $1 == "##" { f = 0 }
    f && match($0, /llama\.cpp@[0-9a-f]+/) { print substr($0, RSTART + 10, RLENGTH - 10); exit }
' "$src/CHANGELOG.md" 2>/dev/null || true)"
log "vendored llama.cpp commit: ${commit:-unknown}"

# 3. configure + build only llama-server
cmake_args=(
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
if [ -n "$commit" ]; then
    cmake_args+=("-DLLAMA_BUILD_COMMIT=$commit")
fi
if grep -qw amx_int8 /proc/cpuinfo && grep -qw amx_tile /proc/cpuinfo; then
    log "CPU has AMX: enabling ggml AMX kernels"
    cmake_args+=("-DCMAKE_C_FLAGS=-D__AMX_INT8__=1 -D__AMX_TILE__=1")
    cmake_args+=("-DCMAKE_CXX_FLAGS=-D__AMX_INT8__=1 -D__AMX_TILE__=1")
else
    log "CPU has no AMX (no amx_int8 in /proc/cpuinfo): AMX flags left out"
fi
if command -v ninja >/dev/null 2>&1; then
    cmake_args+=(-G Ninja)
fi
log "cmake ${cmake_args[*]}"

jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
CC="${CC:-clang}" CXX="${CXX:-clang++}" \
    cmake -S "$llama" -B "$build" "${cmake_args[@]}" >&2
nice -n 19 cmake --build "$build" --config Release --target llama-server \
    -j "$jobs" >&2
log "built in $((SECONDS - start)) s"

[ -x "$bin" ] || { echo "build finished but $bin is missing" >&2; exit 1; }
"$bin" --version >&2 || true
echo "$bin"
