"""test_tools_render.py — templates rendered with `tools` and tool-call history, kvllm against Jinja2.

The reference is test_chat_template.py's (jinja2 configured as Transformers configures it), given `tools`
as Transformers passes a list of {"type": "function", "function": {...}} dicts, and messages as an OpenAI
client sends them, with one normalisation vLLM also applies: an assistant tool call's
`function.arguments`, a JSON string on the wire, is given to the template as the parsed value (templates
write `arguments | tojson`).  kvllm gets the same conversation as JSON (`kvllm template --tools FILE`,
messages with tool_calls / tool_call_id / name).  Outputs must match byte for byte; where Jinja2 raises,
kvllm must fail with a "line:col" error.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvtest import REPO, run_cli
from jinja_ref import render_kvllm, render_ref
from test_chat_template import CONVERSATIONS as PLAIN_CONVERSATIONS
from test_chat_template import TEMPLATES as DATA_TEMPLATES
from test_chat_template import check_same
from test_gemma3_tok import GEMMA3_IT_TEMPLATE

# kvllm's own: Gemma 3's template with tools in the Hermes format (docs/CLI.md, Tool calling)
GEMMA3_TOOLS = "gemma3-tool-calling"
TEMPLATES = {**DATA_TEMPLATES, GEMMA3_TOOLS: (REPO / "docs" / "templates" / f"{GEMMA3_TOOLS}.jinja").read_text()}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers — précisément.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "description": "first"}, "b": {"type": "integer", "description": "second"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "labels"}},
            "required": ["a", "b"]}}},
]

CALL_ID = "a1B2c3D4e"   # 9 alphanumerics: Mistral's template insists


def _call(name: str, args: str, id_: str = CALL_ID) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "tools_first_turn": [{"role": "system", "content": "You are helpful."},
                         {"role": "user", "content": "What's the weather in Paris?"}],
    "tools_no_system": [{"role": "user", "content": "Add 2 and 3.5 please"}],
    "call_and_result": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_call("get_weather", '{"city": "Paris", "unit": "celsius"}')]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"temp": 21.5, "sky": "clear"}'},
    ],
    "call_result_followup": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3.5"},
        {"role": "assistant", "content": "", "tool_calls": [_call("add", '{"a": 2, "b": 3.50, "tags": ["x", "ü"]}')]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "5.5"},
        {"role": "assistant", "content": "It is 5.5."},
        {"role": "user", "content": "Thanks!"},
    ],
    "two_calls": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [_call("get_weather", '{"city": "Paris"}'), _call("get_weather", '{"city": "Rome"}', "Z9y8X7w6v")]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "sunny"},
        {"role": "tool", "tool_call_id": "Z9y8X7w6v", "content": "rainy"},
    ],
    "arguments_not_json": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("get_weather", "city=Paris")]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "ok"},
    ],
}

TOOL_TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "Qwen-Qwen3-0.6B",
    "ibm-granite-granite-3.3-2B-Instruct",
    "HuggingFaceTB-SmolLM2-135M-Instruct",
    GEMMA3_TOOLS,
]


def _for_template(messages: list[dict]) -> list[dict]:
    """What the template sees: arguments strings that parse as JSON become their value."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            a = c["function"].get("arguments")
            if isinstance(a, str):
                try:
                    c["function"]["arguments"] = json.loads(a)
                except ValueError:
                    pass
    return out


def _ref(template: str, messages: list[dict], tools, agp: bool) -> tuple[bool, str]:
    return render_ref(template, _for_template(messages), agp, **({} if tools is None else {"tools": tools}))


def _kvllm(binary, tmp_path: Path, template: str, messages: list[dict], tools, agp: bool):
    extra = []
    if tools is not None:
        tf = tmp_path / "tools.json"
        tf.write_text(json.dumps(tools), encoding="utf-8")
        extra = ["--tools", tf]
    return render_kvllm(binary, tmp_path, template, messages, agp, extra=extra)


@pytest.mark.parametrize("conv", list(CONVERSATIONS))
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_tools_render_matches_jinja2(kvllm, tmp_path, name, conv):
    template, messages = TEMPLATES[name], CONVERSATIONS[conv]
    for tools in (TOOLS, None):
        res = _kvllm(kvllm, tmp_path, template, messages, tools, True)
        check_same(res, _ref(template, messages, tools, True), f"{name} / {conv} / tools={tools is not None}")


@pytest.mark.parametrize("conv", list(PLAIN_CONVERSATIONS))
def test_gemma3_tool_template_without_tools_is_gemmas(kvllm, tmp_path, conv):
    """Without tools the Gemma 3 tool-calling template renders what Gemma 3's own does (Jinja2 on both)."""
    messages = PLAIN_CONVERSATIONS[conv]
    for agp in (True, False):
        ref = render_ref(GEMMA3_IT_TEMPLATE, messages, agp)
        if ref[0]:
            assert render_ref(TEMPLATES[GEMMA3_TOOLS], messages, agp) == ref, conv
            check_same(_kvllm(kvllm, tmp_path, TEMPLATES[GEMMA3_TOOLS], messages, None, agp), ref, conv)


def test_tools_reach_the_template(kvllm, tmp_path):
    """The render differs with tools for templates that use them (the comparison above is not vacuous)."""
    for name in TOOL_TEMPLATES[:5]:
        with_tools = _kvllm(kvllm, tmp_path, TEMPLATES[name], CONVERSATIONS["tools_first_turn"], TOOLS, True)
        without = _kvllm(kvllm, tmp_path, TEMPLATES[name], CONVERSATIONS["tools_first_turn"], None, True)
        assert with_tools.returncode == 0 and without.returncode == 0, with_tools.describe() + without.describe()
        assert b"get_weather" in with_tools.stdout and b"get_weather" not in without.stdout, name


def test_tools_json_errors(kvllm, tmp_path):
    """Malformed tools JSON, or tools that are not a list, fail the render with a message (no crash)."""
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ tools | tojson }}", encoding="utf-8")
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "x"}]), encoding="utf-8")
    for text, want in (('[{"a": 1,}]', "invalid JSON"), ('{"a": 1}', "must be a JSON array"),
                       ("[1e999, 12345678901234567890]", "64 bits"), ('["\\ud800"]', "surrogate")):
        tf = tmp_path / "tools.json"
        tf.write_text(text, encoding="utf-8")
        res = run_cli(kvllm, "template", "--template", tpl, "--messages", msgs, "--tools", tf, timeout=60)
        assert res.returncode == 1 and want in res.err, res.describe()
    # JSON values as Python reads them: order kept, ints vs floats, escapes, unicode, a repeated key
    tf = tmp_path / "tools.json"
    text = '[{"b": 1, "a": [1.0, -0, 2.5e3, true, null, "\\u00e9\\ud83d\\ude00\\n"], "b": 2}]'
    tf.write_text(text, encoding="utf-8")
    res = run_cli(kvllm, "template", "--template", tpl, "--messages", msgs, "--tools", tf, timeout=60)
    assert res.returncode == 0, res.describe()
    assert res.out == json.dumps(json.loads(text), ensure_ascii=False), res.out
