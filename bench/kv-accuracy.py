#!/usr/bin/env python3
"""Quantized KV accuracy: for each KV storage type, logits of a teacher-forced sequence against
the same run with f32 KV, through `kvllm eval --kv-type T`.

Reports the max logit error (max|L_T - L_f32| / max|L_f32|, and absolute) and teacher-forced top-1
agreement: the share of positions whose argmax equals the f32 run's argmax.  Sequences:
stories260K's 256-token greedy reference run (BOS + the reference ids) and a random-weight GQA
model (8 heads / 2 KV heads) fed 256 random ids.

    .venv/bin/python bench/kv-accuracy.py [--kvllm build/kvllm] [--shared tests/data]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from gen_model import ModelConfig, write_model  # noqa: E402

TYPES = ["f16", "bf16", "int8", "fp8"]


def eval_logits(kvllm: str, model: Path, ids: list[int], kv_type: str, out: Path, extra=()) -> np.ndarray:
    subprocess.run([kvllm, "eval", "-m", str(model), "--tokens", " ".join(map(str, ids)), "--kv-type", kv_type,
                    "-o", str(out), *extra], check=True)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def rows(kvllm: str, name: str, model: Path, ids: list[int], d: Path, extra=()) -> list[str]:
    ref = eval_logits(kvllm, model, ids, "f32", d / "f32.bin", extra)
    out = []
    for t in TYPES:
        got = eval_logits(kvllm, model, ids, t, d / f"{t}.bin", extra)
        abs_err = np.abs(got - ref).max()
        rel = abs_err / np.abs(ref).max()
        agree = (got.argmax(1) == ref.argmax(1)).mean() * 100
        out.append(f"| {name} | {t} | {abs_err:.4g} | {rel:.3g} | {agree:.2f} % ({(got.argmax(1) == ref.argmax(1)).sum()}/{len(ids)}) |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvllm", default="build/kvllm")
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[1] / "tests" / "data"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        st = Path(a.shared) / "models" / "stories260K"
        gguf = d / "stories260K.gguf"
        subprocess.run([a.kvllm, "convert", str(st / "stories260K.bin"), "--tokenizer", str(st / "tok512.bin"),
                        "-o", str(gguf)], check=True, capture_output=True)
        ref_ids = [1] + [int(x) for x in (Path(a.shared) / "reference" / "stories260K_greedy_ids.txt").read_text().split()]
        cfg = ModelConfig(n_vocab=1000, n_embd=256, n_layer=4, n_head=8, n_head_kv=2, n_ff=688, n_ctx=512)
        rnd = write_model(d / "gqa.gguf", cfg, seed=42)
        rng = np.random.default_rng(0)
        rnd_ids = [1] + rng.integers(3, cfg.n_vocab, size=255).tolist()
        print("| sequence | KV type | max abs logit error | max rel error | top-1 agreement with f32 KV |")
        print("|---|---|---:|---:|---:|")
        for r in rows(a.kvllm, "stories260K, 257 positions", gguf, ref_ids[:257], d):
            print(r)
        for r in rows(a.kvllm, "random GQA 8/2, 256 positions", rnd, rnd_ids, d):
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
