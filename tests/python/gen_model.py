"""gen_model.py — write random-weight decoder models as GGUF files.

The files follow what llama.cpp's converters (convert_hf_to_gguf.py) write for the "llama" architecture
(also "mistral": llama with sliding-window attention; Llama 3 rope scaling as a
rope_freqs.weight tensor), "qwen2" (Q/K/V biases), "gpt2" (learned positions,
LayerNorm with bias, fused QKV, biases everywhere, GELU FFN), "qwen3" (per-head
attn_q_norm / attn_k_norm, head_dim from attention.key_length), "gemma2" and "gemma3"
(post-norms, GeGLU, tied head, sliding-window layers; gemma2 soft-caps, gemma3 q/k
norms), "phi3" (fused attn_qkv, ffn_up holding gate then up, partial rotary, LongRoPE
rope_factors_short / rope_factors_long), "smollm3" (llama with every fourth layer unroped),
mixture-of-experts "llama" (Mixtral: ffn_gate_inp plus ffn_{gate,up,down}_exps stacked over
experts), "qwen3moe" (qwen3 attention, experts of expert_feed_forward_length) and "gpt-oss" (Q/K/V/O
biases, attn_sinks, post_attention_norm as the FFN's norm, experts with router and expert biases, YaRN
rope scaling, even layers sliding; experts optionally MXFP4, written from random codes): the <arch>.*
hyper-parameter keys, the GGUF tensor names, a SentencePiece-style vocabulary in
tokenizer.ggml.* (the tests only use ids).  As the converters do, qwen3 and
gemma files carry no rope.dimension_count (readers default it to head_dim) and gemma2 no
rope.freq_base unless rope_theta differs from 10000.  Weights are random but scaled so that the
activations of a forward pass stay O(1): matrices are N(0, 1/fan_in), the
embedding N(0, 1/n_embd), norm weights uniform in [0.9, 1.1] (for Gemma that is the stored
1 + w: its converter adds Gemma's RMSNorm offset to every *norm.weight, so readers multiply by the file's w).

Shapes: numpy arrays are (rows, cols); GGUF stores them as ne = [cols, rows]
(the writer reverses the order), e.g. attn_q is numpy (n_head*head_dim, n_embd).

The tensors are generated one at a time while the file is written, so even a
1.1B-parameter model never holds more than one tensor in memory.

Library use (tests):   write_model(path, ModelConfig(n_embd=64, ...), seed=0)
Command line (bench):  python gen_model.py --shape 110M --type f16 -o m.gguf

K-quant types (q4_k, q5_k, q6_k and the mixes q4_k_m, q5_k_m): gguf-py can decode these but not
encode them, so the model is written as F32 next to the output and converted with
`kvllm quantize` (the binary from kvllm_bin=, else $KVLLM_BIN, else <repo>/build/kvllm).
"""
from __future__ import annotations

import argparse
import dataclasses
import string
import sys
from dataclasses import dataclass
import os
import subprocess
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import gguf

N_SPECIAL = 3      # <unk> <s> </s>
N_BYTE = 256       # <0x00> .. <0xFF>
TOKEN_UNK, TOKEN_BOS, TOKEN_EOS = 0, 1, 2


