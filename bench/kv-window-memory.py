#!/usr/bin/env python3
"""KV memory of a model with sliding-window layers at a long context, from the plan and from /metrics.

Starts `kvllm serve -c CTX --max-seqs 4` (with --kv-full: every layer keeps whole contexts, as a full cache),
prints the startup memory plan and the KV gauges of /metrics, sends one greedy completion of N_PROMPT random
token ids and 16 new tokens, polls /metrics every second meanwhile, and prints the gauges at the highest
kvllm_kv_bytes{state="held"} seen (the sequence at full depth).

usage: bench/kv-window-memory.py win|full KVLLM_BIN MODEL N_PROMPT [CTX]
e.g.   bench/kv-window-memory.py win build/kvllm gemma-3-270m.gguf 32700
"""
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

mode, binary, model, n_prompt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = sys.argv[5] if len(sys.argv) > 5 else "32768"
args = [binary, "serve", "-m", model, "-c", ctx, "--max-seqs", "4", "--port", "0", "--log-interval", "0"]
if mode == "full":
    args.append("--kv-full")
p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
port, log = None, []
while port is None:
    line = p.stderr.readline()
    if not line:
        sys.exit("serve died:\n" + "".join(log))
    log.append(line)
    m = re.search(r"127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m[1])
threading.Thread(target=lambda: [log.append(line) for line in p.stderr], daemon=True).start()
base = f"http://127.0.0.1:{port}"
for _ in range(200):
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except OSError:
        time.sleep(0.5)


def metrics() -> dict:
    t = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    return {k: float(v) for k, v in re.findall(r"^(kvllm_kv_\S+) (\S+)$", t, re.M)}


HELD = 'kvllm_kv_bytes{state="held"}'
start, most, done = metrics(), {}, threading.Event()


def poll() -> None:
    while not done.is_set():
        m = metrics()
        if m.get(HELD, 0) >= most.get(HELD, 0):
            most.update(m)
        time.sleep(1)


threading.Thread(target=poll, daemon=True).start()
random.seed(1)
prompt = [2] + [random.randint(100, 200000) for _ in range(n_prompt - 1)]
t0 = time.time()
req = urllib.request.Request(base + "/v1/completions", headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0}).encode())
usage = json.loads(urllib.request.urlopen(req, timeout=7200).read()).get("usage")
done.set()
time.sleep(1.5)
p.terminate()
p.wait()
print(mode, "usage", usage, "seconds %.0f" % (time.time() - t0))
print("".join(line for line in log if "memory plan" in line), end="")
print("at start:", json.dumps(start))
print("at the highest held:", json.dumps(most))
