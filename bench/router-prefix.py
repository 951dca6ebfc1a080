#!/usr/bin/env python3
"""Prefix-cache hit rate of kvllm replicas behind vllm-router, by routing policy (docs/SCALE.md).

A workload of G shared prefixes (a system prompt each, ~4 KV blocks) and R requests per prefix, each the
prefix plus a unique question, interleaved at random (fixed seed) and sent by C concurrent clients through
the router to N fresh replicas whose KV pools are too small to hold every prefix each.  The hit rate is
what the replicas report: sum of vllm:prefix_cache_hits_total / sum of vllm:prefix_cache_queries_total
(prompt tokens served from the cache / prompt tokens).  Policies alternate within each repeat, every run
on fresh replicas, and the median of the repeats is printed.

    bench/router-prefix.py --router build/router-venv/bin/vllm-router [--policies round_robin,cache_aware,kv_aware]
        [--replicas 2] [--groups 6] [--per-group 8] [--clients 4] [--think 0] [--kv-tokens 256] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from ports import free_ports  # noqa: E402
WORDS = ("the little girl dog cat sun tree happy big red ball park friend play ran saw went home day water "
         "bird boat cake fish jump sky blue green house car book toy garden flower rain snow moon star").split()




def get(url, timeout=10):
    return urllib.request.urlopen(url, timeout=timeout).read()


def post(url, body, timeout=120):
    r = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=timeout).read())


def wait_ok(url, procs, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}")
        try:
            get(url, 2)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def workload(a):
    rng = random.Random(a.seed)
    prefixes = [f"Story {g}: " + " ".join(rng.choice(WORDS) for _ in range(36)) + "." for g in range(a.groups)]
    reqs = [(g, f"{prefixes[g]} Question {k}: what did the {rng.choice(WORDS)} do?")
            for g in range(a.groups) for k in range(a.per_group)]
    rng.shuffle(reqs)
    return reqs


def run_once(a, policy, reqs):
    n = a.replicas
    ports = free_ports(3 * n + 1)
    rport, http, pub, rep = ports[0], ports[1:n + 1], ports[n + 1:2 * n + 1], ports[2 * n + 1:]
    model = Path(a.shared) / "models" / "stories260K"
    procs = []
    try:
        for i in range(n):
            procs.append(subprocess.Popen(
                [a.kvllm, "serve", "-m", model / "stories260K.bin", "--tokenizer", model / "tok512.bin", "-t", "1",
                 "--port", str(http[i]), "--alias", "stories", "--kv-tokens", str(a.kv_tokens),
                 "--kv-events", f"tcp://127.0.0.1:{pub[i]}", "--kv-events-replay", f"tcp://127.0.0.1:{rep[i]}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(n):
            wait_ok(f"http://127.0.0.1:{http[i]}/health", procs)
        urls = [f"http://127.0.0.1:{p}" for p in http]
        args = [a.router, "--host", "127.0.0.1", "--port", str(rport), "--worker-urls", *urls, "--policy", policy]
        if policy == "kv_aware":
            for i, u in enumerate(urls):
                args += ["--kv-event-source", f"{u}=tcp://127.0.0.1:{pub[i]}",
                         "--kv-event-replay-source", f"{u}=tcp://127.0.0.1:{rep[i]}"]
            args += ["--kv-event-block-size", "16", "--kv-event-model", "stories"]
        procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        wait_ok(f"http://127.0.0.1:{rport}/v1/models", procs)
        time.sleep(1.0)
        todo = list(reqs)
        lock = threading.Lock()
        errors = []

        def client():
            while True:
                with lock:
                    if not todo:
                        return
                    _, prompt = todo.pop(0)
                try:
                    post(f"http://127.0.0.1:{rport}/v1/completions",
                         {"model": "stories", "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0})
                except OSError as e:
                    errors.append(str(e))
                time.sleep(a.think)

        t0 = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        hits = queries = 0.0
        per = []
        for u in urls:
            m = get(u + "/metrics").decode()
            h, q = metric(m, "vllm:prefix_cache_hits_total"), metric(m, "vllm:prefix_cache_queries_total")
            hits, queries = hits + h, queries + q
            per.append(int(metric(m, "vllm:request_success_total")))
        return {"policy": policy, "hit_rate": hits / queries if queries else 0.0, "requests_per_replica": per,
                "errors": len(errors), "wall_s": round(wall, 2)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvllm", default=str(REPO / "build" / "kvllm"))
    ap.add_argument("--router", default="vllm-router")
    ap.add_argument("--shared", default=str(REPO / "tests" / "data"), help="the test data folder (stories260K)")
    ap.add_argument("--policies", default="round_robin,cache_aware,kv_aware")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--kv-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds each client waits after an answer before its next request (users reading)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    reqs = workload(a)
    policies = a.policies.split(",")
    rows = {p: [] for p in policies}
    for r in range(a.repeats):
        for p in (policies if r % 2 == 0 else policies[::-1]):
            res = run_once(a, p, reqs)
            print(json.dumps(res), flush=True)
            rows[p].append(res)
    print(f"\n{'policy':<14} {'hit rate (median)':>18} {'runs':>30}  requests per replica (last)")
    for p in policies:
        rates = [x["hit_rate"] for x in rows[p]]
        print(f"{p:<14} {statistics.median(rates):>18.3f} {' '.join(f'{x:.3f}' for x in rates):>30}  "
              f"{rows[p][-1]['requests_per_replica']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
