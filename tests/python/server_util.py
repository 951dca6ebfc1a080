"""server_util.py — run `kvllm serve` as a subprocess and talk to it over raw HTTP.

Server(...) starts the binary on a free loopback port (--port 0; the port is read from the
"listening on" line on stderr), waits for /health to answer 200, and stop() sends SIGINT and
returns the exit status with everything the server wrote on stderr (for sanitizer checks).
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

LISTEN_RE = re.compile(r"listening on http://[^:]+:(\d+)")


class Server:
    def __init__(self, binary: str | Path, *args: str | Path, env: dict[str, str] | None = None,
                 ready_timeout: float = 60.0):
        self.args = [str(binary), "serve", *[str(a) for a in args], "--port", "0"]
        e = dict(os.environ)
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

    def metrics(self) -> dict[str, float]:
        """Prometheus text -> {'name{labels}': value}."""
        st, _, raw = self.request("GET", "/metrics")
        assert st == 200, raw
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_blocks_released(self, timeout: float = 2.0) -> dict[str, float]:
        """Poll /metrics until no KV block is held (returns the last metrics either way)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m['kvllm_kv_blocks{state="held"}'] == 0 or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGINT, wait; (returncode, stderr).  Kills it if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.returncode = -9
                return -9, self.stderr() + "\n[killed: no exit after SIGINT]"
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
