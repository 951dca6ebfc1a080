"""`kvllm serve` end to end: the official openai client against the server, batch invariance seen
from outside, disconnects releasing KV blocks, malformed requests, a bounded load run, and an
ASan serve-and-load run.

Models: stories260K (llama2.c checkpoint + tok512 vocabulary) and a random-weight GQA GGUF.
Servers run with -t 1: on a small machine the engine's spinning thread pool would otherwise
compete for the cores with the HTTP threads and the test's own clients.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from kvtest import SANITIZER_MARKERS, mpi_np
from server_util import Server, gqa_args, http_status, raw_exchange, stories_args, write_gqa_model

N_CTX = 512     # stories260K's context


@pytest.fixture(scope="module")
def srv(kvllm, stories):
    s = Server(kvllm, *stories_args(stories))
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-4000:]


@pytest.fixture(scope="module")
def gqa_srv(kvllm, tmp_path_factory):
    s = Server(kvllm, *gqa_args(write_gqa_model(tmp_path_factory.mktemp("srv"))))
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-4000:]


# ---- basics ----------------------------------------------------------------

def test_health_and_models(srv):
    assert srv.request("GET", "/health")[0] == 200
    models = srv.client().models.list()
    assert [m.id for m in models.data] == ["stories260K"]
    st, body = srv.post("/v1/completions", {"model": "stories260K", "prompt": "Hi", "max_tokens": 1})
    assert st == 200, body


def test_hf_folder(kvllm, stories, run, tmp_path):
    """A Hugging Face folder is served under its folder name, and a request without `model` goes to it."""
    out = tmp_path / "stories-hf"
    r = run("convert", stories["bin"], "--tokenizer", stories["tok"], "--to", "hf", "-o", str(out))
    assert r.returncode == 0, r.describe()
    s = Server(kvllm, "-m", str(out), "-t", "1")
    try:
        assert [m.id for m in s.client().models.list().data] == ["stories-hf"]
        st, body = s.post("/v1/completions", {"prompt": [1], "max_tokens": 32, "temperature": 0})
        assert st == 200, body
        assert body["model"] == "stories-hf"
        assert stories["text"].read_text().startswith(body["choices"][0]["text"]), body
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]


def test_greedy_matches_reference(srv, stories):
    """BOS alone, greedy: the published llama2.c output of stories260K."""
    ref = stories["text"].read_text()
    r = srv.client().completions.create(model="stories260K", prompt=[1], max_tokens=64, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert r.usage.prompt_tokens == 1 and r.usage.completion_tokens == 64
    assert ref.startswith(c.text) and len(c.text) > 100, c.text


def test_streaming_matches_nonstreaming(srv):
    oc = srv.client()
    args = dict(model="stories260K", prompt="Once upon a time", max_tokens=40, temperature=0)
    full = oc.completions.create(**args)
    chunks = list(oc.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_seeded_sampling_same_on_both_routes(srv):
    """A request sampled with nothing but temperature, top-k, top-p, min-p and a seed is drawn by the
    backend's sample op (only its ids leave the backend); asking for logprobs puts it on the host
    sampler, which draws from the same seeded RNG: the same text either way, for every chain."""
    oc = srv.client()
    chains = [dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, extra_body={"top_k": 20, "min_p": 0.05}),
              dict(temperature=1.5, top_p=1.0, extra_body={"top_k": 0, "min_p": 0.1})]
    texts = set()
    for chain in chains:
        for seed in (3, 11):
            args = dict(model="stories260K", prompt="Once upon a time", max_tokens=24, seed=seed, **chain)
            dev = oc.completions.create(**args)
            host = oc.completions.create(**args, logprobs=1)
            assert host.choices[0].text == dev.choices[0].text, (chain, seed)
            texts.add(dev.choices[0].text)
    assert len(texts) > 1   # the seeds and chains matter


def test_n_and_prompt_lists(srv):
    oc = srv.client()
    r = oc.completions.create(model="stories260K", prompt="Lily", max_tokens=12, n=3, temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 36
    again = oc.completions.create(model="stories260K", prompt="Lily", max_tokens=12, n=3, temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]   # seeded: reproducible
    # two prompts x n=2: choices prompt-major; greedy samples of one prompt agree
    r = oc.completions.create(model="stories260K", prompt=["Once upon", "The dog"], max_tokens=8, n=2,
                              temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text
    alone = oc.completions.create(model="stories260K", prompt="The dog", max_tokens=8, temperature=0)
    assert r.choices[2].text == alone.choices[0].text
    # token-id prompts, one and several
    r = oc.completions.create(model="stories260K", prompt=[[1, 403], [1]], max_tokens=4, temperature=0)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 3


def test_stop_strings(srv):
    oc = srv.client()
    base = oc.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=48, temperature=0)
    text = base.choices[0].text
    stop = text[20:26]
    cut = text.index(stop)
    for stream in (False, True):
        if stream:
            chunks = list(oc.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=48,
                                                temperature=0, stop=[stop, "zzzz"], stream=True))
            got = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = oc.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=48,
                                      temperature=0, stop=stop)
            got, reason = r.choices[0].text, r.choices[0].finish_reason
        assert got == text[:cut] and reason == "stop", (got, text, stop)


def test_logprobs(srv):
    oc = srv.client()
    r = oc.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=10, temperature=0,
                              logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    for tok_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0 and 1 <= len(top) <= 3
        assert abs(max(top.values()) - tok_lp) < 1e-5   # greedy: the chosen token is the best one
    assert lp.text_offset == sorted(lp.text_offset)
    chunks = list(oc.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=10,
                                        temperature=0, logprobs=3, stream=True))
    streamed = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)


def test_chat_without_template(srv):
    """stories260K carries no chat template: a 400 that says so (streaming or not)."""
    oc = srv.client()
    msgs = [{"role": "user", "content": "Tell me a story."}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            r = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=8, stream=stream)
            if stream:
                list(r)
        assert "chat template" in str(e.value), str(e.value)


def template_server(kvllm, stories, shared, name: str) -> Server:
    return Server(kvllm, *stories_args(stories), "--chat-template", shared / "templates" / name)


def test_chat_with_template(kvllm, stories, shared):
    """--chat-template FILE: the Llama 3.2 template over stories260K (the text is nonsense, the protocol
    is what is checked)."""
    s = template_server(kvllm, stories, shared, "meta-llama-Llama-3.2-3B-Instruct.jinja")
    try:
        oc = s.client()
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
        r = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=2)
        c = r.choices[0]
        assert c.message.role == "assistant" and c.finish_reason in ("stop", "length") and c.message.content
        assert r.usage.prompt_tokens > 20 and 1 <= r.usage.completion_tokens <= 12
        assert len(c.logprobs.content) == r.usage.completion_tokens
        assert all(len(t.top_logprobs) <= 2 and t.logprob <= 0 for t in c.logprobs.content)
        chunks = list(oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.message.content
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
        r = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=6, n=3, temperature=0)
        assert len({x.message.content for x in r.choices}) == 1 and len(r.choices) == 3
        # no max_tokens: until EOS or the context is full
        r = oc.chat.completions.create(model="stories260K", messages=msgs, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens + r.usage.completion_tokens <= N_CTX
        # bad roles and shapes are still 400s here
        st, body = s.post("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
        assert st == 400 and "role" in body["error"]["message"]
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]
    # a template that refuses the conversation (raise_exception): a 400 with its message
    s = template_server(kvllm, stories, shared, "google-gemma-2-2b-it.jinja")
    try:
        st, body = s.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"},
                                                                {"role": "user", "content": "y"}]})
        assert st == 400, body
        if "unsupported" not in body["error"]["message"]:
            assert "System role not supported" in body["error"]["message"], body
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]


def test_gqa_model(gqa_srv):
    oc = gqa_srv.client()
    assert [m.id for m in oc.models.list().data] == ["gqa"]
    a = oc.completions.create(model="gqa", prompt="hello world", max_tokens=16, temperature=0)
    b = "".join(c.choices[0].text for c in oc.completions.create(model="gqa", prompt="hello world",
                                                                  max_tokens=16, temperature=0, stream=True))
    assert a.choices[0].text == b and a.usage.completion_tokens >= 1
    r = oc.completions.create(model="gqa", prompt="abc", max_tokens=6, n=4, temperature=0.9, seed=1, logprobs=2)
    assert len(r.choices) == 4 and all(len(c.logprobs.token_logprobs) <= 6 for c in r.choices)


def test_smollm2_chat_and_completions(kvllm, smollm2, f32_answers):
    """A real instruct model with its own chat template (from the GGUF) and byte-level BPE."""
    s = Server(kvllm, "-m", smollm2, "-t", "1", "--alias", "smollm2", "-c", "2048")
    try:
        oc = s.client()
        q = [{"role": "user", "content": "What is the capital of France?"}]
        r = oc.chat.completions.create(model="smollm2", messages=q, max_tokens=32, temperature=0)
        text = r.choices[0].message.content
        assert "Paris" in text and r.choices[0].finish_reason == "stop", r
        streamed = "".join(c.choices[0].delta.content or "" for c in oc.chat.completions.create(
            model="smollm2", messages=q, max_tokens=32, temperature=0, stream=True) if c.choices)
        assert streamed == text
        c = oc.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0)
        assert "Paris" in c.choices[0].text and c.usage.prompt_tokens == 5
        # concurrency is invisible here too: 8 parallel greedy streams equal the one alone
        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(lambda _: stream_text(s, "smollm2", "Once upon a time", 24), range(8)))
        assert len(set(outs)) == 1 and outs[0]
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-4000:]


# ---- concurrency is invisible -------------------------------------------------

def stream_text(s: Server, model: str, prompt, max_tokens: int) -> str:
    oc = s.client()
    return "".join(c.choices[0].text for c in oc.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                                     temperature=0, stream=True))


@pytest.mark.parametrize("which", ["stories", "gqa"])
def test_concurrent_equals_alone(which, srv, gqa_srv):
    s, model = (srv, "stories260K") if which == "stories" else (gqa_srv, "gqa")
    words = ["Once", "The cat", "Lily and Ben", "A big", "One day", "Tom", "The sun was", "She"]
    prompts = [f"{words[i % 8]} {words[(i * 3) % 8].lower()}" + " x" * (i % 5) for i in range(32)]
    alone = [stream_text(s, model, p, 24) for p in prompts]
    with ThreadPoolExecutor(32) as ex:
        together = list(ex.map(lambda p: stream_text(s, model, p, 24), prompts))
    assert together == alone


def test_async_scheduling_same_answers(kvllm, stories):
    """A server that plans each step while the previous one runs (--async-scheduling) answers 24 concurrent
    requests (greedy and seeded sampling, n = 2, stop strings, a small KV pool that preempts) exactly as the
    synchronous one does, and /metrics counts the steps it planned ahead (none under tensor parallelism)."""
    words = ["Once", "The cat", "Lily and Ben", "A big", "One day", "Tom", "The sun was", "She"]
    reqs = [dict(model="stories260K", prompt=f"{words[i % 8]} {words[(i * 5) % 8].lower()}" + " x" * (i % 4),
                 max_tokens=16 + i % 24, temperature=0 if i % 2 else 0.9, seed=100 + i, n=1 + (i % 3 == 2),
                 stop=["."] if i % 4 == 1 else None) for i in range(24)]

    def answers(s: Server) -> list:
        oc = s.client()
        with ThreadPoolExecutor(24) as ex:
            rs = list(ex.map(lambda q: oc.completions.create(**q), reqs))
        return [[(c.text, c.finish_reason) for c in sorted(r.choices, key=lambda c: c.index)] for r in rs]

    pool = ["--kv-tokens", "512", "--max-batch-tokens", "64"]
    on = Server(kvllm, *stories_args(stories), *pool, "--async-scheduling")
    try:
        got = answers(on)
        ahead = on.metrics()["kvllm_steps_planned_ahead_total"]
        # a tensor-parallel job keeps the synchronous order (its steps are collectives): the same answers, none ahead
        assert (ahead == 0) if mpi_np() > 1 else (ahead > 0), ahead
    finally:
        rc, err = on.stop()
    assert rc == 0, err[-4000:]
    off = Server(kvllm, *stories_args(stories), *pool, "--no-async-scheduling")
    try:
        want = answers(off)
    finally:
        rc, err = off.stop()
    assert rc == 0, err[-4000:]
    assert got == want
    assert any(f == "stop" for a in want for _, f in a) and any(f == "length" for a in want for _, f in a)


# ---- disconnects release KV blocks -----------------------------------------------

KILLABLE_CLIENT = r"""
import sys, openai
oc = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
for c in oc.completions.create(model="gqa", prompt=sys.argv[2], max_tokens=8000, temperature=0,
                               stream=True, extra_body={"ignore_eos": True}):
    print("chunk", flush=True)
