#!/usr/bin/env python3
"""tp-kld.py — how far tensor parallelism is from the single process, teacher-forced over a real text.

    bench/tp-kld.py -m MODEL [--tokenizer TOK] [--ranks 2] [--tokens 1024] [--text tests/data/text/gpl-3.txt]

`kvllm eval` of the text's first TOKENS ids in one process (2 threads) and under `mpirun -np RANKS` (1
thread each), with f32 activations (KVLLM_ACT=f32) and the default 8-bit ones; prints mean KLD / top-1 of
TP against the single process for both, of each default run against the single f32 run, and whether two
TP runs are bit-identical (bench/kldstats.py's definitions; docs/PERF.md, "A quiet machine again").
Any model the single process runs and docs/TP.md can split, mixtures of experts included; a random file of
tests/python/gen_model.py works too (its vocabulary spells the text mostly byte by byte)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from kldstats import stats  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--text", default=str(REPO / "tests" / "data" / "text" / "gpl-3.txt"))
    ap.add_argument("--kvllm", default=os.environ.get("KVLLM_BIN", str(REPO / "build" / "kvllm")))
    a = ap.parse_args()
    m = ["-m", a.model] + (["--tokenizer", a.tokenizer] if a.tokenizer else [])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    text = Path(a.text).read_text()[:16000]
    ids = subprocess.run([a.kvllm, "tokenize", *m, "--ids", text], capture_output=True, text=True,
                         check=True).stdout.split()[:a.tokens]
    out = Path(tempfile.mkdtemp()) / "logits.bin"

    def ev(tp: bool, act: str) -> np.ndarray:
        cmd = [a.kvllm, "eval", *m, "--tokens", " ".join(ids), "-o", str(out)]
        cmd = ["mpirun", "-np", str(a.ranks), "--oversubscribe", *cmd, "-t", "1"] if tp else cmd + ["-t", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, KVLLM_ACT=act))
        if r.returncode:
            sys.exit(f"tp-kld: {' '.join(cmd[:6])} ... failed:\n{r.stderr[-2000:]}")
        x = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
        out.unlink()
        return x

    f1, f2, q1, q2, q3 = ev(False, "f32"), ev(True, "f32"), ev(False, ""), ev(True, ""), ev(True, "")
    row = {"model": Path(a.model).name, "ranks": a.ranks, "tokens": len(ids)}
    for k, (p, q) in {"f32: tp vs single": (f1, f2), "default: tp vs single": (q1, q2),
                      "default single vs f32 single": (f1, q1), "default tp vs f32 single": (f1, q2)}.items():
        s = stats(p, q)
        row[k] = f"{s['kld_mean']:.3e} / {100 * s['top1']:.2f} %"
    row["tp runs bit-identical"] = bool(np.array_equal(q2, q3))
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
