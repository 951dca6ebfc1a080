"""The accuracy standard: kvllm's next-token distribution is no further from the high-precision
reference than llama.cpp's on the same file and text.

The reference is kvllm's scalar f32 path (KVLLM_CPU=scalar KVLLM_ACT=f32: plain C, f32 arithmetic on
dequantized weights).  Teacher-forced over the first 1,024 tokens of the GPL v3 ($KVLLM_SHARED/text/gpl-3.txt),
on SmolLM2-135M-Instruct Q4_1 and the same file requantized by `kvllm quantize` to Q4_K_M, Q4_0, Q8_0,
IQ4_NL, MXFP4, Q3_K, Q2_K and IQ4_XS (rows of 576 are not whole super-blocks: the K files are IQ4_NL but for
ffn_down, as llama.cpp makes them), kvllm's default path (8-bit activations, KVLLM_ACT=q8: integer
kernels for every block type, f32 activations for the logits' matrix) and its f32 path (KVLLM_ACT=f32) must each reach
    mean KL(P_ref || Q) <= llama.cpp's   and   top-1 agreement with the reference >= llama.cpp's,
llama.cpp's figures being the goldens of tests/golden/kld/ (made by bench/kld-goldens.sh with
bench/llamacpp-agreement, llama-cpp-python's default settings, on the same files and token ids; the
goldens record the command and the llama.cpp version).  KLD and agreement are computed by
bench/kldstats.py, the code that made the goldens.  No llama.cpp here: kvllm and numpy only.

One `kvllm eval` (one model load, prefill of all 1,024 tokens) per file and path.  The goldens name the
sha256 of the file they were made on and of the token ids: a changed quantizer or tokenizer fails here
rather than comparing against figures made on other inputs (rerun bench/kld-goldens.sh).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest

from kvtest import REPO, run_cli

sys.path.insert(0, str(REPO / "bench"))
from kldstats import stats  # noqa: E402  (bench/kldstats.py: the goldens' own definitions)

GOLDEN = REPO / "tests" / "golden" / "kld"
ALL_TYPES = ["Q4_1", "Q4_K_M", "Q4_0", "Q8_0", "IQ4_NL", "MXFP4", "Q3_K", "Q2_K", "IQ4_XS"]
# Each type costs three evals of 1,024 tokens (the scalar reference is most of it): per commit, one file of each
# kind of arithmetic (a legacy block with a minimum, K-quants with Q5_0 and Q6_K inside, 8-bit, a non-linear
# table); the nightly tier (KVLLM_NIGHTLY=1, `make nightly`) runs every type.  Each type's kernels are held bit
# for bit to their reference on every commit by test_backend_ops.
TYPES = ALL_TYPES if os.environ.get("KVLLM_NIGHTLY") == "1" else ["Q4_1", "Q4_K_M", "Q8_0", "IQ4_XS"]
TEXT_CHARS = 16000          # as bench/llamacpp-agreement
PATHS = {"default": {"KVLLM_ACT": ""}, "f32": {"KVLLM_ACT": "f32"}}
REFERENCE = {"KVLLM_CPU": "scalar", "KVLLM_ACT": "f32"}


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def kld_setup(kvllm, smollm2, shared, tmp_path_factory):
    """Per type: the GGUF and the token ids; and a cache of figures per type."""
    d = tmp_path_factory.mktemp("kld")

    def run(*args, **kw):
        return run_cli(kvllm, *args, **kw)
    files = {}
    for t in TYPES:
        if t == "Q4_1":
            files[t] = smollm2
        else:
            files[t] = d / f"SmolLM2-135M-Instruct.{t}.gguf"
            run("quantize", smollm2, files[t], t, "--allow-requantize", timeout=300).check_ok()
    text = (shared / "text" / "gpl-3.txt").read_text()[:TEXT_CHARS]
    ids = [int(x) for x in run("tokenize", "-m", smollm2, "--ids", text).check_ok().out.split()]
    return {"dir": d, "files": files, "ids": ids, "stats": {}, "run": run}


def eval_logits(setup, t: str, env: dict, n: int) -> np.ndarray:
    out = setup["dir"] / f"{t}.bin"
    setup["run"]("eval", "-m", setup["files"][t], "--tokens", " ".join(map(str, setup["ids"][:n])), "-o", out,
        "-t", "2", env=env, timeout=900).check_ok()
    x = np.fromfile(out, dtype="<f4").reshape(n, -1)
    out.unlink()
    return x


def kld_stats(setup, t: str, n: int) -> dict:
    """{path: stats against the scalar reference} for type t, every path at once (one reference
    kept in memory at a time: 1,024 x 49,152 f32 is 200 MB).  Also "self" (the reference against
    itself) and "shifted" (row i scored against the reference's row i-1): the measure's own check."""
    if t not in setup["stats"]:
        ref = eval_logits(setup, t, REFERENCE, n)
        r = {p: stats(ref, eval_logits(setup, t, env, n)) for p, env in PATHS.items()}
        r["self"] = stats(ref, ref)
        r["shifted"] = stats(ref[1:], ref[:-1])
        setup["stats"][t] = r
    return setup["stats"][t]


def golden(t: str) -> dict:
    g = json.loads((GOLDEN / f"smollm2-{t}.json").read_text())
    assert g.get("llamacpp"), f"golden smollm2-{t}.json holds no llama.cpp figures (made with --no-llamacpp?)"
    return g


# IQ4_NL 3.240e-3 / 97.07 % (llama.cpp 4.073e-3 / 95.90 %), MXFP4 3.419e-3 / 97.36 % (4.584e-3 / 95.41 %),
# Q3_K 5.532e-3 / 96.00 % (6.679e-3 / 94.73 %), Q2_K 8.897e-3 / 93.65 % (1.055e-2 / 93.26 %), IQ4_XS
# 3.021e-3 / 97.95 % (6.296e-3 / 96.09 %; with activations per 256, as llama.cpp's Q8_K, it was 5.639e-3 /
# 96.00 %, one position short: qmm.h's qmm_act_k).
# The default (q8) meets the bar on every file (1,024 positions, docs/PERF.md): mean KLD / top-1 Q4_1 2.454e-3 / 97.46 %, Q4_K_M 5.115e-3 / 95.90 %, Q4_0 3.068e-3 / 96.68 %, Q8_0
# 2.333e-3 / 96.39 % (llama.cpp: 3.355e-3 / 96.19 %, 6.148e-3 / 94.82 %, 4.283e-3 / 94.43 %, 3.481e-3 /
# 96.09 %).  Q4_K_M's rows of 576 are not whole super-blocks: 166 of its tensors are Q5_0, as llama.cpp
# makes them (they were Q4_1 before kvllm had Q5_0), so this file also holds Q5_0's integer kernels to the bar.  Before the logits' matrix kept f32 activations it was 3 positions short on Q4_1 and Q8_0.
def cases():
    for t in TYPES:
        for path in PATHS:
            yield pytest.param(t, path)


@pytest.mark.parametrize("t,path", list(cases()))
def test_kld_no_worse_than_llamacpp(kld_setup, t, path):
    g = golden(t)
    lc = g["llamacpp"]
    n = g["n_tokens"]
    ids = kld_setup["ids"]
    assert len(ids) >= n >= 1024, (len(ids), n)
    assert hashlib.sha256(" ".join(map(str, ids[:n])).encode()).hexdigest() == g["ids_sha256"], \
        "the token ids differ from those the golden was made on (tokenizer changed?): rerun bench/kld-goldens.sh"
    f = kld_setup["files"][t]
    assert sha256(f) == g["file_sha256"], \
        f"{f.name} differs from the file the golden was made on (quantizer changed?): rerun bench/kld-goldens.sh"
    s = kld_stats(kld_setup, t, n)[path]
    print(f"{t} {path}: KLD mean {s['kld_mean']:.3e} p99 {s['kld_p99']:.3e} top-1 {s['top1']:.2%}; "
          f"llama.cpp {lc['llama_cpp_python']}: KLD mean {lc['kld_mean']:.3e} p99 {lc['kld_p99']:.3e} "
          f"top-1 {lc['top1']:.2%}")
    assert s["kld_mean"] <= lc["kld_mean"], \
        f"{t} {path}: mean KLD {s['kld_mean']:.3e} > llama.cpp's {lc['kld_mean']:.3e}"
    assert s["top1"] >= lc["top1"], f"{t} {path}: top-1 agreement {s['top1']:.2%} < llama.cpp's {lc['top1']:.2%}"


def test_kld_measure_can_fail(kld_setup):
    """The bar is not vacuous: the reference scores 0 against itself, and each row scored against the
    previous position's distribution is far beyond llama.cpp's figures."""
    g = golden("Q4_1")
    r = kld_stats(kld_setup, "Q4_1", g["n_tokens"])
    assert r["self"]["kld_mean"] < 1e-12 and r["self"]["top1"] == 1.0, r["self"]
    assert r["shifted"]["kld_mean"] > 10 * g["llamacpp"]["kld_mean"], r["shifted"]
    assert r["shifted"]["top1"] < g["llamacpp"]["top1"], r["shifted"]
