"""soak.py — many requests against one `kvllm serve` (the ASan build by default), then the checks
that the server is back where it started.

    .venv/bin/python tests/soak/soak.py --requests 3000 [--bin build-asan/kvllm] [--concurrency 16]

Clients (--concurrency threads) send completions and chat requests over raw HTTP/1.1: streaming
and whole responses, n of 1 to 3, prompts that share long prefixes (so the prefix cache hits and
the n samples of one prompt share blocks), random max_tokens, temperatures and seeds.  A fifth of
the requests (--cancel) are cancelled by the client: the socket is closed at a random moment (before
the body is complete, while waiting, or midway through a stream), sometimes with a reset.

Checks, each reported and failing the run (exit 1):
  - every request that was not cancelled answered 200 with a well-formed body (n choices, a
    finish_reason each; a stream ends with [DONE] and carries no error event);
  - /metrics (with the API key) shows 0 KV blocks held once the clients are done;
  - resident memory (VmRSS of the server) at the end is within --rss-tolerance (10 %) of its
    level after the warm-up requests (--warmup, default a quarter of them; ASan's quarantine is
    capped, yet its allocator still wanders by several MB from round to round: the tight bound is
    for long ASan runs and for the release build, whose RSS is flat to a few %);
  - the server exits 0 on SIGINT with no sanitizer report on stderr.
The last line printed is a JSON summary (requests, cancelled, failures, seconds, RSS, blocks).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
from server_util import Server  # noqa: E402

KEY = "soak-key"
SANITIZER_RE = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|WARNING: ThreadSanitizer"
                          r"|ERROR: ThreadSanitizer")
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
PREFIXES = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her",
    "One day, a big brown dog found a red ball under the tree. The dog was very happy and wanted to",
    "Tom and Sue went to the beach with their mom. They saw the sea and the sand and the",
]
SUFFIXES = ["friends.", "ball", "cat. It was", "sun. They were happy", "toys and", "mom said", ""]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def make_request(rng: random.Random) -> tuple[str, dict]:
    prompt = rng.choice(PREFIXES) + " " + rng.choice(SUFFIXES)
    body: dict = {"max_tokens": rng.randint(1, 48), "n": rng.choice([1, 1, 2, 3]),
                  "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randint(0, 1 << 30),
                  "stream": rng.random() < 0.5}
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.3:
        body["messages"] = [{"role": "system", "content": rng.choice(PREFIXES)},
                            {"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt if rng.random() < 0.8 else [prompt, rng.choice(PREFIXES)]
    return "/v1/completions", body


def encode(path: str, body: dict) -> bytes:
    b = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\nConnection: close\r\n\r\n")
    return head.encode() + b


def read_all(s: socket.socket) -> bytes:
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        n = int(data[i:j].split(b";")[0], 16)
        if n == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + n]
        i = j + 2 + n + 2


def check_response(raw: bytes, path: str, body: dict) -> str | None:
    """None if raw is a well-formed 200 answer to body, else what is wrong."""
    head, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        return f"no complete response head ({len(raw)} bytes)"
    status = head.split(b"\r\n")[0]
    if b" 200 " not in status + b" ":
        return f"status {status.decode(errors='replace')}: {payload[:300]!r}"
    if b"transfer-encoding: chunked" in head.lower():
        try:
            payload = dechunk(payload)
        except (ValueError, IndexError):
            return "malformed chunked body"
    n_prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    want = body["n"] * n_prompts
    if body["stream"]:
        events = [e[6:] for e in payload.decode().split("\n\n") if e.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"stream does not end with [DONE]: {payload[-200:]!r}"
        finished = set()
        for e in events[:-1]:
            j = json.loads(e)
            if "error" in j:
                return f"error event: {e[:300]}"
            for c in j.get("choices", []):
                if c.get("finish_reason"):
                    finished.add(c["index"])
        if len(finished) != want:
            return f"{len(finished)} of {want} choices finished"
        return None
    j = json.loads(payload)
    ch = j.get("choices", [])
    if len(ch) != want or any(not c.get("finish_reason") for c in ch):
        return f"{len(ch)} choices for {want}, or one without finish_reason: {payload[:300]!r}"
    return None


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.cancelled = 0
        self.failures: list[str] = []

    def add(self, cancelled: bool, failure: str | None) -> None:
        with self.lock:
            self.done += 1
            self.cancelled += cancelled
            if failure:
                self.failures.append(failure)


def one(port: int, i: int, seed: int, cancel_frac: float, stats: Stats) -> None:
    rng = random.Random(seed * 1_000_003 + i)
    path, body = make_request(rng)
    data = encode(path, body)
    cancel = rng.random() < cancel_frac
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            if not cancel:
                s.sendall(data)
                stats.add(False, check_response(read_all(s), path, body))
                return
            where = rng.random()
            if where < 0.2:                           # mid-request: part of the head or body
                s.sendall(data[:rng.randint(1, len(data) - 1)])
            else:
                s.sendall(data)
                if where < 0.6:                        # while queued or generating
                    time.sleep(rng.random() * 0.3)
                else:                                  # after some of the answer
                    want = rng.randint(1, 2000)
                    got = 0
                    while got < want:
                        b = s.recv(want - got)
                        if not b:
                            break
                        got += len(b)
            if rng.random() < 0.5:                     # a reset rather than an orderly close
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stats.add(True, None)
    except OSError as e:
        stats.add(cancel, None if cancel else f"{path}: {e!r}")


def run(srv: Server, start: int, count: int, args: argparse.Namespace, stats: Stats) -> None:
    with ThreadPoolExecutor(args.concurrency) as ex:
        for f in [ex.submit(one, srv.port, i, args.seed, args.cancel, stats) for i in range(start, start + count)]:
            f.result()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build-asan" / "kvllm"))
    ap.add_argument("--shared", default=str(ROOT / "tests" / "data"), help="the test data folder")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=0, help="requests before the RSS reference (default: 25 %%, >= 50)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--cancel", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    args = ap.parse_args(argv)
    warmup = args.warmup or max(50, args.requests // 4)
    d = Path(args.shared) / "models" / "stories260K"
    tmpl = Path(f"/tmp/kvllm-soak-{id(args)}.jinja")
    tmpl.write_text(TEMPLATE)
    env = {"ASAN_OPTIONS": "quarantine_size_mb=4:detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=0"}
    srv = Server(args.bin, "-m", d / "stories260K.bin", "--tokenizer", d / "tok512.bin", "-t", "2",
                 "--api-key", KEY, "--chat-template", tmpl, "--kv-mem", "2M", "--max-seqs", "16", env=env)
    stats = Stats()
    t0 = time.monotonic()
    problems: list[str] = []
    rss_warm = rss_end = 0
    trajectory: list[int] = []
    metrics: dict[str, float] = {}
    try:
        run(srv, 0, warmup, args, stats)
        auth = {"Authorization": f"Bearer {KEY}"}
        rss_warm = rss_kb(srv.proc.pid)
        step = max(100, (args.requests - warmup) // 10)
        for start in range(warmup, args.requests, step):   # RSS sampled between rounds: a trend, not a point
            run(srv, start, min(step, args.requests - start), args, stats)
            trajectory.append(rss_kb(srv.proc.pid))
        deadline = time.monotonic() + 10
        while True:
            st, _, raw = srv.request("GET", "/metrics", headers=auth)
            metrics = {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in raw.decode().splitlines()
                                                 if ln and not ln.startswith("#"))} if st == 200 else {}
            if st != 200 or metrics.get('kvllm_kv_blocks{state="held"}', 1) == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if st != 200:
            problems.append(f"/metrics answered {st}")
        rss_end = rss_kb(srv.proc.pid)
    finally:
        rc, err = srv.stop(timeout=60)
        tmpl.unlink(missing_ok=True)
    secs = time.monotonic() - t0
    held = metrics.get('kvllm_kv_blocks{state="held"}', -1)
    if stats.failures:
        problems.append(f"{len(stats.failures)} requests failed that were not cancelled, e.g. {stats.failures[:3]}")
    if held != 0:
        problems.append(f"{held:g} KV blocks held after the run")
    if rss_end > rss_warm * (1 + args.rss_tolerance):
        problems.append(f"resident memory {rss_end} kB at the end, {rss_warm} kB after warm-up "
                        f"(+{100 * (rss_end / rss_warm - 1):.1f} %)")
    reports = SANITIZER_RE.findall(err)
    if reports:
        i = SANITIZER_RE.search(err).start()
        problems.append(f"{len(reports)} sanitizer reports:\n{err[max(0, i - 200):i + 3000]}")
    if rc != 0:
        problems.append(f"kvllm serve exited {rc}:\n{err[-2000:]}")
    for p in problems:
        print(f"soak: FAIL: {p}", file=sys.stderr)
    print(json.dumps({"requests": stats.done, "cancelled": stats.cancelled, "failed": len(stats.failures),
                      "concurrency": args.concurrency, "seconds": round(secs, 1),
                      "req_per_s": round(stats.done / secs, 1), "rss_warm_kb": rss_warm, "rss_end_kb": rss_end,
                      "rss_kb_by_round": trajectory,
                      "blocks_held": held, "blocks_cached": metrics.get('kvllm_kv_blocks{state="cached"}', -1),
                      "sanitizer_reports": len(reports), "exit": rc, "bin": args.bin, "ok": not problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
