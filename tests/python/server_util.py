"""server_util.py — run `kvllm serve` as a subprocess and talk to it over raw HTTP.

Server(...) starts the binary on a free loopback port (--port 0; the port is read from the
"listening on" line on stderr), waits for /health to answer 200, and stop() sends SIGINT and
returns the exit status with everything the server wrote on stderr (for sanitizer checks).
With KVLLM_TEST_MPI_NP=N the server is a tensor-parallel job (`mpirun -np N kvllm serve`, kvtest.mpi_launch),
stopped with SIGUSR1 to mpirun: the signal mpirun forwards to every rank without ending the job, on which
rank 0 drains (a SIGINT to mpirun would kill the job: docs/TP.md).
KVLLM_TEST_SERVE_ARGS (whitespace-separated) is appended to every server's arguments: a whole suite run again
with an engine setting, e.g. --async-scheduling (tests/CMakeLists.txt).
request() is a tiny http.client wrapper that never raises on 4xx/5xx, so malformed-request
tests can look at the status and the JSON error body directly.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from gen_model import ModelConfig, write_model
from kvtest import mpi_launch, mpi_rank_pids

LISTEN_RE = re.compile(r"listening on http://[^:]+:(\d+)")


class Server:
    def __init__(self, binary: str | Path, *args: str | Path, env: dict[str, str] | None = None,
                 ready_timeout: float = 60.0, port: int = 0):
        launch, mpi_env = mpi_launch(binary)
        self.mpi = len(launch) > 1
        extra = os.environ.get("KVLLM_TEST_SERVE_ARGS", "").split()
        self.args = [*launch, "serve", *[str(a) for a in args], *extra, "--port", str(port)]
        e = dict(os.environ, **mpi_env)
        e["ASAN_OPTIONS"] = "exitcode=86:abort_on_error=0:" + e.get("ASAN_OPTIONS", "")
        e["UBSAN_OPTIONS"] = "print_stacktrace=1:exitcode=87:" + e.get("UBSAN_OPTIONS", "")
        if env:
            e.update(env)
        self._err = tempfile.NamedTemporaryFile(prefix="kvllm-serve-", suffix=".err", delete=False)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._err, env=e)
        self.port = 0
        self.returncode: int | None = None
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvllm serve exited with {self.proc.returncode}:\n{self.stderr()}")
            if not self.port:
                m = LISTEN_RE.search(self.stderr())
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    if self.request("GET", "/health")[0] == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"kvllm serve not ready after {ready_timeout}s:\n{self.stderr()}")

    @property
    def base_url(self) -> str:
        """For openai.OpenAI(base_url=...)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stderr(self) -> str:
        return Path(self._err.name).read_text(errors="replace")

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, dict, bytes]:
        """(status, headers, body); a dict body is sent as JSON."""
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def post(self, path: str, body: Any, **kw) -> tuple[int, Any]:
        """(status, parsed JSON body)."""
        st, _, raw = self.request("POST", path, body, **kw)
        return st, json.loads(raw)

    def client(self, api_key: str = "none", timeout: float = 120.0, **kw) -> openai.OpenAI:
        """The official OpenAI client on this server, without retries (a test sees the first answer)."""
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=timeout, **kw)

    def metrics(self) -> dict[str, float]:
        """Prometheus text -> {'name{labels}': value}.  /metrics needs the API key unless the server runs with
        --metrics-public: the key the server was started with is sent."""
        key = _started_api_key(self.args)
        st, _, raw = self.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else None)
        assert st == 200, raw
        return parse_metrics(raw)

    @property
    def pid(self) -> int:
        """The process that serves HTTP: the server, or under mpirun its rank 0."""
        if not self.mpi:
            return self.proc.pid
        ranks = mpi_rank_pids(self.proc.pid)
        assert 0 in ranks, f"no rank 0 among mpirun's children:\n{self.stderr()[-2000:]}"
        return ranks[0]

    def rss_kb(self) -> int:
        """The server's resident memory (VmRSS; under mpirun rank 0's), in kB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def wait_rss_below(self, kb: int, timeout: float = 3.0) -> int:
        """Poll VmRSS until it is below `kb` (memory is given back once the last response went out); the last
        value either way."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.rss_kb()
            if r < kb or time.monotonic() > deadline:
                return r
            time.sleep(0.05)

    def wait_blocks_released(self, timeout: float = 2.0) -> dict[str, float]:
        """Poll /metrics until no KV block is held (returns the last metrics either way)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m['kvllm_kv_blocks{state="held"}'] == 0 or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGINT (SIGUSR1 to mpirun), wait; (returncode, stderr).  Kills it if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1 if self.mpi else signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if self.mpi:   # mpirun killed alone would leave its ranks behind
                    for pid in mpi_rank_pids(self.proc.pid).values():
                        os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
                self.returncode = -9
                return -9, self.stderr() + "\n[killed: no exit after the stop signal]"
        self.returncode = self.proc.returncode
        err = self.stderr()
        try:
            os.unlink(self._err.name)
        except OSError:
            pass
        return self.returncode, err


def raw_exchange(port: int, data: bytes, *, read: bool = True, timeout: float = 10.0,
                 half_close: bool = False) -> bytes:
    """Send raw bytes on a fresh connection; return whatever comes back until the server closes
    (or the timeout).  half_close: shut our write side after sending (a truncated upload)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        if not read:
            return b""
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        except (socket.timeout, ConnectionResetError):
            pass
        return b"".join(chunks)


