"""ref_llama.py — a plain numpy float64 decoder forward pass, the oracle for kvllm's logits.

Written from each architecture's math (Transformers' modeling_*.py, the papers, and for the GGUF layout
llama.cpp's convert_hf_to_gguf.py), not from kvllm's C code.  The Llama pass:

    x = token_embd[tokens]
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h Wq^T, h Wk^T, h Wv^T          (split into heads of head_dim)
                rope(q), rope(k)                          GGUF-llama convention: ADJACENT pairs
                                                          (x[2i], x[2i+1]) rotated by pos * theta^(-2i/n_rot),
                                                          i < n_rot/2; dims >= n_rot untouched
                attn = softmax(q k^T / sqrt(head_dim) + causal mask) v
                                                          query head h reads kv head h // (n_head / n_head_kv)
                x += attn Wo^T
                h = rmsnorm(x) * ffn_norm
                x += (silu(h Wgate^T) * (h Wup^T)) Wdown^T
    logits = (rmsnorm(x) * output_norm) Wout^T            Wout = token_embd when output.weight is absent

rmsnorm(x) = x / sqrt(mean(x^2) + eps).  All weights are upcast to float64 (F16 exactly, quantized
types through gguf.quants.dequantize), so the only rounding is float64's.

Every other architecture is the same pass with a different Family (the table FAMILIES below) and
hyper-parameters read from its file:
  mistral / llama with <arch>.attention.sliding_window W: query i attends keys j with i - W < j <= i
  llama with rope_freqs.weight f (Llama 3 rope scaling): pair i turns by pos * theta^(-2i/n_rot) / f[i]
  <arch>.rope.scaling.type linear, factor s: positions are divided by s before rope
  qwen2:  + biases on q, k, v; rope rotates HALVES (x[i], x[i + n_rot/2]) — the GGUF "neox"
          convention, since its converter does not permute Q/K as the llama one does
  gpt2:   x = token_embd[tokens] + position_embd[pos]; no rope
          layernorm(x) = (x - mean) / sqrt(var + eps) * w + b   (attn_norm, ffn_norm, output_norm)
          q, k, v = split(h Wqkv^T + bqkv) in that order;  x += attn Wo^T + bo
          x += gelu(h Wup^T + bup) Wdown^T + bdown,  gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
  qwen3 (modeling_qwen3.py): no biases; q and k of each head RMS-normed over head_dim with attn_q_norm /
          attn_k_norm (head_dim,) BEFORE rope; rope on halves; head_dim = <arch>.attention.key_length,
          which need not be n_embd / n_head
  gemma2 (modeling_gemma2.py), gemma3 (modeling_gemma3.py):
          x = token_embd[tokens] * sqrt(n_embd)               (sqrt rounded to f32, as both llama.cpp and
                                                              Transformers multiply by an f32 scalar)
          h = x + rmsnorm(attn(rmsnorm(x) * attn_norm)) * post_attention_norm
          x = h + rmsnorm(ffn(rmsnorm(h) * ffn_norm)) * post_ffw_norm
          ffn(h) = (gelu_tanh(h Wgate^T) * (h Wup^T)) Wdown^T
          Gemma's RMSNorm multiplies by (1 + w); the converter stores 1 + w, so the file's w is used as is.
          Attention scale 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim; llama.cpp uses n_embd / n_head
          only for the 27B models, by layer count — no generated model has those counts).  Rope on halves.
          Sliding-window layers: with pattern P, layer il slides iff il % P < P - 1 (llama.cpp's
          set_swa_pattern; Transformers' layer_types): gemma2 P = 2 (even layers), gemma3 P = 6.
          gemma2: scores = cap * tanh(scores / cap) with cap = <arch>.attn_logit_softcapping, after the
                  scaling and before the mask and softmax; logits = cap' * tanh(logits / cap') with
                  cap' = <arch>.final_logit_softcapping; one rope base for every layer; window 4096 when
                  the file has none (llama.cpp's default)
          gemma3: q/k norms as qwen3; sliding layers use rope base 10000 and no rope scaling (Transformers'
                  rope_local_base_freq, llama.cpp's rope_freq_base_train_swa), global layers the file's
                  rope.freq_base and its linear scaling; no soft-capping
  phi3 (modeling_phi3.py): q, k, v = split(h Wqkv^T); ffn = silu(g) * u with g, u the first and second halves
          of h Wup^T (Transformers' gate_up_proj); rope on halves of the first n_rot = rope.dimension_count dims
          (partial rotary); LongRoPE: pair i's frequency divided by rope_factors_long[i] when the context
          (context_length) exceeds rope.scaling.original_context_length, else by rope_factors_short[i] —
          llama.cpp's choice at its default context — and cos, sin times rope.scaling.attn_factor; the file's
          sliding_window is ignored, as llama.cpp does
  smollm3 (modeling_smollm3.py): llama, but layers il with (il + 1) % 4 == 0 skip rope (Transformers'
          no_rope_layers with no_rope_layer_interval 4; llama.cpp's n_no_rope_layer_step, fixed at 4)
  mixture of experts — llama with <arch>.expert_count (Mixtral, modeling_mixtral.py) and qwen3moe
          (modeling_qwen3_moe.py, qwen3 attention):
          p = softmax(h Wgate_inp^T) over all n_expert experts; the expert_used_count largest are kept and
          renormalised to sum 1 (= softmax over the kept logits; Qwen3-MoE's norm_topk_prob, which every
          released model sets and llama.cpp always applies);  ffn(h) = sum_e p_e * down_e(silu(gate_e h) * up_e h)
          with ffn_{gate,up}_exps (n_expert, n_ff_exp, n_embd), ffn_down_exps (n_expert, n_embd, n_ff_exp);
          n_ff_exp = expert_feed_forward_length (qwen3moe) or feed_forward_length (llama)
  gpt-oss (modeling_gpt_oss.py): biases on q, k, v and attn_output; rope on halves, with YaRN
          (rope.scaling.type yarn, factor s, original_context_length C, beta_fast 32, beta_slow 1): pair i's
          frequency f_i = theta^(-2i/n_rot) becomes f_i / s * (1 - mix_i) + f_i * mix_i with mix_i = 1 -
          clamp((i - lo) / max(hi - lo, 0.001), 0, 1), lo = max(0, floor(d(beta_fast))), hi = min(n_rot - 1,
          ceil(d(beta_slow))), d(b) = n_rot ln(C / (2 pi b)) / (2 ln theta) (llama.cpp truncates the ramp's
          ends, Transformers' truncate=True), and cos, sin times 1 + 0.1 ln s;
          attention sinks: head h's softmax runs over its scores and the learned logit attn_sinks[h], whose
          probability is dropped (it weighs no value); even layers slide (pattern 2) over
          attention.sliding_window; the FFN input is normed by post_attention_norm (Transformers'
          post_attention_layernorm: there is no ffn_norm); router logits h Wgate_inp^T + b, the top-k kept
          and softmaxed among themselves; each expert e: g = h gate_e^T + bg_e, u = h up_e^T + bu_e,
          g' = min(g, 7), u' = clamp(u, -7, 7), y = (g' sigmoid(1.702 g') (u' + 1)) down_e^T + bd_e
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import gguf


@dataclass(frozen=True)
class Family:
    """What one architecture does differently from Llama; the forward pass reads only this and HParams."""
    norm: str = "rms"              # rms: x / sqrt(mean(x^2) + eps) * w;  layer: LayerNorm with weight and bias
    rope: str = "adjacent"         # pairs rotated: adjacent (x[2i], x[2i+1]) | halves (x[i], x[i + n_rot/2]) | none
    qkv_fused: bool = False        # one attn_qkv (rows q, k, v) instead of attn_q / attn_k / attn_v
    qkv_bias: bool = False         # biases on the q, k, v projections
    out_bias: bool = False         # biases on attn_output, ffn_up and ffn_down
    qk_norm: bool = False          # per-head RMSNorm of q and k (attn_q_norm, attn_k_norm) before rope
    post_norms: bool = False       # each branch's output normed (post_attention_norm, post_ffw_norm) before its add
    ffn: str = "swiglu"            # swiglu: silu(gate) * up | geglu: gelu_tanh(gate) * up | gelu: gelu_tanh(up)
                                   # | swiglu_fused: swiglu with gate and up the two halves of ffn_up
    embd_scale: bool = False       # token embeddings times sqrt(n_embd)
    learned_pos: bool = False      # position_embd added to the embeddings
    swa_pattern: int = 0           # with a window: layer il slides iff il % P < P - 1; 0: every layer slides
    swa_rope_theta: float = 0.0    # > 0: sliding layers use this rope base and no rope scaling
    n_swa_default: int = 0         # window when the file has no sliding_window key
    head_dim_key: bool = False     # head_dim from <arch>.attention.key_length (else n_embd / n_head unless present)
    window_key: bool = True        # whether <arch>.attention.sliding_window is honoured
    no_rope_step: int = 0          # > 0: layers with (il + 1) % step == 0 skip rope
    sinks: bool = False            # attn_sinks: a learned logit per head in each softmax (gpt-oss)
    ffn_norm: str = "ffn_norm"     # the FFN input's norm (gpt-oss: post_attention_norm)
    moe_bias: bool = False         # router and expert biases (gpt-oss)
    o_bias: bool = False           # attn_output bias alone (gpt-oss)


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(rope="halves", qkv_bias=True),
    "gpt2": Family(norm="layer", rope="none", qkv_fused=True, qkv_bias=True, out_bias=True, ffn="gelu",
                   learned_pos=True),
    "qwen3": Family(rope="halves", qk_norm=True, head_dim_key=True),
    "gemma2": Family(rope="halves", post_norms=True, ffn="geglu", embd_scale=True, swa_pattern=2,
                     n_swa_default=4096, head_dim_key=True),
    "gemma3": Family(rope="halves", qk_norm=True, post_norms=True, ffn="geglu", embd_scale=True, swa_pattern=6,
                     swa_rope_theta=10000.0, head_dim_key=True),
    "phi3": Family(rope="halves", qkv_fused=True, ffn="swiglu_fused", window_key=False),
    "smollm3": Family(no_rope_step=4),
    "qwen3moe": Family(rope="halves", qk_norm=True, head_dim_key=True),
    "gpt-oss": Family(rope="halves", qkv_bias=True, ffn="swiglu_oai", swa_pattern=2, head_dim_key=True, sinks=True,
                      ffn_norm="post_attention_norm", moe_bias=True, o_bias=True),
}
ARCHS = tuple(FAMILIES)


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    n_rot: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_ctx: int = 0
    arch: str = "llama"           # a FAMILIES key
    n_swa: int = 0                # sliding window (0: full causal attention)
    rope_scale: float = 1.0       # linear rope scaling factor (positions / rope_scale)
    swa_pattern: int = 0          # which layers the window applies to (Family.swa_pattern)
    rope_theta_swa: float = 0.0   # rope base of sliding layers (0: rope_theta, with rope_scale)
    attn_softcap: float = 0.0     # > 0: attention scores soft-capped at this value
    final_softcap: float = 0.0    # > 0: logits soft-capped at this value
    n_no_rope_layer_step: int = 0 # > 0: layers with (il + 1) % step == 0 skip rope
    n_expert: int = 0             # > 0: the FFN is a mixture of experts
    n_expert_used: int = 0        # experts per token (top-k)
    n_ff_exp: int = 0             # each expert's FFN width
    expert_weights_norm: bool = True   # the kept experts' probabilities renormalised to sum 1
    rope_long: bool = False       # LongRoPE: rope_factors_long (else rope_factors_short) when the file has them
    rope_attn_factor: float = 1.0 # rope's cos and sin multiplied by this
    rope_yarn: bool = False       # YaRN: rope_scale is its factor (see the module doc)
    n_ctx_orig: int = 0           # YaRN's original context
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0

    def layer_uses_rope(self, il: int) -> bool:
        return not self.n_no_rope_layer_step or (il + 1) % self.n_no_rope_layer_step != 0

    def layer_window(self, il: int) -> int:
        """Layer il's sliding window, 0 for full causal attention."""
        if not self.n_swa:
            return 0
        p = self.swa_pattern
        return self.n_swa if p == 0 or il % p < p - 1 else 0

    def layer_rope(self, il: int) -> tuple[float, float]:
        """(base, linear scale) of layer il's rope."""
        if self.layer_window(il) and self.rope_theta_swa:
            return self.rope_theta_swa, 1.0
        return self.rope_theta, self.rope_scale


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.get_field(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF key {key!r} missing")
        return default
    return f.contents()


def tensor_to_f64(t) -> np.ndarray:
    """Dequantize a gguf ReaderTensor to float64 with numpy shape (rows, cols) = reversed ne."""
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    tt = t.tensor_type
    if tt == gguf.GGMLQuantizationType.F32:
        a = np.asarray(t.data, dtype=np.float32)
    elif tt == gguf.GGMLQuantizationType.F16:
        a = np.asarray(t.data, dtype=np.float16)
    elif tt == gguf.GGMLQuantizationType.F64:
        a = np.asarray(t.data, dtype=np.float64)
    else:
        a = gguf.quants.dequantize(np.asarray(t.data), tt)
    return a.astype(np.float64).reshape(shape)


def expected_tensors(hp: HParams, fam: Family) -> dict[str, tuple[int, ...]]:
    """The tensors a model of this family must have, with numpy shapes (output.weight is optional)."""
    d, hd, ff = hp.n_embd, hp.head_dim, hp.n_ff
    qd, kvd = hp.n_head * hd, hp.n_head_kv * hd
    out = {"token_embd.weight": (hp.n_vocab, d), "output_norm.weight": (d,)}
    if fam.norm == "layer":
        out["output_norm.bias"] = (d,)
    if fam.learned_pos:
        out["position_embd.weight"] = (hp.n_ctx, d)
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        norms = ["attn_norm", fam.ffn_norm] + (["post_attention_norm", "post_ffw_norm"] if fam.post_norms else [])
        for n in norms:
            out[p + n + ".weight"] = (d,)
            if fam.norm == "layer":
                out[p + n + ".bias"] = (d,)
        if fam.qkv_fused:
            out[p + "attn_qkv.weight"] = (qd + 2 * kvd, d)
            if fam.qkv_bias:
                out[p + "attn_qkv.bias"] = (qd + 2 * kvd,)
        else:
            out.update({p + "attn_q.weight": (qd, d), p + "attn_k.weight": (kvd, d), p + "attn_v.weight": (kvd, d)})
            if fam.qkv_bias:
                out.update({p + "attn_q.bias": (qd,), p + "attn_k.bias": (kvd,), p + "attn_v.bias": (kvd,)})
        if fam.qk_norm:
            out.update({p + "attn_q_norm.weight": (hd,), p + "attn_k_norm.weight": (hd,)})
        out[p + "attn_output.weight"] = (d, qd)
        if fam.o_bias:
            out[p + "attn_output.bias"] = (d,)
        if fam.sinks:
            out[p + "attn_sinks.weight"] = (hp.n_head,)
        if hp.n_expert:
            ne, fe = hp.n_expert, hp.n_ff_exp
            out.update({p + "ffn_gate_inp.weight": (ne, d), p + "ffn_gate_exps.weight": (ne, fe, d),
                        p + "ffn_up_exps.weight": (ne, fe, d), p + "ffn_down_exps.weight": (ne, d, fe)})
            if fam.moe_bias:
                out.update({p + "ffn_gate_inp.bias": (ne,), p + "ffn_gate_exps.bias": (ne, fe),
                            p + "ffn_up_exps.bias": (ne, fe), p + "ffn_down_exps.bias": (ne, d)})
        elif fam.ffn == "swiglu_fused":
            out.update({p + "ffn_up.weight": (2 * ff, d), p + "ffn_down.weight": (d, ff)})
        else:
            out.update({p + "ffn_up.weight": (ff, d), p + "ffn_down.weight": (d, ff)})
            if fam.ffn != "gelu":
                out[p + "ffn_gate.weight"] = (ff, d)
        if fam.out_bias:
            out.update({p + "attn_output.bias": (d,), p + "ffn_up.bias": (ff,), p + "ffn_down.bias": (d,)})
    return out


class LlamaRef:
    """Reference model: hp + a dict of float64 weights with GGUF names and numpy shapes.

    family: the architecture's behaviour; default FAMILIES[hp.arch] (tests pass a changed one to show that a
    feature matters)."""

    def __init__(self, hp: HParams, weights: dict[str, np.ndarray], family: Family | None = None):
        if hp.arch not in FAMILIES:
            raise ValueError(f"architecture {hp.arch!r} not in {ARCHS}")
        self.hp = hp
        self.w = weights
        self.fam = family or FAMILIES[hp.arch]
        for name, shape in expected_tensors(hp, self.fam).items():
            if name not in weights:
                raise KeyError(f"tensor {name} missing")
            if weights[name].shape != shape:
                raise ValueError(f"tensor {name}: shape {weights[name].shape}, expected {shape}")
        if "output.weight" in weights and weights["output.weight"].shape != (hp.n_vocab, hp.n_embd):
            raise ValueError(f"output.weight: shape {weights['output.weight'].shape}")
        for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
            if name in weights and weights[name].shape != (hp.n_rot // 2,):
                raise ValueError(f"{name}: shape {weights[name].shape}")
        if hp.n_head % hp.n_head_kv or hp.n_rot % 2 or hp.n_rot > hp.head_dim:
            raise ValueError(f"bad head layout {hp}")
        if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
            raise ValueError(f"expert_used_count {hp.n_expert_used} of {hp.n_expert} experts")

    @classmethod
    def from_gguf(cls, path: "str | Path | gguf.GGUFReader") -> "LlamaRef":
        """From a GGUF path, or an already-open gguf.GGUFReader."""
        r = path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in FAMILIES:
            raise ValueError(f"{path}: architecture {arch!r}, supported: {ARCHS}")
        fam = FAMILIES[arch]
        key = lambda k, default=None: _field(r, f"{arch}.{k}", default)
        n_embd = int(key("embedding_length"))
        n_head = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length") if fam.head_dim_key else key("attention.key_length", n_embd // n_head))
        if int(key("attention.value_length", head_dim)) != head_dim:
            raise ValueError(f"{path}: value_length differs from key_length (not supported by the reference)")
        weights = {t.name: tensor_to_f64(t) for t in r.tensors}
        scaling = key("rope.scaling.type", "none")
        if scaling not in ("none", "linear", "yarn"):
            raise ValueError(f"{path}: rope scaling {scaling!r} not supported by the reference")
        layer = fam.norm == "layer"
        n_ctx = int(key("context_length", 0))
        n_expert = int(key("expert_count", 0))
        hp = HParams(
            n_vocab=weights["token_embd.weight"].shape[0],
            n_embd=n_embd,
            n_layer=int(key("block_count")),
            n_head=n_head,
            n_head_kv=int(key("attention.head_count_kv", n_head)),
            n_ff=int(key("feed_forward_length")),
            head_dim=head_dim,
            n_rot=0 if fam.rope == "none" else int(key("rope.dimension_count", head_dim)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            norm_eps=float(key("attention.layer_norm_epsilon" if layer else "attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx=n_ctx,
            arch=arch,
            n_swa=int(key("attention.sliding_window", fam.n_swa_default)) if fam.window_key else 0,
            rope_scale=float(key("rope.scaling.factor", 1.0)) if scaling in ("linear", "yarn") else 1.0,
            rope_yarn=scaling == "yarn",
            n_ctx_orig=int(key("rope.scaling.original_context_length", n_ctx)),
            yarn_beta_fast=float(key("rope.scaling.yarn_beta_fast", 32.0)),
            yarn_beta_slow=float(key("rope.scaling.yarn_beta_slow", 1.0)),
            swa_pattern=fam.swa_pattern,
            rope_theta_swa=fam.swa_rope_theta,
            attn_softcap=float(key("attn_logit_softcapping", 0.0)),
            final_softcap=float(key("final_logit_softcapping", 0.0)),
            n_no_rope_layer_step=fam.no_rope_step,
            n_expert=n_expert,
            n_expert_used=int(key("expert_used_count", 0)),
            n_ff_exp=int(key("expert_feed_forward_length", 0) or key("feed_forward_length")) if n_expert else 0,
            expert_weights_norm=bool(key("expert_weights_norm", True)),
            rope_long=n_ctx > int(key("rope.scaling.original_context_length", n_ctx)),
            rope_attn_factor=float(key("rope.scaling.attn_factor", 1.0)),
        )
        return cls(hp, weights)

    # ---- pieces ----
    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.hp.norm_eps) * w

    def _layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.hp.norm_eps) * w + b

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """name: the norm's prefix, e.g. 'blk.0.attn_norm'."""
        if self.fam.norm == "layer":
            return self._layernorm(x, self.w[name + ".weight"], self.w[name + ".bias"])
        return self._rmsnorm(x, self.w[name + ".weight"])

    def _rope(self, x: np.ndarray, pos: np.ndarray, theta: float | None = None, scale: float | None = None
              ) -> np.ndarray:
        """x: (n_tokens, n_heads, head_dim); rotates pairs of the first n_rot dims, adjacent ones (x[2i], x[2i+1])
        or halves (x[i], x[i + n_rot/2]) as the family says.  theta, scale: default the file's."""
        hp = self.hp
        n_rot = hp.n_rot
        theta = hp.rope_theta if theta is None else theta
        scale = hp.rope_scale if scale is None else scale
        i = np.arange(n_rot // 2, dtype=np.float64)
        freq = theta ** (-2.0 * i / n_rot)                             # (n_rot/2,)
        w = getattr(self, "w", {})
        factors = w.get("rope_freqs.weight",                           # Llama 3 and LongRoPE: per-pair divisors
                        w.get("rope_factors_long.weight" if hp.rope_long else "rope_factors_short.weight"))
        if factors is not None:
            freq = freq / factors
        m = hp.rope_attn_factor
        if hp.rope_yarn and scale != 1.0:                              # interpolation mixed in by a ramp over pairs
            corr = lambda beta: n_rot * np.log(hp.n_ctx_orig / (2 * np.pi * beta)) / (2 * np.log(theta))
            lo, hi = max(0.0, np.floor(corr(hp.yarn_beta_fast))), min(n_rot - 1.0, np.ceil(corr(hp.yarn_beta_slow)))
            mix = 1.0 - np.clip((i - lo) / max(hi - lo, 0.001), 0.0, 1.0)
            freq = freq / scale * (1.0 - mix) + freq * mix
            scale = 1.0
            if hp.rope_scale > 1.0:
                m = m * (1.0 + 0.1 * np.log(hp.rope_scale))
        ang = (pos.astype(np.float64) / scale)[:, None] * freq[None, :]   # (n_tokens, n_rot/2)
        cos, sin = m * np.cos(ang)[:, None, :], m * np.sin(ang)[:, None, :]
        out = x.copy()
        fam = getattr(self, "fam", None) or FAMILIES[hp.arch]
        if fam.rope == "halves":
            a, b = slice(0, n_rot // 2), slice(n_rot // 2, n_rot)
        else:
            a, b = slice(0, n_rot, 2), slice(1, n_rot, 2)
        x0, x1 = x[..., a], x[..., b]
        out[..., a] = x0 * cos - x1 * sin
        out[..., b] = x0 * sin + x1 * cos
        return out

    @staticmethod
    def _gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    @staticmethod
    def _softcap(x: np.ndarray, cap: float) -> np.ndarray:
        return cap * np.tanh(x / cap) if cap > 0 else x

    def _qkv(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q (n, n_head, head_dim), k and v (n, n_head_kv, head_dim) of layer prefix p, before rope."""
        hp, w, fam = self.hp, self.w, self.fam
        n, hd = len(h), hp.head_dim
        qd, kvd = hp.n_head * hd, hp.n_head_kv * hd
        if fam.qkv_fused:
            qkv = h @ w[p + "attn_qkv.weight"].T
            if fam.qkv_bias:
                qkv = qkv + w[p + "attn_qkv.bias"]
            q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]
        else:
            q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
            if fam.qkv_bias:
                q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q, k, v = q.reshape(n, hp.n_head, hd), k.reshape(n, hp.n_head_kv, hd), v.reshape(n, hp.n_head_kv, hd)
        if fam.qk_norm:
            q = self._rmsnorm(q, w[p + "attn_q_norm.weight"])
            k = self._rmsnorm(k, w[p + "attn_k_norm.weight"])
        return q, k, v

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray, window: int,
                   sinks: np.ndarray | None = None) -> np.ndarray:
        """Causal attention (n, n_head * head_dim); window > 0: query at p sees keys at p - window < q <= p;
        sinks (n_head,): one more logit in each head's softmax, with no value."""
        hp = self.hp
        n, hd = len(q), hp.head_dim
        mask = np.triu(np.full((n, n), -np.inf), k=1)                  # key j > query i is masked
        if window:
            mask[np.subtract.outer(pos, pos) >= window] = -np.inf       # key j <= query i - W is masked
        kvh = np.arange(hp.n_head) // (hp.n_head // hp.n_head_kv)       # kv head of each query head
        s = np.einsum("ihd,jhd->hij", q, k[:, kvh, :]) / np.sqrt(hd)   # (n_head, n, n)
        s = self._softcap(s, hp.attn_softcap) + mask
        if sinks is not None:
            s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], (hp.n_head, n, 1))], axis=-1)
        s = s - s.max(axis=-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(axis=-1, keepdims=True)
        return np.einsum("hij,jhd->ihd", pr[..., :n], v[:, kvh, :]).reshape(n, hp.n_head * hd)

    def _ffn(self, h: np.ndarray, p: str) -> np.ndarray:
        w, fam = self.w, self.fam
        if self.hp.n_expert:
            return self._moe(h, p)
        if fam.ffn == "gelu":
            u = self._gelu(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
            return u @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
        if fam.ffn == "swiglu_fused":
            g, u = np.split(h @ w[p + "ffn_up.weight"].T, 2, axis=-1)
        else:
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        act = self._gelu(g) if fam.ffn == "geglu" else g / (1.0 + np.exp(-g))
        return (act * u) @ w[p + "ffn_down.weight"].T

    def routing(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(router logits (n, n_expert), chosen experts (n, k) best first, their weights (n, k))."""
        hp = self.hp
        logits = h @ self.w[p + "ffn_gate_inp.weight"].T
        if self.fam.moe_bias:
            logits = logits + self.w[p + "ffn_gate_inp.bias"]
        prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
        top = np.argsort(-prob, axis=-1, kind="stable")[:, :hp.n_expert_used]
        wt = np.take_along_axis(prob, top, axis=-1)
        if hp.expert_weights_norm:
            wt = wt / wt.sum(axis=-1, keepdims=True)
        return logits, top, wt

    def _moe(self, h: np.ndarray, p: str) -> np.ndarray:
        w = self.w
        _, top, wt = self.routing(h, p)
        out = np.zeros_like(h)
        bias = (lambda name, e: w[p + name + ".bias"][e]) if self.fam.moe_bias else (lambda name, e: 0.0)
        for i in range(len(h)):
            for e, we in zip(top[i], wt[i]):
                g = w[p + "ffn_gate_exps.weight"][e] @ h[i] + bias("ffn_gate_exps", e)
                u = w[p + "ffn_up_exps.weight"][e] @ h[i] + bias("ffn_up_exps", e)
                if self.fam.ffn == "swiglu_oai":
                    g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                    act = g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)
                else:
                    act = g / (1.0 + np.exp(-g)) * u
                out[i] += we * (w[p + "ffn_down_exps.weight"][e] @ act + bias("ffn_down_exps", e))
        return out

    def forward(self, tokens: Sequence[int], start_pos: int = 0, ffn_inputs: list | None = None) -> np.ndarray:
        """Logits (n_tokens, n_vocab) float64: row i = after tokens[0..i] at positions start_pos + 0..i.
        ffn_inputs: if given, each layer's normed FFN input (n_tokens, n_embd) is appended to it."""
        hp, w, fam = self.hp, self.w, self.fam
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("tokens must be a non-empty 1-d sequence")
        if toks.min() < 0 or toks.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        pos = np.arange(start_pos, start_pos + len(toks))

        x = w["token_embd.weight"][toks].copy()                        # (n, n_embd)
        if fam.embd_scale:
            x *= float(np.float32(np.sqrt(hp.n_embd)))
        if fam.learned_pos:
            if pos[-1] >= hp.n_ctx:
                raise ValueError(f"position {pos[-1]} beyond the {hp.n_ctx} learned positions")
            x = x + w["position_embd.weight"][pos]
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            q, k, v = self._qkv(self._norm(x, p + "attn_norm"), p)
            if fam.rope != "none" and hp.layer_uses_rope(il):
                theta, scale = hp.layer_rope(il)
                q, k = self._rope(q, pos, theta, scale), self._rope(k, pos, theta, scale)
            sinks = w[p + "attn_sinks.weight"] if fam.sinks else None
            a = self._attention(q, k, v, pos, hp.layer_window(il), sinks) @ w[p + "attn_output.weight"].T
            if fam.out_bias or fam.o_bias:
                a = a + w[p + "attn_output.bias"]
            if fam.post_norms:
                a = self._norm(a, p + "post_attention_norm")
            x = x + a
            h = self._norm(x, p + fam.ffn_norm)
            if ffn_inputs is not None:
                ffn_inputs.append(h)
            f = self._ffn(h, p)
            if fam.post_norms:
                f = self._norm(f, p + "post_ffw_norm")
            x = x + f

        x = self._norm(x, "output_norm")
        head = w.get("output.weight", w["token_embd.weight"])
        return self._softcap(x @ head.T, hp.final_softcap)


def forward_gguf(path: str | Path, tokens: Sequence[int]) -> np.ndarray:
    """Convenience: logits of tokens for the GGUF at path."""
    return LlamaRef.from_gguf(path).forward(tokens)


def rel_err(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per row: max|got - ref| / max|ref|."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return np.max(np.abs(got - ref), axis=-1) / np.maximum(np.max(np.abs(ref), axis=-1), 1e-30)
