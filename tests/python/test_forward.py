"""kvllm eval logits vs the numpy reference (ref_llama.py) on random-weight Llama GGUFs.

Every config is checked at every position, with the KV cache (prefill all / prefill 1 + decode /
prefill 7 + decode) and without it (--no-kv-cache recomputes each prefix).  F16 models: the
reference reads the same F16 values, dequantized exactly, so the tolerance is the same as F32.
"""
from __future__ import annotations

import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from kvtest import eval_logits
from ref_llama import LlamaRef, rel_err

TOL = 1e-4
N_TOKENS = 20

CONFIGS = {
    # name: config (head_dim = n_embd / n_head)
    "mha_f32_untied": ModelConfig(n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=192),
    "mha_f16_tied": ModelConfig(n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=192,
                                tied=True, dtype="f16"),
    "gqa_f32_tied": ModelConfig(n_vocab=512, n_embd=128, n_layer=2, n_head=8, n_head_kv=2, n_ff=384,
                                tied=True, rope_theta=500000.0, norm_eps=1e-6),
    "gqa_f16_untied": ModelConfig(n_vocab=512, n_embd=128, n_layer=2, n_head=8, n_head_kv=2, n_ff=352,
                                  dtype="f16"),
    # n_rot < head_dim: only the first 8 of 16 dims are rotated
    "mqa_f32_untied_rot8": ModelConfig(n_vocab=400, n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=200,
                                       n_rot=8),
    "mqa_f16_tied_rot8": ModelConfig(n_vocab=400, n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=200,
                                     n_rot=8, tied=True, dtype="f16", norm_eps=1e-6, rope_theta=1000.0),
    # sizes that are multiples of nothing useful (SIMD tails): n_embd 60, head_dim 10, n_ff 100, odd vocab
    "odd_dims_f16": ModelConfig(n_vocab=301, n_embd=60, n_layer=2, n_head=6, n_head_kv=2, n_ff=100,
                                n_rot=6, dtype="f16"),
    "odd_dims_f32_tied": ModelConfig(n_vocab=263, n_embd=36, n_layer=3, n_head=3, n_head_kv=3, n_ff=84,
                                     tied=True),
    # block-quantized and bf16 matrices, written by gguf's quantizers and decoded by gguf.quants in
    # the reference: an independent check of kvllm's block decoding (row lengths: multiples of 32)
    "gqa_bf16_untied": ModelConfig(n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=160,
                                   dtype="bf16"),
    "gqa_q8_0_untied": ModelConfig(n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=160,
                                   dtype="q8_0"),
    "mha_q4_0_tied": ModelConfig(n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=192,
                                 tied=True, dtype="q4_0"),
    "mqa_q4_1_untied": ModelConfig(n_vocab=320, n_embd=96, n_layer=2, n_head=4, n_head_kv=1, n_ff=224,
                                   dtype="q4_1"),
}

MODES = {
    "prefill_all": dict(),
    "prefill_1": dict(prefill=1),
    "prefill_7": dict(prefill=7),
    "no_kv_cache": dict(no_kv_cache=True),
}


class Case:
    def __init__(self, path, tokens, ref):
        self.path, self.tokens, self.ref = path, tokens, ref


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    d = tmp_path_factory.mktemp("forward")
    out = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        path = write_model(d / f"{name}.gguf", cfg, seed=100 + i)
        rng = np.random.default_rng(7 + i)
        tokens = [1] + rng.integers(3, cfg.n_vocab, size=N_TOKENS - 1).tolist()
        ref = LlamaRef.from_gguf(path).forward(tokens)
        out[name] = Case(path, tokens, ref)
    return out


def test_reference_is_not_degenerate(cases):
    """Guard for the oracle: finite, O(1) logits that differ between positions and configs."""
    for name, c in cases.items():
        assert np.isfinite(c.ref).all(), name
        scale = np.abs(c.ref).max()
        assert 0.1 < scale < 100, (name, scale)
        # rows differ (attention mixes positions; a broken model would give constant rows)
        assert np.abs(np.diff(c.ref, axis=0)).max() > 1e-2 * scale, name
        # argmax is not the same token everywhere
        assert len(set(c.ref.argmax(axis=1).tolist())) > 1, name


