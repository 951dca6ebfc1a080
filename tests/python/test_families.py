"""The newer families against the numpy reference: Qwen3 (per-head q/k norms, head_dim from key_length),
Gemma 3 (q/k norms, pre- and post-norms, GeGLU, embedding scale, five sliding-window layers per global one
with their own rope base, linear rope scaling on global layers only), Gemma 2 (sliding window on even
layers, attention and final logit soft-capping), Phi-3 (fused QKV and gate-up, partial rotary, LongRoPE),
SmolLM3 (every fourth layer without rope) and mixtures of experts (Mixtral-style llama, Qwen3-MoE), as GGUF
files written by gen_model.py the way llama.cpp's converter writes them.

Each config is checked at every position with the KV cache (prefill all / prefill 1 + decode / prefill 7 +
decode) and without it (--no-kv-cache): max|kvllm - ref| / max|ref| <= 1e-4 per row, with test_archs.py's
helpers.
The windows are small (5-7 tokens over 26) and the Gemma 3 models have 7 layers, so sliding and global
layers both run and every window is crossed; the expert routers' choices have margins that float32 cannot
flip (test_routing_has_margins).  Every feature is shown to change the reference's logits
(test_*_features_matter), and the reference itself is checked against a second, token-by-token reading of
the same math (test_reference_matches_decode_loop), so a kvllm that ignored a feature could not pass.
"""
from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest

