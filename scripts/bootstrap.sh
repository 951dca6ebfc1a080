#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages (as root)
# and the tests' Python virtual environment (.venv, from tests/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

# clang: the -Werror build and the libFuzzer targets; libclang-rt-14-dev holds the sanitizer and
# libFuzzer runtimes (only a Recommends of clang-14, which images often skip); Open MPI: tensor
# parallelism under mpirun (docs/TP.md)
PKGS=(build-essential cmake python3 python3-venv python3-pip libmicrohttpd-dev libjson-c-dev libpcre2-dev libcurl4-openssl-dev pkg-config
      libzmq3-dev libmsgpack-dev
      clang libclang-rt-14-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The venv is rebuilt only when the pinned requirements change.
REQ=tests/requirements.txt
STAMP=.venv/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: creating .venv from $REQ"
  PY=/usr/bin/python3
  [ -x "$PY" ] || PY=python3
  "$PY" -m venv --clear .venv   # --clear: an older venv (other requirements) is replaced, not patched
  .venv/bin/pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
fi
