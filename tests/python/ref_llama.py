"""ref_llama.py — a plain numpy float64 Llama forward pass, the oracle for kvllm's logits.

Written from the Llama math, not from kvllm's C code:

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

Other architectures, as switches on the same pass (general.architecture):
  mistral / llama with <arch>.attention.sliding_window W: query i attends keys j with i - W < j <= i
  llama with rope_freqs.weight f (Llama 3 rope scaling): pair i turns by pos * theta^(-2i/n_rot) / f[i]
  <arch>.rope.scaling.type linear, factor s: positions are divided by s before rope
  qwen2:  + biases on q, k, v; rope rotates HALVES (x[i], x[i + n_rot/2]) — the GGUF Qwen2 ("neox")
          convention, since its converter does not permute Q/K as the llama one does
  gpt2:   x = token_embd[tokens] + position_embd[pos]; no rope
          layernorm(x) = (x - mean) / sqrt(var + eps) * w + b   (attn_norm, ffn_norm, output_norm)
          q, k, v = split(h Wqkv^T + bqkv) in that order;  x += attn Wo^T + bo
          x += gelu(h Wup^T + bup) Wdown^T + bdown,  gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import gguf


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
    arch: str = "llama"           # llama | mistral | qwen2 | gpt2
    n_swa: int = 0                # sliding window (0: full causal attention)
    rope_scale: float = 1.0       # linear rope scaling factor (positions / rope_scale)


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


ARCHS = ("llama", "mistral", "qwen2", "gpt2")


class LlamaRef:
    """Reference model: hp + a dict of float64 weights with GGUF names and numpy shapes."""

    def __init__(self, hp: HParams, weights: dict[str, np.ndarray]):
        self.hp = hp
        self.w = weights
        d, hd = hp.n_embd, hp.head_dim
        qd, kvd = hp.n_head * hd, hp.n_head_kv * hd
        if hp.arch not in ARCHS:
            raise ValueError(f"architecture {hp.arch!r} not in {ARCHS}")
        gpt2 = hp.arch == "gpt2"
        expect = {"token_embd.weight": (hp.n_vocab, d), "output_norm.weight": (d,)}
        if gpt2:
            expect.update({"output_norm.bias": (d,), "position_embd.weight": (hp.n_ctx, d)})
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            expect.update({p + "attn_norm.weight": (d,), p + "ffn_norm.weight": (d,),
                           p + "attn_output.weight": (d, qd), p + "ffn_up.weight": (hp.n_ff, d),
                           p + "ffn_down.weight": (d, hp.n_ff)})
            if gpt2:
                expect.update({
                    p + "attn_norm.bias": (d,), p + "ffn_norm.bias": (d,),
                    p + "attn_qkv.weight": (qd + 2 * kvd, d), p + "attn_qkv.bias": (qd + 2 * kvd,),
                    p + "attn_output.bias": (d,), p + "ffn_up.bias": (hp.n_ff,), p + "ffn_down.bias": (d,),
                })
            else:
                expect.update({
                    p + "attn_q.weight": (qd, d), p + "attn_k.weight": (kvd, d), p + "attn_v.weight": (kvd, d),
                    p + "ffn_gate.weight": (hp.n_ff, d),
                })
            if hp.arch == "qwen2":
                expect.update({p + "attn_q.bias": (qd,), p + "attn_k.bias": (kvd,), p + "attn_v.bias": (kvd,)})
        for name, shape in expect.items():
            if name not in weights:
                raise KeyError(f"tensor {name} missing")
            if weights[name].shape != shape:
                raise ValueError(f"tensor {name}: shape {weights[name].shape}, expected {shape}")
        if "output.weight" in weights and weights["output.weight"].shape != (hp.n_vocab, d):
            raise ValueError(f"output.weight: shape {weights['output.weight'].shape}")
        if "rope_freqs.weight" in weights and weights["rope_freqs.weight"].shape != (hp.n_rot // 2,):
            raise ValueError(f"rope_freqs.weight: shape {weights['rope_freqs.weight'].shape}")
        if hp.n_head % hp.n_head_kv or hp.n_rot % 2 or hp.n_rot > hp.head_dim:
            raise ValueError(f"bad head layout {hp}")

    @classmethod
    def from_gguf(cls, path: "str | Path | gguf.GGUFReader") -> "LlamaRef":
        """From a GGUF path, or an already-open gguf.GGUFReader."""
        r = path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ARCHS:
            raise ValueError(f"{path}: architecture {arch!r}, supported: {ARCHS}")
        n_embd = int(_field(r, f"{arch}.embedding_length"))
        n_head = int(_field(r, f"{arch}.attention.head_count"))
        head_dim = int(_field(r, f"{arch}.attention.key_length", n_embd // n_head))
        weights = {t.name: tensor_to_f64(t) for t in r.tensors}
        gpt2 = arch == "gpt2"
        scaling = _field(r, f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ValueError(f"{path}: rope scaling {scaling!r} not supported by the reference")
        hp = HParams(
            n_vocab=weights["token_embd.weight"].shape[0],
            n_embd=n_embd,
            n_layer=int(_field(r, f"{arch}.block_count")),
            n_head=n_head,
            n_head_kv=int(_field(r, f"{arch}.attention.head_count_kv", n_head)),
            n_ff=int(_field(r, f"{arch}.feed_forward_length")),
            head_dim=head_dim,
            n_rot=0 if gpt2 else int(_field(r, f"{arch}.rope.dimension_count", head_dim)),
            rope_theta=float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(_field(r, f"{arch}.attention.layer_norm_epsilon" if gpt2 else
                                  f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx=int(_field(r, f"{arch}.context_length", 0)),
            arch=arch,
            n_swa=int(_field(r, f"{arch}.attention.sliding_window", 0)),
            rope_scale=float(_field(r, f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
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
        if self.hp.arch == "gpt2":
            return self._layernorm(x, self.w[name + ".weight"], self.w[name + ".bias"])
        return self._rmsnorm(x, self.w[name + ".weight"])

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: (n_tokens, n_heads, head_dim); rotates pairs of the first n_rot dims: adjacent ones
        (x[2i], x[2i+1]), or for qwen2 the halves (x[i], x[i + n_rot/2])."""
        n_rot = self.hp.n_rot
        i = np.arange(n_rot // 2, dtype=np.float64)
        freq = self.hp.rope_theta ** (-2.0 * i / n_rot)               # (n_rot/2,)
        factors = getattr(self, "w", {}).get("rope_freqs.weight")     # Llama 3: per-pair divisors
        if factors is not None:
            freq = freq / factors
        p = pos.astype(np.float64) / self.hp.rope_scale
        ang = p[:, None] * freq[None, :]                               # (n_tokens, n_rot/2)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if self.hp.arch == "qwen2":
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

    def forward(self, tokens: Sequence[int], start_pos: int = 0) -> np.ndarray:
        """Logits (n_tokens, n_vocab) float64: row i = after tokens[0..i] at positions start_pos + 0..i."""
        hp, w = self.hp, self.w
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("tokens must be a non-empty 1-d sequence")
        if toks.min() < 0 or toks.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        n, hd = len(toks), hp.head_dim
        qd, kvd = hp.n_head * hd, hp.n_head_kv * hd
        group = hp.n_head // hp.n_head_kv
        gpt2 = hp.arch == "gpt2"
        pos = np.arange(start_pos, start_pos + n)
        mask = np.triu(np.full((n, n), -np.inf), k=1)                  # key j > query i is masked
        if hp.n_swa:
            mask[np.subtract.outer(pos, pos) >= hp.n_swa] = -np.inf     # key j <= query i - W is masked

        x = w["token_embd.weight"][toks].copy()                        # (n, n_embd)
        if gpt2:
            if pos[-1] >= hp.n_ctx:
                raise ValueError(f"position {pos[-1]} beyond the {hp.n_ctx} learned positions")
            x = x + w["position_embd.weight"][pos]
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            h = self._norm(x, p + "attn_norm")
            if gpt2:
                qkv = h @ w[p + "attn_qkv.weight"].T + w[p + "attn_qkv.bias"]
                q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]
            else:
                q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
                if hp.arch == "qwen2":
                    q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
            q, k, v = q.reshape(n, hp.n_head, hd), k.reshape(n, hp.n_head_kv, hd), v.reshape(n, hp.n_head_kv, hd)
            if not gpt2:
                q, k = self._rope(q, pos), self._rope(k, pos)
            kvh = np.arange(hp.n_head) // group                         # kv head of each query head
            kq = k[:, kvh, :]                                           # (n, n_head, hd)
            vq = v[:, kvh, :]
            s = np.einsum("ihd,jhd->hij", q, kq) / np.sqrt(hd) + mask   # (n_head, n, n)
            s = s - s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            o = np.einsum("hij,jhd->ihd", pr, vq).reshape(n, hp.n_head * hd)
            x = x + o @ w[p + "attn_output.weight"].T
            if gpt2:
                x = x + w[p + "attn_output.bias"]

            h = self._norm(x, p + "ffn_norm")
            if gpt2:
                u = self._gelu(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
                x = x + u @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
            else:
                g = h @ w[p + "ffn_gate.weight"].T
                u = h @ w[p + "ffn_up.weight"].T
                x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T

        x = self._norm(x, "output_norm")
        head = w.get("output.weight", w["token_embd.weight"])
        return x @ head.T


def forward_gguf(path: str | Path, tokens: Sequence[int]) -> np.ndarray:
    """Convenience: logits of tokens for the GGUF at path."""
    return LlamaRef.from_gguf(path).forward(tokens)


def rel_err(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per row: max|got - ref| / max|ref|."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return np.max(np.abs(got - ref), axis=-1) / np.maximum(np.max(np.abs(ref), axis=-1), 1e-30)