@dataclass
class ModelConfig:
    n_vocab: int = 512
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 192
    n_ctx: int = 512
    n_rot: int | None = None        # None: head_dim (rope over the whole head)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied: bool = False              # True: no output.weight (the head reuses token_embd)
    dtype: str = "f32"              # matrices: f32, f16, bf16, q8_0, q4_0, q4_1, or a KTYPES entry; norms F32
    name: str = "kvllm-random-llama"
    arch: str = "llama"             # general.architecture: one of ARCHS
    n_swa: int = 0                  # > 0: <arch>.attention.sliding_window
    llama3_rope: tuple[float, float, float, int] | None = None
                                    # (factor, low_freq_factor, high_freq_factor, original context):
                                    # rope_freqs.weight as llama.cpp's converter computes it
    rope_scale_linear: float | None = None   # <arch>.rope.scaling.type linear with this factor
    key_length: int | None = None   # head_dim when it is not n_embd / n_head: <arch>.attention.key_length
                                    # and value_length (always written for qwen3 and gemma, as the converters do)
    attn_softcap: float = 50.0      # gemma2: <arch>.attn_logit_softcapping (the Gemma 2 configs' value)
    final_softcap: float = 30.0     # gemma2: <arch>.final_logit_softcapping
    n_expert: int = 0               # > 0: mixture of experts (llama, qwen3moe): <arch>.expert_count
    n_expert_used: int = 0          # <arch>.expert_used_count (top-k)
    n_ff_exp: int | None = None     # qwen3moe: <arch>.expert_feed_forward_length (None: n_ff)
    n_ctx_orig: int | None = None   # phi3: <arch>.rope.scaling.original_context_length (None: n_ctx)
    longrope: bool = False          # phi3: rope_factors_short / rope_factors_long and rope.scaling.attn_factor
    rope_yarn: tuple[float, int] | None = None   # (factor, original context): rope.scaling.type yarn (gpt-oss)
    mxfp4_experts: bool = False     # gpt-oss: ffn_{gate,up,down}_exps stored MXFP4 (as released), random codes
    embd_dtype: str | None = None   # token_embd in this QTYPES type rather than dtype (llama-quantize keeps a
                                    # tied embedding at Q8_0 in a Q4_1 file, as SmolLM2's on PyPI)

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_head

    @property
    def rot(self) -> int:
        return self.head_dim if self.n_rot is None else self.n_rot

    @property
    def ff_exp(self) -> int:
        """Each expert's FFN width."""
        return self.n_ff if self.n_ff_exp is None else self.n_ff_exp

    def check(self) -> None:
        if self.key_length is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} not divisible by n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} not divisible by n_head_kv {self.n_head_kv}")
        if self.rot % 2 or self.rot > self.head_dim:
            raise ValueError(f"n_rot {self.rot} must be even and <= head_dim {self.head_dim}")
        if self.dtype not in ("f32", "f16", *QTYPES, *KTYPES):
            raise ValueError(f"dtype {self.dtype!r}: expected f32, f16 or one of {sorted(QTYPES) + sorted(KTYPES)}")
        if self.n_vocab < 1:
            raise ValueError("n_vocab must be positive")
        if self.arch not in ARCHS:
            raise ValueError(f"arch {self.arch!r}: expected one of {ARCHS}")
        if self.arch == "gpt2" and (self.llama3_rope or self.n_swa or self.n_rot is not None or self.key_length):
            raise ValueError("gpt2 has learned positions: no rope settings or sliding window")
        # what the converters never write for these families: a reader need not accept it
        if self.arch in ("qwen3", "qwen3moe", *GEMMA) and (self.llama3_rope or self.n_rot is not None):
            raise ValueError(f"{self.arch}: rope over the whole head, no rope_freqs")
        if self.arch in ("qwen3", "qwen3moe", "gemma2") and self.rope_scale_linear:
            raise ValueError(f"{self.arch}: no linear rope scaling")
        if self.arch in ("qwen3", "qwen3moe") and self.n_swa:
            raise ValueError(f"{self.arch}: no sliding window")
        if self.arch in ("gemma2", "gemma3") and not self.tied:
            raise ValueError(f"{self.arch}: the head is always token_embd (tied=True)")
        if self.arch == "gemma3" and self.n_swa <= 0:
            raise ValueError("gemma3: sliding_window is required")
        if self.arch == "gemma2" and not (self.attn_softcap > 0 and self.final_softcap > 0):
            raise ValueError("gemma2: both soft-caps must be positive")
        if self.arch in ("qwen3moe", "gpt-oss") and not self.n_expert:
            raise ValueError(f"{self.arch}: n_expert must be positive")
        if self.n_expert and (self.arch not in ("llama", *EXP_FF) or not 0 < self.n_expert_used <= self.n_expert):
            raise ValueError(f"experts: llama, qwen3moe or gpt-oss with 0 < n_expert_used <= n_expert, not "
                             f"{self.arch} {self.n_expert_used}/{self.n_expert}")
        if self.n_ff_exp is not None and self.arch not in EXP_FF:
            raise ValueError("n_ff_exp: qwen3moe and gpt-oss only")
        if (self.rope_yarn or self.mxfp4_experts) and self.arch != "gpt-oss":
            raise ValueError("YaRN and MXFP4 experts: gpt-oss only")
        if self.arch == "gpt-oss" and (self.tied or self.llama3_rope or self.n_rot is not None or self.rope_scale_linear):
            raise ValueError("gpt-oss: an output.weight, rope over the whole head, YaRN scaling only")
        if self.mxfp4_experts and (self.n_embd % 32 or self.ff_exp % 32):
            raise ValueError("MXFP4 experts: n_embd and n_ff_exp multiples of 32")
        if (self.longrope or self.n_ctx_orig) and self.arch != "phi3":
            raise ValueError("LongRoPE: phi3 only")
        if self.arch == "phi3" and (self.key_length or self.llama3_rope or self.rope_scale_linear or self.n_swa):
            raise ValueError("phi3: head_dim n_embd / n_head, rope scaling by LongRoPE factors only, no window")
        if self.arch in ("phi3", "smollm3") and self.key_length:
            raise ValueError(f"{self.arch}: head_dim is n_embd / n_head")


