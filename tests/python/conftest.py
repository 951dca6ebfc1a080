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