from gen_model import GEMMA, KEY_LENGTH, QK_NORM, ModelConfig, longrope_attn_factor
from ref_llama import LlamaRef, rel_err
from test_archs import MODES, TOL, Case, check_info, check_logits, check_not_degenerate, make_cases
from gen_model import write_model
from kvtest import eval_logits

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
    # rope on 12 of 16 dims (Phi-4-mini's 0.75); context 256 over an original 64: the long factors
    "phi3_f32_longrope_long": ModelConfig(arch="phi3", n_vocab=400, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                          n_ff=128, n_rot=12, n_ctx=256, n_ctx_orig=64, longrope=True,
                                          rope_theta=10000.0),
    # context = original: the short factors, attn_factor 1 (512, not less: llama.cpp pads its context to 256,
    # which would pick the long factors for a smaller original context)
    "phi3_f16_longrope_short": ModelConfig(arch="phi3", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=4,
                                           n_ff=96, n_ctx=512, n_ctx_orig=512, longrope=True, dtype="f16"),
    # no LongRoPE; rope on 8 of 32 dims
    "phi3_q8_0_tied_rot8": ModelConfig(arch="phi3", n_vocab=320, n_embd=64, n_layer=3, n_head=2, n_head_kv=1,
                                       n_ff=96, n_rot=8, dtype="q8_0", tied=True),
    # layers 3 and 7 skip rope
    "smollm3_f32_tied_8l": ModelConfig(arch="smollm3", n_vocab=320, n_embd=64, n_layer=8, n_head=4, n_head_kv=2,
                                       n_ff=96, rope_theta=5e6, tied=True),
    "smollm3_f16_4l": ModelConfig(arch="smollm3", n_vocab=320, n_embd=64, n_layer=4, n_head=4, n_head_kv=1,
                                  n_ff=96, dtype="f16"),
    # Mixtral as its converter writes it: llama with experts of feed_forward_length
    "mixtral_f32_4x2": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=64,
                                   n_expert=4, n_expert_used=2),
    "mixtral_q8_0_8x2_tied": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=1,
                                         n_ff=64, n_expert=8, n_expert_used=2, dtype="q8_0", tied=True),
    "qwen3moe_f32_8x2": ModelConfig(arch="qwen3moe", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                    key_length=32, n_ff=192, n_ff_exp=32, n_expert=8, n_expert_used=2,
                                    rope_theta=1e6, norm_eps=1e-6),
    # an expert wider than everything else (feed_forward_length, n_embd, the query heads): its down rows are
    # the longest any matmul reads
    "qwen3moe_f32_wide_experts": ModelConfig(arch="qwen3moe", n_vocab=320, n_embd=32, n_layer=2, n_head=2,
                                             n_head_kv=1, key_length=16, n_ff=24, n_ff_exp=96, n_expert=4,
                                             n_expert_used=2),
    "qwen3moe_f16_7x3_tied": ModelConfig(arch="qwen3moe", n_vocab=330, n_embd=64, n_layer=3, n_head=4, n_head_kv=4,
                                         n_ff=96, n_ff_exp=40, n_expert=7, n_expert_used=3, dtype="f16", tied=True),
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
        value = lambda k: f(k).contents()
        names = {t.name for t in r.tensors}
        if arch in KEY_LENGTH:                                   # head_dim from key_length, n_rot defaults to it
            assert value("attention.key_length") == value("attention.value_length") == cfg.head_dim, name
            assert f("rope.dimension_count") is None, name
        else:
            assert f("attention.key_length") is None and value("rope.dimension_count") == cfg.rot, name
        assert ("output.weight" in names) == (not cfg.tied), name
        # gguf-py 0.17 has no smollm3 entry; its tensors are llama's
        table = gguf.MODEL_TENSORS[gguf.MODEL_ARCH.__members__.get(arch.upper(), gguf.MODEL_ARCH.LLAMA)]
        allowed = {gguf.TENSOR_NAMES[t] for t in table}
        for t in r.tensors:
            base = t.name.rsplit(".", 1)[0]
            base = "blk.{bid}." + base.split(".", 2)[2] if base.startswith("blk.") else base
            assert base in allowed, (name, t.name)
            if t.name.endswith(("norm.weight", "ffn_gate_inp.weight", "rope_factors_long.weight")):
                assert t.tensor_type == gguf.GGMLQuantizationType.F32, (name, t.name)
        qk = {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"}
        assert qk <= names if arch in QK_NORM else not qk & names, name
        post = {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"}
        assert post <= names if arch in GEMMA else not post & names, name
        assert not any(n.endswith(".bias") for n in names), name
        if arch == "gemma2":
            assert value("attn_logit_softcapping") == pytest.approx(cfg.attn_softcap)
            assert value("final_logit_softcapping") == pytest.approx(cfg.final_softcap)
            assert (f("rope.freq_base") is None) == (cfg.rope_theta == 10000.0), name
        else:
            assert f("attn_logit_softcapping") is None and f("final_logit_softcapping") is None, name
        if arch in GEMMA or arch == "phi3":
            assert value("attention.sliding_window") == cfg.n_swa, name      # phi3: 0, as for Phi-4
        else:
            assert f("attention.sliding_window") is None, name
        if cfg.n_expert:
            assert (value("expert_count"), value("expert_used_count")) == (cfg.n_expert, cfg.n_expert_used), name
            assert (f("expert_feed_forward_length") is not None) == (arch == "qwen3moe"), name
            assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_inp.weight"} <= names and \
                "blk.0.ffn_gate.weight" not in names, name
            t = {t.name: t for t in r.tensors}["blk.0.ffn_down_exps.weight"]
            assert t.shape.tolist() == [cfg.ff_exp, cfg.n_embd, cfg.n_expert], name       # ne: reversed numpy
        else:
            assert f("expert_count") is None, name
        if arch == "phi3":
            assert value("rope.scaling.original_context_length") == (cfg.n_ctx_orig or cfg.n_ctx), name
            assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= names and "blk.0.attn_q.weight" not in names
            assert ("rope_factors_long.weight" in names) == ("rope_factors_short.weight" in names) == cfg.longrope
            assert (f("rope.scaling.attn_factor") is not None) == cfg.longrope, name
    r = gguf.GGUFReader(cases["gemma3_f16_linear8"].path)
    assert r.get_field("gemma3.rope.scaling.type").contents() == "linear"
    assert r.get_field("gemma3.rope.scaling.factor").contents() == pytest.approx(8.0)
    cfg = CONFIGS["phi3_f32_longrope_long"]                              # the converter's formula, scale 4
    assert longrope_attn_factor(cfg) == pytest.approx(np.sqrt(1 + np.log(256 / 64) / np.log(64)))


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
    hp = cases["smollm3_f32_tied_8l"].model.hp
    assert [il for il in range(8) if not hp.layer_uses_rope(il)] == [3, 7]
    long, short = cases["phi3_f32_longrope_long"].model.hp, cases["phi3_f16_longrope_short"].model.hp
    assert long.rope_long and long.rope_attn_factor > 1.1 and long.n_rot == 12
    assert not short.rope_long and short.rope_attn_factor == 1.0
    assert cases["qwen3moe_f32_8x2"].model.hp.n_ff_exp == 32 and cases["mixtral_f32_4x2"].model.hp.n_ff_exp == 64


@pytest.mark.parametrize("config", [k for k, cfg in CONFIGS.items() if cfg.n_expert])
def test_routing_has_margins(cases, config):
    """At every token and layer the last expert kept and the first one dropped differ by more than float32's
    rounding could move them (router logits 1e-3 apart), so kvllm must pick the reference's experts; and every
    expert is picked somewhere."""
    c = cases[config]
    inputs: list = []
    c.model.forward(c.tokens, ffn_inputs=inputs)
    k, picked = c.model.hp.n_expert_used, set()
    for il, h in enumerate(inputs):
        logits, top, _ = c.model.routing(h, f"blk.{il}.")
        s = -np.sort(-logits, axis=-1)
        assert (s[:, k - 1] - s[:, k]).min() > 1e-3, (config, il, (s[:, k - 1] - s[:, k]).min())
        picked |= set(top.ravel().tolist())
    assert picked == set(range(c.model.hp.n_expert)), config


def _decode_loop(m: LlamaRef, tokens) -> np.ndarray:
    """A second reading of the families' math, independent of ref_llama's Family table: one token at a time
    against a growing K/V list, one head at a time, rope as a complex rotation, experts chosen by sorting and
    weighted by a softmax over the chosen logits, the layer kinds spelled out per architecture."""
    hp, w, arch = m.hp, m.w, m.hp.arch
    gemma = arch.startswith("gemma")
    hd, group, n_rot = hp.head_dim, hp.n_head // hp.n_head_kv, hp.n_rot
    adjacent = arch in ("llama", "smollm3")         # LlamaModel's converter permutes Q/K rows into pairs

    def rms(v, g):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + hp.norm_eps) * g

    def rope(v, pos, base, scale):
        """Pairs (v[i], v[i + n_rot/2]), or (v[2i], v[2i+1]) for the llama-converted files, as complex numbers,
        times e^(i angle); dims past n_rot as they are."""
        half = n_rot // 2
        re, im = (v[..., 0:n_rot:2], v[..., 1:n_rot:2]) if adjacent else (v[..., :half], v[..., half:n_rot])
        inv = base ** (-np.arange(half) / half)
        if arch == "phi3" and "rope_factors_long.weight" in w:
            inv = inv / w["rope_factors_long.weight" if hp.rope_long else "rope_factors_short.weight"]
        z = (re + 1j * im) * np.exp(1j * (pos / scale) * inv) * hp.rope_attn_factor
        out = v.copy()
        if adjacent:
            out[..., 0:n_rot:2], out[..., 1:n_rot:2] = z.real, z.imag
        else:
            out[..., :half], out[..., half:n_rot] = z.real, z.imag
        return out

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))

    def silu(v):
        return v / (1 + np.exp(-v))

    def ffn(h, p):
        if hp.n_expert:
            logits = w[p + "ffn_gate_inp.weight"] @ h
            chosen = sorted(range(hp.n_expert), key=lambda e: -logits[e])[:hp.n_expert_used]
            weights = np.exp(logits[chosen] - logits[chosen].max())
            f = np.zeros_like(h)
            for e, we in zip(chosen, weights / weights.sum()):
                f += we * (w[p + "ffn_down_exps.weight"][e] @ (silu(w[p + "ffn_gate_exps.weight"][e] @ h) *
                                                               (w[p + "ffn_up_exps.weight"][e] @ h)))
            return f
        if arch == "phi3":
            gu = w[p + "ffn_up.weight"] @ h
            g, u = gu[:hp.n_ff], gu[hp.n_ff:]
        else:
            g, u = w[p + "ffn_gate.weight"] @ h, w[p + "ffn_up.weight"] @ h
        return w[p + "ffn_down.weight"] @ ((gelu(g) if gemma else silu(g)) * u)

    keys = [[] for _ in range(hp.n_layer)]
    vals = [[] for _ in range(hp.n_layer)]
    out = []
    for pos, t in enumerate(tokens):
        x = w["token_embd.weight"][t] * (float(np.float32(np.sqrt(hp.n_embd))) if gemma else 1.0)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            sliding = {"gemma2": il % 2 == 0, "gemma3": il % 6 != 5}.get(arch, False)
            roped = not (arch == "smollm3" and il % 4 == 3)
            base, scale = (10000.0, 1.0) if arch == "gemma3" and sliding else (hp.rope_theta, hp.rope_scale)
            h = rms(x, w[p + "attn_norm.weight"])
            if arch == "phi3":
                qkv = w[p + "attn_qkv.weight"] @ h
                q, k, v = np.split(qkv, [hp.n_head * hd, (hp.n_head + hp.n_head_kv) * hd])
            else:
                q, k, v = w[p + "attn_q.weight"] @ h, w[p + "attn_k.weight"] @ h, w[p + "attn_v.weight"] @ h
            q, k, v = q.reshape(hp.n_head, hd), k.reshape(hp.n_head_kv, hd), v.reshape(hp.n_head_kv, hd)
            if arch in ("qwen3", "qwen3moe", "gemma3"):
                q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
            if roped:
                q, k = rope(q, pos, base, scale), rope(k, pos, base, scale)
            keys[il].append(k)
            vals[il].append(v)
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
            f = ffn(rms(x, w[p + "ffn_norm.weight"]), p)
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