"""


def open_request(port: int, body: dict) -> socket.socket:
    """Send a request on a fresh socket and leave the response unread."""
    raw = json.dumps(body).encode()
    k = socket.create_connection(("127.0.0.1", port))
    k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    return k


def test_disconnect_releases_blocks(gqa_srv):
    """Clients killed mid-stream (openai in a subprocess, SIGKILL), sockets closed mid-stream and
    non-streaming requests abandoned: every sequence is aborted and /metrics shows no block held."""
    s = gqa_srv
    before = s.metrics()['kvllm_requests_total{outcome="aborted"}']
    procs = [subprocess.Popen([sys.executable, "-c", KILLABLE_CLIENT, s.base_url, f"prompt {i} " * (i + 1)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for i in range(3)]
    socks: list[socket.socket] = []
    try:
        for p in procs:                                    # every client is mid-stream
            assert p.stdout.readline().startswith(b"chunk")
        long = {"model": "gqa", "max_tokens": 8000, "ignore_eos": True}
        for i in range(3):
            k = open_request(s.port, {**long, "prompt": f"stream {i}", "stream": True})
            socks.append(k)
            got = b""
            while b"data: " not in got:                    # mid-stream
                b = k.recv(4096)
                assert b, got
                got += b
        socks += [open_request(s.port, {**long, "prompt": f"wait {i}"}) for i in range(2)]
        deadline = time.monotonic() + 10
        while (m := s.metrics())["kvllm_requests_running"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m['kvllm_kv_blocks{state="held"}'] > 0 and m["kvllm_requests_running"] == 8, m
    finally:
        for k in socks:
            k.close()
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    m = s.wait_blocks_released(2.0)
    assert m['kvllm_kv_blocks{state="held"}'] == 0, m
    assert m['kvllm_requests_running'] == 0 and m['kvllm_requests_waiting'] == 0
    assert m['kvllm_requests_total{outcome="aborted"}'] - before == 8
    assert s.post("/v1/completions", {"prompt": "still", "max_tokens": 2})[0] == 200


# ---- malformed requests -----------------------------------------------------------

def deep(n: int) -> str:
    return "[" * n + "]" * n


BAD = [
    # (name, method, path, raw body, expected status, substring of the message or "")
    ("invalid utf-8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}', 400, "UTF-8"),
    ("lone surrogate", "POST", "/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}', 400, "UTF-8"),
    ("truncated json", "POST", "/v1/completions", b'{"prompt": "Once", "max_tok', 400, "JSON"),
    ("not json", "POST", "/v1/completions", b"prompt=Once", 400, "JSON"),
    ("empty body", "POST", "/v1/completions", b"", 400, "empty"),
    ("array body", "POST", "/v1/completions", b"[1, 2]", 400, "object"),
    ("trailing garbage", "POST", "/v1/completions", b'{"prompt": "a"} {"x": 1}', 400, "JSON"),
    ("huge float", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 1e400}', 400, "max_tokens"),
    ("huge int", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 99999999999999999999999}', 400,
     "max_tokens"),
    ("negative max_tokens", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": -5}', 400, "max_tokens"),
    ("zero max_tokens", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 0}', 400, "max_tokens"),
    ("absurd max_tokens", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 100000}', 400, "512"),
    ("fractional max_tokens", "POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 2.5}', 400, "integer"),
    ("prompt wrong type", "POST", "/v1/completions", b'{"prompt": 123}', 400, "prompt"),
    ("prompt missing", "POST", "/v1/completions", b'{"max_tokens": 3}', 400, "prompt"),
    ("prompt mixed list", "POST", "/v1/completions", b'{"prompt": ["a", 1]}', 400, "prompt"),
    ("prompt empty list", "POST", "/v1/completions", b'{"prompt": []}', 400, "prompt"),
    ("token id out of range", "POST", "/v1/completions", b'{"prompt": [1, 99999]}', 400, "out of range"),
    ("prompt too long", "POST", "/v1/completions", json.dumps({"prompt": [5] * 600}).encode(), 400, "512"),
    ("temperature string", "POST", "/v1/completions", b'{"prompt": "a", "temperature": "hot"}', 400, "temperature"),
    ("temperature range", "POST", "/v1/completions", b'{"prompt": "a", "temperature": 5}', 400, "temperature"),
    ("top_p negative", "POST", "/v1/completions", b'{"prompt": "a", "top_p": -0.5}', 400, "top_p"),
    ("n zero", "POST", "/v1/completions", b'{"prompt": "a", "n": 0}', 400, "'n'"),
    ("n absurd", "POST", "/v1/completions", b'{"prompt": "a", "n": 100000}', 400, "'n'"),
    ("n above max-seqs", "POST", "/v1/completions", b'{"prompt": "a", "n": 100}', 400, "max-seqs"),
    ("stop number", "POST", "/v1/completions", b'{"prompt": "a", "stop": 5}', 400, "stop"),
    ("stop with NUL", "POST", "/v1/completions", b'{"prompt": "a", "stop": ["x\\u0000y"]}', 400, "NUL"),
    ("stream string", "POST", "/v1/completions", b'{"prompt": "a", "stream": "yes"}', 400, "stream"),
    ("logprobs too many", "POST", "/v1/completions", b'{"prompt": "a", "logprobs": 50}', 400, "logprobs"),
    ("nested garbage", "POST", "/v1/completions", ('{"prompt": %s}' % deep(200)).encode(), 400, "JSON"),
    ("nested in field", "POST", "/v1/completions", b'{"prompt": "a", "stop": [[["x"]]]}', 400, "stop"),
    ("unknown model", "POST", "/v1/completions", b'{"model": "gpt-9", "prompt": "a"}', 404, "gpt-9"),
    ("chat missing messages", "POST", "/v1/chat/completions", b'{"max_tokens": 3}', 400, "messages"),
    ("chat messages not list", "POST", "/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("chat empty messages", "POST", "/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("chat bad role", "POST", "/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400,
     "role"),
    ("chat content type", "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 7}]}', 400,
     "content"),
    ("chat top_logprobs alone", "POST", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400, "logprobs"),
    ("unknown endpoint", "POST", "/v1/nope", b"{}", 404, "/v1/nope"),
    ("root", "GET", "/", b"", 404, ""),
    ("wrong method", "GET", "/v1/completions", b"", 405, "GET"),
    ("wrong method health", "DELETE", "/health", b"", 405, ""),
    ("unknown model id", "GET", "/v1/models/nothing", b"", 404, "nothing"),
    ("oversized body", "POST", "/v1/completions",
     b'{"prompt": "' + b"a" * (1 << 20) + b'"}', 413, "limit"),
]


def check_error(status: int, raw: bytes, want: int, needle: str, name: str) -> None:
    assert status == want, f"{name}: {status} {raw[:300]!r}"
    e = json.loads(raw)["error"]
    assert isinstance(e["message"], str) and isinstance(e["type"], str), name
    assert "param" in e and "code" in e, name
    assert needle in e["message"], f"{name}: {e['message']!r}"


def test_bad_requests(srv):
    assert len(BAD) >= 20
    good: dict = {}

    def good_request():   # a long-ish stream running through all of it
        good["text"] = stream_text(srv, "stories260K", "Once upon a time", 200)

    t = threading.Thread(target=good_request)
    t.start()
    for name, method, path, body, want, needle in BAD:
        st, _, raw = srv.request(method, path, body)
        check_error(st, raw, want, needle, name)
    t.join()
    assert len(good["text"]) > 100
    # a body cut short: the client gives up mid-upload; nothing to answer, nothing to crash
    raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prom",
                 half_close=True, timeout=5)
    # a body too large to even drain: answered at once
    raw = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n"
                                 b"Connection: close\r\n\r\n", timeout=5)
    assert http_status(raw) == 413, raw[:200]
    # a request line that is not HTTP
    raw_exchange(srv.port, b"\x00\x01garbage\r\n\r\n", timeout=5)
    assert srv.request("GET", "/health")[0] == 200
    assert srv.wait_blocks_released()['kvllm_kv_blocks{state="held"}'] == 0


def test_api_key_and_queue_limit(kvllm, stories):
    s = Server(kvllm, *stories_args(stories), "--api-key", "sekret", "--max-seqs", "1", "--max-queue", "1")
    try:
        st, _, raw = s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
        check_error(st, raw, 401, "API key", "no key")
        st, _, raw = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        check_error(st, raw, 401, "API key", "wrong key")
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert s.request("GET", "/health")[0] == 200          # not behind the key
        oc = s.client(api_key="sekret")
        assert oc.completions.create(model="stories260K", prompt="a", max_tokens=2).usage.completion_tokens >= 1

        def one(_):
            h = {"Authorization": "Bearer sekret"}
            st, _, raw = s.request("POST", "/v1/completions",
                                   {"prompt": "Once", "max_tokens": 400, "ignore_eos": True}, headers=h)
            if st != 200:
                check_error(st, raw, 429, "queue", "queue full")
            return st

        with ThreadPoolExecutor(12) as ex:
            statuses = list(ex.map(one, range(12)))
        assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, statuses
        assert s.metrics()['kvllm_requests_total{outcome="busy"}'] == statuses.count(429)
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]


# ---- load ----------------------------------------------------------------------------

def test_load(srv):
    """500 short requests at concurrency 16, half streaming: zero failures, nothing held after."""
    def one(i):
        body = {"prompt": f"Once upon a time {i}", "max_tokens": 8, "temperature": 0.7, "seed": i,
                "stream": bool(i % 2)}
        st, _, raw = srv.request("POST", "/v1/completions", body)
        assert st == 200, raw
        if i % 2:
            assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
        return st

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as ex:
        assert list(ex.map(one, range(500))) == [200] * 500
    dt = time.monotonic() - t0
    m = srv.wait_blocks_released()
    assert m['kvllm_kv_blocks{state="held"}'] == 0
    assert m["kvllm_time_to_first_token_seconds_count"] >= 500
    print(f"load: 500 requests in {dt:.2f}s ({500 / dt:.1f} req/s)")


def test_bench_serve(srv, run):
    """The C load generator against the server."""
    r = run("bench", "serve", "--url", f"http://127.0.0.1:{srv.port}", "--requests", "200", "--concurrency", "16",
            "--prompt-len", "8:64", "--gen-len", "4:16", "-o", "json", timeout=120)
    assert r.returncode == 0, r.describe()
    res = json.loads(r.out)
    assert res["failed"] == 0 and res["requests"] == 200 and res["output_tokens"] >= 200 * 4
    print("bench serve:", r.out.strip())


# ---- sanitizers ------------------------------------------------------------------------

def test_asan_serve_and_load(asan_bin, stories):
    """A short serve-and-load run on the ASan binary: streams, errors, disconnects, then SIGINT with a
    request still running.  No sanitizer report, no leak, exit 0."""
    s = Server(asan_bin, *stories_args(stories), "--max-seqs", "8")
    lingering = None
    try:
        oc = s.client()

        def one(i):
            if i % 5 == 0:
                return s.request("POST", "/v1/completions", b'{"prompt": [1, 2')[0]
            if i % 3 == 0:
                return len(list(oc.completions.create(model="stories260K", prompt=f"Tom {i}", max_tokens=12, n=2,
                                                      stream=True, logprobs=2, stop=["."])))
            return len(oc.completions.create(model="stories260K", prompt=[1, 300 + i], max_tokens=12).choices)

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(40)))
        try:
            oc.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "hi"}])
        except openai.BadRequestError:
            pass
        body = json.dumps({"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
        raw_exchange(s.port, (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                              % len(body)) + body, read=False)
        # one still running at shutdown (its stream is cut: that is expected)
        lingering = open_request(s.port, json.loads(body))
        time.sleep(0.3)
    finally:
        rc, err = s.stop(timeout=60)
    if lingering:
        lingering.close()
    for m in SANITIZER_MARKERS:
        assert m not in err, err[-6000:]
    assert rc == 0, err[-4000:]
