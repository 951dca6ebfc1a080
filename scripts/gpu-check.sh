#!/usr/bin/env bash
# gpu-check.sh RESULTS_DIR — the CUDA backend's check, one run on a machine with an NVIDIA GPU
# (docs/GPU.md).  The whole run keeps under 7 minutes (DEADLINE_S, 400 s, for a 10-minute command
# limit): every step runs under its own timeout, cut to what is left before the deadline, and a step
# that no longer fits is a SKIP saying so.  Everything goes into RESULTS_DIR as it is found, so a run
# killed at the command limit still leaves its evidence:
#   summary.txt        one line per step: PASS / FAIL / SKIP, seconds, a note (written step by step)
#   env.txt            GPU, driver, nvcc, cmake, the commit and any local changes; nvidia-smi.txt: -q
#   build.log          configure + build (-DKVLLM_CUDA=ON -DKVLLM_CORE_ONLY=ON, -lineinfo: no server, no CLI)
#   unit.log           test_cuda_plan (host-side arithmetic) and test_cuda_errors (the error path)
#   greedy.txt         stories260K F32, 256 greedy ids on the GPU vs tests/data/reference; on a
#                      difference, the logit margin there on the CPU and on the GPU
#   e2e.txt            each model of E2E_MODELS (scripts/gpu-e2e-models.sh makes small ones): greedy
#                      ids after a 65-token batched prefill against the scalar CPU's, the GPU's f32
#                      path (exact up to near-ties) and its default path (parting no earlier than the
#                      CPU's default does), CUDA graphs vs eager; margins at the first difference
#   ops/OP.log, ops.txt       the per-op harness (tests/unit/test_backend_ops.c), one process per op so
#                             one fault cannot hide the rest: CUDA vs the scalar CPU reference on random
#                             small shapes; ops.txt: OK / WRONG / CRASH / TIMEOUT per op
#   timing.txt         gpu_timing: CUDA-event times of a 4096 x 14336 mat-vec per weight type and of
#                      decode attention at 1k and 8k context, against the bandwidth roofline; then the
#                      prefill paths: 512-token cuBLAS matmuls (F16, Q4_0) and tensor-core attention
#                      (512 tokens at 512 and at 8k) in TFLOP/s
#   sanitize/TOOL.log  compute-sanitizer memcheck, racecheck, synccheck, initcheck on a short run
#   large/OP.log, large.txt   the harness at Llama-3-8B / Qwen2.5-7B shapes (KVLLM_TEST_LARGE=1)
# Environment: KVLLM_SHARED (the test data; default tests/data), KVLLM_GPU_BUILD (build dir, default
# build-gpu), KVLLM_GPU_DEPS (json-c and PCRE2 made by scripts/gpu-deps.sh, for a machine without the
# -dev packages; default build-gpu-deps; KVLLM_GPU_FORCE_DEPS=1 uses them even where pkg-config finds
# the system's), KVLLM_TEST_SEED (the harness's seed, default 1), E2E_MODELS (more GGUF files for the
# e2e step, space-separated: carry a quantized one), DEADLINE_S.
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
M=$SHARED/models/stories260K
E2E_MODELS="$SHARED/models/llama-2-tiny-random/llama-2-tiny-random.gguf ${E2E_MODELS:-}"
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
DEADLINE=$((SECONDS + ${DEADLINE_S:-400}))
FAILED=0
: >"$RES/summary.txt"

# step NAME STATUS SECONDS [NOTE]
step() {
    printf '%-10s %-5s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$RES/summary.txt"
    [ "$2" = FAIL ] && FAILED=1
    return 0
}
# budget SECONDS: the step's timeout, cut to the time left before the deadline (0: no time left)
budget() {
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt 5 ] && { echo 0; return; }
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# ---- the machine ----
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    git status --short 2>/dev/null | sed 's/^/  local: /'
    timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    nvcc --version 2>&1 | tail -2
    cmake --version 2>&1 | head -1
    echo "cpu: $(nproc) cores; shared data: $SHARED; seed $SEED"
} >"$RES/env.txt"
timeout 10 nvidia-smi -q >"$RES/nvidia-smi.txt" 2>&1

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
T=$(budget 170)
if timeout "$T" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVLLM_CUDA=ON -DKVLLM_CORE_ONLY=ON \
        -DCMAKE_CUDA_FLAGS=-lineinfo >"$RES/build.log" 2>&1 &&
   timeout "$((T - (SECONDS - t0)))" cmake --build "$BUILD" -j "$JOBS" --target test_backend_ops test_cuda_plan \
        test_cuda_errors gpu_generate gpu_timing >>"$RES/build.log" 2>&1; then
    step build PASS $((SECONDS - t0)) "$(grep -c -i 'warning' "$RES/build.log") warning lines"
