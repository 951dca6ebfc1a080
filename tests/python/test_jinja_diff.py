"""test_jinja_diff.py — the differential Jinja fuzzer's short run (tests/fuzz/jinja_diff.py): random templates
from the subset kvllm implements, rendered by Jinja2 as Transformers sets it up and by `kvllm template`, equal byte
for byte (or both failing); and every saved mismatch (tests/fuzz/corpus/jinja_diff/*.json) replayed as a regression
case.  Long runs are recorded in docs/RELIABILITY.md."""
from __future__ import annotations

import json
import sys
import pytest

from kvtest import REPO

sys.path.insert(0, str(REPO / "tests" / "fuzz"))
import jinja_diff  # noqa: E402

REGRESSIONS = sorted((REPO / "tests" / "fuzz" / "corpus" / "jinja_diff").glob("*.json"))


@pytest.mark.parametrize("block", range(4))
def test_fixed_seed(kvllm, tmp_path, block):
    """Seed 1, cases 0-159 in four blocks (about 10 s each on a loaded 2-core machine)."""
    bad = []
    for i in range(block * 40, block * 40 + 40):
        case = jinja_diff.make_case(1, i)
        why = jinja_diff.compare(str(kvllm), tmp_path, case)
        if why and not why.startswith("unsupported: "):
            bad.append(f"case 1-{i}: {why}\n  {json.dumps(case, ensure_ascii=False)}")
    assert not bad, "\n".join(bad)


def test_regressions(kvllm, tmp_path):
    """Every case a run saved (--save) once kvllm was fixed for it: kvllm agrees with Jinja2 on all of them."""
    bad = []
    for path in REGRESSIONS:
        why = jinja_diff.compare(str(kvllm), tmp_path, json.loads(path.read_text(encoding="utf-8")))
        if why:
            bad.append(f"{path.name}: {why}")
    assert not bad, "\n".join(bad)


def test_generator_is_deterministic():
    assert jinja_diff.make_case(7, 3) == jinja_diff.make_case(7, 3)
    assert jinja_diff.make_case(7, 3) != jinja_diff.make_case(7, 4)
