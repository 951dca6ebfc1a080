"""The newer families against the numpy reference: Qwen3 (per-head q/k norms, head_dim from key_length),
Gemma 3 (q/k norms, pre- and post-norms, GeGLU, embedding scale, five sliding-window layers per global one
with their own rope base, linear rope scaling on global layers only) and Gemma 2 (sliding window on even
layers, attention and final logit soft-capping), as GGUF files written by gen_model.py the way llama.cpp's
converter writes them.

Each config is checked at every position with the KV cache (prefill all / prefill 1 + decode / prefill 7 +
decode) and without it (--no-kv-cache): max|kvllm - ref| / max|ref| <= 1e-4 per row, with test_archs.py's
helpers.
The windows are small (5-7 tokens over 26) and the Gemma 3 models have 7 layers, so sliding and global
layers both run and every window is crossed.  Every feature is shown to change the reference's logits
(test_features_matter), and the reference itself is checked against a second, token-by-token reading of
the same math (test_reference_matches_decode_loop), so a kvllm that ignored a feature could not pass.
"""
from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest

from gen_model import ModelConfig
from ref_llama import LlamaRef, rel_err
from test_archs import MODES, TOL, Case, check_info, check_logits, check_not_degenerate, make_cases

N_TOKENS = 26

CONFIGS = {
    # head_dim 32 with n_embd / n_head = 16: q is 128 wide, the residual 64
    "qwen3_f32_untied_hd32": ModelConfig(arch="qwen3", n_vocab=400, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                         key_length=32, n_ff=160, rope_theta=1e6, norm_eps=1e-6),
    "qwen3_f16_tied_hd16": ModelConfig(arch="qwen3", n_vocab=320, n_embd=64, n_layer=3, n_head=8, n_head_kv=2,
                                       key_length=16, n_ff=128, dtype="f16", tied=True),
    "qwen3_f32_tied": ModelConfig(arch="qwen3", n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=96,
                                  tied=True),
    # layers 0-4 and 6 slide over 5 tokens, layer 5 is global (base 1e6; the sliding ones use 10000)
    "gemma3_f32_w5": ModelConfig(arch="gemma3", n_vocab=400, n_embd=64, n_layer=7, n_head=4, n_head_kv=2,
                                 key_length=32, n_ff=128, n_swa=5, rope_theta=1e6, norm_eps=1e-6, tied=True),
    "gemma3_q8_0_w6_mqa": ModelConfig(arch="gemma3", n_vocab=320, n_embd=64, n_layer=8, n_head=4, n_head_kv=1,
                                      key_length=64, n_ff=96, n_swa=6, rope_theta=1e6, dtype="q8_0", tied=True),
    # global layers' positions / 8; the base is 10000 on both kinds so only the scaling tells them apart
    "gemma3_f16_linear8": ModelConfig(arch="gemma3", n_vocab=320, n_embd=64, n_layer=7, n_head=4, n_head_kv=2,
                                      key_length=32, n_ff=128, n_swa=7, rope_scale_linear=8.0, dtype="f16",
                                      tied=True),
    # even layers slide; no rope.freq_base key (the converter writes none): base 10000
    "gemma2_f32_w5": ModelConfig(arch="gemma2", n_vocab=400, n_embd=64, n_layer=3, n_head=4, n_head_kv=2,
                                 key_length=32, n_ff=128, n_swa=5, attn_softcap=1.0, final_softcap=3.0,
                                 norm_eps=1e-6, tied=True),
    "gemma2_f16_w7_base": ModelConfig(arch="gemma2", n_vocab=320, n_embd=64, n_layer=4, n_head=4, n_head_kv=1,
                                      n_ff=96, n_swa=7, attn_softcap=1.5, final_softcap=2.5, rope_theta=50000.0,
                                      dtype="f16", tied=True),
}

@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    return make_cases(tmp_path_factory.mktemp("families"), CONFIGS, seed=500, token_seed=40, n_tokens=N_TOKENS)