else
    step build FAIL $((SECONDS - t0)) "see build.log"
    echo "build failed: nothing else can run" >>"$RES/summary.txt"
    exit 1
fi
BIN=$BUILD/tests/gpu
GEN=$BIN/gpu_generate

# ---- host-side: the plan's arithmetic and the error path ----
t0=$SECONDS
T=$(budget 30)
if timeout "$T" "$BIN/test_cuda_plan" >"$RES/unit.log" 2>&1 && timeout "$T" "$BIN/test_cuda_errors" >>"$RES/unit.log" 2>&1
then step unit PASS $((SECONDS - t0))
else step unit FAIL $((SECONDS - t0)) "see unit.log"; fi

# first_diff A B: the index of the first differing id of two id lines, or nothing when equal
first_diff() {
    python3 -c 'import sys
a, b = (open(f).read().split() for f in sys.argv[1:3])
i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
print("" if i is None else i)' "$1" "$2"
}
# margin FILE I: line I of a margins file (id, runner-up, margin)
margin() { sed -n "$(($2 + 1))p" "$1" 2>/dev/null; }

# ---- stories260K: 256 greedy ids on the GPU vs the reference ----
t0=$SECONDS
REF=$SHARED/reference/stories260K_greedy_ids.txt
T=$(budget 45)
if [ "$T" -eq 0 ]; then step greedy SKIP 0 "out of time"
elif [ -f "$M/stories260K.bin" ] && [ -f "$REF" ]; then
    KVLLM_BACKEND=cuda timeout "$T" "$GEN" "$M/stories260K.bin" "$M/tok512.bin" 256 0 "$RES/greedy.gpu.margins" \
        >"$RES/greedy_ids.txt" 2>"$RES/greedy.log"
    rc=$?
    i=$(first_diff "$RES/greedy_ids.txt" "$REF")
    if [ "$rc" -eq 0 ] && [ -z "$i" ]; then
        echo "PASS: 256 ids = reference" >"$RES/greedy.txt"
        step greedy PASS $((SECONDS - t0)) "256 ids = reference"
    else
        KVLLM_BACKEND=cpu timeout 30 "$GEN" "$M/stories260K.bin" "$M/tok512.bin" 256 0 "$RES/greedy.cpu.margins" \
            >/dev/null 2>&1
        echo "FAIL: rc $rc, first difference at ${i:-?}; CPU there: $(margin "$RES/greedy.cpu.margins" "${i:-0}");" \
             "GPU: $(margin "$RES/greedy.gpu.margins" "${i:-0}") (id, runner-up, margin)" >"$RES/greedy.txt"
        step greedy FAIL $((SECONDS - t0)) "$(cat "$RES/greedy.txt")"
    fi
else
    step greedy SKIP 0 "no $M/stories260K.bin or $REF (set KVLLM_SHARED)"
fi

