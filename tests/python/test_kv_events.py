"""`kvllm serve --kv-events`: what the prefix cache stores and evicts, published as vLLM publishes it,
read here with pyzmq and msgpack as a router reads it.

The schema is vLLM's (vllm/distributed/kv_events.py): a batch is the positional array [ts, events,
data_parallel_rank] (msgspec array_like); events are tagged structs, encoded today as maps whose keys come
in declaration order after "type" (vllm-router 0.1.17 reads them so), or with --kv-events-layout array as
vLLM <= 0.11's positional arrays [tag, field...].  Messages are three frames [topic, seq (8 bytes, big
endian), payload]; the replay socket answers [identity, "", start] with [identity, "", seq, payload] per
kept batch and [identity, "", -1, ""] at the end.  Also: the endpoints routers probe, the metrics under
vLLM's names, and bad options.  And the whole story: a subscriber that applies every event of a run (prefix
hits, evictions, preemptions, aborts; a replica killed and restarted) holds what the server's prefix cache
holds (GET /debug/kv/blocks).  Model: stories260K on one thread, block size 16.
"""
from __future__ import annotations

import subprocess
import time

import msgpack
import pytest
import zmq

from ports import free_ports
from server_util import Server, stories_args

BS = 16
PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
          "friends every day. One day she saw a big red ball")

STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
               "lora_name"]




class Events:
    """A subscriber and a replay client on one server's endpoints."""

    def __init__(self, pub: str, replay: str, topic: bytes = b""):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(pub)
        self.replay_ep = replay

    def recv(self, timeout: float = 5.0) -> list[bytes]:
        assert self.sub.poll(int(timeout * 1000)), "no event batch arrived"
        return self.sub.recv_multipart()

    def drain(self, quiet: float = 0.3) -> list[list[bytes]]:
        out = []
        while self.sub.poll(int(quiet * 1000)):
            out.append(self.sub.recv_multipart())
        return out

    def replay(self, start: int) -> list[tuple[int, bytes]]:
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.replay_ep)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            assert d.poll(5000), "the replay did not end"
            f = d.recv_multipart()
            assert len(f) == 3 and f[0] == b"" and len(f[1]) == 8
            seq = int.from_bytes(f[1], "big", signed=True)
            if seq < 0:
                assert f[2] == b""
                break
            got.append((seq, f[2]))
        d.close(0)
        return got

    def close(self):
        self.ctx.destroy(0)


def start(kvllm, stories, *extra, ports=None, subscribe=True):
    """A server with events on, and (subscribe) a subscriber to them."""
    http, pub, rep = ports or free_ports(3)
    s = Server(kvllm, *stories_args(stories), "--alias", "stories", "--kv-events", f"tcp://127.0.0.1:{pub}",
               "--kv-events-replay", f"tcp://127.0.0.1:{rep}", *extra)
    ev = Events(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}") if subscribe else None
    return s, ev, (pub, rep)


def complete(s: Server, prompt: str, max_tokens: int = 2) -> dict:
    st, _, body = s.request("POST", "/v1/completions", {"model": "stories", "prompt": prompt,
                                                         "max_tokens": max_tokens, "temperature": 0})
    assert st == 200, body
    import json
    return json.loads(body)


def tokens(s: Server, prompt: str) -> list[int]:
    import json
    st, _, body = s.request("POST", "/tokenize", {"prompt": prompt})
    assert st == 200, body
    return json.loads(body)["tokens"]


def events_of(payload: bytes) -> list:
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, rank = batch
    assert isinstance(ts, float) and abs(ts - time.time()) < 60 and rank == 0
    return events


@pytest.fixture(scope="module")
def pub(kvllm, stories):
    s, ev, _ = start(kvllm, stories)
    yield s, ev
    ev.close()
    rc, err = s.stop()
    assert rc == 0, err[-3000:]