ARCHS = ("llama", "mistral", "qwen2", "gpt2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3", "qwen3moe", "gpt-oss")
GEMMA = ("gemma2", "gemma3")
QK_NORM = ("qwen3", "qwen3moe", "gemma3")      # per-head attn_q_norm / attn_k_norm
KEY_LENGTH = ("qwen3", "qwen3moe", *GEMMA, "gpt-oss")   # converters write attention.key_length, not rope.dimension_count
EXP_FF = ("qwen3moe", "gpt-oss")               # converters write expert_feed_forward_length


SHAPES: dict[str, ModelConfig] = {
    # small enough for the tests, big enough that every code path runs
    "tiny": ModelConfig(n_vocab=512, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=192, n_ctx=512),
    # the llama2.c "stories110M" shape
    "110M": ModelConfig(n_vocab=32000, n_embd=768, n_layer=12, n_head=12, n_head_kv=12, n_ff=2048,
                        n_ctx=2048, tied=True, name="random-llama-110M"),   # stories110M shares its classifier
    # TinyLlama-1.1B-Chat-v1.0
    "tinyllama-1.1B": ModelConfig(n_vocab=32000, n_embd=2048, n_layer=22, n_head=32, n_head_kv=4, n_ff=5632,
                                  n_ctx=2048, rope_theta=10000.0, norm_eps=1e-5, name="random-tinyllama-1.1B"),
}


# ---- vocabulary ---------------------------------------------------------

def _normal_pieces() -> Iterator[str]:
    """Unique SentencePiece-like pieces: ▁a, a, ▁b, b, ..., then two-letter ones, ..."""
    alphabet = string.ascii_lowercase + string.ascii_uppercase + string.digits
    length = 1
    while True:
        for idx in np.ndindex(*([len(alphabet)] * length)):
            s = "".join(alphabet[i] for i in idx)
            yield "\u2581" + s
            yield s
        length += 1


def make_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """tokens, scores, token types (gguf.TokenType values) of a SentencePiece-style vocabulary:
    0 <unk> (UNKNOWN), 1 <s>, 2 </s> (CONTROL), 3..258 <0x00>..<0xFF> (BYTE), then NORMAL pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTE)]
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    types += [int(gguf.TokenType.BYTE)] * N_BYTE
    scores = [0.0] * len(tokens)
    tokens, types, scores = tokens[:n_vocab], types[:n_vocab], scores[:n_vocab]
    pieces = _normal_pieces()
    while len(tokens) < n_vocab:
        tokens.append(next(pieces))
        types.append(int(gguf.TokenType.NORMAL))
        scores.append(-float(len(tokens)))      # earlier pieces merge first
    return tokens, scores, types


# ---- tensors ------------------------------------------------------------

# Types written through the gguf package's own quantizers, so that the reference
# (which dequantizes with gguf.quants) checks kvllm's block decoding independently.
QTYPES = {
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
}

# Types gguf-py cannot quantize: written as F32, then `kvllm quantize ... TYPE` (TYPE as the value).
KTYPES = {"q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K", "q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M"}

REPO = Path(__file__).resolve().parents[2]


def kvllm_binary(kvllm_bin: str | Path | None = None) -> Path:
    """The kvllm binary that converts K-quant models: kvllm_bin, $KVLLM_BIN, or <repo>/build/kvllm."""
    p = Path(kvllm_bin or os.environ.get("KVLLM_BIN") or REPO / "build" / "kvllm")
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise FileNotFoundError(f"kvllm binary {p} not found (K-quant types are written by `kvllm quantize`; "
                                f"build it or pass --kvllm / set KVLLM_BIN)")
    return p

@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]   # numpy order (rows, cols)
    kind: str                # "norm" | "matrix" | "embd"
    fan_in: int

    def dtype(self, cfg: ModelConfig) -> type:
        """numpy dtype of the values before any quantization."""
        if self.kind in VECTOR_KINDS or cfg.dtype != "f16" or (self.kind == "embd" and cfg.embd_dtype):
            return np.float32
        return np.float16

    def qtype(self, cfg: ModelConfig):
        """GGML type the values are quantized to with gguf.quants, or None (stored as dtype())."""
        if self.kind == "embd" and cfg.embd_dtype:
            return QTYPES[cfg.embd_dtype]
        return None if self.kind in VECTOR_KINDS else QTYPES.get(cfg.dtype)


# kinds always stored as F32: norm weights, biases, rope frequency factors, and the expert router
# (convert_hf_to_gguf.py and llama-quantize keep ffn_gate_inp in F32)
VECTOR_KINDS = ("norm", "bias", "freqs", "router", "sinks")


def llama3_rope_factors(cfg: ModelConfig) -> np.ndarray:
    """rope_freqs.weight (rot/2,) as llama.cpp's convert_hf_to_gguf.py computes it for rope_type llama3."""
    factor, low_ff, high_ff, old_ctx = cfg.llama3_rope
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.rot, 2, dtype=np.float64) / cfg.rot))
    low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def longrope_factors(cfg: ModelConfig, which: str) -> np.ndarray:
    """rope_factors_short / rope_factors_long (rot/2,): fixed ramps in the range of Phi-3.5's (short near 1,
    long up to tens), so that the two sets and the plain rope all turn the pairs differently."""
    m = cfg.rot // 2
    f = np.linspace(1.0, 2.5, m) if which == "short" else np.geomspace(1.0, 30.0, m)
    return f.astype(np.float32)


