"""jinja_ref.py — the chat-template reference, and the same template rendered by `kvllm template`.

The reference is jinja2 3.1 exactly as transformers.utils.chat_template_utils._compile_jinja_template
sets it up: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
the globals raise_exception() and strftime_now(), and a tojson filter that is json.dumps(ensure_ascii=False,
indent, separators, sort_keys).  strftime_now is pinned to NOW on both sides (kvllm: --now).

Used by test_chat_template.py, test_tools_render.py and the differential fuzzer (tests/fuzz/jinja_diff.py).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvtest import Result, run_cli

NOW = "2024-07-26"
BOS, EOS = "<|bos|>", "<|eos|>"


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.strptime(NOW, "%Y-%m-%d").strftime(fmt)
    return env


ENV = make_env()


def render_ref(template: str, messages: list[dict], add_generation_prompt: bool, **variables) -> tuple[bool, str]:
    """(True, text) or (False, the exception); `variables` (e.g. tools) are passed to the template too."""
    try:
        return True, ENV.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                      bos_token=BOS, eos_token=EOS, **variables)
    except Exception as e:  # noqa: BLE001 - any Jinja error is an outcome kvllm must match by failing
        return False, f"{type(e).__name__}: {e}"


def render_kvllm(binary, tmp: Path, template: str, messages: list[dict], add_generation_prompt: bool,
                 extra=()) -> Result:
    """`kvllm template` on the same inputs (files written under tmp), with BOS, EOS and NOW as the reference's."""
    tpl, msgs = tmp / "template.jinja", tmp / "messages.json"
    tpl.write_bytes(template.encode("utf-8"))
    msgs.write_text(json.dumps(messages), encoding="utf-8")
    args = ["template", "--template", tpl, "--messages", msgs, "--bos", BOS, "--eos", EOS, "--now", NOW, *extra]
    if add_generation_prompt:
        args.append("--add-generation-prompt")
    return run_cli(binary, *args, timeout=60)