# KVLLM_ACT=int: Q8_0 / Q4_0 / Q4_1 multiply 13-bit integer activations (one scale per block of 32).  The
# rounding of the activations (half a step of amax / 4095 per block) gives about 1e-3 relative on logits
# here (measured 2e-4 .. 1.3e-3); a wrong block scale or code gives O(1).  "" is kvllm's default, 8-bit
# activations (KVLLM_ACT=q8; half a step of amax / 127 per block of 32): measured 0.9-2.7e-2 relative on
# these random-weight models' logits (as llama.cpp's own 8-bit activations; real models are judged by KL
# divergence, test_kld.py); a wrong scale, code or block gives O(1).
INT_TOL = 5e-3
Q8_TOL = 6e-2


@pytest.mark.parametrize("act", ["", "int"])
@pytest.mark.parametrize("config", ["gqa_q8_0_untied", "mha_q4_0_tied", "mqa_q4_1_untied"])
def test_default_and_integer_activations_match_reference(kvllm, cases, tmp_path, config, act):
    c = cases[config]
    for mode in ("prefill_all", "prefill_1"):
        got = eval_logits(kvllm, c.path, c.tokens, tmp_path / "logits.bin", act=act, **MODES[mode])
        err = rel_err(got, c.ref)
        print(f"{config} KVLLM_ACT={act or '(default)'} {mode}: max rel err {err.max():.3g}")
        tol = INT_TOL if act == "int" else Q8_TOL
        assert err.max() <= tol, f"{config}/{mode} KVLLM_ACT={act}: rel err {err.max():.3g}"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_match_reference(kvllm, cases, tmp_path, config, mode):
    c = cases[config]
    got = eval_logits(kvllm, c.path, c.tokens, tmp_path / "logits.bin", **MODES[mode])
    assert got.shape == c.ref.shape, f"logits shape {got.shape}, expected {c.ref.shape}"
    assert np.isfinite(got).all(), "non-finite logits"
    err = rel_err(got, c.ref)
    worst = int(err.argmax())
    assert err.max() <= TOL, (f"{config}/{mode}: max|kvllm-ref|/max|ref| = {err.max():.3g} at position {worst} "
                              f"(tol {TOL}); per-position errors: {np.array2string(err, precision=2)}")


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_counts_match_reference(kvllm, cases, tmp_path, threads):
    c = cases["gqa_f16_untied"]
    for mode in ("prefill_all", "prefill_7"):
        got = eval_logits(kvllm, c.path, c.tokens, tmp_path / "logits.bin", threads=threads, **MODES[mode])
        err = rel_err(got, c.ref)
        assert err.max() <= TOL, f"-t {threads} {mode}: rel err {err.max():.3g} at position {int(err.argmax())}"


@pytest.mark.parametrize("mode", ["prefill_all", "prefill_33", "prefill_1", "no_kv_cache"])
def test_long_sequence(kvllm, cases, tmp_path, mode):
    """100 positions: cache growth across any block / chunk boundary up to 100."""
    c = cases["gqa_f16_untied"]
    tokens = [1] + np.random.default_rng(99).integers(3, 512, size=99).tolist()
    ref = LlamaRef.from_gguf(c.path).forward(tokens)
    kw = {"prefill_all": {}, "prefill_33": dict(prefill=33), "prefill_1": dict(prefill=1),
          "no_kv_cache": dict(no_kv_cache=True)}[mode]
    got = eval_logits(kvllm, c.path, tokens, tmp_path / "logits.bin", **kw)
    err = rel_err(got, ref)
    assert err.max() <= TOL, f"{mode}: rel err {err.max():.3g} at position {int(err.argmax())}"


def test_single_token(kvllm, cases, tmp_path):
    """One token: the smallest batch; logits = reference row 0."""
    c = cases["mha_f32_untied"]
    got = eval_logits(kvllm, c.path, c.tokens[:1], tmp_path / "logits.bin")
    assert got.shape == (1, c.ref.shape[1])
    assert rel_err(got, c.ref[:1]).max() <= TOL


def test_asan_forward(asan_bin, cases, tmp_path):
    """The forward pass under AddressSanitizer (GQA and MQA+partial rope, cache and no cache)."""
    for config in ("gqa_f16_untied", "mqa_f32_untied_rot8"):
        c = cases[config]
        for mode in ("prefill_7", "no_kv_cache"):
            got = eval_logits(asan_bin, c.path, c.tokens, tmp_path / "logits.bin", **MODES[mode])
            err = rel_err(got, c.ref)
            assert err.max() <= TOL, f"ASan {config}/{mode}: rel err {err.max():.3g}"
