"""`kvllm tokenize` on byte-level BPE vocabularies: llama.cpp's vocab-only GGUFs
(gpt-2, falcon, deepseek-coder, starcoder) and Hugging Face vocab.json + merges.txt
(GPT-2, Llama 3) against the reference ids in tests/data/tokenizers (see its README:
.inp cases separated by "\\n__ggml_vocab_test__\\n", .out one id line per case, no BOS)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvtest import assert_no_sanitizer, parse_ids, run_cli

SEP = b"\n__ggml_vocab_test__\n"
L3_SPECIALS = ["--special", "<|begin_of_text|>=128000", "--special", "<|end_of_text|>=128001"]


def cases(shared: Path, name: str) -> list[tuple[bytes, list[int]]]:
    base = shared / "tokenizers" / "llamacpp-vocab" / f"ggml-vocab-{name}.gguf"
    inp = base.with_name(base.name + ".inp").read_bytes()
    out = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    texts = inp.split(SEP)
    assert texts[-1] == b"", "the .inp file ends with the separator"
    texts = texts[:-1]
    assert len(out) >= len(texts)
    return [(t, parse_ids(o)) for t, o in zip(texts, out)]


def vocab_args(shared: Path, name: str) -> list:
    if name == "llama-bpe":
        d = shared / "tokenizers" / "llama3-bpe"
        return ["--vocab", d / "encoder.json", "--merges", d / "vocab.bpe", "--pre", "llama-bpe", *L3_SPECIALS]
    if name == "gpt2-files":
        d = shared / "tokenizers" / "gpt2"
        return ["--vocab", d / "encoder.json", "--merges", d / "vocab.bpe"]
    return ["-m", shared / "tokenizers" / "llamacpp-vocab" / f"ggml-vocab-{name}.gguf"]


@pytest.mark.parametrize("name", ["gpt-2", "falcon", "deepseek-coder", "starcoder", "llama-bpe"])
def test_inp_out_match(run, shared, tmp_path, name):
    ref = cases(shared, name)
    f = tmp_path / "case.txt"
    bad = []
    for text, want in ref:
        f.write_bytes(text)
        res = run("tokenize", *vocab_args(shared, name), "--no-bos", "--ids", "-f", f).check_ok()
        if parse_ids(res.out) != want:
            bad.append((text[:60], parse_ids(res.out)[:20], want[:20]))
    assert not bad, f"{name}: {len(bad)}/{len(ref)} cases differ, first: {bad[0]}"


def test_gguf_and_files_agree(run, shared, tmp_path):
    f = tmp_path / "all.txt"
    f.write_bytes(b"".join(t + b"\n" for t, _ in cases(shared, "gpt-2")))
    a = run("tokenize", *vocab_args(shared, "gpt-2"), "--ids", "-f", f).check_ok().out
    b = run("tokenize", *vocab_args(shared, "gpt2-files"), "--ids", "-f", f).check_ok().out
    assert a == b and len(a.split()) > 100


def test_piece_output_and_no_bos_default(run, shared):
    res = run("tokenize", *vocab_args(shared, "gpt2-files"), "hello world\n").check_ok()
    assert res.out == "31373\t'hello'\n995\t' world'\n198\t'\\n'\n"  # GPT-2 adds no BOS; pieces as text
    res = run("tokenize", *vocab_args(shared, "gpt2-files"), "--raw-pieces", "hello world\n").check_ok()
    assert res.out == "31373\thello\n995\t\u0120world\n198\t\u010a\n"  # the vocabulary entries


def test_llama3_bos_and_special(run, shared):
    args = vocab_args(shared, "llama-bpe")
    res = run("tokenize", *args, "--ids", "hello world").check_ok()
    assert parse_ids(res.out) == [128000, 15339, 1917]  # llama-bpe asks for BOS
    res = run("tokenize", *args, "--ids", "--no-bos", "--parse-special", "hello <|end_of_text|>").check_ok()
    assert parse_ids(res.out) == [15339, 220, 128001]


def test_unknown_pre_named(run, shared):
    res = run("tokenize", *vocab_args(shared, "gpt2-files"), "--pre", "no-such-pre", "hi")
    assert res.returncode == 1 and "no-such-pre" in res.err, res.describe()


@pytest.mark.parametrize("bad", ["x", "=5", "<x>=", "<x>=-1", "<x>=12a"])
def test_bad_special(run, shared, bad):
    res = run("tokenize", *vocab_args(shared, "gpt2-files"), "--special", bad, "hi")
    assert res.returncode == 2 and "--special" in res.err, res.describe()


def test_asan_tokenize(asan_bin, shared, tmp_path):
    f = tmp_path / "all.txt"
    f.write_bytes(b"".join(t for t, _ in cases(shared, "llama-bpe")) + bytes(range(256)))
    for name in ["gpt-2", "llama-bpe"]:
        res = run_cli(asan_bin, "tokenize", *vocab_args(shared, name), "--parse-special", "-f", f)
        assert_no_sanitizer(res)
        assert res.returncode == 0, res.describe()
