#!/bin/sh
# bench/mm/run.sh BUILD_DIR [K M REPS [TYPES]] (TYPES e.g. Q4_K,Q6_K): build mmbench.c against BUILD_DIR's static libraries and run it.
set -e
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); b=${1:?BUILD_DIR}; shift
cc -O2 -std=gnu11 -D_GNU_SOURCE -I"$root/src" -I"$root/include" "$here/mmbench.c" -o "$b/mmbench" \
   "$b/libkvllm_backend.a" "$b/libkvllm_samplechain.a" "$b/libkvllm_tensor.a" "$b/libkvllm_core.a" -lpthread -lm
exec "$b/mmbench" "$@"
