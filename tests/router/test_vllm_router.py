"""Two `kvllm serve` replicas behind the real vllm-router (tests/requirements-router.txt; run by
scripts/test_router.sh, which makes its venv): requests sharing a prefix go to the replica that holds it,
under kv_aware (routing on kvllm's KV events) and cache_aware (the router's own prefix tree); a replica
killed under load is routed around, and once restarted its events begin with AllBlocksCleared, so the
router forgets what the old process held, and learns what the new one caches.

Model: stories260K on one thread per replica, block size 16.  VLLM_ROUTER names the vllm-router
executable (scripts/test_router.sh sets it).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ports import free_ports  # noqa: E402
from server_util import Server, stories_args  # noqa: E402

ROUTER = os.environ.get("VLLM_ROUTER", "vllm-router")
PREFIX = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
          "friends every day. One day she saw a big red ball")
OTHER = ("Tom had a small brown dog called Max. Every morning they walked to the river and looked at the fish "
         "that jumped out of the water")




class Fleet:
    """n replicas (fixed ports, so a replica can be restarted in place) and a router over them."""

    def __init__(self, kvllm, stories, policy, n=2, tmp=None):
        self.kvllm, self.stories, self.policy = kvllm, stories, policy
        p = free_ports(3 * n + 1)
        self.router_port, self.http, self.pub, self.rep = p[0], p[1:n + 1], p[n + 1:2 * n + 1], p[2 * n + 1:]
        self.urls = [f"http://127.0.0.1:{q}" for q in self.http]
        self.reps = [self.start_replica(i) for i in range(n)]
        args = [ROUTER, "--host", "127.0.0.1", "--port", str(self.router_port), "--worker-urls", *self.urls,
                "--policy", policy, "--log-level", "debug", "--health-check-interval-secs", "1",
                "--health-failure-threshold", "1", "--retry-max-retries", "3"]
        if policy == "kv_aware":
            for i, u in enumerate(self.urls):
                args += ["--kv-event-source", f"{u}=tcp://127.0.0.1:{self.pub[i]}",
                         "--kv-event-replay-source", f"{u}=tcp://127.0.0.1:{self.rep[i]}"]
            args += ["--kv-event-block-size", "16", "--kv-event-model", "stories"]
        self.log = Path(tmp or "/tmp") / f"router-{policy}-{self.router_port}.log"
        self.router = subprocess.Popen(args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.router.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.req("GET", "/health")[0] == 200 and self.ready():
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("router not ready:\n" + self.log.read_text()[-3000:])
        time.sleep(1.0)  # the subscribers connect

    def ready(self):
        st, body = self.req("GET", "/v1/models")
        return st == 200

    def start_replica(self, i):
        return Server(self.kvllm, *stories_args(self.stories), "--alias", "stories", "--kv-events",
                      f"tcp://127.0.0.1:{self.pub[i]}", "--kv-events-replay", f"tcp://127.0.0.1:{self.rep[i]}",
                      port=self.http[i])

    def req(self, method, path, body=None, timeout=60):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.router_port, timeout=timeout)
        try:
            c.request(method, path, json.dumps(body) if body is not None else None,
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def complete(self, prompt, max_tokens=2):
        st, body = self.req("POST", "/v1/completions", {"model": "stories", "prompt": prompt,
                                                         "max_tokens": max_tokens, "temperature": 0})
        assert st == 200, body
        return json.loads(body)

    def served(self):
        """Requests each replica answered (vllm:request_success_total)."""
        return [int(r.metrics().get('vllm:request_success_total{model_name="stories"}', 0)) for r in self.reps]

    def close(self):
        self.router.send_signal(signal.SIGTERM)
        try:
            self.router.wait(10)
        except subprocess.TimeoutExpired:
            self.router.kill()
        for r in self.reps:
            if r.proc.poll() is None:
                r.stop()


@pytest.fixture
def fleet(request, kvllm, stories, tmp_path):
    f = Fleet(kvllm, stories, request.param, tmp=tmp_path)
    yield f
    f.close()


@pytest.mark.parametrize("fleet", ["kv_aware"], indirect=True)
def test_kv_aware_routes_to_the_replica_holding_the_prefix(fleet):
    """Warm PREFIX on replica 1 and OTHER on replica 0, directly: every routed request continuing one of
    them lands on the replica that holds it, and is served from its cache."""
    for i, p in ((1, PREFIX), (0, OTHER)):
        st, _, _ = fleet.reps[i].request("POST", "/v1/completions", {"model": "stories", "prompt": p, "max_tokens": 1})
        assert st == 200
    time.sleep(0.5)  # the events reach the router
    before = fleet.served()
    for k in range(4):
        r = fleet.complete(PREFIX + f" with {k} white stars")
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    mid = fleet.served()
    assert [mid[0] - before[0], mid[1] - before[1]] == [0, 4], (before, mid)
    for k in range(4):
        r = fleet.complete(OTHER + f" {k} times")
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    after = fleet.served()
    assert [after[0] - mid[0], after[1] - mid[1]] == [4, 0], (mid, after)
    log = fleet.log.read_text()
    assert "credited_prefix_tokens=48" in re.sub(r"\x1b\[[0-9;]*m", "", log)


@pytest.mark.parametrize("fleet", ["cache_aware"], indirect=True)
def test_cache_aware_keeps_a_prefix_on_one_replica(fleet):
    """cache_aware routes by the request text it has seen: requests sharing a prefix stay on one replica,
    which serves all but the first from its prefix cache."""
    before = fleet.served()
    cached = [fleet.complete(PREFIX + f" number {k}")["usage"]["prompt_tokens_details"]["cached_tokens"]
              for k in range(6)]
    after = fleet.served()
    delta = sorted(a - b for a, b in zip(after, before))
    assert delta == [0, 6], (before, after)
    assert cached[0] == 0 and all(c >= 48 for c in cached[1:]), cached


@pytest.mark.parametrize("fleet", ["kv_aware"], indirect=True)
def test_replica_killed_and_restarted(fleet):
    """Under a steady stream of requests, replica 1 (holding PREFIX) is killed: the router retries or routes
    around it, so requests sent after the kill succeed on replica 0; replica 1 comes back on the same ports,
    its first event batch is AllBlocksCleared, and the router no longer credits it with PREFIX."""
    st, _, _ = fleet.reps[1].request("POST", "/v1/completions", {"model": "stories", "prompt": PREFIX, "max_tokens": 1})
    assert st == 200
    time.sleep(0.5)
    results, stop = [], threading.Event()

    def load():
        k = 0
        while not stop.is_set():
            t = time.monotonic()
            try:
                st, _ = fleet.req("POST", "/v1/completions", {"model": "stories", "prompt": PREFIX + f" {k}",
                                                              "max_tokens": 4, "temperature": 0}, timeout=30)
            except OSError:
                st = -1
            results.append((t, st))
            k += 1

    streams = []

    def stream():
        """A long stream continuing PREFIX (so routed to replica 1), cut by the kill: how it ends."""
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", fleet.router_port, timeout=30)
        try:
            c.request("POST", "/v1/completions", json.dumps({"model": "stories", "prompt": PREFIX + " far away",
                      "max_tokens": 450, "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
            r = c.getresponse()
            body = b""
            try:
                while chunk := r.read1(65536):
                    body += chunk
                end = "closed"
            except (http.client.IncompleteRead, OSError) as e:
                end = type(e).__name__
            streams.append((r.status, end, body[-300:]))
        finally:
            c.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    cut = [threading.Thread(target=stream) for _ in range(2)]
    for t in cut:
        t.start()
    threads += cut
    time.sleep(0.1)
    t_kill = time.monotonic()
    fleet.reps[1].proc.send_signal(signal.SIGKILL)
    fleet.reps[1].proc.wait()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join()
    late = [st for t, st in results if t > t_kill + 1.5]
    assert late and all(st == 200 for st in late), results
    # a stream the kill cut is never passed off as a whole answer: it ends in a transport error (the
    # router forwards the truncated chunked body), not in a clean close without [DONE]
    assert len(streams) == 2, streams
    for st, end, tail in streams:
        assert st == 200 and (end == "closed") == tail.endswith(b"data: [DONE]\n\n"), (st, end, tail)
    early = [st for t, st in results if t_kill - 0.5 < t <= t_kill + 1.5]
    print("streams at the kill:", [end for _, end, _ in streams], "; requests sent from 0.5 s before to 1.5 s "
          f"after: {early.count(200)} of {len(early)} succeeded; later: {len(late)} of {len(late)}")
    # restart in place: the router re-subscribes; the new process holds its first batch (AllBlocksCleared)
    # until that subscription arrives, so the router purges what the old process held
    fleet.reps[1] = fleet.start_replica(1)
    deadline = time.monotonic() + 20
    log = ""
    while time.monotonic() < deadline:
        log = re.sub(r"\x1b\[[0-9;]*m", "", fleet.log.read_text())
        if "cleared" in log.lower() or "AllBlocksCleared" in log:
            break
        time.sleep(0.5)
    time.sleep(2.0)
    before = fleet.served()
    r = fleet.complete(PREFIX + " again")
    after = fleet.served()
    # replica 1 lost PREFIX with its process: the request goes where PREFIX is cached now (replica 0)
    assert after[0] - before[0] == 1 and after[1] == before[1], (before, after)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    # hits come back on the restarted replica: OTHER cached there directly is told to the router, which then
    # sends OTHER's continuations to it, served from its cache
    st, _, _ = fleet.reps[1].request("POST", "/v1/completions", {"model": "stories", "prompt": OTHER, "max_tokens": 1})
    assert st == 200
    time.sleep(0.5)
    before = fleet.served()
    for k in range(3):
        r = fleet.complete(OTHER + f" {k} times")
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48, r["usage"]
    after = fleet.served()
    assert [after[0] - before[0], after[1] - before[1]] == [0, 3], (before, after)
