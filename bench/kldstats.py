"""KL divergence and top-1 agreement of teacher-forced logits against a reference: the one definition
shared by bench/llamacpp-agreement (which makes the goldens) and tests/python/test_kld.py (which holds
kvllm to them), so both measure the same thing.  numpy only.

For every position i, with P = softmax(ref[i]) (the reference) and Q = softmax(got[i]):
    KLD_i = sum_v P(v) (log P(v) - log Q(v))   (nats, f64)
    agree_i = argmax ref[i] == argmax got[i]
Every position counts, the first included (llama.cpp's perplexity tool skips the first half of each
context; here the context is the whole text, so the early positions are scored too).
"""
from __future__ import annotations

import numpy as np

CHUNK = 64   # rows per step: bounds the f64 temporaries to CHUNK x n_vocab


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kld_per_position(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(P_ref || Q_got) per row, f64, (n,)."""
    assert ref.shape == got.shape and ref.ndim == 2, (ref.shape, got.shape)
    out = np.empty(ref.shape[0])
    for i in range(0, ref.shape[0], CHUNK):
        lp, lq = log_softmax(ref[i:i + CHUNK]), log_softmax(got[i:i + CHUNK])
        out[i:i + CHUNK] = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return np.maximum(out, 0.0)   # a row equal to the reference gives -1e-17-ish rounding


def stats(ref: np.ndarray, got: np.ndarray) -> dict:
    """mean / p99 / max KLD (nats) and top-1 agreement (fraction) of got against ref."""
    if not np.isfinite(got).all():
        return {"n": int(ref.shape[0]), "kld_mean": float("inf"), "kld_p99": float("inf"),
                "kld_max": float("inf"), "top1": 0.0}
    k = kld_per_position(ref, got)
    top1 = float((ref.argmax(axis=1) == got.argmax(axis=1)).mean())
    return {"n": int(ref.shape[0]), "kld_mean": float(k.mean()), "kld_p99": float(np.percentile(k, 99)),
            "kld_max": float(k.max()), "top1": top1}
