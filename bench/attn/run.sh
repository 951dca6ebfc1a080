#!/bin/sh
# bench/attn/run.sh BUILD_DIR [L [THREADS [REPS [KV_TYPE [ROUNDS [LAYERS]]]]]]: build attnbench.c against BUILD_DIR's static libraries and run it.
set -e
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); b=${1:?BUILD_DIR}; shift
cc -O2 -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -I"$root/src" -I"$root/include" "$here/attnbench.c" -o "$b/attnbench" \
   "$b/libkvllm_backend.a" "$b/libkvllm_samplechain.a" "$b/libkvllm_tensor.a" "$b/libkvllm_core.a" -lpthread -lm
exec "$b/attnbench" "$@"
