"""The OpenAI and llama-server request fields through `kvllm serve` on SmolLM2, each asserting its behaviour
(none accepted and then ignored), and the audit: every field the parser reads is listed here with a
request that shows it has an effect or is refused.

- min_tokens: a chat answer that ends early under greedy gets at least min_tokens tokens (EOS held back);
  min_tokens above max_tokens is a 400 naming the field.
- stop_token_ids: the answer stops with finish_reason "stop" before the first occurrence of the id, which
  is not in the text; an id out of the vocabulary is a 400.
- logit_bias: -100 on greedy's first token changes it; +100 on a token makes it the first; bad keys and
  biases outside [-100, 100] are 400s.
- best_of: equal to n it changes nothing; any other value is a 400 (kvllm does not rank extra samples).
- echo (completions): the prompt's text (or its ids decoded) comes before the completion, streaming too;
  with logprobs it is a 400.
- top_p 0: accepted (as OpenAI) and greedy: the same text as temperature 0, whatever the temperature.
- llama-server's repeat_last_n is honoured; output-changing fields of OpenAI/vLLM/llama-server that are
  not implemented (typical_p, mirostat, guided_whitespace_pattern, ...) are 400s unless they hold their
  neutral value.
- vLLM's constraints (guided_json / guided_regex / guided_choice / guided_grammar and structured_outputs
  {json, regex, choice, grammar, json_object}) shape the whole answer; include_stop_str_in_output keeps the
  stop string; skip_special_tokens false shows control tokens' text.
"""
from __future__ import annotations


import openai
import pytest

