"""kvllm chat's context shift: when the conversation outgrows -c, the oldest turns after the
system message are dropped and the turns kept stay in the KV cache, moved down (K re-rotated), so only the
new message is computed.  The proof is in the per-turn counts on stderr, against --no-context-shift (the
kept turns recomputed) on the same conversation: up to the first drop both runs are the same greedy
computation, so on that turn the difference in tokens computed must be exactly the tokens the shift
moved, and what the shift run computes must be no more than the new message plus the tail of the previous
answer that re-renders differently.  The logits' closeness is tested in C
(tests/unit/test_engine_session_shift.c, test_backend_kv_shift.c).  GPT-2's learned positions cannot
shift: chat says so once and recomputes, and the conversation still goes on."""
from __future__ import annotations

import re

import pytest

from gen_model import ModelConfig, write_model
from kvtest import parse_ids, run_cli

TURNS = ["Lily had a dog", "The dog ran", "Then it rained", "The sun came out", "They went home", "The end"]
TURN_RE = re.compile(r"turn (\d+): prompt (\d+) tokens: (\d+) reused from the KV cache, (\d+) computed")
SHIFT_RE = re.compile(r"turn (\d+): context shift: (\d+) cached tokens of the kept turns moved back (\d+) positions")
DROP_RE = re.compile(r"turn (\d+): the conversation outgrew the context")


def stats(err: str) -> dict[int, tuple[int, int, int]]:
    """turn -> (prompt tokens, reused, computed)."""
    return {int(m[1]): (int(m[2]), int(m[3]), int(m[4])) for m in TURN_RE.finditer(err)}


def chat_stories(kvllm, stories, chatml, *extra):
    stdin = ("\n".join(TURNS) + "\n").encode()
    return run_cli(kvllm, "chat", "-m", stories["bin"], "--tokenizer", stories["tok"], "--chat-template", chatml,
                   "--temp", "0", "-t", "1", "--interactive", "-c", "160", "-n", "12", "-sys", "Stories.", *extra,
                   stdin=stdin).check_ok()


def test_shift_keeps_the_kept_turns_cached(kvllm, stories, chatml, run):
    on = chat_stories(kvllm, stories, chatml)
    off = chat_stories(kvllm, stories, chatml, "--no-context-shift")
    assert len(on.out.splitlines()) == len(TURNS) == len(off.out.splitlines()), on.describe()
    drops = sorted({int(t) for t in DROP_RE.findall(on.err)})
    shifts = {int(m[1]): (int(m[2]), int(m[3])) for m in SHIFT_RE.finditer(on.err)}
    assert drops and set(shifts) == set(drops), on.err       # every turn that dropped, shifted
    assert not SHIFT_RE.search(off.err) and "context shift" not in off.err, off.err
    first = drops[0]
    s_on, s_off = stats(on.err), stats(off.err)
    # before the first drop: the same computation, the same answers
    assert on.out.splitlines()[:first - 1] == off.out.splitlines()[:first - 1]
    assert all(s_on[t] == s_off[t] for t in range(1, first)), (s_on, s_off)
    prompt, reused, computed = s_on[first]
    moved, delta = shifts[first]
    assert s_off[first][0] == prompt and moved >= 20 and delta > 0, (s_on[first], s_off[first], shifts)
    # the kept turns were not computed again: exactly the moved tokens fewer than recomputing them
    assert s_off[first][2] - computed == moved and reused + computed == prompt, (s_on[first], s_off[first])
    # what was computed is the new message (plus the previous answer's re-rendered tail)
    new_msg = f"<|im_start|>user\n{TURNS[first - 1]}<|im_end|>\n<|im_start|>assistant\n"
    n_new = len(parse_ids(run("tokenize", "-m", stories["bin"], "--tokenizer", stories["tok"], "--ids", new_msg)
                          .check_ok().out))
    assert computed <= n_new + 12, (computed, n_new)
    # later drops shift as well: no turn recomputes the kept turns
    for t in drops:
        assert s_on[t][2] <= s_off[first][2] - 20, (t, s_on[t], s_off[first])


def test_learned_positions_fall_back_to_recompute(kvllm, chatml, tmp_path):
    cfg = ModelConfig(arch="gpt2", n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=128, n_ctx=160)
    path = write_model(tmp_path / "gpt2.gguf", cfg, seed=7)
    r = run_cli(kvllm, "chat", "-m", path, "--chat-template", chatml, "--temp", "0", "-t", "1", "--interactive",
                "-c", "160", "-n", "8", stdin=("\n".join(TURNS) + "\n").encode()).check_ok()
    assert len(r.out.splitlines()) == len(TURNS), r.describe()
    assert DROP_RE.search(r.err), r.err
    assert r.err.count("no context shift for this model") == 1, r.err   # said once
    assert not SHIFT_RE.search(r.err), r.err
