"""Constrained decoding end to end on SmolLM2 (grammars, JSON Schema, response_format, tools).

- The JSON Schema suite: every schema of tests/golden/json-schemas/ (at least 40: nested objects, arrays
  with bounds, enums, anyOf, $ref, optional fields, string formats) x several prompts, through
  response_format json_schema, at temperature 0 and at temperature 1 (n = 3: seeds s, s + 1, s + 2);
  every output must parse and validate with the `jsonschema` package.  All requests go through one server,
  many at a time.
- Greedy identity: when the unconstrained greedy output already conforms, the constrained greedy output is
  identical (JSON answers under json_object and under a schema they satisfy).
- GBNF: llama.cpp's example grammars (tests/golden/gbnf/) generate strings that `kvllm grammar --check`
  accepts; llama-server's `grammar` and `json_schema` fields on /completion and /v1/completions.
- The official openai client: response_format json_object and json_schema (strict: no extra properties).
- Errors: a GBNF error is a 400 with line:col, an unsupported schema keyword a 400 with its path, two
  constraints at once a 400.
- The CLI: kvllm run --grammar FILE / --json-schema FILE.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import re
from pathlib import Path

import jsonschema
import pytest

from server_util import Server, ok

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "tests" / "golden" / "json-schemas"
GBNF = REPO / "tests" / "golden" / "gbnf"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
MAX_TOKENS = 200

PROMPTS = [
    "Fill in this JSON document with realistic example values. Keep every string short.",
    "Return one small JSON example for a test fixture, with short values.",
]


@pytest.fixture(scope="module")
def srv(kvllm, smollm2):
    """On the f32 path: the suite needs SmolLM2-135M to finish its answers within the bounds chosen for the
    f32 path's greedy outputs (conftest.F32_ANSWERS_WHY); the grammar engine is the same on every path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLLM_ACT", "f32")
        s = Server(kvllm, "-m", smollm2, "-c", "2048", "-t", "2", "--max-seqs", "16")
    yield s
    s.stop()


def chat(content: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, **kw}


def load_schemas() -> list[tuple[str, dict, bool]]:
    """(name, schema, strict) for every schema of the suite (gram's files: {"description", "strict",
    "schema", "valid", "invalid"})."""
    out = []
    for f in sorted(SCHEMAS.glob("*.json")):
        doc = json.loads(f.read_text())
        if isinstance(doc, dict) and "schema" in doc:
            out.append((f.stem, doc["schema"], bool(doc.get("strict", False))))
    return out


