#!/usr/bin/env bash
# gpu-check.sh RESULTS_DIR — the CUDA backend's check, one run on a machine with an NVIDIA GPU
# (docs/GPU.md).  About 4-6 minutes on an H200; everything it finds goes into RESULTS_DIR:
#   summary.txt        one line per step: PASS / FAIL / SKIP and the time it took
#   env.txt            GPU, driver, nvcc, cmake, the commit and any local changes
#   build.log          configure + build (-DKVLLM_CUDA=ON -DKVLLM_CORE_ONLY=ON: no server, no CLI)
#   plan.log           tests/unit/test_cuda_plan (host-side arithmetic; needs no GPU)
#   ops.log, ops.txt   the per-op harness (tests/unit/test_backend_ops.c): every op of the CUDA
#                      backend against the scalar CPU reference on random shapes; ops.txt has one
#                      line per op: worst relative error vs scalar (tolerance) and OK / WRONG
#   greedy.txt         stories260K F32, 256 greedy ids on the GPU vs tests/data/reference
#   memcheck.log       compute-sanitizer --tool memcheck on a 24-token generation
# Environment: KVLLM_SHARED (the test data: models/stories260K, reference/; default tests/data),
# KVLLM_GPU_BUILD (build dir, default build-gpu), KVLLM_GPU_DEPS (json-c and PCRE2
# headers and libraries made by scripts/gpu-deps.sh, for a machine without the -dev packages;
# default build-gpu-deps; KVLLM_GPU_FORCE_DEPS=1 uses them even where pkg-config finds the system's),
# KVLLM_TEST_SEED (the harness's seed, default 1).
# Exit status: 0 when every step passed, 1 otherwise.
set -u
RES=${1:?usage: scripts/gpu-check.sh RESULTS_DIR}
mkdir -p "$RES" && RES=$(cd "$RES" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${KVLLM_GPU_BUILD:-$ROOT/build-gpu}
DEPS=${KVLLM_GPU_DEPS:-$ROOT/build-gpu-deps}
SEED=${KVLLM_TEST_SEED:-1}
SHARED=${KVLLM_SHARED:-$ROOT/tests/data}
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
FAILED=0
: >"$RES/summary.txt"

# step NAME STATUS SECONDS [NOTE]
step() {
    printf '%-10s %-5s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$RES/summary.txt"
    [ "$2" = FAIL ] && FAILED=1
    return 0
}

# ---- the machine ----
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    git status --short 2>/dev/null | sed 's/^/  local: /'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    nvcc --version 2>&1 | tail -2
    cmake --version 2>&1 | head -1
    echo "cpu: $(nproc) cores; shared data: $SHARED"
} >"$RES/env.txt"

# ---- build ----
t0=$SECONDS
if [ -n "${KVLLM_GPU_FORCE_DEPS:-}" ] || ! pkg-config --exists json-c libpcre2-8 2>/dev/null; then
    if [ -d "$DEPS/usr" ]; then
        # the carried .pc files name /usr: point them at $DEPS (only them, with KVLLM_GPU_FORCE_DEPS)
        PC=$BUILD-pc
        mkdir -p "$PC"
        find "$DEPS" -name '*.pc' | while read -r f; do sed "s|=/usr|=$DEPS/usr|" "$f" >"$PC/$(basename "$f")"; done
        if [ -n "${KVLLM_GPU_FORCE_DEPS:-}" ]; then export PKG_CONFIG_LIBDIR=$PC
        else export PKG_CONFIG_PATH=$PC${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}; fi
        echo "json-c and PCRE2 from $DEPS (static)" >>"$RES/env.txt"
    else
        echo "json-c / libpcre2-8 missing and no $DEPS (scripts/gpu-deps.sh makes it)" >>"$RES/env.txt"
    fi
fi
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVLLM_CUDA=ON -DKVLLM_CORE_ONLY=ON >"$RES/build.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target test_backend_ops test_cuda_plan gpu_generate >>"$RES/build.log" 2>&1; then
    nw=$(grep -c -i 'warning' "$RES/build.log")
    step build PASS $((SECONDS - t0)) "$nw warning lines"
else
    step build FAIL $((SECONDS - t0)) "see build.log"
    echo "build failed: nothing else can run" >>"$RES/summary.txt"
    exit 1
fi
BIN=$BUILD/tests/gpu

# ---- host-side arithmetic ----
t0=$SECONDS
if timeout 60 "$BIN/test_cuda_plan" >"$RES/plan.log" 2>&1; then step plan PASS $((SECONDS - t0))
else step plan FAIL $((SECONDS - t0)) "see plan.log"; fi