def test_frames_schema_and_chain(pub):
    """One completion: the batch's frames, the exact bytes of the map layout, BlockStored's fields in
    vLLM's order, the prompt's full blocks with their tokens, hashes chained parent to child."""
    s, ev = pub
    time.sleep(0.3)  # the subscription reaches the publisher
    ids = tokens(s, PROMPT)
    complete(s, PROMPT)
    # batch 0 waited for a subscriber, so this one, subscribed before any request, gets it live
    first = ev.recv()
    assert int.from_bytes(first[1], "big") == 0 and events_of(first[2]) == [{"type": "AllBlocksCleared"}]
    frames = ev.recv()
    assert len(frames) == 3 and frames[0] == b"" and int.from_bytes(frames[1], "big") == 1
    payload = frames[2]
    # [ts (float 64), [one event], 0]: fixarray 3, float64 marker
    assert payload[0] == 0x93 and payload[1] == 0xCB
    events = events_of(payload)
    assert len(events) == 1
    e = events[0]
    assert list(e.keys()) == STORED_KEYS, e.keys()
    assert e["type"] == "BlockStored" and e["block_size"] == BS and e["medium"] == "GPU"
    assert e["lora_id"] is None and e["lora_name"] is None and e["parent_block_hash"] is None
    n_full = len(ids) // BS
    assert n_full >= 2 and len(e["block_hashes"]) == n_full
    assert e["token_ids"] == ids[:n_full * BS]
    assert all(isinstance(h, int) and 0 < h < 2**64 for h in e["block_hashes"])
    assert len(set(e["block_hashes"])) == n_full
    # a longer prompt sharing the prefix: only its new full block is told, chained to the last one
    longer = PROMPT + " and a little blue kite that flew high above the trees"
    ids2 = tokens(s, longer)
    assert ids2[:n_full * BS] == ids[:n_full * BS] and len(ids2) // BS > n_full
    complete(s, longer)
    e2 = events_of(ev.recv()[2])[0]
    assert e2["type"] == "BlockStored" and e2["parent_block_hash"] == e["block_hashes"][-1]
    assert e2["token_ids"] == ids2[n_full * BS:(len(ids2) // BS) * BS]
    # the same prompt again is a cache hit: nothing new is stored
    complete(s, PROMPT)
    assert ev.drain() == []


def test_hashes_agree_across_replicas(kvllm, stories, pub):
    """The published hash is a function of the token prefix: a second replica names the same blocks alike
    (the engine's own prefix-cache hash is keyed per process and never leaves it)."""
    s, ev = pub
    s2, ev2, _ = start(kvllm, stories)
    try:
        time.sleep(0.3)
        ev.drain(0.1)
        prompt = "Tom had a small brown dog called Max. Every morning they walked to the river and looked at the fish"
        complete(s, prompt)
        complete(s2, prompt)
        ha = [h for f in ev.drain() for e in events_of(f[2]) if e["type"] == "BlockStored" for h in e["block_hashes"]]
        hb = [h for f in ev2.drain() for e in events_of(f[2]) if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert len(ha) >= len(tokens(s, prompt)) // BS and ha == hb  # generated tokens may fill one more
    finally:
        ev2.close()
        rc, err = s2.stop()
        assert rc == 0, err[-3000:]


def test_sequence_numbers_and_replay(pub):
    """Sequence numbers count batches from 0 (AllBlocksCleared, sent when the first subscriber came); a late
    subscriber gets everything it missed from the replay socket, in order, then the end mark."""
    s, ev = pub
    time.sleep(0.3)
    ev.drain(0.1)
    complete(s, "Ben and Mia built a tall tower of blocks in the kitchen, and the cat knocked it over twice before lunch")
    live = ev.recv()
    seq = int.from_bytes(live[1], "big")
    replayed = ev.replay(0)
    seqs = [q for q, _ in replayed]
    assert seqs == list(range(0, seq + 1)), seqs
    assert events_of(replayed[0][1]) == [{"type": "AllBlocksCleared"}]
    assert replayed[-1][1] == live[2]
    # from a later start, only what follows; past the end, just the end mark
    assert [q for q, _ in ev.replay(seq)] == [seq]
    assert ev.replay(seq + 1000) == []
    # a malformed request is ignored and the socket keeps answering
    d = ev.ctx.socket(zmq.DEALER)
    d.connect(ev.replay_ep)
    d.send_multipart([b"", b"\x00\x01"])
    assert not d.poll(300)
    d.close(0)
    assert [q for q, _ in ev.replay(seq)] == [seq]


def test_eviction_tells_block_removed(kvllm, stories):
    """A pool of 8 blocks: distinct prompts evict each other's cached blocks; every removal names blocks
    stored before and not removed since."""
    s, ev, _ = start(kvllm, stories, "--kv-tokens", "128")
    try:
        time.sleep(0.3)
        stored, removed = set(), []
        for k in range(6):
            complete(s, f"{k} " + PROMPT.replace("Lily", f"Lily{k}"), max_tokens=1)
            for f in ev.drain(0.2):
                for e in events_of(f[2]):
                    if e["type"] == "BlockStored":
                        stored.update(e["block_hashes"])
                    elif e["type"] == "BlockRemoved":
                        assert list(e.keys()) == ["type", "block_hashes", "medium"] and e["medium"] == "GPU"
                        for h in e["block_hashes"]:
                            assert h in stored, "removed a block never stored"
                            stored.discard(h)
                            removed.append(h)
        assert removed, "no BlockRemoved with 6 prompts of 3 blocks in a pool of 8"
        assert len(stored) <= 8
    finally:
        ev.close()
        rc, err = s.stop()
        assert rc == 0, err[-3000:]


def test_array_layout_and_topic(kvllm, stories):
    """--kv-events-layout array: vLLM <= 0.11's positional events; --kv-events-topic: the first frame; a
    socket bound to every address is listed in /kv_event_sources under the host the asker reached."""
    import json
    http, pub_port, rep = free_ports(3)
    s = Server(kvllm, *stories_args(stories), "--alias", "stories", "--kv-events", f"tcp://*:{pub_port}",
               "--kv-events-layout", "array", "--kv-events-topic", "kv")
    st, _, body = s.request("GET", "/kv_event_sources")
    assert st == 200 and json.loads(body) == [{"data_parallel_rank": 0, "endpoint": f"tcp://127.0.0.1:{pub_port}",
                                               "replay_endpoint": None, "topic": "kv"}]
    ev = Events(f"tcp://127.0.0.1:{pub_port}", "", topic=b"kv")
    try:
        time.sleep(0.3)
        ids = tokens(s, PROMPT)
        complete(s, PROMPT)
        first = ev.recv()  # batch 0, held for this subscriber
        assert first[0] == b"kv" and events_of(first[2]) == [["AllBlocksCleared"]]
        frames = ev.recv()
        assert frames[0] == b"kv"
        (e,) = events_of(frames[2])
        n = len(ids) // BS
        assert e[0] == "BlockStored" and len(e) == 8
        assert e[2] is None and e[3] == ids[:n * BS] and e[4:] == [BS, None, "GPU", None] and len(e[1]) == n
    finally:
        ev.close()
        rc, err = s.stop()
        assert rc == 0, err[-3000:]


def test_router_endpoints(pub):
    """What vllm-router and sglang-router probe: event sources, load, server and model info, health."""
    import json
    s, _ = pub
    st, _, body = s.request("GET", "/kv_event_sources")
    assert st == 200
    src = json.loads(body)
    assert len(src) == 1 and src[0]["data_parallel_rank"] == 0 and src[0]["topic"] == ""
    assert src[0]["endpoint"].startswith("tcp://127.0.0.1:") and src[0]["replay_endpoint"].startswith("tcp://")
    st, _, body = s.request("GET", "/get_load")
    assert st == 200 and json.loads(body)["load"] == 0
    st, _, body = s.request("GET", "/get_server_info")
    info = json.loads(body)
    assert st == 200 and info["block_size"] == BS and info["max_model_len"] == 512 and info["kv_events"] is True
    st, _, body = s.request("GET", "/get_model_info")
    assert st == 200 and json.loads(body)["is_generation"] is True
    assert s.request("GET", "/health_generate")[0] == 200


def test_debug_blocks_needs_kv_events(kvllm, stories):
    """Without --kv-events there is nothing told to check: GET /debug/kv/blocks is 404, no event source."""
    import json
    s = Server(kvllm, *stories_args(stories))
    try:
        st, _, body = s.request("GET", "/debug/kv/blocks")
        assert st == 404 and b"--kv-events" in body, body
        st, _, body = s.request("GET", "/kv_event_sources")
        assert st == 200 and json.loads(body) == []
    finally:
        rc, err = s.stop()
        assert rc == 0, err[-3000:]


def test_vllm_metric_names(pub):
    """The Gateway API Inference Extension's model-server protocol and vLLM dashboards: vLLM's names with
    its model_name label, prefix-cache queries and hits in tokens."""
    s, _ = pub
    complete(s, PROMPT)
    complete(s, PROMPT)
    m = s.wait_blocks_released()  # the engine's gauges are a snapshot of its last step
    lab = '{model_name="stories"}'
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_count"):
        assert name + lab in m, name
    assert m["vllm:num_requests_running" + lab] == 0 and m["vllm:kv_cache_usage_perc" + lab] == 0
    q, h = m["vllm:prefix_cache_queries_total" + lab], m["vllm:prefix_cache_hits_total" + lab]
    assert q > 0 and 0 < h < q  # the repeated prompt hit
    assert m["vllm:prompt_tokens_total" + lab] == m["kvllm_prompt_tokens_total"]


def test_bad_kv_events_options(kvllm, stories, pub):
    """An endpoint that cannot be bound (in use, malformed) stops serve with a message naming it; replay
    without an endpoint is refused."""
    _, ev = pub
    _, pub_port, _ = free_ports(3)
    busy = zmq.Context().socket(zmq.PUB)
    busy.bind(f"tcp://127.0.0.1:{pub_port}")
    try:
        for ep, what in ((f"tcp://127.0.0.1:{pub_port}", "cannot bind"), ("nonsense", "cannot bind")):
            p = subprocess.run([str(kvllm), "serve", *map(str, stories_args(stories)), "--port", "0",
                                "--kv-events", ep], capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and "--kv-events" in p.stderr and ep in p.stderr and what in p.stderr, p.stderr
    finally:
        busy.close(0)
    for opt in (["--kv-events-replay", "tcp://*:1"], ["--kv-events-max-queued", "32"]):
        p = subprocess.run([str(kvllm), "serve", *map(str, stories_args(stories)), *opt],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "need --kv-events" in p.stderr and opt[0] in p.stderr, p.stderr
    p = subprocess.run([str(kvllm), "serve", *map(str, stories_args(stories)), "--kv-events", "tcp://*:1",
                        "--kv-events-layout", "list"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "map or array" in p.stderr, p.stderr


# ---- the whole run, rebuilt from the events ----------------------------------------------------------------

def fnv_chain(parent: int | None, ids: list[int]) -> int:
    """The published hash (kv_events.c): FNV-1a 64 over the parent's hash (8 bytes, little-endian; 0 for a
    first block) and the block's token ids (4 bytes each, little-endian); 0 is taken as 1."""
    h = 0xCBF29CE484222325
    for b in (parent or 0).to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


class Replica:
    """What a router believes one replica caches, from its events alone, checked as it goes: a block is stored
    once (until removed), chained to a parent still cached, under the hash of its tokens; only cached blocks
    are removed."""

    def __init__(self):
        self.blocks: set[int] = set()
        self.count = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.stored = self.removed = self.cleared = 0  # blocks, and blocks dropped by AllBlocksCleared

    def apply(self, e: dict):
        t = e["type"]
        self.count[t] += 1
        if t == "BlockStored":
            parent, hs, ids = e["parent_block_hash"], e["block_hashes"], e["token_ids"]
            assert parent is None or parent in self.blocks, "stored under a parent that is not cached"
            assert hs and len(ids) == len(hs) * BS and e["block_size"] == BS
            for k, h in enumerate(hs):
                assert h == fnv_chain(parent, ids[k * BS:(k + 1) * BS]), "a hash is not its tokens' chain"
                assert h not in self.blocks, "a block stored twice without a removal between"
                self.blocks.add(h)
                parent = h
            self.stored += len(hs)
        elif t == "BlockRemoved":
            for h in e["block_hashes"]:
                assert h in self.blocks, "removed a block that is not cached"
                self.blocks.discard(h)
            self.removed += len(e["block_hashes"])
        else:
            assert t == "AllBlocksCleared", e
            self.cleared += len(self.blocks)
            self.blocks.clear()


def every_batch(ev: Events, live: list[list[bytes]]) -> list[tuple[int, bytes]]:
    """The process's batches from sequence 0, without a gap: those received live, the ones before the first
    (missed while the subscription was reaching the publisher) from the replay socket, which must also agree
    byte for byte with what came live."""
    got = [(int.from_bytes(f[1], "big"), f[2]) for f in live]
    replayed = dict(ev.replay(0))
    first = got[0][0] if got else len(replayed)
    batches = [(q, replayed[q]) for q in range(first)] + got
    assert [q for q, _ in batches] == list(range(len(batches))), "a batch was lost"
    for q, payload in got:
        assert replayed.get(q) == payload, f"replay of batch {q} differs from the live one"
    return batches


def stream_and_leave(port: int, prompt: str) -> bool:
    """A streaming completion left after its first chunk (the socket closed under it); True once it had
    started."""
    import json
    import socket
    raw = json.dumps({"model": "stories", "prompt": prompt, "max_tokens": 400, "ignore_eos": True,
                      "stream": True, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as k:
        k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        got = b""
        while b"data: " not in got:
            b = k.recv(4096)
            if not b:
                return False
            got += b
    return True


def test_subscriber_rebuilds_the_cached_set(kvllm, stories):
    """A subscriber that applies every event of a run with prefix hits, evictions, preemptions and aborts
    holds at the end exactly the blocks the server's prefix cache holds (GET /debug/kv/blocks, as the
    publisher named them): 0 missing, 0 extra.  A pool of 32 blocks of 16 serves 3 shared prefixes under
    many suffixes, 8 at a time and long (preemptions, evictions, hits), while streams are dropped mid-way
    (aborts)."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    s, ev, _ = start(kvllm, stories, "--kv-tokens", "512", "--max-seqs", "8")
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        live: list[list[bytes]] = []
        prefixes = [PROMPT, "Tom had a small brown dog called Max. Every morning they walked to the river and "
                    "looked at the fish that swam under the old wooden bridge near the farm",
                    "Ben and Mia built a tall tower of blocks in the kitchen, and the cat knocked it over twice "
                    "before lunch, so they built it again"]
        def ask(i: int):
            p = prefixes[i % 3] + f" and then {i} friends came to see" + " the sun" * (i % 4)
            st, _, body = s.request("POST", "/v1/completions", {"model": "stories", "prompt": p, "temperature": 0,
                                                                "max_tokens": 64 + 16 * (i % 5), "ignore_eos": True})
            assert st == 200, body
        def snapshot() -> dict:
            st, _, body = s.request("GET", "/debug/kv/blocks")
            assert st == 200, body
            return json.loads(body)
        with ThreadPoolExecutor(10) as ex:
            jobs = [ex.submit(ask, i) for i in range(24)]
            left = [ex.submit(stream_and_leave, s.port, prefixes[k % 3] + f" but {k} left early") for k in range(4)]
            # between any two steps the publisher is in step with the pool (taken on the engine thread)
            for _ in range(5):
                mid = snapshot()
                assert mid["untold"] == 0 and mid["stale"] == 0, mid
                time.sleep(0.05)
            for j in jobs:
                j.result()
            assert sum(j.result() for j in left) >= 1
            live += ev.drain(0.0)
        m = s.wait_blocks_released(5.0)
        assert m['kvllm_kv_blocks{state="held"}'] == 0, m
        live += ev.drain(0.5)  # the last step's batch
        server = snapshot()
        assert ev.drain(0.3) == [], "the server stepped while idle"

        r = Replica()
        batches = every_batch(ev, live)
        assert events_of(batches[0][1]) == [{"type": "AllBlocksCleared"}]
        for _, payload in batches:
            for e in events_of(payload):
                r.apply(e)
        held = set(server["block_hashes"])
        assert len(held) == len(server["block_hashes"])
        missing, extra = held - r.blocks, r.blocks - held
        lab = '{model_name="stories"}'
        figures = {"batches": len(batches), **r.count, "blocks stored": r.stored, "blocks removed": r.removed,
                   "subscriber set": len(r.blocks), "server set": len(held), "missing": len(missing),
                   "extra": len(extra), "untold": server["untold"], "stale": server["stale"],
                   "preemptions": m["vllm:num_preemptions_total" + lab],
                   "prefix hit tokens": m["vllm:prefix_cache_hits_total" + lab],
                   "aborted": m['kvllm_requests_total{outcome="aborted"}']}
        print("kv events run:", figures)
        assert not missing and not extra, figures
        assert server["untold"] == 0 and server["stale"] == 0, figures
        assert len(held) == server["blocks_cached"] and server["blocks_held"] == 0, (server, figures)
        # the run did what it was meant to: none of these may be vacuous
        assert r.count["BlockRemoved"] > 0 and r.removed > 0, figures           # evictions
        assert figures["preemptions"] > 0, figures
        assert figures["prefix hit tokens"] > 0, figures
        assert figures["aborted"] > 0, figures
        assert r.count["AllBlocksCleared"] == 1 and len(held) > 0, figures
    finally:
        ev.close()
        rc, err = s.stop()
        assert rc == 0, err[-3000:]


def test_fallen_behind_publisher_forgets_what_it_told(kvllm, stories):
    """A publisher that falls behind (here: more than 32 tokens of events in one step, --kv-events-max-queued)
    drops what is queued and tells AllBlocksCleared; the blocks it told before count as never told from
    then on (no removal, no child of theirs is told), so a subscriber still holds what GET /debug/kv/blocks
    lists, and a new prefix is told again."""
    import json
    s, ev, _ = start(kvllm, stories, "--kv-events-max-queued", "32")
    live: list[list[bytes]] = []

    def agree() -> dict:
        live.extend(ev.drain(0.3))
        st, _, body = s.request("GET", "/debug/kv/blocks")
        assert st == 200, body
        server = json.loads(body)
        r = Replica()
        for _, payload in every_batch(ev, live):
            for e in events_of(payload):
                r.apply(e)
        assert r.blocks == set(server["block_hashes"]) and server["stale"] == 0, (server, r.blocks)
        return {"told": len(r.blocks), "untold": server["untold"], "cleared": r.count["AllBlocksCleared"]}
    try:
        time.sleep(0.3)
        short = "A small cat sat on the warm mat all day long"  # one full block: within the limit
        assert len(tokens(s, short)) // BS == 1
        complete(s, short)
        assert agree() == {"told": 1, "untold": 0, "cleared": 1}
        n_full = len(tokens(s, PROMPT)) // BS
        assert n_full >= 3
        complete(s, PROMPT)  # one step stores more than 32 tokens of blocks: dropped, and every name forgotten
        assert agree() == {"told": 0, "untold": 1 + n_full, "cleared": 2}
        assert "fell behind" in s.stderr()
        complete(s, PROMPT + " and a little blue kite that flew high above the trees")  # child of an untold prefix
        complete(s, "Two dogs ran along the beach in the morning sun")
        got = agree()
        assert got["told"] == 1 and got["untold"] > 1 + n_full and got["cleared"] == 2, got
    finally:
        ev.close()
        rc, err = s.stop()
        assert rc == 0, err[-3000:]


def test_sigkill_restart_starts_with_all_blocks_cleared(kvllm, stories):
    """A replica killed (SIGKILL) under load and restarted on the same endpoints: its sequence starts again at
    0 with AllBlocksCleared, which a subscriber that stayed connected gets live (the new process holds its
    first batch until a subscription arrives, however late ZMQ reconnects) — and what that subscriber then believes is what the new process
    holds; a subscriber that joins late rebuilds the same set from the replay alone, the restarted replica's
    new prefixes in it."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    ports = free_ports(3)
    s, ev, (pub_port, rep_port) = start(kvllm, stories, ports=ports)
    late = None
    try:
        time.sleep(0.3)
        stayed, old = Replica(), []
        complete(s, PROMPT)
        while not any(e["type"] == "BlockStored" for f in old for e in events_of(f[2])):
            old.append(ev.recv())  # AllBlocksCleared (batch 0) may arrive live too

        def long_request(k: int) -> int:
            try:
                return s.request("POST", "/v1/completions", {"model": "stories", "prompt": f"{k} {PROMPT}",
                                                             "max_tokens": 450, "ignore_eos": True})[0]
            except OSError:
                return 0  # cut by the kill
        with ThreadPoolExecutor(6) as ex:
            inflight = [ex.submit(long_request, k) for k in range(6)]
            deadline = time.monotonic() + 10
            while s.metrics()["kvllm_requests_running"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            s.proc.kill()  # mid-load: nothing is flushed, no last batch is sent
            s.proc.wait()
            cut = sum(f.result() != 200 for f in inflight)
        assert cut > 0, "every request finished before the kill"
        s.stop()
        old += ev.drain(0.3)  # what the old process sent before it died
        for f in old:
            for e in events_of(f[2]):
                stayed.apply(e)
        believed = len(stayed.blocks)
        assert believed > 0

        # no second subscriber: batch 0 goes to the first subscription the new process sees
        s, _, _ = start(kvllm, stories, ports=ports, subscribe=False)
        got = []
        for k in range(20):  # until the subscriber has reconnected (ZMQ retries every 100 ms)
            complete(s, f"{k} " + PROMPT)
            got = ev.drain(0.3)
            if got:
                break
        assert got, "no batch from the restarted replica"
        # it held batch 0 until this subscriber had reconnected: AllBlocksCleared arrives live
        assert int.from_bytes(got[0][1], "big") == 0, int.from_bytes(got[0][1], "big")
        assert events_of(got[0][2])[0] == {"type": "AllBlocksCleared"}
        complete(s, PROMPT, max_tokens=8)
        got += ev.drain(0.3)
        # the new process's sequence: batch 0 begins with AllBlocksCleared (then what was stored before
        # the subscription arrived)
        batches = every_batch(ev, got)
        assert batches[0][0] == 0 and events_of(batches[0][1])[0] == {"type": "AllBlocksCleared"}
        for _, payload in batches:
            for e in events_of(payload):
                stayed.apply(e)
        assert stayed.cleared >= believed  # the old process's blocks are forgotten
        st, _, body = s.request("GET", "/debug/kv/blocks")
        assert st == 200, body
        held = set(json.loads(body)["block_hashes"])
        assert stayed.blocks == held and held

        # a late subscriber catches up through the replay alone
        late = Events(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{rep_port}")
        r = Replica()
        for _, payload in late.replay(0):
            for e in events_of(payload):
                r.apply(e)
        assert r.count["AllBlocksCleared"] == 1 and r.blocks == held
        ids, parent, chain = tokens(s, PROMPT), None, []
        for k in range(len(ids) // BS):
            parent = fnv_chain(parent, ids[k * BS:(k + 1) * BS])
            chain.append(parent)
        assert set(chain) <= r.blocks  # a router that replayed knows the new process holds the prompt again
        print(f"kv events restart: {cut} requests cut, {believed} blocks believed before, "
              f"{len(batches)} batches after, {len(held)} held, late subscriber {len(r.blocks)}")
    finally:
        ev.close()
        if late:
            late.close()
        rc, err = s.stop()
        assert rc == 0, err[-3000:]
