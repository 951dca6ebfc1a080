"""llama2c.py — read Karpathy's llama2.c checkpoint (legacy fp32 "version 0") and tokenizer.bin
with numpy, independently of kvllm, plus a minimal SentencePiece .model (protobuf) reader.

Checkpoint layout: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
vocab_size < 0 means an unshared classifier), then float32 arrays
  token_embedding (vocab, dim), rms_att (L, dim), wq (L, dim, dim), wk (L, kv_dim, dim),
  wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn (L, dim), w1 (L, hidden, dim), w2 (L, dim, hidden),
  w3 (L, hidden, dim), rms_final (dim), freq_cis_real (seq_len, hs/2), freq_cis_imag (seq_len, hs/2),
  [wcls (vocab, dim) if unshared].
Tokenizer layout: int32 max_token_length, then per token: float32 score, int32 len, len bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ref_llama import HParams, LlamaRef


@dataclass
class Checkpoint:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared: bool
    w: dict[str, np.ndarray]     # llama2.c names -> float32 arrays

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.head_size * self.n_kv_heads

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """The same weights under GGUF llama names, numpy shapes (rows, cols); no output.weight when shared."""
        w, out = self.w, {}
        out["token_embd.weight"] = w["token_embedding"]
        for il in range(self.n_layers):
            p = f"blk.{il}."
            out[p + "attn_norm.weight"] = w["rms_att"][il]
            out[p + "attn_q.weight"] = w["wq"][il]
            out[p + "attn_k.weight"] = w["wk"][il]
            out[p + "attn_v.weight"] = w["wv"][il]
            out[p + "attn_output.weight"] = w["wo"][il]
            out[p + "ffn_norm.weight"] = w["rms_ffn"][il]
            out[p + "ffn_gate.weight"] = w["w1"][il]
            out[p + "ffn_down.weight"] = w["w2"][il]
            out[p + "ffn_up.weight"] = w["w3"][il]
        out["output_norm.weight"] = w["rms_final"]
        if not self.shared:
            out["output.weight"] = w["wcls"]
        return out

    def ref(self) -> LlamaRef:
        """A reference model (llama2.c uses rope theta 10000 over the whole head and eps 1e-5)."""
        hp = HParams(n_vocab=self.vocab_size, n_embd=self.dim, n_layer=self.n_layers, n_head=self.n_heads,
                     n_head_kv=self.n_kv_heads, n_ff=self.hidden_dim, head_dim=self.head_size,
                     n_rot=self.head_size, rope_theta=10000.0, norm_eps=1e-5, n_ctx=self.seq_len)
        return LlamaRef(hp, {k: v.astype(np.float64) for k, v in self.gguf_tensors().items()})


def read_checkpoint(path: str | Path) -> Checkpoint:
    raw = Path(path).read_bytes()
    dim, hidden, L, nh, nkv, vocab, seq = struct.unpack_from("<7i", raw, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // nh
    kv_dim = hs * nkv
    layout = [
        ("token_embedding", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
        ("wk", (L, kv_dim, dim)), ("wv", (L, kv_dim, dim)), ("wo", (L, dim, dim)),
        ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
        ("w3", (L, hidden, dim)), ("rms_final", (dim,)), ("freq_cis_real", (seq, hs // 2)),
        ("freq_cis_imag", (seq, hs // 2)),
    ]
    if not shared:
        layout.append(("wcls", (vocab, dim)))
    off, w = 28, {}
    for name, shape in layout:
        n = int(np.prod(shape))
        if off + 4 * n > len(raw):
            raise ValueError(f"{path}: truncated at {name}")
        w[name] = np.frombuffer(raw, dtype="<f4", count=n, offset=off).reshape(shape)
        off += 4 * n
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw) - off} trailing bytes")
    return Checkpoint(dim, hidden, L, nh, nkv, vocab, seq, shared, w)


def read_tokenizer_bin(path: str | Path, vocab_size: int) -> tuple[int, list[bytes], list[float]]:
    """(max_token_length, token bytes, scores) of a llama2.c tokenizer.bin."""
    raw = Path(path).read_bytes()
    (max_len,) = struct.unpack_from("<i", raw, 0)
    off, toks, scores = 4, [], []
    for _ in range(vocab_size):
        score, n = struct.unpack_from("<fi", raw, off)
        off += 8
        toks.append(raw[off:off + n])
        off += n
        scores.append(score)
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw) - off} trailing bytes")
    return max_len, toks, scores


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def read_sentencepiece_model(path: str | Path) -> list[tuple[str, float, int]]:
    """(piece, score, type) of every piece in a SentencePiece ModelProto (field 1, repeated).
    Types: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE (the GGUF token types)."""
    buf = Path(path).read_bytes()

    def fields(b: bytes):
        i = 0
        while i < len(b):
            key, i = _varint(b, i)
            fno, wt = key >> 3, key & 7
            if wt == 0:
                v, i = _varint(b, i)
            elif wt == 1:
                v, i = b[i:i + 8], i + 8
            elif wt == 2:
                n, i = _varint(b, i)
                v, i = b[i:i + n], i + n
            elif wt == 5:
                v, i = b[i:i + 4], i + 4
            else:
                raise ValueError(f"protobuf wire type {wt}")
            yield fno, wt, v

    pieces = []
    for fno, wt, v in fields(buf):
        if fno != 1 or wt != 2:
            continue
        piece, score, typ = "", 0.0, 1
        for f2, w2, v2 in fields(v):
            if f2 == 1:
                piece = v2.decode("utf-8")
            elif f2 == 2 and w2 == 5:
                (score,) = struct.unpack("<f", v2)
            elif f2 == 3:
                typ = v2
        pieces.append((piece, score, typ))
    return pieces


def write_checkpoint(path: str | Path, dim: int = 64, hidden_dim: int = 160, n_layers: int = 2, n_heads: int = 4,
                     n_kv_heads: int = 2, vocab_size: int = 512, seq_len: int = 128, shared: bool = True,
                     seed: int = 0) -> Path:
    """Write a random-weight llama2.c checkpoint (matrices N(0, 1/fan_in), norms ~1, the rope table
    llama2.c's export writes); vocab_size is stored negative when not shared."""
    rng = np.random.default_rng(seed)
    hs = dim // n_heads
    kv_dim = hs * n_kv_heads

    def mat(*shape):
        return rng.standard_normal(shape).astype(np.float32) / np.float32(np.sqrt(shape[-1]))

    def norm(*shape):
        return rng.uniform(0.9, 1.1, shape).astype(np.float32)

    L = n_layers
    ang = np.arange(seq_len)[:, None] * 10000.0 ** (-np.arange(0, hs, 2) / hs)
    parts = [mat(vocab_size, dim), norm(L, dim), mat(L, dim, dim), mat(L, kv_dim, dim), mat(L, kv_dim, dim),
             mat(L, dim, dim), norm(L, dim), mat(L, hidden_dim, dim), mat(L, dim, hidden_dim),
             mat(L, hidden_dim, dim), norm(dim), np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]
    if not shared:
        parts.append(mat(vocab_size, dim))
    path = Path(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                            vocab_size if shared else -vocab_size, seq_len))
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype="<f4").tobytes())
    return path
