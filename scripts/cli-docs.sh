#!/usr/bin/env bash
# cli-docs.sh [KVLLM] — rewrite the options reference of docs/CLI.md (the lines between
# "<!-- options:begin -->" and "<!-- options:end -->") from the option tables, through
# `kvllm help --markdown` (default build/kvllm).  tests/python/test_cli.py checks they agree.
set -euo pipefail
cd "$(dirname "$0")/.."
KVLLM=${1:-build/kvllm}
doc=docs/CLI.md
new=$(mktemp)
trap 'rm -f "$new"' EXIT
ref=$("$KVLLM" help --markdown)
awk -v ref="$ref" '
  /^<!-- options:begin -->$/ { print; print ref; skip = 1; next }
  /^<!-- options:end -->$/   { skip = 0 }
  !skip { print }' "$doc" > "$new"
grep -q '^<!-- options:begin -->$' "$new" || { echo "cli-docs.sh: $doc has no options:begin line" >&2; exit 1; }
cat "$new" > "$doc"