from server_util import Server, ok

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def srv(kvllm, smollm2):
    """On the f32 path: some cases check the content of SmolLM2-135M's greedy answers (a comma to stop
    at; conftest.F32_ANSWERS_WHY)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLLM_ACT", "f32")
        s = Server(kvllm, "-m", smollm2, "-c", "1024", "-t", "2", "--max-seqs", "8")
    yield s
    s.stop()


def bad(s: Server, path: str, body: dict, param: str, needle: str = "") -> str:
    status, r = s.post(path, body)
    assert status == 400, (body, r)
    assert r["error"]["param"] == param, r
    assert needle in r["error"]["message"], r
    return r["error"]["message"]


def chat(content: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


def tokens(s: Server, text: str) -> list[int]:
    return ok(s, "/tokenize", {"content": text})["tokens"]


def test_min_tokens(srv):
    """A greedy answer that ends early is held open until min_tokens (the issue: min_tokens 25 gave 12)."""
    short = None
    for q in ("Reply with one word: yes or no?", "What is 2+2? Answer with a number only.", "Say OK."):
        r = ok(srv, CHAT, chat(q, max_tokens=64))
        if r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 20:
            short = (q, r)
            break
    assert short, "no prompt gave a short greedy answer to test min_tokens with"
    q, base = short
    n0 = base["usage"]["completion_tokens"]
    want = n0 + 15
    r = ok(srv, CHAT, chat(q, max_tokens=64, min_tokens=want))
    assert r["usage"]["completion_tokens"] >= want, (n0, r)
    # the text starts as the short answer did: only the end was held back
    assert r["choices"][0]["message"]["content"].startswith(base["choices"][0]["message"]["content"].rstrip()), r
    bad(srv, CHAT, chat(q, max_tokens=10, min_tokens=25), "min_tokens", "25")
    bad(srv, CHAT, chat(q, min_tokens=-1), "min_tokens")


def test_stop_token_ids(srv):
    """The issue: stop_token_ids [28] (",") did not stop at ","."""
    comma = tokens(srv, ",")
    assert len(comma) == 1, comma
    body = chat("Say hi", max_tokens=48)
    base = ok(srv, CHAT, body)["choices"][0]["message"]["content"]
    assert "," in base, base
    r = ok(srv, CHAT, {**body, "stop_token_ids": comma})
    text = r["choices"][0]["message"]["content"]
    assert r["choices"][0]["finish_reason"] == "stop", r
    assert text == base[:base.index(",")], (text, base)
    bad(srv, CHAT, {**body, "stop_token_ids": [10 ** 6]}, "stop_token_ids", "out of range")
    bad(srv, CHAT, {**body, "stop_token_ids": ["x"]}, "stop_token_ids")
    bad(srv, CHAT, {**body, "stop_token_ids": 5}, "stop_token_ids")


def test_logit_bias(srv):
    body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    base = ok(srv, CMPL, body)["choices"][0]["text"]
    first = tokens(srv, base)[0]
    r = ok(srv, CMPL, {**body, "logit_bias": {str(first): -100}})["choices"][0]["text"]
    assert tokens(srv, r)[:1] != [first], (base, r)
    forced = tokens(srv, " banana")
    assert len(forced) == 1, forced
    r = ok(srv, CMPL, {**body, "logit_bias": {str(forced[0]): 100}})["choices"][0]["text"]
    assert r.startswith(" banana"), r
    # through the official client (chat), the same ban
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    a = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
                                  temperature=0, max_tokens=8)
    t0 = tokens(srv, a.choices[0].message.content)[0]
    b = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
                                  temperature=0, max_tokens=8, logit_bias={str(t0): -100})
    assert tokens(srv, b.choices[0].message.content)[:1] != [t0], (a, b)
    bad(srv, CMPL, {**body, "logit_bias": {"x": 1}}, "logit_bias", "token id")
    bad(srv, CMPL, {**body, "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]")
    bad(srv, CMPL, {**body, "logit_bias": {"999999": 1}}, "logit_bias", "out of range")
    bad(srv, CMPL, {**body, "logit_bias": [1]}, "logit_bias")


def test_best_of(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
    base = ok(srv, CMPL, body)["choices"][0]["text"]
    assert ok(srv, CMPL, {**body, "best_of": 1})["choices"][0]["text"] == base
    r = ok(srv, CMPL, {**body, "n": 2, "best_of": 2})
    assert [c["text"] for c in r["choices"]] == [base, base], r
    bad(srv, CMPL, {**body, "best_of": 3}, "best_of", "must equal 'n'")
    bad(srv, CMPL, {**body, "n": 2, "best_of": 1}, "best_of")


def test_echo(srv):
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    base = ok(srv, CMPL, body)["choices"][0]["text"]
    r = ok(srv, CMPL, {**body, "echo": True})
    assert r["choices"][0]["text"] == body["prompt"] + base, r
    assert r["usage"]["completion_tokens"] == 4
    # token-id prompts are decoded
    ids = tokens(srv, body["prompt"])
    r = ok(srv, CMPL, {**body, "prompt": ids, "echo": True})
    assert r["choices"][0]["text"] == body["prompt"] + base, r
    # streaming: the prompt first, then the completion; two prompts each echo their own
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    parts: dict[int, str] = {}
    for ch in c.completions.create(model=MODEL, prompt=[body["prompt"], "Hello"], max_tokens=4, temperature=0,
                                   echo=True, stream=True):
        for x in ch.choices:
            parts[x.index] = parts.get(x.index, "") + x.text
    assert parts[0] == body["prompt"] + base, parts
    assert parts[1].startswith("Hello") and len(parts[1]) > len("Hello"), parts
    bad(srv, CMPL, {**body, "echo": True, "logprobs": 1}, "echo", "logprobs")
    bad(srv, CMPL, {**body, "echo": "yes"}, "echo")


def test_top_p_zero_is_greedy(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 12}
    greedy = ok(srv, CMPL, {**body, "temperature": 0})["choices"][0]["text"]
    for seed in (1, 2, 3):
        r = ok(srv, CMPL, {**body, "temperature": 1.5, "top_p": 0, "seed": seed})
        assert r["choices"][0]["text"] == greedy, (seed, r)
    bad(srv, CMPL, {**body, "top_p": -0.1}, "top_p")


def test_repeat_last_n(srv):
    """llama-server's penalty window: with a strong repetition penalty, a window of 0 (off) gives the plain
    greedy text and a whole-history window changes it."""
    body = {"prompt": "one one one one one one", "max_tokens": 12, "temperature": 0, "repetition_penalty": 3.0}
    off = ok(srv, CMPL, {**body, "repeat_last_n": 0})["choices"][0]["text"]
    plain = ok(srv, CMPL, {k: v for k, v in body.items() if k != "repetition_penalty"})["choices"][0]["text"]
    on = ok(srv, CMPL, {**body, "repeat_last_n": -1})["choices"][0]["text"]
    assert off == plain and on != plain, (off, plain, on)


def test_vllm_structured_outputs(srv):
    """vLLM's constraints, old spelling (guided_*, before 0.12) and new (structured_outputs): the whole
    answer is one of the choices, matches the regex in full, is JSON of the schema, or a string of the
    grammar; on chat and completions.  Two constraints, a pattern a grammar cannot follow and an unknown
    structured_outputs key are 400s naming the field."""
    import json
    import re
    choices = ["Paris", "London", "Berlin"]
    q = chat("What is the capital of France?", max_tokens=10)
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        r = ok(srv, CHAT, {**q, **extra})
        assert r["choices"][0]["message"]["content"] in choices, (extra, r)
    pat = r"\d{3}-[a-c]{2}( ok)?"
    for extra in ({"guided_regex": pat}, {"structured_outputs": {"regex": pat}}):
        for path, body in ((CHAT, chat("Write a code.", max_tokens=12)),
                           (CMPL, {"prompt": "Code:", "max_tokens": 12, "temperature": 0})):
            r = ok(srv, path, {**body, **extra})
            text = r["choices"][0]["message"]["content"] if path == CHAT else r["choices"][0]["text"]
            assert re.fullmatch(pat, text), (extra, text)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)}, {"structured_outputs": {"json": schema}}):
        r = ok(srv, CHAT, {**chat("How old is the universe?", max_tokens=30), **extra})
        v = json.loads(r["choices"][0]["message"]["content"])
        assert list(v) == ["age"] and isinstance(v["age"], int), (extra, v)
    r = ok(srv, CHAT, {**chat("Give me JSON.", max_tokens=30), "structured_outputs": {"json_object": True}})
    text = r["choices"][0]["message"]["content"]
    assert text.lstrip().startswith("{"), text
    if r["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text
    for extra in ({"guided_grammar": 'root ::= "yes" | "no"'}, {"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}):
        assert ok(srv, CHAT, {**chat("Is water wet?"), **extra})["choices"][0]["message"]["content"] in ("yes", "no")
    bad(srv, CHAT, {**q, "guided_choice": choices, "response_format": {"type": "json_object"}}, "response_format",
        "give one constraint")
    bad(srv, CHAT, {**q, "guided_regex": "a", "structured_outputs": {"choice": ["a"]}}, "structured_outputs",
        "give one constraint")
    bad(srv, CHAT, {**q, "guided_regex": r"(a)\1"}, "guided_regex", "offset 3")
    bad(srv, CHAT, {**q, "structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex", "unclosed")
    bad(srv, CHAT, {**q, "guided_choice": []}, "guided_choice", "list of 1 to")
    bad(srv, CHAT, {**q, "guided_choice": ["a", 3]}, "guided_choice", "guided_choice[1] must be a string")
    bad(srv, CHAT, {**q, "structured_outputs": {"structural_tag": {"x": 1}}}, "structured_outputs", "structural_tag")
    bad(srv, CHAT, {**q, "structured_outputs": "a+"}, "structured_outputs", "must be an object")


def test_include_stop_str_in_output(srv):
    """vLLM: the stop string that ended the answer stays at its end when asked (cut before it by default)."""
    body = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}
    base = ok(srv, CMPL, body)["choices"][0]["text"]
    words = [w for w in base.split(" ")[2:] if len(w) > 2]
    assert words, base
    stop = " " + words[0]
    cut = base.index(stop)
    r = ok(srv, CMPL, {**body, "stop": [stop]})["choices"][0]
    assert r["text"] == base[:cut] and r["finish_reason"] == "stop", (r, base)
    r = ok(srv, CMPL, {**body, "stop": [stop], "include_stop_str_in_output": True})["choices"][0]
    assert r["text"] == base[:cut + len(stop)] and r["finish_reason"] == "stop", (r, base)
    r = ok(srv, CMPL, {**body, "stop": [stop], "include_stop_str_in_output": True, "stream": False})
    bad(srv, CMPL, {**body, "include_stop_str_in_output": 1}, "include_stop_str_in_output", "boolean")


def test_skip_special_tokens(srv):
    """vLLM's skip_special_tokens false: a control token sampled mid-text shows its text (<|im_start|>, forced
    first here by logit_bias); by default it gives none.  spaces_between_special_tokens is accepted."""
    (im,) = tokens(srv, "<|im_start|>")
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "logit_bias": {str(im): 100}}
    plain = ok(srv, CMPL, body)["choices"][0]["text"]
    shown = ok(srv, CMPL, {**body, "skip_special_tokens": False, "spaces_between_special_tokens": False})
    assert "<|im_start|>" not in plain, plain
    assert shown["choices"][0]["text"].startswith("<|im_start|>"), shown
    assert shown["choices"][0]["text"] == "<|im_start|>" * 3, shown


REFUSED = [("typical_p", 0.5, 1), ("mirostat", 2, 0), ("tfs_z", 0.9, 1), ("dry_multiplier", 0.8, 0),
           ("xtc_probability", 0.5, 0), ("n_probs", 3, 0), ("use_beam_search", True, False),
           ("guided_whitespace_pattern", "[ ]?", None), ("bad_words", ["x"], []),
           ("allowed_token_ids", [1, 2], []), ("prompt_logprobs", 1, None), ("suffix", "tail", "")]


@pytest.mark.parametrize("key,value,neutral", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_unless_neutral(srv, key, value, neutral):
    body = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}
    bad(srv, CMPL, {**body, key: value}, key, "not supported")
    ok(srv, CMPL, {**body, key: neutral})


# Every field the parser reads, with the test that shows it honoured (or refused).
ACCEPTED = {
    "model": "test_server.py (404 for another name)", "prompt": "everywhere", "messages": "everywhere",
    "max_tokens": "everywhere", "max_completion_tokens": "test_accepted_fields_audit",
    "temperature": "test_top_p_zero_is_greedy", "top_p": "test_top_p_zero_is_greedy",
    "top_k": "test_accepted_fields_audit", "min_p": "test_accepted_fields_audit",
    "repetition_penalty": "test_repeat_last_n", "repeat_last_n": "test_repeat_last_n",
    "seed": "test_server.py", "n": "test_best_of", "presence_penalty": "test_server.py",
    "frequency_penalty": "test_server.py", "stop": "test_server.py", "stream": "test_echo",
    "stream_options": "test_server.py", "ignore_eos": "test_server.py", "user": "metadata only (OpenAI's abuse id)",
    "logprobs": "test_server.py", "top_logprobs": "test_server.py", "min_tokens": "test_min_tokens",
    "stop_token_ids": "test_stop_token_ids", "logit_bias": "test_logit_bias", "best_of": "test_best_of",
    "echo": "test_echo", "response_format": "test_constrained.py", "grammar": "test_constrained.py",
    "json_schema": "test_constrained.py", "suffix": "test_refused_unless_neutral", "tools": "test_tools.py",
    "tool_choice": "test_tools.py", "parallel_tool_calls": "test_tools.py", "function": "test_tools.py (tool_choice)",
    "n_predict": "test_server_endpoints.py (llama-server's /completion)",
    "repeat_penalty": "test_server_endpoints.py (llama-server's /completion)",
    "structured_outputs": "test_vllm_structured_outputs", "skip_special_tokens": "test_skip_special_tokens",
    "include_stop_str_in_output": "test_include_stop_str_in_output",
    "spaces_between_special_tokens": "test_skip_special_tokens (accepted: kvllm adds no spaces, as fast tokenizers)",
}


def test_accepted_fields_audit(srv):
    """The parser's accepted fields (grepped from openai_parse.c) are exactly the list above, and the few
    without a test of their own change the output here."""
    from pathlib import Path
    import re
    src = (Path(__file__).resolve().parents[2] / "src" / "server" / "openai_parse.c").read_text()
    read = set(re.findall(r'(?:field|get_int|get_num|get_bool)\((?:root|v), "([a-z_]+)"', src))
    read |= {"messages", "prompt"}
    refused = {r[0] for r in REFUSED}
    missing = read - set(ACCEPTED) - refused - {"include_usage", "type", "text", "content", "role"}
    assert not missing, f"fields read by the parser without a test listed here: {sorted(missing)}"
    body = chat("Name a fruit.", max_tokens=3)
    base = ok(srv, CHAT, body)
    r = ok(srv, CHAT, {**chat("Name a fruit."), "max_completion_tokens": 1})
    assert r["usage"]["completion_tokens"] == 1, r
    hot = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.5, "seed": 7}
    assert ok(srv, CMPL, {**hot, "top_k": 1})["choices"][0]["text"] == \
        ok(srv, CMPL, {**hot, "temperature": 0})["choices"][0]["text"]
    assert ok(srv, CMPL, {**hot, "min_p": 1.0})["choices"][0]["text"] == \
        ok(srv, CMPL, {**hot, "temperature": 0})["choices"][0]["text"]
    assert base["usage"]["completion_tokens"] <= 3
