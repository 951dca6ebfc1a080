"""test_tools.py — tool calling end to end with the official `openai` client, streaming and not.

SmolLM2-135M-Instruct served with a Hermes/Qwen-style template (Qwen2.5's) and a Llama-3.1-style one
(`--chat-template`), so the tool-call format is detected from the template text; and Gemma 3 270M with
kvllm's Gemma 3 tool-calling template (docs/templates/gemma3-tool-calling.jinja: Gemma's turns, Hermes calls),
the way to serve tools on Gemma 3, whose own template has none.  A 135M model rarely calls a
tool on its own: under `auto` an answer must be either text or calls whose arguments validate against the
function's `parameters` schema (jsonschema); under `required` and a named function the call is constrained by
a grammar, so it must always be there and always validate.  A second turn that carries the assistant's call
and the `tool` result must continue the conversation with text.  Requests that cannot be honoured are 400s.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from gemma3 import gemma3  # noqa: F401  (the fixture)
from kvtest import REPO
from server_util import Server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
TEMPLATES = {"qwen": "Qwen-Qwen2.5-7B-Instruct.jinja", "llama31": "meta-llama-Llama-3.1-8B-Instruct.jinja"}
GEMMA3_TOOLS = REPO / "docs" / "templates" / "gemma3-tool-calling.jinja"


@pytest.fixture(scope="module", params=[*TEMPLATES, "gemma3"])
def served(request, kvllm, shared):
    """(name, client, server): SmolLM2 with each of TEMPLATES, Gemma 3 with its tool-calling template; every
    one served as "smol"."""
    if request.param == "gemma3":
        model, template = request.getfixturevalue("gemma3"), GEMMA3_TOOLS
    else:
        model, template = request.getfixturevalue("smollm2"), shared / "templates" / TEMPLATES[request.param]
    s = Server(kvllm, model, "--served-model-name", "smol", "--max-model-len", "2048", "-np", "4",
               "--chat-template", template)
    client = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=120)
    yield request.param, client, s
    rc, err = s.stop()
    assert rc == 0, err


def _check_calls(calls, only: str | None = None) -> None:
    assert calls, "no tool calls"
    ids = set()
    for c in calls:
        assert c.type == "function" and c.id and c.id not in ids, c
        ids.add(c.id)
        assert c.function.name in SCHEMAS, c
        if only:
            assert c.function.name == only, c
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _stream(client, **kw):
    """Run a streamed request; returns (content, calls as dicts, finish_reason, chunks)."""
    content, calls, finish, chunks = "", {}, None, []
    for ch in client.chat.completions.create(model="smol", stream=True, **kw):
        chunks.append(ch)
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            if d.index not in calls:
                # the first delta of a call: index, id, type and name, arguments ""
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == "", d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None, d
                calls[d.index]["arguments"] += d.function.arguments or ""
        if c.finish_reason:
            finish = c.finish_reason
    return content, [calls[i] for i in sorted(calls)], finish, chunks


def _check_stream_calls(calls, only: str | None = None) -> None:
    assert calls, "no tool calls"
    assert len({c["id"] for c in calls}) == len(calls)
    for c in calls:
        assert c["name"] == only if only else c["name"] in SCHEMAS, c
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_auto_text_or_valid_call(served):
    _, client, _ = served
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, max_tokens=48, temperature=0)
    m, fin = r.choices[0].message, r.choices[0].finish_reason
    if m.tool_calls:
        assert fin == "tool_calls"
        _check_calls(m.tool_calls)
    else:
        assert isinstance(m.content, str) and m.content.strip() and fin in ("stop", "length"), r
    content, calls, sfin, _ = _stream(client, messages=ASK, tools=TOOLS, max_tokens=48, temperature=0)
    if calls:
        assert sfin == "tool_calls"
        _check_stream_calls(calls)
    else:
        assert content.strip() and sfin in ("stop", "length")
    # greedy: the stream and the whole answer agree
    assert (content or None) == (m.content or None) and sfin == fin
    assert [c["name"] for c in calls] == [c.function.name for c in m.tool_calls or []]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_call_is_always_valid(served, choice):
    _, client, _ = served
    asks = [ASK, [{"role": "user", "content": "Please add 17 and 25."}],
            [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}]]
    for k, msgs in enumerate(asks):
        name = "add" if k == 1 else "get_weather"
        tc = "required" if choice == "required" else {"type": "function", "function": {"name": name}}
        r = client.chat.completions.create(model="smol", messages=msgs, tools=TOOLS, tool_choice=tc, max_tokens=96,
                                           temperature=0.8, seed=k)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", r
        _check_calls(m.tool_calls, None if choice == "required" else name)
        content, calls, fin, _ = _stream(client, messages=msgs, tools=TOOLS, tool_choice=tc, max_tokens=96,
                                         temperature=0.8, seed=k)
        assert fin == "tool_calls"
        _check_stream_calls(calls, None if choice == "required" else name)
        # a seeded sample is the same streamed or not
        assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments)
                                                                for c in m.tool_calls]


def test_second_turn_with_tool_result(served):
    name, client, _ = served
    call_id = "call_Abc123xyz"
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ]
    r = client.chat.completions.create(model="smol", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=40,
                                       temperature=0)
    m = r.choices[0].message
    assert not m.tool_calls and isinstance(m.content, str) and m.content.strip(), r
    assert r.choices[0].finish_reason in ("stop", "length")
    content, calls, fin, _ = _stream(client, messages=msgs, tools=TOOLS, max_tokens=40, temperature=0)
    assert fin in ("stop", "length", "tool_calls")
    if calls:
        _check_stream_calls(calls)
    else:
        assert content.strip()
    # the history reached the prompt: the call and the result are in it
    assert r.usage.prompt_tokens > client.chat.completions.create(
        model="smol", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1).usage.prompt_tokens + 20


def test_tool_choice_none_and_parallel_flag(served):
    _, client, _ = served
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    # tools offered vs not: the prompt grows by the definitions
    with_tools = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, max_tokens=1)
    assert with_tools.usage.prompt_tokens > r.usage.prompt_tokens + 40


def test_parallel_false_gives_one_call(served):
    _, client, _ = served
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=96, temperature=0, n=2)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
        _check_calls(c.message.tool_calls)


def test_function_without_parameters(served):
    """A function without `parameters` takes none: a forced call to it has arguments {}."""
    _, client, _ = served
    now = {"type": "function", "function": {"name": "now", "description": "The current time."}}
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "What time is it?"}],
                                       tools=[now, WEATHER], tool_choice={"type": "function", "function": {"name": "now"}},
                                       max_tokens=40, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [(c.function.name, c.function.arguments) for c in calls] == \
        [("now", "{}")], r


def test_refusals(served):
    _, client, s = served
    bad = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in 'tools'"),
        ({"tool_choice": "required"}, "needs 'tools'"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "function.name"),
        ({"tools": [{"type": "retrieval"}]}, "type must be"),
        ({"tools": [WEATHER, WEATHER]}, "defined twice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "parameters"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": 1}}]}, "tool_calls must be a list"),
    ]
    for extra, want in bad:
        body = {"model": "smol", "messages": ASK, "max_tokens": 4, **extra}
        status, out = s.post("/v1/chat/completions", body)
        assert status == 400 and want in out["error"]["message"], (extra, status, out)


def test_template_without_tool_format(kvllm, smollm2):
    """SmolLM2's own template knows no tool calls: tools are refused unless tool_choice is none."""
    s = Server(kvllm, smollm2, "--served-model-name", "smol", "--max-model-len", "1024", "-np", "1")
    try:
        status, out = s.post("/v1/chat/completions", {"model": "smol", "messages": ASK, "tools": TOOLS, "max_tokens": 2})
        assert status == 400 and out["error"]["code"] == "tools_unsupported", out
        status, out = s.post("/v1/chat/completions", {"model": "smol", "messages": ASK, "tools": TOOLS,
                                                      "tool_choice": "none", "max_tokens": 2})
        assert status == 200, out
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    # a bad --tool-call-format is a usage error at start
    with pytest.raises(RuntimeError):
        Server(kvllm, smollm2, "--tool-call-format", "granite")


def test_mistral_forced_call(kvllm, smollm2, shared):
    """Mistral Nemo's template: [TOOL_CALLS] opens a forced call, ids are 9 letters and digits (the template
    refuses others), and a second turn with those ids renders."""
    s = Server(kvllm, smollm2, "--served-model-name", "smol", "--max-model-len", "2048", "-np", "2",
               "--chat-template", shared / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    try:
        client = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=96, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls", r
        _check_calls(calls)
        assert all(len(c.id) == 9 and c.id.isalnum() for c in calls), calls
        content, scalls, fin, _ = _stream(client, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=96,
                                          temperature=0)
        assert fin == "tool_calls" and [(c["name"], c["arguments"]) for c in scalls] == \
            [(c.function.name, c.function.arguments) for c in calls]
        msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                      {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"}]
        r = client.chat.completions.create(model="smol", messages=msgs, tools=TOOLS, max_tokens=24, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r
    finally:
        rc, err = s.stop()
    assert rc == 0, err
