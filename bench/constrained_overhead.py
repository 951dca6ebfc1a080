#!/usr/bin/env python3
"""End-to-end cost of constrained decoding: the median decode step of a JSON-Schema-constrained stream
against an unconstrained one, on one `kvllm serve`, in one run (the bound: <= 10 %, the goal <= 2 %).

The two kinds of request alternate (constrained, unconstrained, constrained, ...) so that machine noise
falls on both; each is one stream at a time (no batching), max_tokens long.  A step is the gap between two
consecutive SSE chunks of a stream (one chunk per token; the first, which holds the prefill, is dropped).
The constrained request's schema keeps it going for about max_tokens tokens (a long array of bounded
strings); the unconstrained one runs with ignore_eos.  Reported: the median step of each kind, their ratio
minus one (the overhead), and tokens/s.

usage: bench/constrained_overhead.py [--bin build/kvllm] [--model models/smollm2/...gguf] [--reps 6]
                                     [--tokens 160] [--threads 2] [--schema FILE] [--json-object]
                                     [--temperature T]
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object",
          "properties": {"title": {"type": "string", "maxLength": 40},
                         "items": {"type": "array", "minItems": 40, "maxItems": 40,
                                   "items": {"type": "object",
                                             "properties": {"name": {"type": "string", "maxLength": 24},
                                                            "count": {"type": "integer"},
                                                            "tag": {"enum": ["red", "green", "blue"]}},
                                             "required": ["name", "count", "tag"]}}},
          "required": ["title", "items"]}


def stream_gaps(port: int, body: dict) -> tuple[list[float], int]:
    """Seconds between consecutive SSE chunks after the first, and the completion tokens."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({**body, "stream": True,
                                                     "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    times, tokens, buf = [], 0, b""
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        if line.startswith(b"data: [DONE]"):
            break
        d = json.loads(line[6:])
        if d.get("usage"):
            tokens = d["usage"]["completion_tokens"]
        if d.get("choices"):
            times.append(time.perf_counter())
        buf += line
    c.close()
    return [b - a for a, b in zip(times[1:], times[2:])], tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "kvllm"))
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--schema", help="a JSON Schema file (default: a long array of small objects)")
    ap.add_argument("--json-object", action="store_true", help="response_format json_object instead of a schema")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 (default): greedy, which fills the mask only when the grammar refuses the argmax; "
                         "> 0: the mask is filled at every token")
    a = ap.parse_args()
    schema = json.loads(Path(a.schema).read_text()) if a.schema else SCHEMA
    rf = {"type": "json_object"} if a.json_object else \
        {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
    err = tempfile.NamedTemporaryFile(prefix="kvllm-bench-", suffix=".err", delete=False)
    srv = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", "0", "-c", "2048", "-t", str(a.threads),
                            "--max-seqs", "4"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        port = 0
        for _ in range(600):
            m = re.search(r"listening on http://[^:]+:(\d+)", Path(err.name).read_text())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.1)
        assert port, Path(err.name).read_text()
        prompt = "Write an inventory as JSON with a title and a list of items:\n"
        base = {"prompt": prompt, "max_tokens": a.tokens, "temperature": a.temperature, "seed": 1}
        kinds = {"constrained": {**base, "response_format": rf}, "unconstrained": {**base, "ignore_eos": True}}
        gaps = {k: [] for k in kinds}
        toks = {k: 0 for k in kinds}
        secs = {k: 0.0 for k in kinds}
        stream_gaps(port, kinds["constrained"])   # warm-up: the vocabulary index, caches
        for _ in range(a.reps):
            for k, body in kinds.items():
                g, n = stream_gaps(port, body)
                gaps[k] += g
                toks[k] += len(g)
                secs[k] += sum(g)
        med = {k: statistics.median(v) for k, v in gaps.items()}
        print(f"model {Path(a.model).name}, {a.threads} threads, {a.reps} reps x {a.tokens} tokens, "
              f"{'json_object' if a.json_object else 'JSON Schema'}, temperature {a.temperature:g}")
        for k in kinds:
            print(f"  {k:13s} median step {1e3 * med[k]:7.2f} ms  ({toks[k]} steps, {toks[k] / secs[k]:.1f} tok/s)")
        print(f"  overhead of the constraint: {100 * (med['constrained'] / med['unconstrained'] - 1):+.1f} % "
              f"(median step)")
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