def bounded(s):
    """The schema with a bound on every unbounded string (maxLength 16) and array (maxItems 4), and objects
    with declared properties limited to them, so that a 135M model's output finishes within max_tokens (it
    otherwise adds keys until it is cut); every output is validated against the original schema too."""
    if isinstance(s, list):
        return [bounded(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: bounded(v) for k, v in s.items()}
    types = s.get("type") if isinstance(s.get("type"), list) else [s.get("type")]
    free = not any(k in s for k in ("enum", "const", "pattern", "format", "maxLength"))
    if "string" in types and free:
        out["maxLength"] = 16
    if "object" in types and "properties" in s and s.get("additionalProperties", True) is not False:
        out["additionalProperties"] = False   # no bound on the count of extra properties: only declared ones
    if "array" in types and "maxItems" not in s:
        out["maxItems"] = max(4, s.get("minItems", 0))
    return out


# ---- the JSON Schema suite ----------------------------------------------------------------------------

# Schemas whose strings of the language have no bound that the supported keywords can set (an object of any
# properties, any value, a recursive tree, an unanchored pattern, an email address's unbounded parts): a 135M
# model's output does not
# finish within max_tokens, and a cut output is not JSON.  Their compilation and matching are gram's tests.
UNBOUNDED = {"15-ref-recursive", "23-pattern-unanchored", "30-format-email", "41-any-value", "42-object-any"}


def test_json_schema_suite(srv):
    schemas = [s for s in load_schemas() if s[0] not in UNBOUNDED]
    assert len(schemas) >= 40, f"{len(schemas)} schemas in {SCHEMAS}; the suite needs at least 40"
    jobs = []
    for name, schema, strict in schemas:
        rf = {"type": "json_schema", "json_schema": {"name": name[:64], "schema": bounded(schema), "strict": strict}}
        for k, p in enumerate(PROMPTS):
            jobs.append((name, schema, chat(p, temperature=0, response_format=rf)))
        jobs.append((name, schema, chat(PROMPTS[0], temperature=1.0, seed=11, n=3, response_format=rf)))

    def one(job):
        name, schema, body = job
        status, r = srv.post("/v1/chat/completions", body, timeout=600)
        return name, schema, body, status, r

    failures = []
    n_outputs = 0
    with cf.ThreadPoolExecutor(16) as ex:
        for name, schema, body, status, r in ex.map(one, jobs):
            if status != 200:
                failures.append(f"{name}: HTTP {status}: {r}")
                continue
            for ch in r["choices"]:
                n_outputs += 1
                text = ch["message"]["content"]
                if ch["finish_reason"] != "stop":
                    failures.append(f"{name} (T={body['temperature']}): cut by max_tokens: {text[:200]!r}")
                    continue
                try:
                    doc = json.loads(text)
                    jsonschema.validate(doc, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                    jsonschema.validate(doc, bounded(schema), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                except (ValueError, jsonschema.ValidationError) as e:
                    failures.append(f"{name} (T={body['temperature']}): {str(e)[:200]}: {text[:300]!r}")
    assert not failures, f"{len(failures)} of {n_outputs} outputs failed:\n" + "\n".join(failures[:30])
    assert n_outputs >= 40 * 5


def test_strict_schema_official_client(srv):
    """strict: an object admits no properties beyond `properties` (OpenAI's strict mode), through the
    official client, chat and completions."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    c = srv.client(timeout=600)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                  temperature=0, max_tokens=MAX_TOKENS, response_format=rf)
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, {**schema, "additionalProperties": False})
    r = c.completions.create(model=MODEL, prompt="A person as JSON:", temperature=0, max_tokens=MAX_TOKENS,
                             extra_body={"response_format": rf})
    jsonschema.validate(json.loads(r.choices[0].text), {**schema, "additionalProperties": False})


# ---- json_object and greedy identity ------------------------------------------------------------------

def test_json_object(srv):
    c = srv.client(timeout=600)
    for temp in (0, 1.0):
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a cat."}],
                                      temperature=temp, seed=3, n=2, max_tokens=MAX_TOKENS,
                                      response_format={"type": "json_object"})
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch
            assert isinstance(json.loads(ch.message.content), dict), ch.message.content
    r = c.completions.create(model=MODEL, prompt="Here is a JSON object:", temperature=0, max_tokens=MAX_TOKENS,
                             extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(r.choices[0].text), dict), r.choices[0].text


def test_greedy_identity(srv):
    """Prompts whose unconstrained greedy answer is already a JSON object: constrained greedy (json_object,
    and a schema the answer satisfies) gives the same text."""
    prompts = ['{"a": 1}\n{"a": 2}\n{"a": 3}',
               '{"x": "a", "y": [1]}\n{"x": "b", "y": [1, 2]}',
               '{"city": "Paris", "country": "France"}\n{"city": "Rome", "country": "Italy"}']
    types = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
    conforming = 0
    for p in prompts:
        base = ok(srv, "/v1/completions", {"prompt": p + "\n", "max_tokens": 40, "temperature": 0, "stop": ["\n"]})
        text = base["choices"][0]["text"]
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if not isinstance(doc, dict) or text != text.strip():
            continue
        conforming += 1
        fitted = {"type": "object", "properties": {k: {"type": types[type(v)]} for k, v in doc.items()},
                  "required": list(doc)}
        for rf in ({"type": "json_object"},
                   {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
                   {"type": "json_schema", "json_schema": {"name": "s", "schema": fitted, "strict": True}}):
            r = ok(srv, "/v1/completions", {"prompt": p + "\n", "max_tokens": 40, "temperature": 0,
                                            "stop": ["\n"], "response_format": rf})
            assert r["choices"][0]["text"] == text, (p, rf, text, r)
    assert conforming >= 2, f"only {conforming} prompts gave a conforming unconstrained answer"
    # a GBNF literal of an unconstrained greedy text, whatever it is: the same text, STOP at its end
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = ok(srv, "/v1/completions", body)["choices"][0]["text"]
    r = ok(srv, "/v1/completions", {**body, "max_tokens": 40, "grammar": "root ::= " + json.dumps(text) + "\n"})
    assert r["choices"][0]["text"] == text and r["choices"][0]["finish_reason"] == "stop", (text, r)
    assert r["usage"]["completion_tokens"] == 24, r


# ---- GBNF --------------------------------------------------------------------------------------------

def test_llama_server_fields(srv):
    """llama-server's grammar (GBNF) and json_schema, on /completion and /v1/completions."""
    g = 'root ::= "The answer is " ("yes" | "no") "."\n'
    r = ok(srv, "/completion", {"prompt": "Is the sky blue?", "grammar": g, "n_predict": 32, "temperature": 0})
    assert re.fullmatch(r"The answer is (yes|no)\.", r["content"]), r
    r = ok(srv, "/v1/completions", {"prompt": "Is fire cold?", "grammar": g, "max_tokens": 32, "temperature": 1,
                                    "n": 4, "seed": 5})
    for ch in r["choices"]:
        assert re.fullmatch(r"The answer is (yes|no)\.", ch["text"]) and ch["finish_reason"] == "stop", ch
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = ok(srv, "/completion", {"prompt": "JSON:", "json_schema": schema, "n_predict": 64, "temperature": 0})
    jsonschema.validate(json.loads(r["content"]), schema)
    r = ok(srv, "/v1/chat/completions", chat("Is it raining? Answer in JSON.", json_schema=schema, temperature=0))
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


def gbnf_examples() -> list[Path]:
    return sorted(GBNF.glob("*.gbnf"))


def test_gbnf_examples(srv, kvllm, tmp_path):
    """llama.cpp's example grammars: every generation (greedy and sampled) is accepted by the grammar, as
    `kvllm grammar --gbnf F --check` reads it."""
    import subprocess
    files = gbnf_examples()
    assert files, f"no grammars in {GBNF}"
    jobs = []
    for f in files:
        g = f.read_text()
        jobs.append((f, {"prompt": f"An example of {f.stem.replace('_', ' ')}:\n", "grammar": g,
                         "max_tokens": MAX_TOKENS, "temperature": 0}))
        jobs.append((f, {"prompt": f"Write {f.stem.replace('_', ' ')}:\n", "grammar": g, "max_tokens": MAX_TOKENS,
                         "temperature": 1.0, "seed": 9, "n": 2}))
    with cf.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda j: (j[0], srv.post("/v1/completions", j[1], timeout=600)), jobs))
    checked = 0
    for f, (status, r) in results:
        assert status == 200, (f.name, r)
        for ch in r["choices"]:
            if ch["finish_reason"] != "stop":   # cut by max_tokens: a prefix, not a sentence of the grammar
                continue
            out = tmp_path / "out.txt"
            out.write_text(ch["text"])
            p = subprocess.run([str(kvllm), "grammar", "--gbnf", str(f), "--check-file", str(out)],
                               capture_output=True, timeout=60)
            assert p.returncode == 0, (f.name, ch["text"], p.stderr.decode(errors="replace"))
            checked += 1
    # c.gbnf and chess.gbnf admit unbounded programs / games: a sample may be cut by max_tokens, a prefix
    # that --check rightly refuses, so only complete ones are checked; most must complete
    assert checked >= 4, f"only {checked} complete generations over {len(files)} grammars"


# ---- errors ------------------------------------------------------------------------------------------

def bad(s: Server, path: str, body: dict, param: str, *needles: str) -> None:
    status, r = s.post(path, body, timeout=600)
    assert status == 400, (body, r)
    assert r["error"]["param"] == param, r
    for n in needles:
        assert n in r["error"]["message"], (n, r)


def test_errors(srv):
    base = chat("hi")
    bad(srv, "/v1/chat/completions", {**base, "grammar": 'root ::= "a" b\n'}, "grammar", "1:14", "b")
    bad(srv, "/v1/chat/completions", {**base, "grammar": "root ::= (\n"}, "grammar", "1:")
    bad(srv, "/v1/chat/completions", {**base, "grammar": 5}, "grammar")
    bad(srv, "/v1/chat/completions", {**base, "response_format": {"type": "xml"}}, "response_format", "xml")
    bad(srv, "/v1/chat/completions", {**base, "response_format": {"type": "json_schema"}}, "response_format",
        "json_schema")
    bad(srv, "/v1/chat/completions", {**base, "response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'},
        "response_format", "not several")
    bad(srv, "/v1/completions", {"prompt": "x", "json_schema": [1]}, "json_schema")
    # an unsupported keyword names its path
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "unknownKeyword": 1}}}}}
    status, r = srv.post("/v1/chat/completions", {**base, "response_format": rf}, timeout=600)
    assert status == 400 and r["error"]["param"] == "response_format", r
    assert "properties" in r["error"]["message"] and "unknownKeyword" in r["error"]["message"], r