def longrope_attn_factor(cfg: ModelConfig) -> float:
    """rope.scaling.attn_factor as the phi3 converter computes it for rope_type longrope."""
    scale = cfg.n_ctx / (cfg.n_ctx_orig or cfg.n_ctx)
    return float(np.sqrt(1 + np.log(scale) / np.log(cfg.n_ctx_orig or cfg.n_ctx))) if scale > 1.0 else 1.0


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
    """Tensors in file order, with numpy shapes."""
    d, hd = cfg.n_embd, cfg.head_dim
    q_dim, kv_dim = cfg.n_head * hd, cfg.n_head_kv * hd
    specs = [TensorSpec("token_embd.weight", (cfg.n_vocab, d), "embd", d)]
    if cfg.arch == "gpt2":
        specs.append(TensorSpec("position_embd.weight", (cfg.n_ctx, d), "embd", d))
    if cfg.llama3_rope:
        specs.append(TensorSpec("rope_freqs.weight", (cfg.rot // 2,), "freqs", 0))
    if cfg.longrope:
        specs.append(TensorSpec("rope_factors_long.weight", (cfg.rot // 2,), "freqs", 0))
        specs.append(TensorSpec("rope_factors_short.weight", (cfg.rot // 2,), "freqs", 0))
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        if cfg.arch == "gpt2":
            specs += [
                TensorSpec(p + "attn_norm.weight", (d,), "norm", d),
                TensorSpec(p + "attn_norm.bias", (d,), "bias", d),
                TensorSpec(p + "attn_qkv.weight", (q_dim + 2 * kv_dim, d), "matrix", d),
                TensorSpec(p + "attn_qkv.bias", (q_dim + 2 * kv_dim,), "bias", d),
                TensorSpec(p + "attn_output.weight", (d, q_dim), "matrix", q_dim),
                TensorSpec(p + "attn_output.bias", (d,), "bias", q_dim),
                TensorSpec(p + "ffn_norm.weight", (d,), "norm", d),
                TensorSpec(p + "ffn_norm.bias", (d,), "bias", d),
                TensorSpec(p + "ffn_up.weight", (cfg.n_ff, d), "matrix", d),
                TensorSpec(p + "ffn_up.bias", (cfg.n_ff,), "bias", d),
                TensorSpec(p + "ffn_down.weight", (d, cfg.n_ff), "matrix", cfg.n_ff),
                TensorSpec(p + "ffn_down.bias", (d,), "bias", cfg.n_ff),
            ]
            continue
        if cfg.arch == "phi3":
            specs += [
                TensorSpec(p + "attn_norm.weight", (d,), "norm", d),
                TensorSpec(p + "attn_qkv.weight", (q_dim + 2 * kv_dim, d), "matrix", d),
                TensorSpec(p + "attn_output.weight", (d, q_dim), "matrix", q_dim),
                TensorSpec(p + "ffn_norm.weight", (d,), "norm", d),
                TensorSpec(p + "ffn_up.weight", (2 * cfg.n_ff, d), "matrix", d),     # gate rows, then up rows
                TensorSpec(p + "ffn_down.weight", (d, cfg.n_ff), "matrix", cfg.n_ff),
            ]
            continue
        if cfg.arch == "gpt-oss":   # in the order convert_hf_to_gguf.py writes them
            ne, ff = cfg.n_expert, cfg.ff_exp
            ex = "mxfp4" if cfg.mxfp4_experts else "matrix"
            specs += [
                TensorSpec(p + "attn_norm.weight", (d,), "norm", d),
                TensorSpec(p + "attn_q.weight", (q_dim, d), "matrix", d),
                TensorSpec(p + "attn_q.bias", (q_dim,), "bias", d),
                TensorSpec(p + "attn_k.weight", (kv_dim, d), "matrix", d),
                TensorSpec(p + "attn_k.bias", (kv_dim,), "bias", d),
                TensorSpec(p + "attn_v.weight", (kv_dim, d), "matrix", d),
                TensorSpec(p + "attn_v.bias", (kv_dim,), "bias", d),
                TensorSpec(p + "attn_output.weight", (d, q_dim), "matrix", q_dim),
                TensorSpec(p + "attn_output.bias", (d,), "bias", q_dim),
                TensorSpec(p + "attn_sinks.weight", (cfg.n_head,), "sinks", 0),
                TensorSpec(p + "post_attention_norm.weight", (d,), "norm", d),
                TensorSpec(p + "ffn_gate_inp.weight", (ne, d), "router", d),
                TensorSpec(p + "ffn_gate_inp.bias", (ne,), "bias", d),
                TensorSpec(p + "ffn_gate_exps.weight", (ne, ff, d), ex, d),
                TensorSpec(p + "ffn_gate_exps.bias", (ne, ff), "bias", d),
                TensorSpec(p + "ffn_up_exps.weight", (ne, ff, d), ex, d),
                TensorSpec(p + "ffn_up_exps.bias", (ne, ff), "bias", d),
                TensorSpec(p + "ffn_down_exps.weight", (ne, d, ff), ex, ff),
                TensorSpec(p + "ffn_down_exps.bias", (ne, d), "bias", ff),
            ]
            continue
        specs += [
            TensorSpec(p + "attn_norm.weight", (d,), "norm", d),
            TensorSpec(p + "attn_q.weight", (q_dim, d), "matrix", d),
            TensorSpec(p + "attn_k.weight", (kv_dim, d), "matrix", d),
            TensorSpec(p + "attn_v.weight", (kv_dim, d), "matrix", d),
        ]
        if cfg.arch == "qwen2":
            specs += [
                TensorSpec(p + "attn_q.bias", (q_dim,), "bias", d),
                TensorSpec(p + "attn_k.bias", (kv_dim,), "bias", d),
                TensorSpec(p + "attn_v.bias", (kv_dim,), "bias", d),
            ]
        if cfg.arch in QK_NORM:
            specs += [
                TensorSpec(p + "attn_q_norm.weight", (hd,), "norm", hd),
                TensorSpec(p + "attn_k_norm.weight", (hd,), "norm", hd),
            ]
        specs.append(TensorSpec(p + "attn_output.weight", (d, q_dim), "matrix", q_dim))
        if cfg.arch in GEMMA:
            specs.append(TensorSpec(p + "post_attention_norm.weight", (d,), "norm", d))
        specs.append(TensorSpec(p + "ffn_norm.weight", (d,), "norm", d))
        if cfg.n_expert:
            ne, ff = cfg.n_expert, cfg.ff_exp
            specs += [
                TensorSpec(p + "ffn_gate_inp.weight", (ne, d), "router", d),
                TensorSpec(p + "ffn_gate_exps.weight", (ne, ff, d), "matrix", d),
                TensorSpec(p + "ffn_up_exps.weight", (ne, ff, d), "matrix", d),
                TensorSpec(p + "ffn_down_exps.weight", (ne, d, ff), "matrix", ff),
            ]
        else:
            specs += [
                TensorSpec(p + "ffn_gate.weight", (cfg.n_ff, d), "matrix", d),
                TensorSpec(p + "ffn_up.weight", (cfg.n_ff, d), "matrix", d),
                TensorSpec(p + "ffn_down.weight", (d, cfg.n_ff), "matrix", cfg.n_ff),
            ]
        if cfg.arch in GEMMA:
            specs.append(TensorSpec(p + "post_ffw_norm.weight", (d,), "norm", d))
    specs.append(TensorSpec("output_norm.weight", (d,), "norm", d))
    if cfg.arch == "gpt2":
        specs.append(TensorSpec("output_norm.bias", (d,), "bias", d))
    if not cfg.tied:
        specs.append(TensorSpec("output.weight", (cfg.n_vocab, d), "matrix", d))
    return specs


# MXFP4 (ggml's block_mxfp4): per 32 values one byte e (scale 2^(e - 128)) and 16 bytes of 4-bit codes,
# value j in the low nibble of byte j, value j + 16 in its high nibble; a code is an index into these
# (E2M1 values, doubled).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float64)
GGML_TYPE_MXFP4 = 39   # gguf-py of the test venv does not know the type: written as raw bytes


def mxfp4_random(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Random MXFP4 blocks (bytes, shape[:-1] + (shape[-1] // 32 * 17,)) whose values have about the spread
    of N(0, 1/fan_in): codes uniform, block scales around 2^-3 / sqrt(fan_in) times a factor of 1, 2 or 1/2."""
    nb = shape[-1] // 32
    lead = shape[:-1] + (nb,)
    e0 = int(np.round(np.log2(1.0 / np.sqrt(fan_in) / 5.0))) + 128   # the mean |code| is about 5
    e = (e0 + rng.integers(-1, 2, size=lead)).astype(np.uint8)
    qs = rng.integers(0, 256, size=lead + (16,), dtype=np.uint8)
    return np.concatenate([e[..., None], qs], axis=-1).reshape(shape[:-1] + (nb * 17,))


def mxfp4_to_f64(raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Decode MXFP4 bytes to float64 of shape (the values' numpy shape)."""
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, 17)
    scale = np.ldexp(1.0, b[:, 0].astype(np.int64) - 128)
    lo, hi = MXFP4_VALUES[b[:, 1:] & 0x0F], MXFP4_VALUES[b[:, 1:] >> 4]
    return (np.concatenate([lo, hi], axis=-1) * scale[:, None]).reshape(shape)


def _random_tensor(rng: np.random.Generator, spec: TensorSpec, cfg: ModelConfig) -> np.ndarray:
    if spec.kind == "mxfp4":
        return mxfp4_random(rng, spec.shape, spec.fan_in)
    if spec.kind == "sinks":                  # around the scores' range, so that they take from nothing to most
        t = rng.uniform(-2.0, 3.0, size=spec.shape).astype(np.float32)
    elif spec.kind == "norm":
        t = rng.uniform(0.9, 1.1, size=spec.shape).astype(np.float32)
    elif spec.kind == "bias":
        t = rng.uniform(-0.2, 0.2, size=spec.shape).astype(np.float32)
    elif spec.kind == "freqs":                # computed, not drawn: the rng stream is untouched
        if spec.name == "rope_freqs.weight":
            t = llama3_rope_factors(cfg)
        else:
            t = longrope_factors(cfg, "long" if spec.name == "rope_factors_long.weight" else "short")
    else:
        t = rng.standard_normal(size=spec.shape, dtype=np.float32)
        t *= np.float32(1.0 / np.sqrt(spec.fan_in))
    return np.ascontiguousarray(t.astype(spec.dtype(cfg)))


def random_tensors(cfg: ModelConfig, seed: int = 0) -> Iterator[tuple[TensorSpec, np.ndarray]]:
    """(spec, array) for every tensor in file order; deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    for spec in tensor_specs(cfg):
        yield spec, _random_tensor(rng, spec, cfg)


# ---- writing ------------------------------------------------------------

def write_model(path: str | Path, cfg: ModelConfig, seed: int = 0, *,
                omit_keys: Sequence[str] = (), omit_tensors: Sequence[str] = (),
                vocab: tuple[list[str], list[float], list[int]] | None = None,
                tensors: dict[str, np.ndarray] | None = None,
                kvllm_bin: str | Path | None = None) -> Path:
    """Write a random Llama GGUF to path and return it.

    omit_keys / omit_tensors: leave these metadata keys / tensors out (for bad-input tests).
    vocab: (tokens, scores, types) to use instead of make_vocab(cfg.n_vocab).
    tensors: arrays to use instead of random ones for these names (numpy shapes, any float dtype;
             converted to the tensor's dtype).
    kvllm_bin: the kvllm binary for K-quant dtypes (see kvllm_binary)."""
    cfg.check()
    path = Path(path)
    if cfg.dtype in KTYPES:
        binary = kvllm_binary(kvllm_bin)
        tmp = path.with_name(path.name + ".f32.tmp")
        try:
            write_model(tmp, dataclasses.replace(cfg, dtype="f32"), seed, omit_keys=omit_keys,
                        omit_tensors=omit_tensors, vocab=vocab, tensors=tensors)
            p = subprocess.run([str(binary), "quantize", str(tmp), str(path), KTYPES[cfg.dtype]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"kvllm quantize {KTYPES[cfg.dtype]} failed (rc {p.returncode}):\n{p.stderr}")
        finally:
            tmp.unlink(missing_ok=True)
        return path
    arch = cfg.arch
    w = gguf.GGUFWriter(path, arch)
    omit = set(omit_keys)

    def kv(key: str, add, value) -> None:
        if key not in omit:
            add(key, value)

    # GGUFWriter adds general.architecture itself; drop it again if asked.
    if "general.architecture" in omit:
        w.kv_data[0].pop("general.architecture", None)
    kv("general.name", w.add_string, cfg.name)
    kv(f"{arch}.context_length", w.add_uint32, cfg.n_ctx)
    kv(f"{arch}.embedding_length", w.add_uint32, cfg.n_embd)
    kv(f"{arch}.block_count", w.add_uint32, cfg.n_layer)
    kv(f"{arch}.feed_forward_length", w.add_uint32, cfg.n_ff)
    kv(f"{arch}.attention.head_count", w.add_uint32, cfg.n_head)
    kv(f"{arch}.attention.head_count_kv", w.add_uint32, cfg.n_head_kv)
    if cfg.key_length or arch in KEY_LENGTH:
        kv(f"{arch}.attention.key_length", w.add_uint32, cfg.head_dim)
        kv(f"{arch}.attention.value_length", w.add_uint32, cfg.head_dim)
    if cfg.n_expert:
        kv(f"{arch}.expert_count", w.add_uint32, cfg.n_expert)
        kv(f"{arch}.expert_used_count", w.add_uint32, cfg.n_expert_used)
        if arch in EXP_FF:
            kv(f"{arch}.expert_feed_forward_length", w.add_uint32, cfg.ff_exp)
    if cfg.rope_yarn:
        kv(f"{arch}.rope.scaling.type", w.add_string, "yarn")
        kv(f"{arch}.rope.scaling.factor", w.add_float32, cfg.rope_yarn[0])
        kv(f"{arch}.rope.scaling.original_context_length", w.add_uint32, cfg.rope_yarn[1])
    if arch == "phi3":
        kv(f"{arch}.rope.scaling.original_context_length", w.add_uint32, cfg.n_ctx_orig or cfg.n_ctx)
        kv(f"{arch}.attention.sliding_window", w.add_uint32, 0)        # what the converter writes for Phi-4
        if cfg.longrope:
            kv(f"{arch}.rope.scaling.attn_factor", w.add_float32, longrope_attn_factor(cfg))
    if arch == "gpt2":
        kv(f"{arch}.attention.layer_norm_epsilon", w.add_float32, cfg.norm_eps)
    else:
        if arch not in KEY_LENGTH:
            kv(f"{arch}.rope.dimension_count", w.add_uint32, cfg.rot)
        if arch != "gemma2" or cfg.rope_theta != 10000.0:
            kv(f"{arch}.rope.freq_base", w.add_float32, cfg.rope_theta)
        kv(f"{arch}.attention.layer_norm_rms_epsilon", w.add_float32, cfg.norm_eps)
        if arch == "gemma2":
            kv(f"{arch}.attn_logit_softcapping", w.add_float32, cfg.attn_softcap)
            kv(f"{arch}.final_logit_softcapping", w.add_float32, cfg.final_softcap)
        if cfg.n_swa:
            kv(f"{arch}.attention.sliding_window", w.add_uint32, cfg.n_swa)
        if cfg.rope_scale_linear:
            kv(f"{arch}.rope.scaling.type", w.add_string, "linear")
            kv(f"{arch}.rope.scaling.factor", w.add_float32, cfg.rope_scale_linear)
    # llama.cpp's LLAMA_FTYPE numbering of the dominant matrix type
    ftype = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32}[cfg.dtype]
    kv("general.file_type", w.add_uint32, ftype)

    tokens, scores, types = vocab if vocab is not None else make_vocab(cfg.n_vocab)
    kv("tokenizer.ggml.model", w.add_string, "llama")
    kv("tokenizer.ggml.tokens", w.add_array, tokens)
    kv("tokenizer.ggml.scores", w.add_array, [float(s) for s in scores])
    kv("tokenizer.ggml.token_type", w.add_array, [int(t) for t in types])
    kv("tokenizer.ggml.bos_token_id", w.add_uint32, TOKEN_BOS)
    kv("tokenizer.ggml.eos_token_id", w.add_uint32, TOKEN_EOS)
    kv("tokenizer.ggml.unknown_token_id", w.add_uint32, TOKEN_UNK)
    kv("tokenizer.ggml.add_bos_token", w.add_bool, True)
    kv("tokenizer.ggml.add_eos_token", w.add_bool, False)

    specs = [s for s in tensor_specs(cfg) if s.name not in set(omit_tensors)]
    for s in specs:
        qt = s.qtype(cfg)
        if s.kind == "mxfp4":
            w.add_tensor_info(s.name, s.shape, np.dtype(np.float32), int(np.prod(s.shape)) // 32 * 17)
            w.tensors[-1][s.name] = dataclasses.replace(w.tensors[-1][s.name], dtype=GGML_TYPE_MXFP4)
        elif qt is not None:
            bshape = gguf.quants.quant_shape_to_byte_shape(s.shape, qt)
            w.add_tensor_info(s.name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=qt)
        else:
            dt = np.dtype(s.dtype(cfg))
            w.add_tensor_info(s.name, s.shape, dt, int(np.prod(s.shape)) * dt.itemsize)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for s in tensor_specs(cfg):                 # all specs, so the rng stream does not depend on omissions
        t = _random_tensor(rng, s, cfg)
        if tensors is not None and s.name in tensors:
            t = np.ascontiguousarray(np.asarray(tensors[s.name]).astype(s.dtype(cfg)))
            assert t.shape == s.shape, (s.name, t.shape, s.shape)
        if s.name in set(omit_tensors):
            continue
        if s.qtype(cfg) is not None and s.kind != "mxfp4":
            t = gguf.quants.quantize(t, s.qtype(cfg))
        w.write_tensor_data(t)
        del t
    w.close()
    return path


# ---- command line -------------------------------------------------------

def build_config(args: argparse.Namespace) -> ModelConfig:
    cfg = dataclasses.replace(SHAPES[args.shape])
    cfg.dtype = args.type
    for f in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx", "n_rot",
              "rope_theta", "norm_eps", "key_length", "n_expert", "n_expert_used", "n_ff_exp", "n_ctx_orig"):
        v = getattr(args, f)
        if v is not None:
            setattr(cfg, f, v)
    if args.tied:
        cfg.tied = True
    cfg.embd_dtype = args.embd_dtype
    if args.name:
        cfg.name = args.name
    if args.arch:
        cfg.arch = args.arch
    if args.n_swa is not None:
        cfg.n_swa = args.n_swa
    if args.longrope:
        cfg.longrope = True
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gen-model",
                                 description="Write a random-weight Llama model as GGUF (llama arch, SentencePiece-style vocab).")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="base shape (default tiny)")
    ap.add_argument("--type", choices=("f32", "f16", *QTYPES, *KTYPES), default="f32",
                    help="matrix dtype (norms stay F32); K types go through `kvllm quantize`")
    ap.add_argument("--kvllm", default=None, help="kvllm binary for K types (default $KVLLM_BIN or build/kvllm)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", required=True, help="output .gguf path")
    ap.add_argument("--tied", action="store_true", help="no output.weight: the head reuses token_embd")
    ap.add_argument("--embd-type", dest="embd_dtype", choices=sorted(QTYPES), default=None,
                    help="token_embd's type (default: --type's)")
    ap.add_argument("--name", default=None, help="general.name")
    ap.add_argument("--arch", choices=ARCHS, default=None, help="general.architecture (default llama)")
    ap.add_argument("--sliding-window", dest="n_swa", type=int, default=None, help="attention.sliding_window")
    ap.add_argument("--longrope", action="store_true", help="phi3: LongRoPE factors (with --n-ctx-orig < --n-ctx)")
    for f, t in (("n_vocab", int), ("n_embd", int), ("n_layer", int), ("n_head", int), ("n_head_kv", int),
                 ("n_ff", int), ("n_ctx", int), ("n_rot", int), ("rope_theta", float), ("norm_eps", float),
                 ("key_length", int), ("n_expert", int), ("n_expert_used", int), ("n_ff_exp", int),
                 ("n_ctx_orig", int)):
        ap.add_argument("--" + f.replace("_", "-"), dest=f, type=t, default=None, help=f"override {f}")
    args = ap.parse_args(argv)
    cfg = build_config(args)
    try:
        cfg.check()
    except ValueError as e:
        ap.error(str(e))
    try:
        out = write_model(args.output, cfg, seed=args.seed, kvllm_bin=args.kvllm)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"gen-model: {e}", file=sys.stderr)
        return 1
    n_params = sum(int(np.prod(s.shape)) for s in tensor_specs(cfg))
    print(f"gen-model: wrote {out} ({n_params / 1e6:.1f}M params, {cfg.dtype}, "
          f"n_embd {cfg.n_embd}, n_layer {cfg.n_layer}, n_head {cfg.n_head}/{cfg.n_head_kv}, "
          f"n_ff {cfg.n_ff}, n_vocab {cfg.n_vocab}, {out.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
