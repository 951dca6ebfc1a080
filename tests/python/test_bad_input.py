"""Corrupt, truncated and absurd model files must be refused cleanly.

For every case, `kvllm run -m FILE -n 4 -q` and `kvllm info FILE`, with the release binary and
(when built) the ASan one, must: exit 1 (not a signal, not a sanitizer exit), print exactly one
stderr line starting with "kvllm: error:" that names the file, and no sanitizer report.
With -q that error line is all of stderr.

The GGUF cases are made from a small valid model written by gguf_build.py (byte-level control);
one is written by gen_model (GGUFWriter) with a required key left out.  llama2.c cases start
from the real stories260K checkpoint / tok512.bin.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import gguf

from gen_model import write_model
from gguf_build import ARRAY, BASE_CFG, FLOAT32, INT32, STRING, UINT32, GGUF, base_model, gstr
from kvtest import check_refused, parse_ids, read_logits, run_cli
from ref_llama import LlamaRef, rel_err

TIMEOUT = 120


# ---- GGUF cases -----------------------------------------------------------------
# each builder returns the file's bytes

def _base() -> GGUF:
    return base_model()


def _trunc(where: Callable[[GGUF, bytes], int]) -> Callable[[], bytes]:
    def build() -> bytes:
        g = _base()
        b = g.render()
        n = where(g, b)
        assert 0 < n < len(b)
        return b[:n]
    return build


def _edit(fn: Callable[[GGUF], object]) -> Callable[[], bytes]:
    def build() -> bytes:
        g = _base()
        fn(g)
        return g.render()
    return build


def _set_ti(name: str, **kw) -> Callable[[GGUF], None]:
    def fn(g: GGUF) -> None:
        g.tensor(name).update(kw)
    return fn


def _last_tensor_past_end(g: GGUF) -> None:
    t = g.tis[-1]
    t["offset"] = t["offset"] + 64            # aligned, and its bytes now run 64 past the end


def _misaligned(g: GGUF) -> None:
    g.tis[-1]["offset"] += 4


def _dup_tensor(g: GGUF) -> None:
    g.tis.append(dict(g.tis[1]))


def _n_tensors_plus_one(g: GGUF) -> None:
    g.n_tensors = len(g.tis) + 1


def _tokens_more_than_rows(g: GGUF) -> None:
    from gen_model import make_vocab
    toks, scores, types = make_vocab(BASE_CFG.n_vocab + 30)
    g.set_array("tokenizer.ggml.tokens", STRING, toks)
    g.set_array("tokenizer.ggml.scores", FLOAT32, scores)
    g.set_array("tokenizer.ggml.token_type", INT32, types)


def _huge_key_len(g: GGUF) -> None:
    g.raw_kv(struct.pack("<Q", 2**63) + b"general.bogus" + struct.pack("<I", UINT32) + struct.pack("<I", 1))


def _huge_string_value(g: GGUF) -> None:
    g.set("general.name", STRING, struct.pack("<Q", 2**62) + b"name")


def _bad_value_type(g: GGUF) -> None:
    g.raw_kv(gstr("general.bogus") + struct.pack("<I", 99) + struct.pack("<I", 1))


def _array_of_arrays(g: GGUF) -> None:
    inner = struct.pack("<IQ", UINT32, 2**40)
    g.set("general.bogus", ARRAY, struct.pack("<IQ", ARRAY, 2**40) + inner)


GGUF_CASES: dict[str, Callable[[], bytes]] = {
    # truncation
    "trunc_in_magic": _trunc(lambda g, b: 2),
    "trunc_in_version": _trunc(lambda g, b: 6),
    "trunc_in_counts": _trunc(lambda g, b: 20),
    "trunc_after_header": _trunc(lambda g, b: 24),
    "trunc_in_kv": _trunc(lambda g, b: g.kv_span("llama.block_count")[0] + 5),
    "trunc_in_token_array": _trunc(lambda g, b: sum(g.kv_span("tokenizer.ggml.tokens")) // 2),
    "trunc_in_tensor_info": _trunc(lambda g, b: (g.ti_start + g.data_start) // 2),
    "trunc_at_data": _trunc(lambda g, b: g.data_start),
    "trunc_in_data": _trunc(lambda g, b: (g.data_start + len(b)) // 2),
    "trunc_last_byte": _trunc(lambda g, b: len(b) - 1),
    # header
    "magic_wrong": _edit(lambda g: setattr(g, "magic", b"GGUX")),
    "magic_zero": _edit(lambda g: setattr(g, "magic", b"\0\0\0\0")),
    "version_0": _edit(lambda g: setattr(g, "version", 0)),
    "version_1": _edit(lambda g: setattr(g, "version", 1)),
    "version_99": _edit(lambda g: setattr(g, "version", 99)),
    "n_tensors_huge": _edit(lambda g: setattr(g, "n_tensors", 2**62)),
    "n_kv_huge": _edit(lambda g: setattr(g, "n_kv", 2**62)),
    "n_kv_plus_one": _edit(lambda g: setattr(g, "n_kv", len(g.kvs) + 1)),
    "n_tensors_plus_one": _edit(_n_tensors_plus_one),
    # metadata encoding
    "key_len_huge": _edit(_huge_key_len),
    "string_len_huge": _edit(_huge_string_value),
    "value_type_99": _edit(_bad_value_type),
    "array_of_huge_arrays": _edit(_array_of_arrays),
    "tokens_count_huge": _edit(lambda g: g.set_array("tokenizer.ggml.tokens", STRING, ["a", "b"], count=2**60)),
    "scores_count_huge": _edit(lambda g: g.set_array("tokenizer.ggml.scores", FLOAT32, [0.0], count=2**62 + 1)),
    # required / inconsistent hyper-parameters
    "no_embedding_length": _edit(lambda g: g.drop("llama.embedding_length")),
    "no_block_count": _edit(lambda g: g.drop("llama.block_count")),
    "no_architecture": _edit(lambda g: g.drop("general.architecture")),
    "arch_unknown": _edit(lambda g: g.set_str("general.architecture", "no-such-arch")),
    "embedding_length_2pow40": _edit(lambda g: g.set_u64("llama.embedding_length", 2**40)),
    "embedding_length_u32max": _edit(lambda g: g.set_u32("llama.embedding_length", 0xFFFFFFFF)),
    "embedding_length_string": _edit(lambda g: g.set_str("llama.embedding_length", "16")),
    "block_count_1000": _edit(lambda g: g.set_u32("llama.block_count", 1000)),
    "block_count_2pow31": _edit(lambda g: g.set_u32("llama.block_count", 2**31)),
    "head_count_0": _edit(lambda g: g.set_u32("llama.attention.head_count", 0)),
    "head_count_kv_0": _edit(lambda g: g.set_u32("llama.attention.head_count_kv", 0)),
    "head_count_kv_not_divisor": _edit(lambda g: g.set_u32("llama.attention.head_count_kv", 3)),
    "head_count_not_dividing_embd": _edit(lambda g: g.set_u32("llama.attention.head_count", 3)),
    "rope_dims_too_big": _edit(lambda g: g.set_u32("llama.rope.dimension_count", 1000)),
    # tokenizer
    "tokens_empty": _edit(lambda g: g.set_array("tokenizer.ggml.tokens", STRING, [])),
    "tokens_not_strings": _edit(lambda g: g.set_array("tokenizer.ggml.tokens", INT32, list(range(BASE_CFG.n_vocab)))),
    "token_type_short": _edit(lambda g: g.set_array("tokenizer.ggml.token_type", INT32, [1] * 10)),
    "scores_short": _edit(lambda g: g.set_array("tokenizer.ggml.scores", FLOAT32, [0.0] * 10)),
    "tokens_more_than_rows": _edit(_tokens_more_than_rows),
    "tokenizer_model_unknown": _edit(lambda g: g.set_str("tokenizer.ggml.model", "no-such-tokenizer")),
    # tensors
    "tensor_offset_past_end": _edit(_last_tensor_past_end),
    "tensor_offset_2pow40": _edit(_set_ti("output.weight", offset=2**40)),
    "tensor_offset_wraps": _edit(_set_ti("output.weight", offset=2**64 - 32)),
    "tensor_offset_misaligned": _edit(_misaligned),
    "tensor_type_200": _edit(_set_ti("blk.0.attn_q.weight", type=200)),
    "tensor_ne_2pow62": _edit(_set_ti("token_embd.weight", ne=[16, 2**62])),
    "tensor_ne_product_wraps": _edit(_set_ti("token_embd.weight", ne=[2**32, 2**32])),
    "tensor_ne_u64max": _edit(_set_ti("token_embd.weight", ne=[16, 2**64 - 1])),
    "tensor_ne_zero": _edit(_set_ti("blk.0.attn_q.weight", ne=[16, 0])),
    "tensor_n_dims_5": _edit(_set_ti("blk.0.attn_norm.weight", ne=[16, 1, 1, 1, 1])),
    "tensor_n_dims_1000": _edit(_set_ti("blk.0.attn_norm.weight", ne=[1] * 1000)),
    "tensor_wrong_shape": _edit(_set_ti("blk.0.attn_q.weight", ne=[16, 8])),
    "tensor_missing": _edit(lambda g: g.drop_tensor("blk.0.ffn_down.weight")),
    "tensor_duplicate": _edit(_dup_tensor),
}


# ---- llama2.c cases (from the real stories260K files) ---------------------------

def _ckpt_header_edit(**fields) -> Callable[[bytes], bytes]:
    names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"]

    def fn(raw: bytes) -> bytes:
        h = list(struct.unpack_from("<7i", raw, 0))
        for k, v in fields.items():
            h[names.index(k)] = v
        return struct.pack("<7i", *h) + raw[28:]
    return fn


def _ckpt_sized(dim=64, hidden=172, n_layers=5, n_heads=8, n_kv_heads=4, vocab=512, seq_len=512):
    """A checkpoint whose size matches its header (so it looks like llama2.c) but whose header is
    inconsistent: the loader's own checks, not format detection, must refuse it."""
    def fn(raw: bytes) -> bytes:
        hs = dim // n_heads
        kv_dim = hs * n_kv_heads
        n = (abs(vocab) * dim + n_layers * (2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim)
             + dim + seq_len * (hs // 2) * 2 + (0 if vocab > 0 else abs(vocab) * dim))
        body = np.random.default_rng(0).standard_normal(n).astype("<f4").tobytes()
        return struct.pack("<7i", dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len) + body
    return fn


BIN_CASES: dict[str, Callable[[bytes], bytes]] = {
    "sized_heads_not_dividing_dim": _ckpt_sized(n_heads=7, n_kv_heads=7),
    "sized_kv_heads_not_dividing": _ckpt_sized(n_kv_heads=3),
    "sized_kv_heads_gt_heads": _ckpt_sized(n_heads=4, n_kv_heads=8),
    "sized_odd_head_size": _ckpt_sized(dim=63, n_heads=7, n_kv_heads=7),
    "sized_seq_len_0": _ckpt_sized(seq_len=0),
    "dim_2pow30": _ckpt_header_edit(dim=2**30),
    "dim_negative": _ckpt_header_edit(dim=-64),
    "dim_zero": _ckpt_header_edit(dim=0),
    "n_heads_0": _ckpt_header_edit(n_heads=0),
    "n_kv_heads_0": _ckpt_header_edit(n_kv_heads=0),
    "n_kv_heads_3": _ckpt_header_edit(n_kv_heads=3),
    "n_heads_not_dividing_dim": _ckpt_header_edit(n_heads=7),
    "n_layers_2pow30": _ckpt_header_edit(n_layers=2**30),
    "n_layers_negative": _ckpt_header_edit(n_layers=-5),
    "vocab_0": _ckpt_header_edit(vocab_size=0),
    "vocab_int_min": _ckpt_header_edit(vocab_size=-2**31),
    "seq_len_0": _ckpt_header_edit(seq_len=0),
    "hidden_2pow31m1": _ckpt_header_edit(hidden_dim=2**31 - 1),
    "trunc_half": lambda raw: raw[:len(raw) // 2],
    "trunc_last_byte": lambda raw: raw[:-1],
    "header_only": lambda raw: raw[:28],
    "trunc_in_header": lambda raw: raw[:20],
}


def _tok_edit_len(raw: bytes) -> bytes:
    # first token: score at 4, len at 8 -> a negative length
    return raw[:8] + struct.pack("<i", -5) + raw[12:]


def _tok_huge_len(raw: bytes) -> bytes:
    return raw[:8] + struct.pack("<i", 2**31 - 1) + raw[12:]


TOK_CASES: dict[str, Callable[[bytes], bytes]] = {
    "tok_trunc_half": lambda raw: raw[:len(raw) // 2],
    "tok_trunc_last_byte": lambda raw: raw[:-1],
    "tok_header_only": lambda raw: raw[:4],
    "tok_len_negative": _tok_edit_len,
    "tok_len_huge": _tok_huge_len,
}


# ---- files --------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad")


@pytest.fixture(scope="module")
def base_gguf(bad_dir) -> Path:
    p = bad_dir / "base_valid.gguf"
    p.write_bytes(base_model().render())
    return p


@pytest.fixture(scope="module")
def files(bad_dir, stories) -> dict[str, tuple[Path, list[str]]]:
    """case -> (the file to name in the error, the run args that load it)."""
    out: dict[str, tuple[Path, list[str]]] = {}
    for name, build in GGUF_CASES.items():
        p = bad_dir / f"{name}.gguf"
        p.write_bytes(build())
        out["gguf_" + name] = (p, ["-m", p])
    # a required key left out by the gguf package's own writer
    p = write_model(bad_dir / "writer_no_embedding_length.gguf", BASE_CFG, omit_keys=["llama.embedding_length"])
    out["gguf_writer_no_embedding_length"] = (p, ["-m", p])
    ckpt = stories["bin"].read_bytes()
    for name, edit in BIN_CASES.items():
        p = bad_dir / f"ckpt_{name}.bin"
        p.write_bytes(edit(ckpt))
        out["bin_" + name] = (p, ["-m", p, "--tokenizer", stories["tok"]])
    tok = stories["tok"].read_bytes()
    for name, edit in TOK_CASES.items():
        p = bad_dir / f"{name}.bin"
        p.write_bytes(edit(tok))
        out["tok_" + name] = (p, ["-m", stories["bin"], "--tokenizer", p])
    for ext in ("gguf", "bin"):
        p = bad_dir / f"empty_file.{ext}"
        p.write_bytes(b"")
        out[f"empty_{ext}"] = (p, ["-m", p] + (["--tokenizer", stories["tok"]] if ext == "bin" else []))
    p = bad_dir / "no_such_file.gguf"
    out["nonexistent"] = (p, ["-m", p])
    p = bad_dir / "a_directory.gguf"
    p.mkdir()
    out["directory"] = (p, ["-m", p])
    return out


ALL_CASES = (["gguf_" + n for n in GGUF_CASES] + ["gguf_writer_no_embedding_length"]
             + ["bin_" + n for n in BIN_CASES] + ["tok_" + n for n in TOK_CASES]
             + ["empty_gguf", "empty_bin", "nonexistent", "directory"])


# ---- tests --------------------------------------------------------------------

def test_base_model_is_valid(kvllm, base_gguf, tmp_path):
    """The builder's unmodified output is a good model: otherwise the cases below prove nothing."""
    r = gguf.GGUFReader(base_gguf)
    assert r.get_field("llama.embedding_length").contents() == BASE_CFG.n_embd
    assert len(r.tensors) == 3 + 9 * BASE_CFG.n_layer
    res = run_cli(kvllm, "info", base_gguf, timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    res = run_cli(kvllm, "run", "-m", base_gguf, "-n", "4", "--temp", "0", "--ids", "--ignore-eos", "-q",
                  timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert len(parse_ids(res.out)) == 4
    toks = [1, 5, 77, 200, 3]
    out = tmp_path / "l.bin"
    res = run_cli(kvllm, "eval", "-m", base_gguf, "--tokens", " ".join(map(str, toks)), "-o", out, timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert rel_err(read_logits(out, len(toks)), LlamaRef.from_gguf(base_gguf).forward(toks)).max() <= 1e-4


@pytest.mark.parametrize("vocab", [512, -512], ids=["shared", "unshared"])
def test_sized_checkpoint_baseline_is_valid(kvllm, stories, tmp_path, vocab):
    """_ckpt_sized with a consistent header is a loadable checkpoint: the "sized_*" cases fail
    only because of their header values."""
    p = tmp_path / "sized_ok.bin"
    p.write_bytes(_ckpt_sized(vocab=vocab)(b""))
    res = run_cli(kvllm, "info", p, timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    res = run_cli(kvllm, "run", "-m", p, "--tokenizer", stories["tok"], "-n", "4", "--ids", "--ignore-eos", "-q",
                  timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert len(parse_ids(res.out)) == 4


@pytest.mark.parametrize("case", ALL_CASES)
def test_run_refuses(binary, files, case):
    path, margs = files[case]
    res = run_cli(binary, "run", *margs, "-n", "4", "-q", timeout=TIMEOUT)
    check_refused(res, path.name, quiet=True)


@pytest.mark.parametrize("case", [c for c in ALL_CASES if not c.startswith("tok_")])
def test_info_refuses(binary, files, case):
    path, _ = files[case]
    res = run_cli(binary, "info", path, timeout=TIMEOUT)
    check_refused(res, path.name, quiet=False)
