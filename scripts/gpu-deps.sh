#!/usr/bin/env bash
# gpu-deps.sh [OUT_DIR] — the two -dev packages the core build needs (json-c and PCRE2: headers,
# static libraries, pkg-config files), unpacked into OUT_DIR (default build-gpu-deps) for a GPU
# machine that has no Debian -dev packages and no network.  Run it on a Debian 12 machine (the
# .debs come from the apt cache, else `apt-get download`); carry OUT_DIR to the GPU machine, where
# scripts/gpu-check.sh finds it.  Shared libraries and symbolic links are left out: the build links
# the static archives, so nothing is needed at run time.
set -eu
OUT=${1:-build-gpu-deps}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in libjson-c-dev libpcre2-dev; do
    deb=$(ls /var/cache/apt/archives/"${p}"_*.deb 2>/dev/null | head -1 || true)
    if [ -z "$deb" ]; then
        (cd "$tmp" && apt-get download "$p")
        deb=$(ls "$tmp"/"${p}"_*.deb | head -1)
    fi
    dpkg-deb -x "$deb" "$OUT"
    echo "unpacked $(basename "$deb")"
done
find "$OUT" -type l -delete
find "$OUT" -name '*.so*' -delete
rm -rf "$OUT/usr/share" "$OUT/usr/bin"
du -sh "$OUT"
