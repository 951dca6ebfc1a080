#!/usr/bin/env python3
"""tp-rss.py — memory per rank of `kvllm serve` alone and as a tensor-parallel job (docs/PERF.md).

For each model and each N of --np: start `kvllm serve -m MODEL -t 1 --kv-tokens T` (N > 1: under
`mpirun -np N --oversubscribe`), wait for /health, run one completion (a 64-token prompt, 16 tokens out) so
that every weight has been read, then read each rank's VmRSS (RssAnon + RssFile) and VmHWM from /proc/PID/status and its memory
plan line (placed weights, KV pool), and stop it (SIGINT alone, SIGUSR1 to mpirun: the drain).  Prints a
Markdown table, a row per rank.

usage: bench/tp-rss.py MODEL[,TOKENIZER]... [--np 1,2] [--kv-tokens 2048]
       (KVLLM_BIN: build/kvllm; as root, Open MPI's OMPI_ALLOW_RUN_AS_ROOT variables are set here)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from mpi_procs import mpi_rank_pids  # noqa: E402
from ports import free_ports  # noqa: E402

PLAN = re.compile(r"memory plan \(([^)]*(?:\([^)]*\))?[^)]*)\): weights ([\d.]+) MiB.*?KV pool ([\d.]+) MiB")


def status_kb(pid: int) -> dict[str, int]:
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            vals[k] = int(v.split()[0])
    return vals


def measure(binary: str, model: str, n: int, kv_tokens: int) -> list[dict]:
    port = free_ports(1)[0]
    model, _, tok = model.partition(",")
    cmd = [binary, "serve", "-m", model, *(["--tokenizer", tok] if tok else []), "-t", "1", "--kv-tokens",
           str(kv_tokens), "--port", str(port)]
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", *cmd]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    err = tempfile.NamedTemporaryFile(prefix="tp-rss-", suffix=".err", delete=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, Path(err.name).read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        body = json.dumps({"prompt": list(range(1, 65)), "max_tokens": 16, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            assert r.status == 200
        pids = mpi_rank_pids(proc.pid) if n > 1 else {0: proc.pid}
        mem = {r: status_kb(p) for r, p in pids.items()}
    finally:
        proc.send_signal(signal.SIGUSR1 if n > 1 else signal.SIGINT)
        proc.wait(timeout=60)
    text = Path(err.name).read_text()
    os.unlink(err.name)
    plans = {}
    for m in PLAN.finditer(text):
        r = re.search(r"rank (\d+) of", m[1])
        plans[int(r[1]) if r else 0] = (float(m[2]), float(m[3]))
    return [dict(rank=r, weights=plans[r][0], kv=plans[r][1], **{k: v / 1024 for k, v in mem[r].items()})
            for r in sorted(mem)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--np", default="1,2")
    ap.add_argument("--kv-tokens", type=int, default=2048)
    a = ap.parse_args()
    binary = os.environ.get("KVLLM_BIN", "build/kvllm")
    print("| model | processes | rank | placed weights MiB | KV pool MiB | VmRSS MiB (anonymous + file) | VmHWM MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in a.models:
        for n in map(int, a.np.split(",")):
            for row in measure(binary, model, n, a.kv_tokens):
                print(f"| {Path(model.partition(',')[0]).name} | {n} | {row['rank']} | {row['weights']:.1f} | {row['kv']:.1f} | "
                      f"{row['VmRSS']:.1f} ({row['RssAnon']:.1f} + {row['RssFile']:.1f}) | {row['VmHWM']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
