#!/usr/bin/env bash
# tp-vs-one.sh — tensor parallelism against one process on this machine: ROUNDS alternating rounds of
#   kvllm bench model -m MODEL -p PP -n TG -r 3 -t 2          (one process, two threads)
#   mpirun -np 2 kvllm bench model ... -t 1                   (two ranks, a thread each)
# then per test the medians of the rounds' medians, their ratio and the TP columns (docs/TP.md).
# usage: bench/tp-vs-one.sh MODEL.gguf [PP=128] [TG=32] [ROUNDS=3]   (KVLLM_BIN: build/kvllm)
set -euo pipefail
cd "$(dirname "$0")/.."
M=$1 PP=${2:-128} TG=${3:-32} ROUNDS=${4:-3}
BIN=${KVLLM_BIN:-build/kvllm}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  "$BIN" bench model -m "$M" -p "$PP" -n "$TG" -r 3 -t 2 -o jsonl > "$OUT/one.$r"
  mpirun -np 2 "$BIN" bench model -m "$M" -p "$PP" -n "$TG" -r 3 -t 1 -o jsonl > "$OUT/tp.$r"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for kind in ("one", "tp"):
    for r in range(1, rounds + 1):
        for line in open(f"{d}/{kind}.{r}"):
            if line.startswith("{"):
                x = json.loads(line)
                rows.setdefault((x["test"], kind), []).append(x)
print("| test | 1 process, 2 threads | 2 ranks x 1 thread | ratio | comm KiB/token | all-reduce ms/token | all-reduce us/layer |")
print("|---|---:|---:|---:|---:|---:|---:|")
for test in sorted({t for t, _ in rows}):
    one, tp = rows[(test, "one")], rows[(test, "tp")]
    m1 = statistics.median(x["tokens_per_s_median"] for x in one)
    m2 = statistics.median(x["tokens_per_s_median"] for x in tp)
    ar = statistics.median(x["all_reduce_ms_per_token"] for x in tp)
    us = statistics.median(x["all_reduce_us_per_layer"] for x in tp)
    print(f"| {test} | {m1:.2f} | {m2:.2f} | {m2 / m1:.3f} | {tp[0]['comm_kib_per_token']:.1f} | {ar:.3f} | {us:.1f} |")
PY