# Each feature changes the reference's logits, so kvllm cannot match while ignoring it.

def test_qk_norm_features_matter(cases):
    for name in ("qwen3_f32_untied_hd32", "qwen3_f16_tied_hd16", "gemma3_f32_w5", "gemma3_q8_0_w6_mqa"):
        c = cases[name]
        _differs(f"{name} q/k norms", _ref_with(c, family=dict(qk_norm=False)), c.ref)
        _differs(f"{name} q/k norm weights", _ref_with(c, weights={**_ones(c, "attn_q_norm.weight"),
                                                                    **_ones(c, "attn_k_norm.weight")}), c.ref)
        _differs(f"{name} rope on halves", _ref_with(c, family=dict(rope="adjacent")), c.ref)


def test_gemma_features_matter(cases):
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


def test_phi3_features_matter(cases):
    for name in ("phi3_f32_longrope_long", "phi3_f16_longrope_short", "phi3_q8_0_tied_rot8"):
        c = cases[name]
        _differs(f"{name} rope on halves", _ref_with(c, family=dict(rope="adjacent")), c.ref)
        up = {k: np.concatenate(np.split(v, 2)[::-1]) for k, v in c.model.w.items() if k.endswith("ffn_up.weight")}
        _differs(f"{name} gate half first", _ref_with(c, weights=up), c.ref, 0)
    c = cases["phi3_q8_0_tied_rot8"]
    _differs("phi3 partial rotary", _ref_with(c, hp=dict(n_rot=32)), c.ref)
    c = cases["phi3_f32_longrope_long"]
    _differs("phi3 long factors", _ref_with(c, hp=dict(rope_long=False)), c.ref)
    _differs("phi3 attn_factor", _ref_with(c, hp=dict(rope_attn_factor=1.0)), c.ref)
    c = cases["phi3_f16_longrope_short"]
    _differs("phi3 short factors", _ref_with(c, hp=dict(rope_long=True)), c.ref)
    no_factors = {k: np.ones_like(v) for k, v in c.model.w.items() if k.startswith("rope_factors")}
    _differs("phi3 short factors vs none", _ref_with(c, weights=no_factors), c.ref)


