#!/usr/bin/env bash
# Run the tests of kvllm replicas behind the real vllm-router (tests/router): makes a venv with
# tests/requirements-router.txt in $ROUTER_VENV (default build/router-venv) once, then runs pytest from
# the test venv (.venv) with VLLM_ROUTER pointing at that venv's vllm-router.  Needs build/kvllm
# (make build) and the shared stories260K model; about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROUTER_VENV:-build/router-venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
if [ ! -x "$VENV/bin/vllm-router" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r tests/requirements-router.txt
fi
PY=${KVLLM_PYTHON:-.venv/bin/python}
VLLM_ROUTER="$VENV/bin/vllm-router" exec "$PY" -m pytest -q -p no:cacheprovider tests/router "$@"