# ---- the per-op harness: CUDA vs the scalar reference ----
t0=$SECONDS
KVLLM_TEST_SEED=$SEED timeout 300 "$BIN/test_backend_ops" >"$RES/ops.log" 2>&1
rc=$?
# one line per op of the cuda backend: the table row, WRONG when a CHECK named "cuda <op>" failed
awk '
    /CHECK failed/ && / cuda / { for (i = 1; i <= NF; i++) if ($i == "cuda") { bad[$(i + 1)] = 1; break } }
    $1 == "cuda" && $2 ~ /^(matmul|get_rows|gather_rows|rmsnorm|layernorm|rope|add_bias|add|swiglu|gelu|kv_store|paged_attention|copy_blocks)$/ { row[$2] = $0; order[++n] = $2 }
    END {
        for (k = 1; k <= n; k++) { op = order[k]; printf "%-8s %s\n", (op in bad) ? "WRONG" : "OK", row[op] }
        for (op in bad) if (!(op in row)) printf "WRONG    %s (no table row)\n", op
    }' "$RES/ops.log" >"$RES/ops.txt"
grep -q '^SKIP cuda' "$RES/ops.log" && step ops FAIL $((SECONDS - t0)) "$(grep '^SKIP cuda' "$RES/ops.log")"
if ! grep -q '^SKIP cuda' "$RES/ops.log"; then
    nbad=$(grep -c '^WRONG' "$RES/ops.txt")
    if [ "$rc" -eq 0 ]; then step ops PASS $((SECONDS - t0)) "seed $SEED; ops.txt"
    else step ops FAIL $((SECONDS - t0)) "rc $rc, $nbad ops wrong: $(grep '^WRONG' "$RES/ops.txt" | awk '{print $3}' | sort -u | tr '\n' ' ')"; fi
fi

# ---- stories260K: 256 greedy ids on the GPU vs the reference ----
t0=$SECONDS
M=$SHARED/models/stories260K
REF=$SHARED/reference/stories260K_greedy_ids.txt
if [ -f "$M/stories260K.bin" ] && [ -f "$REF" ]; then
    KVLLM_BACKEND=cuda timeout 120 "$BIN/gpu_generate" "$M/stories260K.bin" "$M/tok512.bin" 256 \
        >"$RES/greedy_ids.txt" 2>"$RES/greedy.log"
    rc=$?
    python3 - "$RES/greedy_ids.txt" "$REF" >"$RES/greedy.txt" <<'PY'
import sys
got = open(sys.argv[1]).read().split()
ref = open(sys.argv[2]).read().split()
i = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
ok = got == ref
print(("PASS" if ok else "FAIL") + f": {len(got)} ids, {len(ref)} in the reference, first difference at {i}"
      + ("" if ok else f" (got {got[i:i + 5]}, want {ref[i:i + 5]})"))
sys.exit(0 if ok else 1)
PY
    prc=$?
    if [ "$rc" -eq 0 ] && [ "$prc" -eq 0 ] && grep -q '^PASS' "$RES/greedy.txt"; then step greedy PASS $((SECONDS - t0)) "256 ids = reference"
    else step greedy FAIL $((SECONDS - t0)) "rc $rc; $(cat "$RES/greedy.txt")"; fi
else
    step greedy SKIP 0 "no $M/stories260K.bin or $REF (set KVLLM_SHARED)"
fi

# ---- compute-sanitizer memcheck on one short generation ----
t0=$SECONDS
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null || true)
if [ -n "$CS" ] && [ -f "$M/stories260K.bin" ]; then
    if KVLLM_BACKEND=cuda timeout 240 "$CS" --tool memcheck --leak-check full --error-exitcode 3 \
        "$BIN/gpu_generate" "$M/stories260K.bin" "$M/tok512.bin" 24 >"$RES/memcheck.log" 2>&1; then
        step memcheck PASS $((SECONDS - t0)) "$(grep -E 'ERROR SUMMARY' "$RES/memcheck.log" | tail -1)"
    else
        step memcheck FAIL $((SECONDS - t0)) "$(grep -E 'ERROR SUMMARY' "$RES/memcheck.log" | tail -1); see memcheck.log"
    fi
else
    step memcheck SKIP 0 "no compute-sanitizer in PATH or no model"
fi

echo "not yet checked here (docs/GPU.md): SmolLM2 KLD, server invariance, Llama-3-8B-shape speed vs Transformers" \
    >>"$RES/summary.txt"
exit $FAILED
