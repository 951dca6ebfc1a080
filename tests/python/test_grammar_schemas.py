"""JSON Schema grammars against the `jsonschema` validator (tests/golden/json-schemas/*.json).

Each golden file holds a schema, `strict`, and instances labelled valid / invalid (as JSON text, so
whitespace and malformed JSON can be labelled too).  For every instance:
  - `kvllm grammar --json-schema F [--strict] --check-file INSTANCE` accepts exactly the valid ones
    (exit 0) and rejects the invalid ones (exit 1);
  - jsonschema (Draft 2020-12, with its format checker) agrees with the label: a valid instance is
    JSON that validates; an invalid one is not JSON or does not validate.
A strict schema is validated with additionalProperties false added where the schema says nothing,
which is what strict means.  Grammars list properties in the schema's order, so valid instances
keep that order (an out-of-order instance is valid JSON Schema-wise and therefore never labelled
invalid here).  Also: unsupported keywords are refused with their JSON path (exit 2), and the GBNF
printed by --print-gbnf is a grammar that judges the instances the same way.
"""
from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

import jsonschema  # pinned in tests/requirements.txt: missing is a broken setup, a failure, not a skip

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "json-schemas"
CASES = sorted(GOLDEN.glob("*.json"))


def load(p: Path) -> dict:
    return json.loads(p.read_text(encoding="utf-8"))


def strictify(s):
    """additionalProperties false on every object schema that does not say otherwise."""
    if isinstance(s, dict):
        s = {k: strictify(v) for k, v in s.items()}
        is_obj = s.get("type") == "object" or "properties" in s
        if is_obj and "additionalProperties" not in s:
            s["additionalProperties"] = False
        return s
    if isinstance(s, list):
        return [strictify(v) for v in s]
    return s


def check(kvllm: Path, args: list[str], text: str, tmp_path: Path) -> int:
    inst = tmp_path / "instance.json"
    inst.write_bytes(text.encode("utf-8"))
    r = subprocess.run([str(kvllm), "grammar", *args, "--check-file", str(inst)], capture_output=True, timeout=60)
    assert r.returncode in (0, 1), f"exit {r.returncode}: {r.stderr.decode(errors='replace')}"
    return r.returncode


def js_valid(schema: dict, text: str) -> bool:
    try:
        v = json.loads(text)
    except ValueError:
        return False
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return validator.is_valid(v)


def test_enough_cases():
    assert len(CASES) >= 40
    for p in CASES:
        d = load(p)
        assert d["valid"] and d["invalid"], p.name


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_schema(kvllm, tmp_path, path):
    d = load(path)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(d["schema"]), encoding="utf-8")
    args = ["--json-schema", str(schema_file)] + (["--strict"] if d["strict"] else [])
    ref_schema = strictify(copy.deepcopy(d["schema"])) if d["strict"] else d["schema"]
    bad = []
    for text in d["valid"]:
        if not js_valid(ref_schema, text):
            bad.append(f"jsonschema rejects the valid instance {text!r}")
        if check(kvllm, args, text, tmp_path) != 0:
            bad.append(f"grammar rejects the valid instance {text!r}")
    for text in d["invalid"]:
        if js_valid(ref_schema, text):
            bad.append(f"jsonschema accepts the invalid instance {text!r}")
        if check(kvllm, args, text, tmp_path) != 1:
            bad.append(f"grammar accepts the invalid instance {text!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["person", "ref-defs", "unicode-keys", "number-negative-range"])
def test_printed_gbnf_judges_the_same(kvllm, tmp_path, name):
    (path,) = GOLDEN.glob(f"[0-9][0-9]-{name}.json")
    d = load(path)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(d["schema"]), encoding="utf-8")
    r = subprocess.run([str(kvllm), "grammar", "--json-schema", str(schema_file), "--print-gbnf"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_bytes(r.stdout)
    for text in d["valid"]:
        assert check(kvllm, ["--gbnf", str(gbnf)], text, tmp_path) == 0, text
    for text in d["invalid"]:
        assert check(kvllm, ["--gbnf", str(gbnf)], text, tmp_path) == 1, text


UNSUPPORTED = [
    ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}, "$.properties.a.multipleOf"),
    ({"allOf": [{"type": "string"}]}, "$.allOf"),
    ({"type": "string", "format": "uri"}, "$.format"),
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=a)b$"}}}, "$.properties.p.pattern"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "$.uniqueItems"),
    ({"$defs": {"x": {"not": {"type": "null"}}}, "$ref": "#/$defs/x"}, "$.$defs.x.not"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "$.patternProperties"),
    ({"$ref": "https://example.com/schema.json"}, "$: $ref"),
    ({"type": "number", "minimum": 0.5}, "$: number bounds"),
    ({"anyOf": [{"type": "string"}, {"if": {"type": "string"}}]}, "$.anyOf[1].if"),
]


@pytest.mark.parametrize("schema,where", UNSUPPORTED, ids=[w for _, w in UNSUPPORTED])
def test_unsupported_keywords_are_refused_with_their_path(kvllm, tmp_path, schema, where):
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema), encoding="utf-8")
    r = subprocess.run([str(kvllm), "grammar", "--json-schema", str(f), "--check", "x"], capture_output=True,
                       timeout=60)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert where in err, err


def test_invalid_schema_json(kvllm, tmp_path):
    f = tmp_path / "schema.json"
    f.write_text('{"type": "object",', encoding="utf-8")
    r = subprocess.run([str(kvllm), "grammar", "--json-schema", str(f)], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"not valid JSON" in r.stderr


def test_json_object(kvllm, tmp_path):
    for text, want in [('{"a": [1, 2, {"b": null}]}', 0), ("{}", 0), ("[]", 1), ('"x"', 1), ('{"a": }', 1)]:
        assert check(kvllm, ["--json-object"], text, tmp_path) == want, text