# ---- end to end: a batched prefill, then greedy ids, GPU vs the CPU's exact path, per model ----
# The reference is the scalar f32 set (KVLLM_CPU=scalar).  The GPU's f32 path (KVLLM_ACT=f32) must
# give its ids, parting only at a near-tie (the reference's margin there below 1e-3).  The GPU's
# default path (8-bit activations, cuBLAS and tensor-core attention for the prefill) rounds other
# things than the CPU's default path does, so it is held to the reference as the CPU's default is:
# its first difference from the reference no earlier than the CPU default's.  CUDA graphs must
# give the eager run's ids exactly.  A model the CUDA backend refuses (an op it does not run) is a
# SKIP naming the op.
t0=$SECONDS
: >"$RES/e2e.txt"
bad=0; n=0
for f in $E2E_MODELS; do
    T=$(budget 40)
    [ "$T" -eq 0 ] && { echo "SKIP $f: out of time" >>"$RES/e2e.txt"; continue; }
    [ -f "$f" ] || { echo "SKIP $f: no such file" >>"$RES/e2e.txt"; continue; }
    b=$RES/e2e.$(basename "$f")
    KVLLM_BACKEND=cpu KVLLM_CPU=scalar timeout "$T" "$GEN" "$f" - 64 65 "$b.ref.margins" >"$b.ref" 2>"$b.log"
    KVLLM_BACKEND=cpu timeout "$T" "$GEN" "$f" - 64 65 "$b.cpu.margins" >"$b.cpu" 2>>"$b.log"
    KVLLM_BACKEND=cuda timeout "$T" "$GEN" "$f" - 64 65 "$b.gpu.margins" >"$b.gpu" 2>>"$b.log"
    rc=$?
    if [ "$rc" -ne 0 ] && grep -q "cuda backend cannot run" "$b.log"; then
        echo "SKIP $f: $(grep -m1 -o 'the cuda backend cannot run.*' "$b.log")" >>"$RES/e2e.txt"
        continue
    fi
    KVLLM_BACKEND=cuda KVLLM_ACT=f32 timeout "$T" "$GEN" "$f" - 64 65 "$b.gpu-f32.margins" >"$b.gpu-f32" 2>>"$b.log"
    rc32=$?
    # the same on the GPU with every op issued directly: a difference here is the CUDA graph's
    KVLLM_BACKEND=cuda KVLLM_ENFORCE_EAGER=1 timeout "$T" "$GEN" "$f" - 64 65 >"$b.gpu-eager" 2>>"$b.log"
    n=$((n + 1)); ok=1
    j=$(first_diff "$b.gpu" "$b.gpu-eager")
    if [ "$rc" -eq 0 ] && [ -s "$b.gpu-eager" ] && [ -z "$j" ]; then echo "PASS $f: CUDA graphs = eager, 64 ids" >>"$RES/e2e.txt"
    else ok=0; echo "FAIL $f: CUDA graphs vs eager: first difference at ${j:-?} (log: $b.log)" >>"$RES/e2e.txt"; fi
    i=$(first_diff "$b.gpu-f32" "$b.ref")
    rm=$(margin "$b.ref.margins" "${i:-0}" | awk '{print $3}')
    if [ "$rc32" -eq 0 ] && [ -s "$b.gpu-f32" ] && { [ -z "$i" ] || awk -v m="$rm" 'BEGIN { exit !(m < 1e-3) }'; }; then
        echo "PASS $f: f32 path: 64 ids after 65 prefilled = the scalar CPU's${i:+ up to a near-tie at $i (margin $rm)}" >>"$RES/e2e.txt"
    else
        ok=0
        echo "FAIL $f: f32 path: rc $rc32, first difference at ${i:-?}; scalar CPU $(margin "$b.ref.margins" "${i:-0}")," \
             "GPU $(margin "$b.gpu-f32.margins" "${i:-0}") (id, runner-up, margin)" >>"$RES/e2e.txt"
    fi
    ig=$(first_diff "$b.gpu" "$b.ref"); ic=$(first_diff "$b.cpu" "$b.ref")
    if [ -s "$b.gpu" ] && { [ -z "$ig" ] || { [ -n "$ic" ] && [ "$ig" -ge "$ic" ]; }; }; then
        echo "PASS $f: default path: first difference from the scalar CPU at ${ig:-none} (the CPU's default: ${ic:-none})" >>"$RES/e2e.txt"
    else
        ok=0
        echo "FAIL $f: default path: first difference from the scalar CPU at ${ig:-?}, the CPU's default at ${ic:-none};" \
             "scalar $(margin "$b.ref.margins" "${ig:-0}"), GPU $(margin "$b.gpu.margins" "${ig:-0}") (id, runner-up, margin)" >>"$RES/e2e.txt"
    fi
    [ "$ok" -eq 1 ] || bad=$((bad + 1))
done
if [ "$n" -eq 0 ]; then step e2e SKIP $((SECONDS - t0)) "$(head -1 "$RES/e2e.txt")"
elif [ "$bad" -eq 0 ]; then step e2e PASS $((SECONDS - t0)) "$n model(s); e2e.txt"
else step e2e FAIL $((SECONDS - t0)) "$bad of $n differ; e2e.txt"; fi