# ---- the generated files and the reference (no kvllm) --------------------------------------------------------

def test_files_carry_what_the_converter_writes(cases):
    """Keys and tensor names as convert_hf_to_gguf.py writes them for each family (tensor names also in
    gguf-py's own table for the architecture)."""
    for name, cfg in CONFIGS.items():
        r = gguf.GGUFReader(cases[name].path)
        arch = cfg.arch
        f = lambda k: r.get_field(f"{arch}.{k}")
        assert f("attention.key_length").contents() == cfg.head_dim, name
        assert f("attention.value_length").contents() == cfg.head_dim, name
        assert f("rope.dimension_count") is None, name                  # readers default it to head_dim
        assert ("output.weight" in {t.name for t in r.tensors}) == (not cfg.tied), name
        allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]}
        for t in r.tensors:
            base = t.name.rsplit(".", 1)[0]
            base = "blk.{bid}." + base.split(".", 2)[2] if base.startswith("blk.") else base
            assert base in allowed, (name, t.name)
            if t.name.endswith("norm.weight"):
                assert t.tensor_type == gguf.GGMLQuantizationType.F32, (name, t.name)
        names = {t.name for t in r.tensors}
        qk = {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"}
        assert qk <= names if arch in ("qwen3", "gemma3") else not qk & names, name
        post = {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"}
        assert post <= names if arch != "qwen3" else not post & names, name
        assert not any(n.endswith(".bias") for n in names), name
        if arch == "gemma2":
            assert f("attn_logit_softcapping").contents() == pytest.approx(cfg.attn_softcap)
            assert f("final_logit_softcapping").contents() == pytest.approx(cfg.final_softcap)
            assert (f("rope.freq_base") is None) == (cfg.rope_theta == 10000.0), name
        else:
            assert f("attn_logit_softcapping") is None and f("final_logit_softcapping") is None, name
        if arch != "qwen3":
            assert f("attention.sliding_window").contents() == cfg.n_swa, name
    r = gguf.GGUFReader(cases["gemma3_f16_linear8"].path)
    assert r.get_field("gemma3.rope.scaling.type").contents() == "linear"
    assert r.get_field("gemma3.rope.scaling.factor").contents() == pytest.approx(8.0)


def test_reference_is_not_degenerate(cases):
    check_not_degenerate(cases)


def test_layer_kinds(cases):
    """Which layers slide (llama.cpp's set_swa_pattern: Gemma 3 every layer but each sixth, Gemma 2 the even
    ones) and the rope each kind uses."""
    hp = cases["gemma3_f32_w5"].model.hp
    assert [hp.layer_window(il) for il in range(7)] == [5, 5, 5, 5, 5, 0, 5]
    assert [hp.layer_rope(il) for il in (0, 5, 6)] == [(10000.0, 1.0), (1e6, 1.0), (10000.0, 1.0)]
    hp = cases["gemma3_f16_linear8"].model.hp
    assert [hp.layer_rope(il) for il in (4, 5)] == [(10000.0, 1.0), (10000.0, 8.0)]
    hp = cases["gemma2_f32_w5"].model.hp
    assert [hp.layer_window(il) for il in range(3)] == [5, 0, 5]
    assert hp.rope_theta == 10000.0 and hp.layer_rope(0) == hp.layer_rope(1)
    assert cases["gemma2_f16_w7_base"].model.hp.rope_theta == 50000.0


def _decode_loop(m: LlamaRef, tokens) -> np.ndarray:
    """A second reading of the qwen3 / gemma2 / gemma3 math, independent of ref_llama's Family table: one
    token at a time against a growing K/V list, one head at a time, rope as a complex rotation of the halves
    (x[i] + i x[i + d/2]), the layer kinds spelled out per architecture."""
    hp, w, arch = m.hp, m.w, m.hp.arch
    gemma = arch.startswith("gemma")
    hd, group = hp.head_dim, hp.n_head // hp.n_head_kv

    def rms(v, g):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + hp.norm_eps) * g

    def rope(v, pos, base, scale):
        half = hd // 2
        z = (v[..., :half] + 1j * v[..., half:]) * np.exp(1j * (pos / scale) * base ** (-np.arange(half) / half))
        return np.concatenate([z.real, z.imag], axis=-1)

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))

    keys = [[] for _ in range(hp.n_layer)]
    vals = [[] for _ in range(hp.n_layer)]
    out = []
    for pos, t in enumerate(tokens):
        x = w["token_embd.weight"][t] * (float(np.float32(np.sqrt(hp.n_embd))) if gemma else 1.0)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            sliding = {"gemma2": il % 2 == 0, "gemma3": il % 6 != 5}.get(arch, False)
            base, scale = (10000.0, 1.0) if arch == "gemma3" and sliding else (hp.rope_theta, hp.rope_scale)
            h = rms(x, w[p + "attn_norm.weight"])
            q = (w[p + "attn_q.weight"] @ h).reshape(hp.n_head, hd)
            k = (w[p + "attn_k.weight"] @ h).reshape(hp.n_head_kv, hd)
            v = (w[p + "attn_v.weight"] @ h).reshape(hp.n_head_kv, hd)
            if arch in ("qwen3", "gemma3"):
                q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
            keys[il].append(rope(k, pos, base, scale))
            vals[il].append(v)
            q = rope(q, pos, base, scale)
            first = max(0, pos - hp.n_swa + 1) if sliding else 0
            o = np.zeros((hp.n_head, hd))
            for hq in range(hp.n_head):
                kv = hq // group
                s = np.array([q[hq] @ keys[il][j][kv] for j in range(first, pos + 1)]) / np.sqrt(hd)
                if arch == "gemma2":
                    s = hp.attn_softcap * np.tanh(s / hp.attn_softcap)
                e = np.exp(s - s.max())
                for j in range(first, pos + 1):
                    o[hq] += e[j - first] / e.sum() * vals[il][j][kv]
            a = w[p + "attn_output.weight"] @ o.reshape(-1)
            x = x + (rms(a, w[p + "post_attention_norm.weight"]) if gemma else a)
            h = rms(x, w[p + "ffn_norm.weight"])
            g, u = w[p + "ffn_gate.weight"] @ h, w[p + "ffn_up.weight"] @ h
            f = w[p + "ffn_down.weight"] @ ((gelu(g) if gemma else g / (1 + np.exp(-g))) * u)
            x = x + (rms(f, w[p + "post_ffw_norm.weight"]) if gemma else f)
        logits = w.get("output.weight", w["token_embd.weight"]) @ rms(x, w["output_norm.weight"])
        if arch == "gemma2":
            logits = hp.final_softcap * np.tanh(logits / hp.final_softcap)
        out.append(logits)
    return np.array(out)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_reference_matches_decode_loop(cases, config):
    c = cases[config]
    assert rel_err(_decode_loop(c.model, c.tokens), c.ref).max() < 1e-10


