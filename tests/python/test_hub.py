"""Models by name (tools/cli/hub.c): `kvllm run -hf REPO[:QUANT]`, `--hf-file`, `kvllm serve owner/name`, against a
local HTTP server that answers as the Hugging Face hub does: the tree API (/api/models/REPO/tree/main), resolve URLs
(/REPO/resolve/main/FILE) that redirect large files to a CDN path with X-Linked-Etag (the SHA-256) and X-Repo-Commit,
Range requests answered 206, 404s.  The cache must come out in huggingface_hub's layout (blobs/, snapshots/COMMIT/,
refs/main), a cut download must resume with a Range request, a wrong checksum must be refused, and an unreachable hub
must be a clear error naming the URL."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvtest import run_cli
from server_util import Server

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """repos: {"owner/name": {"file": bytes}}.  Files ending .gguf / .safetensors are LFS files (a redirect to /cdn/,
    X-Linked-Etag = SHA-256); others are answered directly with a git-blob-like ETag.  cut_once: the first GET of each
    CDN file sends half its bytes and closes the connection.  corrupt: the CDN serves bytes other than the hashed ones."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.log: list[tuple[str, str, dict[str, str]]] = []
        self.cut_once = False
        self.corrupt = False
        self._cut_done: set[str] = set()
        self.by_sha = {hashlib.sha256(b).hexdigest(): b for r in repos.values() for b in r.values()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.answer(head=True)

            def do_GET(self):
                self.answer(head=False)

            def send(self, status, body=b"", headers=None, head=False):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def answer(self, head):
                hub.log.append((self.command, self.path, dict(self.headers)))
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                if path.startswith("/api/models/") and parts[4:6] == ["tree", "main"]:
                    files = hub.repos.get("/".join(parts[2:4]))
                    if files is None:
                        return self.send(404, b'{"error":"Repository not found"}', head=head)
                    lst = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                           for n, b in files.items()]
                    return self.send(200, json.dumps(lst).encode(), {"Content-Type": "application/json"}, head)
                if len(parts) >= 5 and parts[2:4] == ["resolve", "main"]:
                    files = hub.repos.get("/".join(parts[:2]), {})
                    name = "/".join(parts[4:])
                    if name not in files:
                        return self.send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
                    b = files[name]
                    if name.endswith((".gguf", ".safetensors")):
                        sha = hashlib.sha256(b).hexdigest()
                        return self.send(302, b"", {"Location": f"/cdn/{sha}?sig=x", "X-Repo-Commit": COMMIT,
                                                    "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(b)),
                                                    "ETag": '"not-the-hash"'}, head)
                    return self.send(200, b, {"ETag": f'"{hashlib.sha1(b).hexdigest()}"', "X-Repo-Commit": COMMIT}, head)
                if path.startswith("/cdn/"):
                    sha = parts[1]
                    b = hub.by_sha.get(sha)
                    if b is None:
                        return self.send(404, head=head)
                    if hub.corrupt:
                        b = bytes([b[0] ^ 1]) + b[1:]
                    start = 0
                    rng = self.headers.get("Range")
                    if rng and rng.startswith("bytes=") and rng.endswith("-"):
                        start = int(rng[6:-1])
                    body = b[start:]
                    status = 206 if rng else 200
                    hdrs = {"ETag": '"cdn-etag"', "Accept-Ranges": "bytes"}
                    if rng:
                        hdrs["Content-Range"] = f"bytes {start}-{len(b) - 1}/{len(b)}"
                    if head:
                        return self.send(status, body, hdrs, head=True)
                    if hub.cut_once and sha not in hub._cut_done and not rng:
                        hub._cut_done.add(sha)
                        self.send_response(200)
                        for k, v in hdrs.items():
                            self.send_header(k, v)
                        self.send_header("Content-Length", str(len(b)))
                        self.end_headers()
                        self.wfile.write(b[: len(b) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    return self.send(status, body, hdrs)
                return self.send(404, head=head)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def gets(self, prefix: str) -> list[tuple[str, str, dict[str, str]]]:
        return [e for e in self.log if e[0] == "GET" and e[1].startswith(prefix)]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def gguf(kvllm, stories, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hub") / "stories.gguf"
    run_cli(kvllm, "convert", stories["bin"], "--tokenizer", stories["tok"], "-o", out).check_ok()
    return out


@pytest.fixture(scope="module")
def hf_folder(kvllm, gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hubhf") / "folder"
    run_cli(kvllm, "convert", gguf, "--to", "hf", "-o", out).check_ok()
    return out


@pytest.fixture
def hub(gguf, hf_folder):
    data = gguf.read_bytes()
    h = FakeHub({
        "owner/stories": {"stories-Q8_0.gguf": data, "stories-F32.gguf": b"GGUF not this one",
                          "README.md": b"# stories\n"},
        "owner/ambiguous": {"m-Q4_K_M.gguf": b"a", "m-Q4_K_S.gguf": b"b"},
        "owner/folder": {p.name: p.read_bytes() for p in hf_folder.iterdir() if p.is_file()},
    })
    yield h
    h.close()


def env_for(hub_url: str, home: Path, **extra) -> dict[str, str]:
    e = {"HF_ENDPOINT": hub_url, "HF_HOME": str(home), "HF_TOKEN": "", "HF_HUB_CACHE": "", "HF_HUB_OFFLINE": ""}
    e.update(extra)
    return e


GEN = ["-p", "Once upon a time", "-n", "12", "--temp", "0", "-q"]


def test_hf_quant_downloads_into_hf_cache_and_runs(kvllm, hub, gguf, tmp_path):
    want = run_cli(kvllm, "run", "-m", gguf, *GEN).check_ok().out
    env = env_for(hub.url, tmp_path, HF_TOKEN="sekrit")
    res = run_cli(kvllm, "run", "-hf", "owner/stories:q8_0", *GEN, env=env).check_ok()
    assert res.out == want
    repo = tmp_path / "hub" / "models--owner--stories"
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert (repo / "refs" / "main").read_text() == COMMIT
    snap = repo / "snapshots" / COMMIT / "stories-Q8_0.gguf"
    assert snap.is_symlink() and os.readlink(snap) == f"../../blobs/{sha}"
    assert (repo / "blobs" / sha).read_bytes() == gguf.read_bytes()
    assert not list((repo / "blobs").glob("*.incomplete"))
    # the token went to the hub's API and resolve URLs
    api = [e for e in hub.log if e[1].startswith("/api/models/owner/stories/tree/main")]
    assert api and api[0][2].get("Authorization") == "Bearer sekrit"
    # cached: the second run fetches no bytes again
    n_cdn = len(hub.gets("/cdn/"))
    assert n_cdn == 1
    res = run_cli(kvllm, "run", "--hf-repo", "owner/stories:Q8_0", *GEN, env=env).check_ok()
    assert res.out == want and len(hub.gets("/cdn/")) == n_cdn
    # --hf-file names the file itself; without QUANT the single Q8_0 is the default's second choice
    res = run_cli(kvllm, "run", "-hf", "owner/stories", "--hf-file=stories-Q8_0.gguf", *GEN, env=env).check_ok()
    assert res.out == want
    res = run_cli(kvllm, "run", "-hf", "owner/stories", *GEN, env=env).check_ok()
    assert res.out == want


def test_hf_resume_after_cut(kvllm, hub, gguf, tmp_path):
    hub.cut_once = True
    env = env_for(hub.url, tmp_path)
    res = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env).check_ok()
    size = len(gguf.read_bytes())
    ranges = [e[2].get("Range") for e in hub.gets("/cdn/")]
    assert ranges[0] is None and ranges[1] == f"bytes={size // 2}-", (ranges, res.err)
    assert "resuming" in res.err
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert (tmp_path / "hub" / "models--owner--stories" / "blobs" / sha).read_bytes() == gguf.read_bytes()


def test_hf_resume_across_runs(kvllm, hub, gguf, tmp_path):
    """An .incomplete file left by an earlier run is continued, not restarted."""
    data = gguf.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    blobs = tmp_path / "hub" / "models--owner--stories" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").write_bytes(data[:1000])
    run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env_for(hub.url, tmp_path)).check_ok()
    assert [e[2].get("Range") for e in hub.gets("/cdn/")] == ["bytes=1000-"]
    assert (blobs / sha).read_bytes() == data


def test_hf_checksum_mismatch_refused(kvllm, hub, tmp_path):
    hub.corrupt = True
    res = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env_for(hub.url, tmp_path))
    assert res.returncode == 1, res.describe()
    assert "SHA-256 mismatch" in res.err and "/owner/stories/resolve/main/stories-Q8_0.gguf" in res.err
    blobs = tmp_path / "hub" / "models--owner--stories" / "blobs"
    assert not list(blobs.iterdir()), list(blobs.iterdir())


def test_hf_not_found(kvllm, hub, tmp_path):
    env = env_for(hub.url, tmp_path)
    res = run_cli(kvllm, "run", "-hf", "owner/missing", *GEN, env=env)
    assert res.returncode == 1 and f"{hub.url}/api/models/owner/missing/tree/main" in res.err and "404" in res.err
    res = run_cli(kvllm, "run", "-hf", "owner/stories", "-hff", "nothere.gguf", *GEN, env=env)
    assert res.returncode == 1 and f"{hub.url}/owner/stories/resolve/main/nothere.gguf" in res.err, res.describe()
    assert "404" in res.err
    res = run_cli(kvllm, "run", "-hf", "owner/stories:IQ1_S", *GEN, env=env)
    assert res.returncode == 1 and "IQ1_S" in res.err and "stories-Q8_0.gguf" in res.err, res.describe()
    res = run_cli(kvllm, "run", "-hf", "owner/ambiguous:q4_k", *GEN, env=env)
    assert res.returncode == 1 and "m-Q4_K_M.gguf" in res.err and "m-Q4_K_S.gguf" in res.err, res.describe()
    res = run_cli(kvllm, "run", "-hf", "not a repo", *GEN, env=env)
    assert res.returncode == 1 and "not a repository name" in res.err, res.describe()


def test_hf_offline(kvllm, hub, gguf, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()   # nothing listens there: connection refused
    res = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env_for(dead, tmp_path))
    assert res.returncode == 1, res.describe()
    errs = [ln for ln in res.err.splitlines() if ln.startswith("kvllm: error:")]
    assert len(errs) == 1 and f"{dead}/api/models/owner/stories/tree/main" in errs[0], res.describe()
    # once cached, an unreachable hub (or HF_HUB_OFFLINE=1) falls back to the cache
    want = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env_for(hub.url, tmp_path)).check_ok().out
    res = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN, env=env_for(dead, tmp_path)).check_ok()
    assert res.out == want and "cached" in res.err
    res = run_cli(kvllm, "run", "-hf", "owner/stories:Q8_0", *GEN,
                  env=env_for(dead, tmp_path, HF_HUB_OFFLINE="1")).check_ok()
    assert res.out == want


def test_hf_folder_and_serve_by_name(kvllm, hub, gguf, hf_folder, tmp_path):
    """A repository without .gguf is a Hugging Face folder; `kvllm serve owner/name` (vLLM) serves it by that name."""
    env = env_for(hub.url, tmp_path)
    want = run_cli(kvllm, "run", "-m", hf_folder, *GEN).check_ok().out
    res = run_cli(kvllm, "run", "-hf", "owner/folder", *GEN, env=env).check_ok()
    assert res.out == want
    snap = tmp_path / "hub" / "models--owner--folder" / "snapshots" / COMMIT
    assert sorted(p.name for p in snap.iterdir()) == sorted(p.name for p in hf_folder.iterdir() if p.is_file())
    s = Server(kvllm, "owner/folder", env=env)
    try:
        st, _, body = s.request("GET", "/v1/models")
        assert st == 200 and json.loads(body)["data"][0]["id"] == "owner/folder", body
    finally:
        s.stop()
