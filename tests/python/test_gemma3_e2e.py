"""Gemma 3 270M (Q4_K_M GGUF, fixture gemma3) end to end: `kvllm run`, `kvllm chat` and `kvllm serve`.

The file is the base (pretrained) model, not the instruction-tuned one.  Completions of factual prompts are
sensible ("Paris is the capital of" -> France) and that is what `run` and /v1/completions are held to.  In
Gemma's chat format (<start_of_turn>user ... <start_of_turn>model) the base model does not answer: it mostly
repeats the question and wanders, and llama.cpp (llama-cpp-python 0.3, same file, same prompt ids) gives the
same tokens.  So `kvllm chat` is checked for sensible answers with a question/answer template (a base
model's natural format), over two turns; with the model's own template (kvllm's built-in Gemma 3 one) for
the mechanics: the second turn reuses the first from the KV cache and answers as a fresh computation does,
across 15 sliding-window layers.

The server: /v1/completions and /v1/chat/completions (stream and not, equal), n > 1, stop strings,
response_format json_object and json_schema, logprobs, and concurrent requests answering as alone.
Tool calling on Gemma 3 is test_tools.py's, parametrized over this model too.
Greedy throughout (the default 8-bit activations, as a user runs it); answers are short so that the whole
file stays near a minute on a loaded 2-core machine.
"""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from gemma3 import gemma3  # noqa: F401  (the fixture)
from kvtest import run_cli
from server_util import Server

# prompt -> a word its greedy completion must hold (what the 270M base model completes, checked by hand)
FACTS = {"Paris is the capital of": "France", "The capital of Japan is": "Tokyo",
         "Q: What is the capital of France?\nA:": "Paris", "Monday, Tuesday, Wednesday,": "Thursday",
         "The chemical symbol for gold is": "Au"}
QA_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
               "{% else %}A: {{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}")
TURN_RE = re.compile(r"turn (\d+): prompt (\d+) tokens: (\d+) reused from the KV cache, (\d+) computed")
MODEL = "gemma3"


def test_run_completes_facts(kvllm, gemma3):
    for prompt, want in FACTS.items():
        r = run_cli(kvllm, "run", "-m", gemma3, "-p", prompt, "-n", "8", "--temp", "0", "-t", "2", "--no-echo",
                    "-q").check_ok()
        assert want in r.out, (prompt, r.out)


def test_chat_answers_two_turns(kvllm, gemma3):
    """Two questions, one conversation: each answer is right, and turn 2 starts from turn 1's cache."""
    r = run_cli(kvllm, "chat", "-m", gemma3, "--chat-template", QA_TEMPLATE, "--interactive", "-n", "8",
                "--temp", "0", "-t", "2", stdin=b"What is the capital of France?\nWhat is the capital of Japan?\n"
                ).check_ok()
    assert "Paris" in r.out and "Tokyo" in r.out[r.out.index("Paris"):], r.describe()
    st = [tuple(int(g) for g in m.groups()) for m in TURN_RE.finditer(r.err)]
    assert [s[0] for s in st] == [1, 2] and st[1][2] >= st[0][1], r.describe()


def test_chat_own_template_reuse_is_exact(kvllm, gemma3):
    """Gemma's own template: turn 2 on top of turn 1's KV cache gives what recomputing the whole conversation
    gives (the sliding-window layers' cache included)."""
    stdin = b"Hello, who are you?\nTell me about Paris.\n"
    args = ["chat", "-m", gemma3, "--interactive", "-n", "12", "--temp", "0", "-t", "2"]
    a = run_cli(kvllm, *args, stdin=stdin).check_ok()
    st = [tuple(int(g) for g in m.groups()) for m in TURN_RE.finditer(a.err)]
    assert [s[0] for s in st] == [1, 2] and st[1][2] >= st[0][1], a.describe()
    b = run_cli(kvllm, *args, "--no-reuse", stdin=stdin).check_ok()
    assert a.out == b.out and a.out.strip(), (a.out, b.out)


# ---- kvllm serve --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(kvllm, gemma3):
    s = Server(kvllm, "-m", gemma3, "--served-model-name", MODEL, "-t", "2", "--max-model-len", "2048", "-np", "4")
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-4000:]


def test_completions_stream_and_not(srv):
    oc = srv.client()
    for prompt, want in list(FACTS.items())[:2]:
        full = oc.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        c = full.choices[0]
        assert want in c.text and c.finish_reason == "length" and full.usage.completion_tokens == 8, full
        chunks = list(oc.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text


def test_chat_stream_and_not(srv):
    oc = srv.client()
    msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a color."}]
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    m, fin = r.choices[0].message, r.choices[0].finish_reason
    assert isinstance(m.content, str) and m.content and fin in ("stop", "length"), r
    text, sfin = "", None
    for ch in oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0, stream=True):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            sfin = ch.choices[0].finish_reason or sfin
    assert text == m.content and sfin == fin
    # the prompt is Gemma's turn format with the system message folded into the user turn
    st, tok = srv.post("/tokenize", {"model": MODEL, "messages": msgs, "return_token_strs": True})
    assert st == 200 and tok["count"] == r.usage.prompt_tokens, tok


def test_n_and_seed(srv):
    oc = srv.client()
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=6, n=3, temperature=1.0, seed=11)
    r = oc.completions.create(**args)
    assert sorted(c.index for c in r.choices) == [0, 1, 2] and r.usage.completion_tokens <= 18
    assert [c.text for c in oc.completions.create(**args).choices] == [c.text for c in r.choices]


def test_stop_string(srv):
    oc = srv.client()
    prompt = "Monday, Tuesday, Wednesday,"
    base = oc.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    assert "Friday" in base, base
    for stream in (False, True):
        kw = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=["Friday"])
        if stream:
            chunks = list(oc.completions.create(**kw, stream=True))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert fin == ["stop"]
        else:
            c = oc.completions.create(**kw).choices[0]
            text = c.text
            assert c.finish_reason == "stop"
        assert text == base[:base.index("Friday")], (stream, text, base)


def test_response_format(srv):
    oc = srv.client()
    ask = [{"role": "user", "content": "Give the capital of France as JSON."}]
    r = oc.chat.completions.create(model=MODEL, messages=ask, max_tokens=48, temperature=0,
                                   response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict), r
    else:   # cut by max_tokens: a prefix of an object
        assert r.choices[0].message.content.lstrip().startswith("{"), r
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "country": {"type": "string", "enum": ["France", "Japan"]}},
              "required": ["city", "country"], "additionalProperties": False}
    r = oc.chat.completions.create(model=MODEL, messages=ask, max_tokens=48, temperature=0,
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "capital", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_logprobs(srv):
    oc = srv.client()
    r = oc.completions.create(model=MODEL, prompt="Paris is the capital of", max_tokens=4, temperature=0,
                              logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and "".join(lp.tokens) == r.choices[0].text, lp
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(l, abs=1e-4), (tok, l, top)
    r = oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                   temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content), r


def test_concurrent_equals_alone(srv):
    """Greedy answers do not depend on what else is in the batch."""
    oc = srv.client()
    prompts = list(FACTS)[:4]
    alone = [oc.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0).choices[0].text
             for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as ex:
        together = list(ex.map(lambda p: oc.completions.create(model=MODEL, prompt=p, max_tokens=8,
                                                                temperature=0).choices[0].text, prompts))
    assert together == alone
