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


class LlamaRef:
    """Reference model: hp + a dict of float64 weights with GGUF names and numpy shapes."""

    def __init__(self, hp: HParams, weights: dict[str, np.ndarray]):
        self.hp = hp
        self.w = weights
        d, hd = hp.n_embd, hp.head_dim
        expect = {"token_embd.weight": (hp.n_vocab, d), "output_norm.weight": (d,)}
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            expect.update({
                p + "attn_norm.weight": (d,), p + "ffn_norm.weight": (d,),
                p + "attn_q.weight": (hp.n_head * hd, d),
                p + "attn_k.weight": (hp.n_head_kv * hd, d),
                p + "attn_v.weight": (hp.n_head_kv * hd, d),
                p + "attn_output.weight": (d, hp.n_head * hd),
                p + "ffn_gate.weight": (hp.n_ff, d), p + "ffn_up.weight": (hp.n_ff, d),
                p + "ffn_down.weight": (d, hp.n_ff),
            })
        for name, shape in expect.items():
            if name not in weights:
                raise KeyError(f"tensor {name} missing")
            if weights[name].shape != shape:
                raise ValueError(f"tensor {name}: shape {weights[name].shape}, expected {shape}")
        if "output.weight" in weights and weights["output.weight"].shape != (hp.n_vocab, d):
            raise ValueError(f"output.weight: shape {weights['output.weight'].shape}")
        if hp.n_head % hp.n_head_kv or hp.n_rot % 2 or hp.n_rot > hp.head_dim:
            raise ValueError(f"bad head layout {hp}")

    @classmethod
    def from_gguf(cls, path: "str | Path | gguf.GGUFReader") -> "LlamaRef":
        """From a GGUF path, or an already-open gguf.GGUFReader."""
        r = path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}, only llama supported")
        n_embd = int(_field(r, f"{arch}.embedding_length"))
        n_head = int(_field(r, f"{arch}.attention.head_count"))
        head_dim = int(_field(r, f"{arch}.attention.key_length", n_embd // n_head))
        weights = {t.name: tensor_to_f64(t) for t in r.tensors}
        hp = HParams(
            n_vocab=weights["token_embd.weight"].shape[0],
            n_embd=n_embd,
            n_layer=int(_field(r, f"{arch}.block_count")),
            n_head=n_head,
            n_head_kv=int(_field(r, f"{arch}.attention.head_count_kv", n_head)),
            n_ff=int(_field(r, f"{arch}.feed_forward_length")),
            head_dim=head_dim,
            n_rot=int(_field(r, f"{arch}.rope.dimension_count", head_dim)),
            rope_theta=float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx=int(_field(r, f"{arch}.context_length", 0)),
        )
        return cls(hp, weights)

    # ---- pieces ----
    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.hp.norm_eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: (n_tokens, n_heads, head_dim); rotates adjacent pairs of the first n_rot dims."""
        n_rot = self.hp.n_rot
        i = np.arange(n_rot // 2, dtype=np.float64)
        freq = self.hp.rope_theta ** (-2.0 * i / n_rot)               # (n_rot/2,)
        ang = pos.astype(np.float64)[:, None] * freq[None, :]          # (n_tokens, n_rot/2)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens: Sequence[int], start_pos: int = 0) -> np.ndarray:
        """Logits (n_tokens, n_vocab) float64: row i = after tokens[0..i] at positions start_pos + 0..i."""
        hp, w = self.hp, self.w
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("tokens must be a non-empty 1-d sequence")
        if toks.min() < 0 or toks.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        n, hd = len(toks), hp.head_dim
        group = hp.n_head // hp.n_head_kv
        pos = np.arange(start_pos, start_pos + n)
        mask = np.triu(np.full((n, n), -np.inf), k=1)                  # key j > query i is masked

        x = w["token_embd.weight"][toks].copy()                        # (n, n_embd)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            h = self._rmsnorm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, hp.n_head, hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, hp.n_head_kv, hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, hp.n_head_kv, hd)
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

            h = self._rmsnorm(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T

        x = self._rmsnorm(x, w["output_norm.weight"])
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
