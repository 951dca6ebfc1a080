"""Checks of the test tooling itself (no kvllm binary needed): gen_model writes GGUFs that
gguf.GGUFReader reads back as specified, and ref_llama is a correct Llama forward:
it reproduces llama2.c's published greedy output for stories260K, is causal, is invariant to
a global position shift (RoPE depends only on relative positions), and GQA equals MHA with
repeated K/V heads.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import gguf

from gen_model import SHAPES, ModelConfig, make_vocab, random_tensors, tensor_specs, write_model
from llama2c import read_checkpoint
from ref_llama import LlamaRef, rel_err


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    cfg = ModelConfig(n_vocab=320, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=160, n_rot=6,
                      dtype="f16", rope_theta=20000.0, norm_eps=1e-6)
    path = write_model(tmp_path_factory.mktemp("ref") / "gqa.gguf", cfg, seed=3)
    return cfg, path


def test_gen_model_metadata_and_tensors(gqa_model):
    cfg, path = gqa_model
    r = gguf.GGUFReader(path)
    f = lambda k: r.get_field(k).contents()
    assert f("general.architecture") == "llama"
    assert f("llama.embedding_length") == 64
    assert f("llama.block_count") == 2
    assert f("llama.feed_forward_length") == 160
    assert f("llama.attention.head_count") == 8
    assert f("llama.attention.head_count_kv") == 2
    assert f("llama.rope.dimension_count") == 6
    assert f("llama.rope.freq_base") == pytest.approx(20000.0)
    assert f("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert f("llama.context_length") == cfg.n_ctx
    assert f("tokenizer.ggml.model") == "llama"
    toks = f("tokenizer.ggml.tokens")
    types = f("tokenizer.ggml.token_type")
    assert len(toks) == len(types) == len(f("tokenizer.ggml.scores")) == 320
    assert toks[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert toks[3] == "<0x00>" and toks[258] == "<0xFF>" and set(types[3:259]) == {6}
    assert set(types[259:]) == {1} and len(set(toks)) == len(toks)
    assert (f("tokenizer.ggml.bos_token_id"), f("tokenizer.ggml.eos_token_id"),
            f("tokenizer.ggml.unknown_token_id")) == (1, 2, 0)

    specs = {s.name: s for s in tensor_specs(cfg)}
    assert {t.name for t in r.tensors} == set(specs)
    arrays = {s.name: a for s, a in random_tensors(cfg, seed=3)}
    for t in r.tensors:
        s = specs[t.name]
        assert tuple(reversed(t.shape.tolist())) == s.shape, t.name          # ne = reversed numpy shape
        want_type = gguf.GGMLQuantizationType.F32 if s.kind == "norm" else gguf.GGMLQuantizationType.F16
        assert t.tensor_type == want_type, t.name
        assert np.array_equal(np.asarray(t.data).reshape(s.shape), arrays[t.name]), t.name
        assert t.data_offset % 32 == 0


def test_gen_model_shapes_and_cli(tmp_path):
    import gen_model
    assert SHAPES["tinyllama-1.1B"].n_head_kv == 4 and SHAPES["tinyllama-1.1B"].n_ff == 5632
    n110 = sum(int(np.prod(s.shape)) for s in tensor_specs(SHAPES["110M"]))
    assert 100e6 < n110 < 140e6
    out = tmp_path / "cli.gguf"
    assert gen_model.main(["--shape", "tiny", "--type", "f16", "--n-vocab", "300", "--tied", "--seed", "5",
                           "-o", str(out)]) == 0
    r = gguf.GGUFReader(out)
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names
    assert r.get_field("tokenizer.ggml.tokens").contents()[-1] == make_vocab(300)[0][-1]


def test_omit_keys_and_tensors(tmp_path):
    cfg = ModelConfig(n_vocab=270, n_embd=16, n_layer=1, n_head=2, n_head_kv=2, n_ff=32)
    p = write_model(tmp_path / "m.gguf", cfg, omit_keys=["llama.embedding_length"],
                    omit_tensors=["blk.0.ffn_down.weight"])
    r = gguf.GGUFReader(p)
    assert r.get_field("llama.embedding_length") is None
    assert r.get_field("llama.block_count").contents() == 1
    assert "blk.0.ffn_down.weight" not in {t.name for t in r.tensors}


def test_reference_reproduces_llama2c_greedy(stories):
    """ref_llama on the llama2.c checkpoint predicts every one of the 256 published greedy ids."""
    ck = read_checkpoint(stories["bin"])
    assert (ck.dim, ck.hidden_dim, ck.n_layers, ck.n_heads, ck.n_kv_heads, ck.vocab_size, ck.seq_len) == \
        (64, 172, 5, 8, 4, 512, 512)
    # llama2.c's stored rope table is theta 10000 over adjacent pairs of the head: the ref's convention
    hs = ck.head_size
    ang = np.arange(ck.seq_len)[:, None] * 10000.0 ** (-np.arange(0, hs, 2) / hs)
    assert np.abs(np.cos(ang) - ck.w["freq_cis_real"]).max() < 1e-4
    assert np.abs(np.sin(ang) - ck.w["freq_cis_imag"]).max() < 1e-4
    ids = [int(t) for t in stories["ids"].read_text().split()]
    assert len(ids) == 256
    logits = ck.ref().forward([1] + ids[:-1])
    pred = logits.argmax(axis=1)
    bad = np.nonzero(pred != np.array(ids))[0]
    assert bad.size == 0, f"reference diverges from llama2.c at positions {bad[:10].tolist()}"


def test_causal(gqa_model):
    cfg, path = gqa_model
    ref = LlamaRef.from_gguf(path)
    rng = np.random.default_rng(0)
    a = rng.integers(0, cfg.n_vocab, size=12).tolist()
    b = a[:6] + rng.integers(0, cfg.n_vocab, size=6).tolist()
    la, lb = ref.forward(a), ref.forward(b)
    assert np.allclose(la[:6], lb[:6], rtol=0, atol=1e-12)     # positions < 6 cannot see the change
    assert np.abs(la[6:] - lb[6:]).max() > 1e-3                 # positions >= 6 do
    # prefix evaluation equals the rows of the full evaluation
    assert np.allclose(ref.forward(a[:5]), la[:5], rtol=0, atol=1e-12)
    # changing the first token changes every row
    c = [(a[0] + 1) % cfg.n_vocab] + a[1:]
    assert (np.abs(ref.forward(c) - la).max(axis=1) > 1e-6).all()


def test_rope_shift_invariance(gqa_model):
    """RoPE makes attention depend only on relative positions: a global shift leaves logits unchanged,
    while dropping RoPE (n_rot = 0) changes them."""
    cfg, path = gqa_model
    ref = LlamaRef.from_gguf(path)
    toks = np.random.default_rng(1).integers(0, cfg.n_vocab, size=10).tolist()
    base = ref.forward(toks)
    assert np.allclose(ref.forward(toks, start_pos=37), base, rtol=0, atol=1e-9)
    norot = LlamaRef(dataclasses.replace(ref.hp, n_rot=0), ref.w).forward(toks)
    assert np.abs(norot - base).max() > 1e-3
    # position 0 is unrotated: the first row does not depend on rope at all
    assert np.allclose(norot[0], base[0], rtol=0, atol=1e-12)


def test_rope_pairs_are_adjacent():
    """Rotating adjacent pairs: dims (0,1) at pos 1 turn by exactly 1 radian for any theta."""
    hp = dataclasses.replace(_dummy_hp(), n_rot=4, head_dim=6)
    r = LlamaRef.__new__(LlamaRef)
    r.hp = hp
    x = np.zeros((2, 1, 6))
    x[:, 0, 0] = 1.0
    x[:, 0, 2] = 1.0
    x[:, 0, 4] = 1.0
    y = r._rope(x, np.array([0, 1]))
    assert np.allclose(y[0, 0], x[0, 0])
    assert np.allclose(y[1, 0, :2], [np.cos(1.0), np.sin(1.0)])
    f = hp.rope_theta ** (-2 / 4)
    assert np.allclose(y[1, 0, 2:4], [np.cos(f), np.sin(f)])
    assert np.allclose(y[1, 0, 4:], [1.0, 0.0])              # past n_rot: untouched


def _dummy_hp():
    from ref_llama import HParams
    return HParams(n_vocab=4, n_embd=6, n_layer=0, n_head=1, n_head_kv=1, n_ff=4, head_dim=6, n_rot=6)


def test_gqa_equals_mha_with_repeated_kv(gqa_model):
    """Query head h uses kv head h // (n_head / n_head_kv): an MHA model whose K/V rows repeat
    each kv head for its group gives identical logits."""
    cfg, path = gqa_model
    ref = LlamaRef.from_gguf(path)
    hp, hd, group = ref.hp, ref.hp.head_dim, ref.hp.n_head // ref.hp.n_head_kv
    w = dict(ref.w)
    for il in range(hp.n_layer):
        for t in ("attn_k", "attn_v"):
            m = w[f"blk.{il}.{t}.weight"].reshape(hp.n_head_kv, hd, hp.n_embd)
            w[f"blk.{il}.{t}.weight"] = np.repeat(m, group, axis=0).reshape(hp.n_head * hd, hp.n_embd)
    mha = LlamaRef(dataclasses.replace(hp, n_head_kv=hp.n_head), w)
    toks = np.random.default_rng(2).integers(0, cfg.n_vocab, size=9).tolist()
    assert rel_err(mha.forward(toks), ref.forward(toks)).max() < 1e-12


def test_tied_head_uses_token_embd(tmp_path):
    cfg = ModelConfig(n_vocab=280, n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64, tied=True)
    ref = LlamaRef.from_gguf(write_model(tmp_path / "t.gguf", cfg, seed=9))
    assert "output.weight" not in ref.w
    toks = [1, 5, 9, 200]
    lg = ref.forward(toks)
    w2 = dict(ref.w)
    w2["output.weight"] = ref.w["token_embd.weight"].copy()
    assert np.array_equal(LlamaRef(ref.hp, w2).forward(toks), lg)


def test_bench_gen_model_wrapper(tmp_path):
    """bench/gen-model (the executable wrapper) writes a readable model."""
    import subprocess
    import sys
    from kvtest import REPO
    out = tmp_path / "w.gguf"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gen-model"), "--shape", "tiny", "--n-layer", "1",
                        "--seed", "2", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = gguf.GGUFReader(out)
    assert r.get_field("llama.block_count").contents() == 1
    assert len(r.tensors) == 3 + 9          # token_embd, output_norm, output + one layer of 9