# run_ops DIR LARGE TIMEOUT OPS...: the harness once per op (OP or OP:WEIGHT_TYPE), in parallel, the
# scalar CPU backend as the reference; DIR/OP.log and a verdict line each
run_ops() {
    local dir=$1 large=$2 t=$3
    shift 3
    mkdir -p "$dir"
    printf '%s\n' "$@" | xargs -P "$((JOBS / 2 > 1 ? JOBS / 2 : 1))" -I{} sh -c '
        op=${2%%:*}; wt=; case $2 in *:*) wt=${2#*:} ;; esac
        log=$1/$(echo "$2" | tr : _).log
        KVLLM_TEST_SEED='"$SEED"' KVLLM_TEST_LARGE='"$large"' KVLLM_TEST_OPS=$op KVLLM_TEST_WTYPES=$wt \
            KVLLM_TEST_BACKENDS=cuda timeout '"$t"' "$0" >"$log" 2>&1
        rc=$?
        if grep -q "^SKIP cuda" "$log"; then v=SKIP
        elif [ $rc -eq 0 ]; then v=OK
        elif [ $rc -eq 124 ]; then v=TIMEOUT
        elif [ $rc -gt 128 ]; then v=CRASH
        else v=WRONG; fi
        echo "$v $2 rc=$rc $(grep -m1 "CHECK failed" "$log")"' "$BIN/test_backend_ops" "$dir" {}
}
ops_step() {   # ops_step NAME DIR LARGE BUDGET OPS...
    local name=$1 dir=$2 large=$3 t0=$SECONDS T
    T=$(budget "$4")
    shift 4
    if [ "$T" -eq 0 ]; then step "$name" SKIP 0 "out of time"; return; fi
    run_ops "$dir" "$large" "$T" "$@" | sort >"$dir.txt"
    if grep -q '^SKIP' "$dir.txt"; then step "$name" FAIL $((SECONDS - t0)) "$(grep -h '^SKIP cuda' "$dir"/*.log | head -1)"
    elif grep -qv '^OK' "$dir.txt"; then
        step "$name" FAIL $((SECONDS - t0)) "$(grep -vc '^OK' "$dir.txt") of $# ops: $(grep -v '^OK' "$dir.txt" | awk '{print $1, $2}' | tr '\n' ' ')"
    else step "$name" PASS $((SECONDS - t0)) "$# ops, seed $SEED; $(basename "$dir").txt"; fi
}

# ---- the per-op harness: CUDA vs the scalar reference, random small shapes ----
ops_step ops "$RES/ops" 0 100 matmul get_rows gather_rows rmsnorm layernorm rope add_bias add swiglu gelu geglu \
    scale softcap moe kv_store paged_attention copy_blocks argmax sample add_rmsnorm \
    rope_kv_store errors

# ---- timings against the roofline ----
t0=$SECONDS
T=$(budget 40)
if [ "$T" -eq 0 ]; then step timing SKIP 0 "out of time"
elif timeout "$T" "$BIN/gpu_timing" 50 >"$RES/timing.txt" 2>&1; then
    pf=$(grep -m1 'prefill attention' "$RES/timing.txt" | sed 's/  */ /g')
    step timing PASS $((SECONDS - t0)) "$(grep -m1 'Q4_0' "$RES/timing.txt" | sed 's/  */ /g'); $pf"
else step timing FAIL $((SECONDS - t0)) "see timing.txt"; fi

# ---- compute-sanitizer: four tools at once on a short run (-lineinfo build) ----
t0=$SECONDS
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null || true)
T=$(budget 120)
if [ "$T" -eq 0 ]; then step sanitize SKIP 0 "out of time"
elif [ -n "$CS" ] && [ -f "$M/stories260K.bin" ]; then
    mkdir -p "$RES/sanitize"
    for tool in memcheck racecheck synccheck initcheck; do
        extra=""; [ "$tool" = memcheck ] && extra="--leak-check full"
        # shellcheck disable=SC2086
        KVLLM_BACKEND=cuda timeout "$T" "$CS" --tool "$tool" $extra --error-exitcode 3 \
            "$GEN" "$M/stories260K.bin" "$M/tok512.bin" 8 20 >"$RES/sanitize/$tool.log" 2>&1 &
    done
    wait
    note=""; bad=0
    for tool in memcheck racecheck synccheck initcheck; do
        s=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$RES/sanitize/$tool.log" | tail -1)
        grep -qE '(ERROR|RACECHECK) SUMMARY: 0 ' "$RES/sanitize/$tool.log" || bad=1
        note="$note$tool: ${s:-no summary}; "
    done
    if [ "$bad" -eq 0 ]; then step sanitize PASS $((SECONDS - t0)) "$note"
    else step sanitize FAIL $((SECONDS - t0)) "$note see sanitize/"; fi
else
    step sanitize SKIP 0 "no compute-sanitizer in PATH or no model"
fi

# ---- the harness at real models' shapes: matmul and get_rows one weight type per process ----
WTYPES="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4"
# shellcheck disable=SC2046
ops_step large "$RES/large" 1 150 $(for w in $WTYPES; do echo "matmul:$w get_rows:$w"; done) rmsnorm rope \
    elementwise argmax sample add_rmsnorm rope_kv_store paged_attention

echo "total $SECONDS s; not checked here (docs/GPU.md): SmolLM2 KLD, server invariance, Transformers comparison" \
    >>"$RES/summary.txt"
exit $FAILED