def test_smollm3_features_matter(cases):
    for name in ("smollm3_f32_tied_8l", "smollm3_f16_4l"):
        c = cases[name]
        _differs(f"{name} unroped layers", _ref_with(c, hp=dict(n_no_rope_layer_step=0)), c.ref)


def test_moe_features_matter(cases):
    for name, cfg in CONFIGS.items():
        if not cfg.n_expert:
            continue
        c = cases[name]
        _differs(f"{name} top-k", _ref_with(c, hp=dict(n_expert_used=cfg.n_expert_used + 1)), c.ref, 0)
        _differs(f"{name} renormalised", _ref_with(c, hp=dict(expert_weights_norm=False)), c.ref, 0)


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
    for config in ("qwen3_f16_tied_hd16", "gemma3_q8_0_w6_mqa", "gemma2_f32_w5", "phi3_f32_longrope_long",
                   "qwen3moe_f32_8x2"):
        for mode in ("prefill_7", "no_kv_cache"):
            check_logits(asan_bin, cases[config], tmp_path / "logits.bin", config, mode)


# ---- long contexts and batches --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["prefill_all", "prefill_300"])
def test_gemma3_window_across_attention_splits(kvllm, tmp_path, mode):
    """2,500 positions with a window of 1,100 on five sliding layers and a global one: late tokens' windows
    start inside the second attention split (PAGED_ATTN_SPLIT = 1024) and end in the third, while the global
    layer reads all three; in one prefill and in chunks of 300."""
    cfg = ModelConfig(arch="gemma3", n_vocab=300, n_embd=32, n_layer=6, n_head=2, n_head_kv=1, key_length=16,
                      n_ff=48, n_ctx=4096, n_swa=1100, rope_theta=1e6, norm_eps=1e-6, tied=True)
    path = write_model(tmp_path / "gemma3_long.gguf", cfg, seed=77)
    tokens = [1] + np.random.default_rng(9).integers(3, 300, size=2499).tolist()
    model = LlamaRef.from_gguf(path)
    ref = model.forward(tokens)
    assert [model.hp.layer_window(il) for il in range(6)] == [1100] * 5 + [0]
    got = eval_logits(kvllm, path, tokens, tmp_path / "logits.bin", **({} if mode == "prefill_all" else
                                                                        dict(prefill=300)))
    err = rel_err(got, ref)
    assert err.max() <= TOL, f"{mode}: rel err {err.max():.3g} at position {int(err.argmax())}"
    full = LlamaRef(dataclasses.replace(model.hp, n_swa=10 ** 6), model.w, model.fam).forward(tokens[:1400])
    assert rel_err(full[1100:], ref[1100:1400]).min() > 10 * TOL, "the window changes nothing here"


