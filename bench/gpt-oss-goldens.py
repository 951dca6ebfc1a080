#!/usr/bin/env python3
"""gpt-oss-goldens.py — llama.cpp's logits on test_gpt_oss.py's random files, for its test_llamacpp_agrees.

Writes each config's file exactly as the test does (tests/python/test_gpt_oss.case_file), feeds its ids to
llama.cpp (llama-cpp-python with f32 K/V, every position's logits) and writes tests/golden/gpt-oss/
llamacpp.npz (one array per config) and llamacpp.json (per config: the file's sha256, the ids, and the
llama-cpp-python version).  Run with the test venv's Python; llama.cpp runs in bench/build-llamacpp.sh's venv
(LLAMACPP_VENV, default /work/cache/llamacpp-venv):

    .venv/bin/python bench/gpt-oss-goldens.py
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from test_gpt_oss import CONFIGS, GOLDEN, case_file  # noqa: E402

CHILD = r"""
import json, sys, numpy as np, llama_cpp
path, out, toks = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = llama_cpp.Llama(model_path=path, n_ctx=len(toks) + 64, n_batch=512, logits_all=True, verbose=False,
                    type_k=0, type_v=0)   # f32 K/V (GGML_TYPE_F32)
m.eval(toks)
np.save(out, np.asarray(m.scores[:len(toks)], dtype=np.float32))
print(llama_cpp.__version__)
"""


def main() -> int:
    py = Path(os.environ.get("LLAMACPP_VENV", "/work/cache/llamacpp-venv")) / "bin" / "python"
    if not py.is_file():
        sys.exit(f"gpt-oss-goldens: no llama.cpp venv at {py} (bench/build-llamacpp.sh makes it)")
    d = Path(tempfile.mkdtemp())
    arrays, meta = {}, {}
    for name in CONFIGS:
        path, tokens = case_file(d, name)
        out = d / f"{name}.npy"
        p = subprocess.run([str(py), "-c", CHILD, str(path), str(out), json.dumps(tokens)], capture_output=True,
                           text=True, timeout=600)
        if p.returncode:
            sys.exit(f"gpt-oss-goldens: llama.cpp failed on {name}:\n{p.stderr[-3000:]}")
        arrays[name] = np.load(out)
        meta[name] = {"file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tokens": tokens,
                      "llama_cpp_python": p.stdout.strip().splitlines()[-1]}
    GOLDEN.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDEN / "llamacpp.npz", **arrays)
    (GOLDEN / "llamacpp.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"gpt-oss-goldens: wrote {GOLDEN}/llamacpp.npz and llamacpp.json ({', '.join(CONFIGS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
