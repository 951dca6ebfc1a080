"""kvllm chat: the conversation loop, its KV-cache reuse across turns, and its exactness.

stories260K (llama2.c checkpoint + tok512.bin) with a ChatML-like template (conftest.py's `chatml`): the model is
not an instruct model, but the mechanics are the same.  The reuse proof: a multi-turn chat (stdin lines with
--interactive) reports how many prompt tokens each turn took from the KV cache; turn k >= 2 must reuse at
least everything up to the previous answer, and its greedy answer must equal what a fresh computation of
the whole conversation gives — both `--no-reuse` (the session emptied every turn) and `kvllm run` (the
engine, a separate code path) over the conversation rendered by `kvllm template`.
"""
from __future__ import annotations

import json
import re

import pytest

from kvtest import assert_no_sanitizer, run_cli

TURNS = ["Lily had a little dog", "The dog ran into the park", "Then it began to rain"]

TURN_RE = re.compile(r"turn (\d+): prompt (\d+) tokens: (\d+) reused from the KV cache, (\d+) computed")


@pytest.fixture
def chat(kvllm, stories, chatml):
    """chat(*args, stdin=None, binary=None) with stories260K and the ChatML template."""
    def _chat(*args, stdin: bytes | None = None, binary=None, tmpl=chatml):
        return run_cli(binary or kvllm, "chat", "-m", stories["bin"], "--tokenizer", stories["tok"],
                       *(["--chat-template", tmpl] if tmpl else []), "--temp", "0", "-t", "1", *args, stdin=stdin)
    return _chat


def turn_stats(err: str) -> list[tuple[int, int, int, int]]:
    """(turn, prompt tokens, reused, computed) per turn, from the stderr log."""
    return [tuple(int(g) for g in m.groups()) for m in TURN_RE.finditer(err)]


def test_one_turn_with_prompt(chat):
    r = chat("-p", "Once upon a time", "-n", "24").check_ok()
    assert r.out.endswith("\n") and r.out.strip(), r.describe()
    st = turn_stats(r.err)
    assert len(st) == 1 and st[0][2] == 0 and st[0][3] == st[0][1] > 0, r.describe()
    # greedy: the same answer again
    assert chat("-p", "Once upon a time", "-n", "24").check_ok().out == r.out


def test_stdin_not_a_terminal_answers_once(chat):
    """No -p and stdin a pipe: all of stdin is one user message; one answer, then exit."""
    a = chat("-n", "20", stdin=b"Lily had a little dog\n").check_ok()
    b = chat("-p", "Lily had a little dog", "-n", "20").check_ok()
    assert a.out == b.out and a.out.strip(), a.describe()
    c = chat("-n", "20", stdin="\n".join(TURNS).encode() + b"\n").check_ok()
    assert len(turn_stats(c.err)) == 1, c.describe()


def test_multi_turn_reuses_kv_cache_exactly(chat):
    stdin = ("\n".join(TURNS) + "\n").encode()
    r = chat("--interactive", "-n", "24", stdin=stdin).check_ok()
    st = turn_stats(r.err)
    assert [s[0] for s in st] == [1, 2, 3], r.describe()
    for prev, cur in zip(st, st[1:]):
        # everything of the previous turn's prompt came from the cache, plus (most of) its answer
        assert cur[2] >= prev[1], f"turn {cur[0]} recomputed earlier turns: {st}\n{r.describe()}"
        assert cur[3] < cur[1] - prev[1], f"turn {cur[0]} computed too much: {st}"
        assert cur[2] + cur[3] == cur[1]
    # the same conversation with the session emptied every turn gives the same answers
    base = chat("--interactive", "--no-reuse", "-n", "24", stdin=stdin).check_ok()
    bst = turn_stats(base.err)
    assert [s[2] for s in bst] == [0, 0, 0] and [s[1] for s in bst] == [s[1] for s in st], base.describe()
    assert base.out == r.out, f"KV reuse changed the answers\n--- reuse ---\n{r.out}\n--- no reuse ---\n{base.out}"


def test_second_turn_matches_a_fresh_run(chat, run, stories, chatml, tmp_path):
    """Turn 2 computed on top of turn 1's cache == the engine (`kvllm run`) over the whole conversation."""
    n = "24"
    a1 = chat("-p", TURNS[0], "-n", n).check_ok().out
    assert a1.endswith("\n")
    a1 = a1[:-1]
    both = chat("--interactive", "-n", n, stdin=f"{TURNS[0]}\n{TURNS[1]}\n".encode()).check_ok()
    assert both.out.startswith(a1 + "\n"), both.describe()
    a2 = both.out[len(a1) + 1:]
    assert a2.endswith("\n")
    a2 = a2[:-1]

    msgs = tmp_path / "conv.json"
    msgs.write_text(json.dumps([{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": a1},
                                {"role": "user", "content": TURNS[1]}]))
    prompt = run("template", "--template", chatml, "--messages", msgs, "--add-generation-prompt").check_ok().out
    fresh = run("run", "-m", stories["bin"], "--tokenizer", stories["tok"], "-p", prompt, "-n", n, "--temp", "0",
                "--no-echo", "-t", "1").check_ok().out
    assert fresh.endswith("\n")
    # `run` keeps the first token's SentencePiece space (it continues the prompt); chat's answer starts clean
    fresh = fresh[:-1]
    assert fresh == a2 or fresh[1:] == a2 and fresh[0] == " ", f"turn 2 {a2!r} != fresh {fresh!r}"


def test_verbose_prints_the_rendered_prompt(chat):
    r = chat("-p", "hello", "-n", "4", "-v").check_ok()
    assert "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n" in r.err, r.describe()


def test_system_message(chat):
    r = chat("--system", "You tell stories.", "-p", "hello", "-n", "4", "-v").check_ok()
    assert "<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nhello" in r.err, r.describe()


def test_no_template_is_a_clear_error(chat):
    r = chat("-p", "hello", tmpl=None)
    assert r.returncode == 1, r.describe()
    assert "no chat template" in r.err and "--chat-template" in r.err, r.describe()
    assert r.out == ""


def test_template_error_is_reported(chat, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ raise_exception('no users here') }}{% endfor %}")
    r = chat("-p", "hello", tmpl=bad)
    assert r.returncode == 1 and "no users here" in r.err, r.describe()


def test_conversation_outgrowing_the_context(chat):
    """The oldest turns go and the conversation goes on; a single message that cannot fit is
    still refused."""
    r = chat("--interactive", "-c", "64", "-n", "8", stdin=("\n".join(TURNS) + "\n").encode())
    assert r.returncode == 0 and "dropped the 2 oldest message" in r.err, r.describe()
    assert len(r.out.splitlines()) == len(TURNS), r.describe()
    r = chat("--interactive", "-c", "64", "-n", "8", stdin=(" ".join(["word"] * 80) + "\n").encode())
    assert r.returncode == 1 and "context" in r.err, r.describe()


def test_usage_errors(chat, run):
    assert run("chat").returncode == 2
    assert chat("--bogus").returncode == 2
    assert chat("-n", "0").returncode == 2
    r = run("chat", "--help").check_ok()
    assert "--chat-template" in r.out and "--interactive" in r.out


def test_chat_asan_clean(chat, asan_bin):
    r = chat("--interactive", "-n", "12", stdin=("\n".join(TURNS[:2]) + "\n").encode(), binary=asan_bin)
    assert_no_sanitizer(r)
    r.check_ok()
    assert len(turn_stats(r.err)) == 2