FAMILY_BATCH_MODELS = {
    # window 12 under prompts of up to 80 tokens; layer 5 global
    "gemma3": ModelConfig(arch="gemma3", n_vocab=320, n_embd=64, n_layer=7, n_head=4, n_head_kv=2, key_length=16,
                          n_ff=96, n_ctx=256, n_swa=12, rope_theta=1e6, tied=True),
    "gemma2": ModelConfig(arch="gemma2", n_vocab=320, n_embd=64, n_layer=3, n_head=4, n_head_kv=2, key_length=16,
                          n_ff=96, n_ctx=256, n_swa=9, attn_softcap=1.5, final_softcap=3.0, tied=True),
    "qwen3moe": ModelConfig(arch="qwen3moe", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                            key_length=16, n_ff=96, n_ff_exp=32, n_expert=8, n_expert_used=2, n_ctx=256),
    "phi3_longrope": ModelConfig(arch="phi3", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                                 n_rot=12, n_ctx=256, n_ctx_orig=64, longrope=True),
}


@pytest.fixture(scope="module")
def family_batch_setup(kvllm, tmp_path_factory):
    from test_archs import _run_batch
    d = tmp_path_factory.mktemp("families_batch")
    rng = np.random.default_rng(18)
    prefix = [1] + rng.integers(3, 320, size=30).tolist()
    prompts = [(prefix if i % 2 else [1]) + rng.integers(3, 320, size=int(rng.integers(3, 50))).tolist()
               for i in range(6)]
    out = {}
    for name, cfg in FAMILY_BATCH_MODELS.items():
        model = write_model(d / f"{name}.gguf", cfg, seed=31)
        alone = [_run_batch(kvllm, d, model, [p], f"{name}_alone{i}") for i, p in enumerate(prompts)]
        out[name] = (model, [a[0][0] for a in alone], np.stack([a[1][0] for a in alone]))
    return d, prompts, out


@pytest.mark.parametrize("setting", ["default", "chunk_7", "block_size_5", "preempt", "threads_1"])
@pytest.mark.parametrize("arch", list(FAMILY_BATCH_MODELS))
def test_family_batch_invariance(kvllm, family_batch_setup, arch, setting):
    """test_archs' batch invariance for the new families: each prompt's greedy ids and logits are the same run
    alone or batched with the others (sliding windows crossed, experts grouped across sequences)."""
    from test_archs import BATCH_SETTINGS, _run_batch
    d, prompts, out = family_batch_setup
    model, want_ids, want_logits = out[arch]
    ids, logits = _run_batch(kvllm, d, model, prompts, f"{arch}_{setting}", *BATCH_SETTINGS[setting])
    assert ids == want_ids, f"{arch}/{setting}: greedy ids differ from the prompts run alone"
    diff = np.abs(logits - want_logits).max() / np.abs(want_logits).max()
    assert diff <= 1e-6, f"{arch}/{setting}: max|batched - alone| / max|alone| = {diff:.3g}"