def _ref_with(c: Case, hp: dict | None = None, family: dict | None = None, weights: dict | None = None):
    """The reference's logits with some hyper-parameters, family traits or weights changed."""
    m = c.model
    fam = dataclasses.replace(m.fam, **(family or {}))
    return LlamaRef(dataclasses.replace(m.hp, **(hp or {})), {**m.w, **(weights or {})}, fam).forward(c.tokens)


def _ones(c: Case, suffix: str) -> dict:
    return {k: np.ones_like(v) for k, v in c.model.w.items() if k.endswith(suffix)}


def _differs(name: str, got: np.ndarray, ref: np.ndarray, first: int = 1) -> None:
    """Every row from `first` on differs by more than ten times the test tolerance (row 0 attends only to
    itself, so what changes q, k or positions alone leaves it as it is)."""
    err = rel_err(got[first:], ref[first:])
    assert err.min() > 10 * TOL, f"{name}: the feature changes row {first + int(err.argmin())} by {err.min():.2g}"


def test_features_matter(cases):
    """Each feature changes the reference's logits, so kvllm cannot match while ignoring it."""
    for name in ("qwen3_f32_untied_hd32", "qwen3_f16_tied_hd16", "gemma3_f32_w5", "gemma3_q8_0_w6_mqa"):
        c = cases[name]
        _differs(f"{name} q/k norms", _ref_with(c, family=dict(qk_norm=False)), c.ref)
        _differs(f"{name} q/k norm weights", _ref_with(c, weights={**_ones(c, "attn_q_norm.weight"),
                                                                    **_ones(c, "attn_k_norm.weight")}), c.ref)
        _differs(f"{name} rope on halves", _ref_with(c, family=dict(rope="adjacent")), c.ref)
    for name in ("gemma3_f32_w5", "gemma3_q8_0_w6_mqa", "gemma3_f16_linear8", "gemma2_f32_w5", "gemma2_f16_w7_base"):
        c = cases[name]
        n_swa = c.model.hp.n_swa
        full = _ref_with(c, hp=dict(n_swa=10 ** 6))                                # same layer kinds, no mask
        assert np.abs(full[:n_swa] - c.ref[:n_swa]).max() == 0, name              # within the window: identical
        _differs(f"{name} window", full, c.ref, first=n_swa)                       # beyond it: every row
        every = _ref_with(c, hp=dict(swa_pattern=0))                                # the global layers slide too
        _differs(f"{name} global layers", every, c.ref, first=n_swa)
        _differs(f"{name} embedding scale", _ref_with(c, family=dict(embd_scale=False)), c.ref, 0)
        _differs(f"{name} post-norms", _ref_with(c, family=dict(post_norms=False)), c.ref, 0)
        _differs(f"{name} post-norm weights", _ref_with(c, weights=_ones(c, "post_ffw_norm.weight")), c.ref, 0)
        _differs(f"{name} GeGLU", _ref_with(c, family=dict(ffn="swiglu")), c.ref, 0)
    c = cases["gemma3_f32_w5"]
    _differs("gemma3 sliding layers' rope base", _ref_with(c, hp=dict(rope_theta_swa=0.0)), c.ref)
    _differs("gemma3 global layers' rope base", _ref_with(c, hp=dict(rope_theta=10000.0)), c.ref)
    c = cases["gemma3_f16_linear8"]
    _differs("gemma3 linear scaling", _ref_with(c, hp=dict(rope_scale=1.0)), c.ref)
    _differs("gemma3 sliding layers unscaled", _ref_with(c, hp=dict(rope_theta_swa=0.0)), c.ref)
    for name in ("gemma2_f32_w5", "gemma2_f16_w7_base"):
        c = cases[name]
        _differs(f"{name} attention soft-cap", _ref_with(c, hp=dict(attn_softcap=0.0)), c.ref)
        _differs(f"{name} final soft-cap", _ref_with(c, hp=dict(final_softcap=0.0)), c.ref, 0)
    c = cases["gemma2_f16_w7_base"]
    _differs("gemma2 rope base", _ref_with(c, hp=dict(rope_theta=10000.0)), c.ref)


# ---- kvllm ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_match_reference(kvllm, cases, tmp_path, config, mode):
    check_logits(kvllm, cases[config], tmp_path / "logits.bin", config, mode)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_info_names_the_architecture(run, cases, config):
    check_info(run, cases[config].path, CONFIGS[config].arch)


def test_asan_families(asan_bin, cases, tmp_path):
    """One case per family under AddressSanitizer, with the cache and without."""
    for config in ("qwen3_f16_tied_hd16", "gemma3_q8_0_w6_mqa", "gemma2_f32_w5"):
        for mode in ("prefill_7", "no_kv_cache"):
            check_logits(asan_bin, cases[config], tmp_path / "logits.bin", config, mode)
