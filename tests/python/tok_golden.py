"""Checks of `kvllm tokenize` against a golden file of llama.cpp's that holds parse_special both ways and
decoding (scripts/golden-tok-llamacpp.py writes them: tests/golden/tok-gemma3, tests/golden/tok-qwen3).

    DOC = load("tok-gemma3/gemma-3-270m.json")
    check_case(run, vocab, DOC["cases"][i], tmp_path)   # ids, ids_special and decoded bytes of one text
    check_decode(run, vocab, decode_cases)              # id lists -> bytes

Known mismatches are by token id (a case or id list holding one is xfail(strict=True)): case_params and
known_decode_params build the parameters.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtest import REPO

GOLDEN = REPO / "tests" / "golden"


def load(rel: str) -> dict:
    return json.loads((GOLDEN / rel).read_text(encoding="utf-8"))


def check_well_formed(doc: dict, vocab: str, min_cases: int, min_decode: int, known: dict[int, str]) -> None:
    assert doc["made_by"] == "scripts/golden-tok-llamacpp.py" and doc["llama_cpp_python"]
    assert doc["vocab"] == vocab
    assert len(doc["cases"]) >= min_cases and len(doc["decode_cases"]) >= min_decode
    for c in doc["cases"]:
        assert isinstance(c["text"], str) and all(isinstance(i, int) and i >= 0 for i in c["ids"] + c["ids_special"])
        bytes.fromhex(c["decoded"])
    assert all(any([t] == c["ids"] for c in doc["decode_cases"]) for t in known), "a known mismatch is never decoded"


def _known(known: dict[int, str], ids: list[int]) -> str | None:
    return next((known[i] for i in ids if i in known), None)


def case_params(doc: dict, known: dict[int, str]) -> list:
    out = []
    for i, c in enumerate(doc["cases"]):
        why = _known(known, c["ids"] + c["ids_special"])
        out.append(pytest.param(i, marks=[pytest.mark.xfail(reason=why, strict=True)] if why else []))
    return out


def known_decode_params(known: dict[int, str]) -> list:
    return [pytest.param(t, marks=pytest.mark.xfail(reason=why, strict=True)) for t, why in known.items()]


def _diff(what: str, got: list[int], want: list[int]) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"{what}: first difference at index {k}: kvllm {got[k:k + 8]}, llama.cpp {want[k:k + 8]}\n"
            f" kvllm:     {got}\n llama.cpp: {want}")


def check_case(run, vocab: Path, case: dict, tmp_path: Path) -> None:
    """--ids against llama_tokenize(parse_special=False), --parse-special against parse_special=True, --decode of
    the latter against llama_detokenize (control tokens print nothing)."""
    f = tmp_path / "text.txt"
    f.write_bytes(case["text"].encode("utf-8"))
    got = [int(t) for t in run("tokenize", "-m", vocab, "--ids", "-f", f).check_ok().out.split()]
    assert got == case["ids"], _diff(repr(case["text"]), got, case["ids"])
    got = [int(t) for t in run("tokenize", "-m", vocab, "--ids", "--parse-special", "-f", f).check_ok().out.split()]
    assert got == case["ids_special"], _diff(f"{case['text']!r} (parse_special)", got, case["ids_special"])
    res = run("tokenize", "-m", vocab, "--decode", " ".join(map(str, got))).check_ok()
    assert res.stdout == bytes.fromhex(case["decoded"]), (case["text"], res.stdout, bytes.fromhex(case["decoded"]))


def check_decode(run, vocab: Path, doc: dict, known: dict[int, str]) -> None:
    """Every id list of decode_cases but the known mismatches at once (llama.cpp's bytes of a list are its tokens'
    bytes in a row: neither vocabulary has a space prefix to drop), then one by one where the whole differs, to name
    the first id list that does."""
    dec = [c for c in doc["decode_cases"] if not _known(known, c["ids"])]
    want = b"".join(bytes.fromhex(c["bytes"]) for c in dec)
    res = run("tokenize", "-m", vocab, "--decode", " ".join(str(i) for c in dec for i in c["ids"])).check_ok()
    if res.stdout == want:
        return
    for c in dec:
        got = run("tokenize", "-m", vocab, "--decode", " ".join(map(str, c["ids"]))).check_ok().stdout
        assert got == bytes.fromhex(c["bytes"]), (c["ids"], got, bytes.fromhex(c["bytes"]))
    pytest.fail("the whole decodes differently from its parts")


def check_decode_one(run, vocab: Path, doc: dict, token: int) -> None:
    want = next(c["bytes"] for c in doc["decode_cases"] if c["ids"] == [token])
    assert run("tokenize", "-m", vocab, "--decode", str(token)).check_ok().stdout == bytes.fromhex(want)