def http_status(raw: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else 0


# ---- for test_server_attack.py (and /metrics behind the API key) ------------------------

def _started_api_key(args: list[str]) -> str | None:
    """The --api-key a server was started with (None: none)."""
    for a, v in zip(args, args[1:]):
        if a == "--api-key":
            return v
    return None




def raise_fd_limit(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `want` (capped by the hard limit); the new soft limit."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def connect_from(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    """A TCP connection to the server from a chosen loopback address (all of 127/8 is local on Linux): the
    server sees it as another client, for per-client limits."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


def stories_args(stories) -> list:
    """`serve` arguments for stories260K (the `stories` fixture) on one thread."""
    return ["-m", stories["bin"], "--tokenizer", stories["tok"], "-t", "1"]


def write_gqa_model(directory: Path) -> Path:
    """A random-weight GQA model (8 query heads over 2 KV heads) of ~2 ms a token on one thread and a context of
    8192: an 8000-token stream runs for many seconds, so a client is surely still streaming when it leaves."""
    cfg = ModelConfig(n_vocab=2048, n_embd=256, n_layer=6, n_head=8, n_head_kv=2, n_ff=768, n_ctx=8192)
    return write_model(Path(directory) / "gqa.gguf", cfg, seed=5)


def gqa_args(path) -> list:
    """`serve` arguments for write_gqa_model's file: one thread, alias "gqa", a small KV pool."""
    return ["-m", path, "-t", "1", "--alias", "gqa", "--kv-mem", "64M"]


def ok(s: Server, path: str, body: Any, timeout: float = 600.0) -> Any:
    """The parsed JSON body of a POST that must be answered 200 (a generous timeout: constrained decoding on a
    loaded machine)."""
    st, r = s.post(path, body, timeout=timeout)
    assert st == 200, (body, r)
    return r


def parse_metrics(raw: bytes) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def request_bytes(method: str, path: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None,
                  version: str = "HTTP/1.1") -> bytes:
    """A whole HTTP request as bytes (Host and Content-Length included unless given)."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    body = body or b""
    h = {"Host": "x"} if version == "HTTP/1.1" else {}
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + body


def read_response(s: socket.socket, timeout: float = 10.0, prefix: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (Content-Length, chunked, or until close) from a socket, `prefix` being what
    was already read of it; interim 1xx responses are skipped.  (status, lower-cased headers, body); status
    0 if the peer closed first."""
    s.settimeout(timeout)
    buf = prefix

    def more() -> bool:
        nonlocal buf
        try:
            b = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return False
        buf += b
        return bool(b)

    while True:
        while b"\r\n\r\n" not in buf:
            if not more():
                return 0, {}, buf
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if 100 <= status < 200:
            continue
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        break
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        while len(buf) < n and more():
            pass
        return status, hdrs, buf[:n]
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        out = b""
        while True:
            while b"\r\n" not in buf:
                if not more():
                    return status, hdrs, out
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                if not more():
                    return status, hdrs, out + buf
            out += buf[:size]
            buf = buf[size + 2:]
            if size == 0:
                return status, hdrs, out
    while more():
        pass
    return status, hdrs, buf
