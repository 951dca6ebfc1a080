"""The CPU-speed issue's agreement check on a full-size shape: a random-weight Q8_0 model of the
TinyLlama-1.1B shape (n_embd 2048, 22 layers, 32 heads / 4 KV heads, ffn 5632, vocab 32000; 1.17 GB,
written by gen_model in about 30 s), teacher-forced over 96 random token ids.  The fast paths'
argmax must agree with the scalar path's (f32 arithmetic on dequantized weights, the oracle) at
>= 99 % of positions on the f32 path (KVLLM_ACT=f32: FMA rounding only) and the 13-bit
integer-activation path (KVLLM_ACT=int).  Measured: 100 % for both, max relative logit error
1.4e-6 (f32) and 8.5e-4 (int).  The default, 8-bit activations as llama.cpp's (KVLLM_ACT=q8), is
judged on real models by its KL divergence next to llama.cpp's (test_kld.py); on this random-weight
model, whose next-token distributions are nearly flat (ties everywhere), it agrees at 93.75 % (max
relative logit error 2.6e-2), held here to >= 90 %: a wrong scale or block agrees at chance.  On a
CPU without AVX2 every path is the scalar path and agrees trivially.

The same file shows the load's peak memory on the default path, which repacks every Q8_0 matrix: the
file pages a tensor was packed from are given back as soon as it is packed, so the process's peak RSS
stays near one copy of the weights (1132 MiB measured for the 1116 MiB file) rather than two (2110 MiB before).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess

import numpy as np

from gen_model import SHAPES, write_model

N_TOKENS = 96


def peak_rss(kvllm, *args) -> int:
    """The highest RSS in bytes of one kvllm process (its own rusage, from wait4)."""
    p = subprocess.Popen([str(kvllm), *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    assert p.returncode == 0, err
    return ru.ru_maxrss * 1024


def test_q8_0_tinyllama_shape_agrees_with_scalar(run, kvllm, tmp_path):
    path = tmp_path / "tinyllama-q8_0.gguf"
    write_model(path, dataclasses.replace(SHAPES["tinyllama-1.1B"], dtype="q8_0"), seed=3)
    rng = np.random.default_rng(11)
    tokens = " ".join(str(int(t)) for t in rng.integers(3, 32000, N_TOKENS))
    logits = {}
    paths = (("scalar", {"KVLLM_CPU": "scalar"}), ("f32", {"KVLLM_ACT": "f32"}), ("int", {"KVLLM_ACT": "int"}),
             ("default", {}))
    for name, env in paths:
        out = tmp_path / f"{name}.bin"
        run("eval", "-m", path, "--tokens", tokens, "-o", out, env=env, timeout=900).check_ok()
        logits[name] = np.fromfile(out, dtype="<f4").reshape(N_TOKENS, -1)
    peak = peak_rss(kvllm, "eval", "-m", path, "--tokens", "1 2 3", "-o", tmp_path / "peak.bin")
    size = path.stat().st_size
    path.unlink()   # 1.17 GB: do not keep it for the rest of the session
    print(f"default path: peak RSS {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file")
    assert peak < 1.4 * size, f"peak RSS {peak / 2**20:.0f} MiB: the repacked weights and their file pages at once"
    ref = logits["scalar"]
    for name, bound in (("f32", 0.99), ("int", 0.99), ("default", 0.90)):
        got = logits[name]
        agree = float((got.argmax(axis=1) == ref.argmax(axis=1)).mean())
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        print(f"{name}: top-1 agreement {agree:.2%} over {N_TOKENS} positions, max rel logit error {rel:.3g}")
        assert agree >= bound, f"{name}: top-1 agreement {agree:.2%} with the scalar path"