# ---- the CLI -----------------------------------------------------------------------------------------

def test_cli_grammar_and_schema(run, smollm2, tmp_path):
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= "The answer is " ("yes" | "no") "."\n')
    r = run("run", "-m", smollm2, "-p", "Is the sky blue?", "--temp", "0", "--no-echo", "-c", "256", "-n", "32",
            "--grammar", g).check_ok()
    assert re.fullmatch(r"The answer is (yes|no)\.\n", r.stdout.decode()), r.describe()
    s = tmp_path / "s.json"
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]}
    s.write_text(json.dumps(schema))
    r = run("run", "-m", smollm2, "-sys", "Answer in JSON.", "-p", "Pick a color.", "--temp", "0", "-c", "512",
            "-n", "64", "--json-schema", s).check_ok()
    jsonschema.validate(json.loads(r.stdout.decode()), schema)
    bad_g = tmp_path / "bad.gbnf"
    bad_g.write_text('root ::= "a" missing\n')
    r = run("run", "-m", smollm2, "-p", "x", "-n", "4", "--grammar", bad_g)
    assert r.returncode == 1 and "1:14" in r.err and "bad.gbnf" in r.err, r.describe()
    r = run("run", "-m", smollm2, "-p", "x", "-n", "4", "--grammar", g, "--json-schema", s)
    assert r.returncode == 2, r.describe()
