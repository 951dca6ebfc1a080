"""`kvllm serve` as llama-server and vLLM users drive it: `serve MODEL` and the vLLM /
llama-server option names, POST /tokenize and /detokenize in both servers' shapes, GET /version and
/props, llama-server's /completion (whole and streamed), /v1/embeddings answered 501, CORS
(--allowed-origins, OPTIONS preflight), the per-request and engine log lines (text and
--log-format json) and the warning for a model without a chat template.  Plain HTTP and the official
openai client."""
from __future__ import annotations

import json
import re
import time

import openai
import pytest

from server_util import Server

IM = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
SYS = "<|im_start|>system\nYou are terse.<|im_end|>\n"


@pytest.fixture(scope="module")
def smol(kvllm, smollm2):
    """vLLM's spelling: the model positional, --served-model-name, --max-model-len, -np, --jinja.  On the f32
    path: test_llama_server_completion checks the answer (conftest.F32_ANSWERS_WHY)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLLM_ACT", "f32")
        s = Server(kvllm, smollm2, "--served-model-name", "smol", "--max-model-len", "1024", "-np", "3", "--jinja",
                   "-t", "1", "--allowed-origins", "http://good.example,http://also.example", "--log-interval",
                   "0.05")
    yield s
    rc, err = s.stop()
    assert rc == 0, err


def test_vllm_style_options(smol):
    models = smol.client().models.list()
    assert [m.id for m in models.data] == ["smol"]
    st, _, raw = smol.request("GET", "/props")
    props = json.loads(raw)
    assert st == 200 and props["n_ctx"] == 1024 and props["total_slots"] == 3, props
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert "<|im_start|>" in props["chat_template"] and props["has_chat_template"] is True
    assert props["build_info"].startswith("kvllm ") and props["model"] == "smol"


def test_props_tells_the_builtin_template(kvllm, tmp_path):
    """A Gemma 3 file without tokenizer.chat_template is rendered with kvllm's built-in Gemma 3 template:
    /props shows that template (it showed none, while chat used the built-in one)."""
    from gen_model import ModelConfig, write_model
    cfg = ModelConfig(arch="gemma3", n_vocab=300, n_embd=32, n_layer=2, n_head=2, n_head_kv=1, key_length=16,
                      n_ff=64, n_swa=4, tied=True, name="gemma3-no-template")
    s = Server(kvllm, write_model(tmp_path / "g.gguf", cfg), "-t", "1")
    try:
        st, _, raw = s.request("GET", "/props")
        props = json.loads(raw)
        assert st == 200 and props["has_chat_template"] is True, props
        assert "<start_of_turn>" in props["chat_template"], props["chat_template"][:200]
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_version(smol, run):
    st, _, raw = smol.request("GET", "/version")
    v = json.loads(raw)
    cli = run("--version").check_ok().out.splitlines()[0]
    assert st == 200 and cli == f"kvllm {v['version']} (commit {v['commit']})", (v, cli)


def test_tokenize_detokenize_both_shapes(smol, run, smollm2):
    want = [int(x) for x in run("tokenize", "-m", smollm2, "--parse-special", "--ids", IM).check_ok().out.split()]
    # llama-server: content, add_special false, special text parsed
    st, r = smol.post("/tokenize", {"content": IM})
    assert st == 200 and r["tokens"] == want, r
    st, r = smol.post("/tokenize", {"content": "Hello world", "with_pieces": True})
    assert st == 200 and [p["piece"] for p in r["tokens"]] == ["Hello", " world"], r
    # vLLM: prompt (+ model), count and max_model_len
    st, r = smol.post("/tokenize", {"model": "smol", "prompt": "Hello world", "return_token_strs": True})
    assert st == 200 and r["count"] == 2 and r["max_model_len"] == 1024 and r["token_strs"] == ["Hello", " world"], r
    with_sys = [int(x) for x in run("tokenize", "-m", smollm2, "--parse-special", "--ids", SYS + IM).check_ok().out.split()]
    st, r = smol.post("/tokenize", {"model": "smol", "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the capital of France?"}]})
    assert st == 200 and r["tokens"] == with_sys, r
    st, r = smol.post("/tokenize", {"content": "What is the capital, café?"})
    st, r = smol.post("/detokenize", {"tokens": r["tokens"]})
    assert st == 200 and r["content"] == r["prompt"] == "What is the capital, café?", r
    st, r = smol.post("/detokenize", {"tokens": [1, 99999999]})
    assert st == 400 and "tokens[1]" in r["error"]["message"], r
    st, r = smol.post("/tokenize", {"model": "other", "prompt": "x"})
    assert st == 404, r
    st, r = smol.post("/tokenize", {"nothing": 1})
    assert st == 400 and "content" in r["error"]["message"], r


def test_llama_server_completion(smol):
    st, r = smol.post("/completion", {"prompt": IM, "n_predict": 16, "temperature": 0})
    assert st == 200 and "Paris" in r["content"] and r["stop"] is True, r
    assert r["tokens_evaluated"] == 16 and 0 < r["tokens_predicted"] <= 16 and r["stop_type"] in ("eos", "limit"), r
    # streamed: {"content", "stop": false} pieces, then the summary with "stop": true (no [DONE])
    st, h, raw = smol.request("POST", "/completion", {"prompt": IM, "n_predict": 16, "temperature": 0, "stream": True})
    assert st == 200 and h["content-type"].startswith("text/event-stream")
    events = [json.loads(l[6:]) for l in raw.decode().splitlines() if l.startswith("data: ")]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1]), events
    assert "".join(e["content"] for e in events) == r["content"]
    # n_predict -1 (llama-server's default): until end of text
    st, r2 = smol.post("/completion", {"prompt": IM, "n_predict": -1, "temperature": 0, "seed": -1})
    assert st == 200 and r2["content"].startswith(r["content"]) and r2["stop_type"] == "eos", r2


def test_llama_server_n_probs(smol):
    """llama-server's n_probs: completion_probabilities, one entry per generated token ({"id", "token", "bytes",
    "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}]}, the n best of the raw distribution),
    in the whole answer and on each streamed event; the same figures both ways.  Above 20, at most 20."""
    import math
    body = {"prompt": IM, "n_predict": 6, "temperature": 0, "n_probs": 3}
    st, r = smol.post("/completion", body)
    assert st == 200, r
    probs = r["completion_probabilities"]
    assert len(probs) == r["tokens_predicted"] > 0, r
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}, p
        top = p["top_logprobs"]
        assert len(top) == 3 and all(set(t) == {"id", "token", "bytes", "logprob"} for t in top), p
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True), p
        assert top[0]["id"] == p["id"] and math.isclose(top[0]["logprob"], p["logprob"]), p   # greedy: the best
        assert p["logprob"] <= 0 and bytes(p["bytes"]).decode("utf-8", "replace") == p["token"], p
    assert "".join(p["token"] for p in probs).startswith(r["content"][:4]), (probs, r["content"])
    st, h, raw = smol.request("POST", "/completion", {**body, "stream": True})
    events = [json.loads(l[6:]) for l in raw.decode().splitlines() if l.startswith("data: ")]
    streamed = [p for e in events[:-1] for p in e["completion_probabilities"]]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs], (streamed, probs)
    assert all(math.isclose(a["logprob"], b["logprob"], abs_tol=1e-5) for a, b in zip(streamed, probs))
    st, r = smol.post("/completion", {**body, "n_predict": 1, "n_probs": 50})
    assert st == 200 and len(r["completion_probabilities"][0]["top_logprobs"]) == 20, r
    st, r = smol.post("/completion", {"prompt": IM, "n_predict": 2})   # without n_probs: none
    assert st == 200 and "completion_probabilities" not in r, r


def test_embeddings_not_implemented(smol):
    with pytest.raises(openai.APIStatusError) as e:
        smol.client().embeddings.create(model="smol", input="hello")
    assert e.value.status_code == 501
    msg = e.value.response.json()["error"]["message"]
    assert "embeddings are not supported" in msg and "/v1/chat/completions" in msg, msg


def test_cors_preflight_configured_origin_only(smol):
    pre = {"Origin": "http://good.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, _ = smol.request("OPTIONS", "/v1/chat/completions", headers=pre)
    assert st == 204 and h["access-control-allow-origin"] == "http://good.example", h
    assert "POST" in h["access-control-allow-methods"] and "authorization" in h["access-control-allow-headers"]
    st, h, _ = smol.request("OPTIONS", "/no/such/path", headers={**pre, "Origin": "http://also.example"})
    assert st == 204 and h["access-control-allow-origin"] == "http://also.example", h
    st, h, raw = smol.request("OPTIONS", "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})
    assert st == 403 and "access-control-allow-origin" not in h, (st, h, raw)
    # actual requests: the header only for an allowed origin
    st, h, _ = smol.request("GET", "/v1/models", headers={"Origin": "http://good.example"})
    assert st == 200 and h["access-control-allow-origin"] == "http://good.example" and "Origin" in h["vary"]
    st, h, _ = smol.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert st == 200 and "access-control-allow-origin" not in h
    st, h, raw = smol.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True},
                              headers={"Origin": "http://good.example"})
    assert st == 200 and h["access-control-allow-origin"] == "http://good.example"


def test_cors_off_by_default_star_by_choice(kvllm, stories):
    args = ["-m", stories["bin"], "--tokenizer", stories["tok"], "-t", "1"]
    pre = {"Origin": "http://x.example", "Access-Control-Request-Method": "POST"}
    s = Server(kvllm, *args, "--api-key", "k")
    try:
        st, h, _ = s.request("OPTIONS", "/v1/completions", headers=pre)
        assert st == 403 and "access-control-allow-origin" not in h
        st, h, _ = s.request("GET", "/v1/models", headers={"Origin": "http://x.example", "Authorization": "Bearer k"})
        assert st == 200 and "access-control-allow-origin" not in h
    finally:
        s.stop()
    s = Server(kvllm, *args, "--allowed-origins", "*", "--api-key", "k")
    try:
        st, h, _ = s.request("OPTIONS", "/v1/completions", headers=pre)   # no key: preflights carry none
        assert st == 204 and h["access-control-allow-origin"] == "*"
        st, h, _ = s.request("GET", "/v1/models", headers={"Origin": "http://x.example"})
        assert st == 401 and h["access-control-allow-origin"] == "*"   # the browser may read the 401
    finally:
        s.stop()


def test_request_and_engine_log_lines(smol):
    c = smol.client()
    r = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Name a color."}],
                                  max_tokens=24, temperature=0)
    time.sleep(0.2)
    err = smol.stderr()
    line = [l for l in err.splitlines() if f"request {r.id}:" in l]
    assert len(line) == 1, err[-3000:]
    m = re.search(r": 200, prompt (\d+) tokens \((\d+) cached\), output (\d+) tokens, ttft ([\d.]+) ms, "
                  r"([\d.]+) tok/s, finish (\w+)", line[0])
    assert m, line[0]
    assert int(m.group(1)) == r.usage.prompt_tokens and int(m.group(3)) == r.usage.completion_tokens
    assert m.group(6) == r.choices[0].finish_reason
    assert re.search(r"engine: running \d+, waiting \d+, KV [\d.]+% used", err), err[-3000:]
    # a 4xx's line says why, with the message its client got
    st, body = smol.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "min_tokens": -1})
    assert st == 400, body
    time.sleep(0.2)
    line = [l for l in smol.stderr().splitlines() if re.search(r"request -: 400, ", l)]
    assert line and line[-1].endswith(": " + body["error"]["message"]), (line, body)


def test_log_format_json_and_template_warning(kvllm, stories):
    s = Server(kvllm, "-m", stories["bin"], "--tokenizer", stories["tok"], "-t", "1", "--log-format", "json",
               "--log-interval", "0.001")
    try:
        st, _ = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True})
        assert st == 200
        st, _ = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 1000000})
        assert st == 400
        time.sleep(0.2)
    finally:
        rc, err = s.stop()
    lines = [json.loads(l) for l in err.splitlines() if l.strip()]   # every line is JSON
    assert all("ts" in l and "level" in l for l in lines)
    warn = [l for l in lines if l["level"] == "warning" and "no chat template" in l.get("msg", "")]
    ready = [i for i, l in enumerate(lines) if l.get("msg", "").startswith("ready:")]
    assert warn and ready and lines.index(warn[0]) < ready[0], lines   # before "ready", not after
    req = [l for l in lines if l.get("event") == "request"]
    assert [r["status"] for r in req] == [200, 400], req
    assert "error" not in req[0] and "maximum context length" in req[1]["error"], req   # a 4xx says why
    assert req[0]["prompt_tokens"] > 0 and req[0]["output_tokens"] > 0 and req[0]["ttft_ms"] > 0
    assert req[0]["finish_reason"] in ("stop", "length")
    assert any(l.get("event") == "engine" and "kv_used_pct" in l for l in lines), lines
