#!/usr/bin/env bash
# Start N kvllm replicas and a router in front of them on one machine (docs/SCALE.md).
#
#   scripts/replicas.sh -m MODEL [-n N] [--policy P] [--port PORT] [--base-port BASE] [--router PATH|none]
#                       [-- extra kvllm serve arguments]
#
# Replica i serves HTTP on BASE+i, publishes KV events on BASE+100+i and answers replays on BASE+200+i
# (all on 127.0.0.1), pinned with taskset to its own cores: the machine's CPUs split into N equal ranges,
# each replica running that many threads, so replicas do not fight over cores.  The router (vllm-router,
# from PATH or --router; `pip install vllm-router`) listens on PORT with policy P (default kv_aware, wired
# to the replicas' events; cache_aware, round_robin, power_of_two, ... also work).  A replica that exits
# is started again a second later (its new process publishes AllBlocksCleared first; the router routes
# around it meanwhile).  Ctrl-C or SIGTERM drains the replicas (each gets kvllm's --shutdown-timeout)
# and stops the router.  Logs: $LOG_DIR (default ./replicas-logs).  --router none: replicas only.
set -euo pipefail

N=2 MODEL="" POLICY=kv_aware PORT=8000 BASE=8100 ROUTER=${ROUTER:-vllm-router}
KVLLM=${KVLLM:-$(dirname "$0")/../build/kvllm}
LOG_DIR=${LOG_DIR:-replicas-logs}
EXTRA=()
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2 ;;
    -m|--model) MODEL=$2; shift 2 ;;
    --policy) POLICY=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --base-port) BASE=$2; shift 2 ;;
    --router) ROUTER=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "replicas.sh: unknown option '$1'" >&2; usage ;;
  esac
done
[ -n "$MODEL" ] || { echo "replicas.sh: -m MODEL is required" >&2; usage; }
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "replicas.sh: -n wants a positive count, not '$N'" >&2; exit 2; }
[ -x "$KVLLM" ] || { echo "replicas.sh: no kvllm binary at $KVLLM (make build, or set KVLLM)" >&2; exit 2; }
if [ "$ROUTER" != none ] && ! command -v "$ROUTER" > /dev/null; then
  echo "replicas.sh: no router '$ROUTER' (pip install vllm-router, or --router PATH, or --router none)" >&2; exit 2
fi
mkdir -p "$LOG_DIR"

CPUS=$(nproc)
PER=$(( CPUS / N )); [ "$PER" -ge 1 ] || PER=1
PIDS=()
stop() {
  trap - INT TERM
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  wait || true
}
trap stop INT TERM

URLS=() SOURCES=()
for ((i = 0; i < N; i++)); do
  first=$(( (i * PER) % CPUS )); last=$(( first + PER - 1 ))
  http=$((BASE + i)) pub=$((BASE + 100 + i)) rep=$((BASE + 200 + i))
  # a supervisor per replica: restarts it when it exits, passes SIGTERM on (kvllm drains)
  (
    child=0
    trap 'kill -TERM $child 2> /dev/null; wait $child; exit 0' TERM
    while :; do
      taskset -c "$first-$last" "$KVLLM" serve -m "$MODEL" --host 127.0.0.1 --port "$http" -t "$PER" \
        --kv-events "tcp://127.0.0.1:$pub" --kv-events-replay "tcp://127.0.0.1:$rep" ${EXTRA[@]+"${EXTRA[@]}"} \
        2>> "$LOG_DIR/replica-$i.log" &
      child=$!
      wait $child || true
      echo "replicas.sh: replica $i exited; restarting" >&2
      sleep 1
    done
  ) &
  PIDS+=($!)
  URLS+=("http://127.0.0.1:$http")
  SOURCES+=(--kv-event-source "http://127.0.0.1:$http=tcp://127.0.0.1:$pub"
            --kv-event-replay-source "http://127.0.0.1:$http=tcp://127.0.0.1:$rep")
  echo "replica $i: http://127.0.0.1:$http (cpus $first-$last, events tcp://127.0.0.1:$pub, replay :$rep)"
done

# every replica healthy (the model loaded) before the router starts
for u in "${URLS[@]}"; do
  for _ in $(seq 600); do
    curl -fsS -o /dev/null "$u/health" 2> /dev/null && break
    sleep 0.2
  done
done

if [ "$ROUTER" != none ]; then
  ARGS=(--host 127.0.0.1 --port "$PORT" --worker-urls "${URLS[@]}" --policy "$POLICY")
  if [ "$POLICY" = kv_aware ]; then
    bs=$(curl -fsS "${URLS[0]}/get_server_info" | sed -n 's/.*"block_size":\([0-9]*\).*/\1/p')
    id=$(curl -fsS "${URLS[0]}/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
    ARGS+=("${SOURCES[@]}" --kv-event-block-size "${bs:-16}" --kv-event-model "$id")
  fi
  "$ROUTER" "${ARGS[@]}" > "$LOG_DIR/router.log" 2>&1 &
  PIDS+=($!)
  echo "router ($POLICY): http://127.0.0.1:$PORT  (log: $LOG_DIR/router.log)"
fi
echo "ready; Ctrl-C stops everything"
wait
