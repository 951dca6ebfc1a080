"""`kvllm tokenize` against golden ids from llama.cpp itself.

tests/golden/tok-llamacpp/<vocab>.json were written by scripts/golden-tok-llamacpp.py
with llama-cpp-python (vocab_only=True, llama_tokenize(add_special=True,
parse_special=False)); this test needs none of that: it runs
`kvllm tokenize -m VOCAB --ids -f TEXT` (BOS as the vocabulary asks, control-token
text left as text) for each case and compares the ids exactly.

The vocabularies: llama.cpp's vocab-only GGUFs in tests/data/tokenizers/llamacpp-vocab
("shared:" paths) and SmolLM2-135M-Instruct ("repo:models/smollm2/...", through the
smollm2 fixture, which skips when it cannot be fetched).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtest import REPO

GOLDEN = REPO / "tests" / "golden" / "tok-llamacpp"

# (golden file stem, case text) -> why kvllm differs from llama.cpp there. Each is an
# xfail(strict=True): when kvllm is fixed the test turns XPASS -> failure, so drop the entry.
KNOWN_MISMATCHES: dict[tuple[str, str], str] = {
}


def _load() -> list[tuple[str, dict]]:
    return [(f.stem, json.loads(f.read_text(encoding="utf-8"))) for f in sorted(GOLDEN.glob("*.json"))]


DOCS = _load()


def _params():
    out = []
    for stem, doc in DOCS:
        for i, case in enumerate(doc["cases"]):
            why = KNOWN_MISMATCHES.get((stem, case["text"]))
            marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
            out.append(pytest.param(stem, i, marks=marks, id=f"{stem}-{i:03d}"))
    return out


@pytest.fixture(scope="module")
def vocabs(request, shared) -> dict[str, Path]:
    """golden stem -> vocabulary file; a vocab that cannot be had maps to a skip reason (str)."""
    out = {}
    for stem, doc in DOCS:
        where, rel = doc["vocab"].split(":", 1)
        if where == "shared":
            p = shared / rel
            if not p.is_file():
                pytest.fail(f"shared vocabulary {p} missing")
            out[stem] = p
        elif rel.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"):
            out[stem] = None  # resolved lazily through the smollm2 fixture (it may skip)
        else:
            out[stem] = REPO / rel
    return out


def test_golden_files_well_formed():
    assert DOCS, f"no golden files in {GOLDEN}"
    for stem, doc in DOCS:
        assert doc["vocab"].split(":", 1)[0] in ("shared", "repo"), stem
        assert doc["llama_cpp_python"] and doc["add_special"] is True and doc["parse_special"] is False
        assert len(doc["cases"]) >= 60, stem
        for c in doc["cases"]:
            assert isinstance(c["text"], str) and all(isinstance(i, int) and i >= 0 for i in c["ids"])
    assert {k[0] for k in KNOWN_MISMATCHES} <= {s for s, _ in DOCS}
    for stem, text in KNOWN_MISMATCHES:
        assert any(c["text"] == text for s, d in DOCS if s == stem for c in d["cases"]), (stem, text)


@pytest.mark.parametrize("stem,idx", _params())
def test_tokenize_matches_llamacpp(request, run, vocabs, tmp_path, stem, idx):
    doc = dict(DOCS)[stem]
    case = doc["cases"][idx]
    vocab = vocabs[stem]
    if vocab is None:
        vocab = request.getfixturevalue("smollm2")
    f = tmp_path / "text.txt"
    f.write_bytes(case["text"].encode("utf-8"))
    res = run("tokenize", "-m", vocab, "--ids", "-f", f).check_ok()
    got = [int(t) for t in res.out.split()]
    want = case["ids"]
    if got != want:
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        pytest.fail(f"{stem} case {idx} {case['text']!r}: first difference at index {k}: "
                    f"kvllm {got[k:k + 8]}, llama.cpp {want[k:k + 8]}\n kvllm:     {got}\n llama.cpp: {want}")
