"""jinja_diff.py — differential fuzzing of kvllm's chat-template interpreter against Jinja2.

    .venv/bin/python tests/fuzz/jinja_diff.py --bin build/kvllm --seed 1 --cases 2000 [--save DIR]

A generator writes random templates from the subset kvllm implements (text with every
whitespace-control sign, output of expressions, if / elif / else, for with loop.* and else,
break / continue, set, namespace, macros and call, filters, tests, string methods, slices,
arithmetic, comparisons, list and dict literals) and a random conversation (roles, contents
with unicode, whitespace and Jinja-looking text, None contents).  Each case is rendered by Jinja2
set up as Transformers sets it up (tests/python/jinja_ref.py: ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, Transformers' tojson, raise_exception, strftime_now pinned) and by
`kvllm template`; the outputs must be equal byte for byte, and where Jinja2 raises, kvllm must
fail (exit 1, nothing on stdout).  A mismatch is printed (and saved under --save as a JSON case:
template, messages, add_generation_prompt) and makes the exit status 1.

The fixed-seed short run and the saved regression cases (tests/fuzz/corpus/jinja_diff/*.json)
run in ctest as tests/python/test_jinja_diff.py.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from jinja_ref import render_kvllm, render_ref  # noqa: E402  (tests/python: the reference both tests share)


def compare(binary: str, tmp: Path, case: dict) -> str | None:
    """None when kvllm agrees with Jinja2 on case, else what differs.  "unsupported: ..." when kvllm refuses
    a construct it documents as outside its subset (KVLLM_EUNSUPPORTED) where Jinja2 renders: counted apart,
    since the generator should not write those (a count above zero means it strayed, or a gap to close)."""
    ok, text = render_ref(case["template"], case["messages"], case["add_generation_prompt"])
    res = render_kvllm(binary, tmp, case["template"], case["messages"], case["add_generation_prompt"])
    err = res.stderr.decode("utf-8", "replace")
    if "Sanitizer" in err or "runtime error:" in err:
        return f"sanitizer report:\n{err[-3000:]}"
    if ok:
        if res.returncode != 0 and ("not supported" in err or "cannot print a" in err):
            return "unsupported: " + err.strip()[-300:]
        if res.returncode != 0:
            return f"Jinja2 renders {text[:300]!r}, kvllm failed (exit {res.returncode}): {err.strip()[-500:]}"
        if res.stdout != text.encode("utf-8"):
            return f"outputs differ:\n  jinja2 {text[:600]!r}\n  kvllm  {res.stdout.decode('utf-8', 'replace')[:600]!r}"
        return None
    if res.returncode != 1 or res.stdout:
        return (f"Jinja2 raised ({text[:300]}), kvllm exit {res.returncode} with "
                f"{res.stdout.decode('utf-8', 'replace')[:300]!r}")
    return None


# ---- the generator ----

CONTENTS = ["Hello!", "What is 2+2?", "", " padded  ", "line one\nline two\n", "Héllo wörld — 你好 🎉",
            "{{ not a tag }} {% if %}", "A, b, c", "  \t\n", "ß İ ı", "user", "x" * 40, "The answer is 42.",
            "<think>\nhmm\n</think>\n\nok", "a'b\"c\\d", "UPPER lower Title", "1,2,3", "  a  b  "]
ROLES = ["system", "user", "assistant", "tool", "user", "assistant"]
WORDS = ["a", "b", "xy", "user", "Hello", " sp ", "é", ",", "\n", "assistant", "<|im_start|>", "1"]


def make_messages(r: random.Random) -> list[dict]:
    n = r.choice([0, 1, 1, 2, 2, 3, 4])
    out = []
    for i in range(n):
        role = "system" if i == 0 and r.random() < 0.3 else r.choice(ROLES)
        content = None if r.random() < 0.06 else r.choice(CONTENTS)
        out.append({"role": role, "content": content})
    return out


class Gen:
    """Random templates; expressions are typed loosely (str, int, bool, list, dict) so most of them
    make sense, while some do not (Jinja2 raises, and kvllm must fail too)."""

    def __init__(self, r: random.Random) -> None:
        self.r = r
        self.scopes: list[list[tuple[str, str]]] = [[("m0", "msg")]]   # (name, type); m0 is set in every prelude
        self.loop_depth = 0
        self.macros: list[tuple[str, int]] = []
        self.depth = 0

    # -- expressions --
    def lit_str(self) -> str:
        w = self.r.choice(WORDS)
        q = self.r.choice(["'", '"'])
        return q + w.replace("\\", "\\\\").replace(q, "\\" + q).replace("\n", "\\n") + q

    def var(self, ty: str) -> str | None:
        names = [n for s in self.scopes for (n, t) in s if t == ty]
        return self.r.choice(names) if names else None

    def expr(self, ty: str | None = None, d: int = 0) -> str:
        r = self.r
        ty = ty or r.choice(["str", "str", "int", "bool", "list"])
        if d > 3:
            leaf = {"str": self.lit_str(), "int": str(r.randint(-3, 9)), "bool": r.choice(["true", "false"]),
                    "list": "[1, 2]", "dict": "{'a': 1}", "msg": "messages[0]"}
            return leaf.get(ty, leaf["str"])
        v = self.var(ty)
        if ty == "str":
            k = r.randint(0, 22)
            if k == 0 and v:
                return v
            if k <= 2:
                return self.lit_str()
            if k == 3:
                m = self.var("msg") or "messages[0]"
                return m + r.choice([".role", ".content", '["role"]', '["content"]'])
            if k == 4:
                return r.choice(["bos_token", "eos_token"])
            if k == 5:
                return f"{self.expr('str', d + 1)} ~ {self.expr(r.choice(['str', 'int']), d + 1)}"
            if k == 6:
                return f"{self.expr('str', d + 1)} + {self.expr('str', d + 1)}"
            if k == 7:
                meth = r.choice(["strip()", "upper()", "lower()", "title()", "capitalize()", "lstrip()", "rstrip()",
                                 "strip(' a')", f"replace({self.lit_str()}, {self.lit_str()})", "rstrip('\\n')",
                                 f"removeprefix({self.lit_str()})", f"removesuffix({self.lit_str()})",
                                 f"replace({self.lit_str()}, {self.lit_str()}, {r.randint(-1, 2)})", "lstrip('x ')"])
                return f"({self.expr('str', d + 1)}).{meth}"
            if k == 8:
                f = r.choice(["trim", "upper", "lower", "title", "capitalize", "string", "tojson", "first", "last",
                              "reverse", "e", "safe", f"replace({self.lit_str()}, {self.lit_str()})",
                              f"default({self.lit_str()})", f"indent({r.randint(0, 4)})", "indent(2, true)",
                              f"trim({self.lit_str()})", "list|join(',')", "tojson(indent=2)", "forceescape"])
                return f"{self.expr('str', d + 1)}|{f}"
            if k == 9:
                a, b = r.choice(["", "1", "-2", "0"]), r.choice(["", "3", "-1", "10"])
                step = r.choice(["", "", ":-1", ":2"])
                return f"({self.expr('str', d + 1)})[{a}:{b}{step}]"
            if k == 10:
                return f"{self.expr('list', d + 1)}|join({self.lit_str()})"
            if k == 11:
                return (f"{self.expr('str', d + 1)} if {self.expr('bool', d + 1)} else "
                        f"{self.expr('str', d + 1)}")
            if k == 12:
                return f"{self.expr('int', d + 1)}|string"
            if k == 13:
                return f"({self.expr(r.choice(['list', 'dict', 'int', 'bool']), d + 1)})|tojson"
            if k == 14 and self.loop_depth:
                return r.choice(["loop.cycle('x', 'y')", "(loop.previtem|default('none'))|string"])
            if k == 15:
                return f"({self.expr('str', d + 1)}).split({r.choice(['', self.lit_str()])})|join('|')"
            if k == 16:
                return f"{self.expr('list', d + 1)}|first|string"
            if k == 17:
                return f"({self.expr('str', d + 1)}).rsplit({self.lit_str()}, 1)|join('+')"
            if k == 18:
                return f"{self.expr('dict', d + 1)}[{self.lit_str()}]|default('-')|string"
            if k == 19 and self.macros:
                name, n = r.choice(self.macros)
                return f"{name}({', '.join(self.expr('str', d + 1) for _ in range(r.randint(0, n)))})"
            if k == 20:
                return f"strftime_now({r.choice(['%Y-%m-%d', '%d %b %Y', '%A', '%B %-d'])!r})"
            if k == 21:
                return f"{self.expr('dict', d + 1)}.get({self.lit_str()}, {self.lit_str()})|string"
            return f"{self.expr('str', d + 1)}|length|string"
        if ty == "int":
            k = r.randint(0, 10)
            if k == 0 and v:
                return v
            if k <= 2:
                return str(r.randint(-5, 12))
            if k == 3:
                return f"messages|length"
            if k == 4 and self.loop_depth:
                return r.choice(["loop.index", "loop.index0", "loop.length", "loop.revindex", "loop.revindex0",
                                 "loop.depth"])
            if k == 5:
                return f"({self.expr('int', d + 1)} {r.choice(['+', '-', '*', '//', '%', '**'])} " \
                       f"{r.choice(['1', '2', '3', '-2', self.expr('int', d + 1)])})"
            if k == 6:
                return f"{self.expr(r.choice(['str', 'list']), d + 1)}|length"
            if k == 7:
                return f"({self.expr('str', d + 1)}).count({self.lit_str()})"
            if k == 8:
                return f"{self.expr('list', d + 1)}|{r.choice(['sum', 'max', 'min', 'length'])}" \
                    if r.random() < 0.5 else f"range({r.randint(0, 4)})|sum"
            if k == 9:
                return f"({self.expr('str', d + 1)}).find({self.lit_str()})"
            return f"{r.choice(['1.5', '2.0', '-0.25', '7'])}|{r.choice(['int', 'round', 'abs', 'float', 'string'])}" \
                   + ("" if r.random() < 0.7 else "|string")
        if ty == "bool":
            k = r.randint(0, 12)
            if k == 0 and v:
                return v
            if k == 1:
                return r.choice(["true", "false", "True", "none is none", "add_generation_prompt"])
            if k == 2:
                left = self.expr('int', d + 1)
                return f"{left} {r.choice(['==', '!=', '<', '>', '<=', '>='])} {self.expr('int', d + 1)}"
            if k == 3:
                return f"{self.expr('str', d + 1)} {r.choice(['==', '!='])} {self.expr('str', d + 1)}"
            if k == 4:
                return f"{self.lit_str()} in {self.expr(r.choice(['str', 'list']), d + 1)}"
            if k == 5:
                return f"not {self.expr('bool', d + 1)}"
            if k == 6:
                return f"({self.expr('bool', d + 1)} {r.choice(['and', 'or'])} {self.expr('bool', d + 1)})"
            if k == 7 and self.loop_depth:
                return r.choice(["loop.first", "loop.last", "loop.previtem is defined", "loop.nextitem is undefined"])
            if k == 8:
                m = self.var("msg") or "messages[0]"
                return f"{m}.content is {r.choice(['none', 'string', 'defined', 'not none'])}"
            if k == 9:
                test = r.choice(["string", "number", "defined", "undefined", "none", "iterable", "mapping", "sequence",
                                 "integer", "float", "boolean", "true", "false", "lower", "upper", "not none",
                                 "odd" if r.random() < 0.5 else "even", "divisibleby(3)"])
                return f"{self.expr(r.choice(['str', 'int', 'list', 'dict', 'bool']), d + 1)} is {test}"
            if k == 10:
                return f"({self.expr('str', d + 1)}).{r.choice(['startswith', 'endswith'])}({self.lit_str()})"
            if k == 11:
                meth = r.choice(["isdigit", "isalpha", "isspace", "isupper", "islower", "isalnum"])
                return f"({self.expr('str', d + 1)}).{meth}()"
            return f"{self.expr('str', d + 1)}"   # truthiness
        if ty == "list":
            k = r.randint(0, 12)
            if k == 0 and v:
                return v
            if k == 1:
                return "messages"
            if k == 2:
                if r.random() < 0.5:
                    return "range(" + r.choice(["0", "1", "3", "5", "1, 4", "5, 0, -2", "0, 6, 2"]) + ")|list"
                return f"range({r.randint(0, 4)})"
            if k == 3:
                return "[" + ", ".join(self.expr(r.choice(["str", "int"]), d + 1) for _ in range(r.randint(0, 3))) + "]"
            if k == 4:
                return f"({self.expr('str', d + 1)}).split({r.choice(['', self.lit_str()])})"
            if k == 5:
                return "messages|map(attribute=" + r.choice(['"role"', '"content"']) + ")|list"
            if k == 6:
                return ("messages|" + r.choice(["selectattr", "rejectattr"]) + "('role', "
                        + r.choice(['"equalto", "user"', '"eq", "system"', '"ne", "user"']) + ")|list")
            if k == 7:
                return f"{self.expr('list', d + 1)}|{r.choice(['reverse', 'unique', 'sort'])}|list"
            if k == 8:
                return f"{self.expr('dict', d + 1)}.items()|list" if r.random() < 0.5 \
                    else f"{self.expr('dict', d + 1)}|{r.choice(['dictsort', 'list'])}"
            if k == 9:
                return f"({self.expr('list', d + 1)})[{r.choice(['1:', ':2', '::-1', '-2:'])}]"
            if k == 10:
                return f"{self.expr('list', d + 1)} + {self.expr('list', d + 1)}"
            if k == 11:
                return "[1, 3, 2]|" + r.choice(['select("odd")', 'reject("even")', 'map("string")', "list",
                                                 'map("upper")' if r.random() < 0.3 else "list"]) + "|list"
            return f"({self.expr('str', d + 1)}).splitlines()" if r.random() < 0.5 else "[]"
        if ty == "dict":
            if v and r.random() < 0.3:
                return v
            items = [f"{self.lit_str()}: {self.expr(r.choice(['str', 'int', 'bool']), d + 1)}"
                     for _ in range(r.randint(0, 3))]
            return "{" + ", ".join(items) + "}" if r.random() < 0.8 else "dict(a=1, b='x')"
        if ty == "msg":
            return v or f"messages[{r.randint(-1, 1)}]"
        return self.lit_str()

    # -- statements --
    def ws(self) -> str:
        return self.r.choice(["", "", "", "-", "+"])

    def tag(self, body: str) -> str:
        return "{%" + self.ws() + " " + body + " " + self.ws() + "%}"

    def text(self) -> str:
        return self.r.choice(["", " ", "\n", "  \n", "text ", "\n  ", "\t", ": ", "<|im_start|>", "| ", "\n\n",
                              "é ", "{ ", " }"])

    def block(self, n: int) -> str:
        self.depth += 1
        out = "".join(self.stmt() for _ in range(n))
        self.depth -= 1
        return out

    def stmt(self) -> str:
        r = self.r
        k = r.random()
        if self.depth >= 3:
            k = r.random() * 0.5
        if k < 0.22:
            return self.text()
        if k < 0.5:
            return "{{" + r.choice(["", "-"]) + " " + self.expr() + " " + r.choice(["", "-"]) + "}}"
        if k < 0.58:
            return "{#" + r.choice(["", "-"]) + " note " + r.choice(["", "-"]) + "#}" if r.random() < 0.5 \
                else self.text()
        if k < 0.68:
            s = self.tag(f"if {self.expr('bool')}") + self.block(r.randint(1, 3))
            for _ in range(r.choice([0, 0, 1, 2])):
                s += self.tag(f"elif {self.expr('bool')}") + self.block(r.randint(1, 2))
            if r.random() < 0.5:
                s += self.tag("else") + self.block(r.randint(1, 2))
            return s + self.tag("endif")
        if k < 0.8:
            name = r.choice(["x", "item", "m", "c"])
            src = r.random()
            if src < 0.45:
                it, ty = "messages", "msg"
            elif src < 0.7:
                it, ty = f"range({r.randint(0, 4)})", "int"
            elif src < 0.85:
                it, ty = f"({self.expr('str')}).split()", "str"
            else:
                it, ty = self.expr("list"), "any"
            filt = f" if {self.expr('bool')}" if r.random() < 0.15 else ""
            if r.random() < 0.1 and ty == "msg":   # tuple unpacking
                s = self.tag(f"for k, v in {self.expr('dict')}.items()")
                self.scopes.append([("k", "str"), ("v", "any")])
            else:
                s = self.tag(f"for {name} in {it}{filt}")
                self.scopes.append([(name, ty)])
            self.loop_depth += 1
            body = self.block(r.randint(1, 4))
            if r.random() < 0.15:
                body += self.tag(f"if {self.expr('bool')}") + self.tag(r.choice(["break", "continue"])) + \
                    self.tag("endif")
            self.loop_depth -= 1
            self.scopes.pop()
            s += body
            if r.random() < 0.15:
                s += self.tag("else") + self.block(1)
            return s + self.tag("endfor")
        if k < 0.88:
            ty = r.choice(["str", "int", "bool", "list", "dict"])
            name = r.choice(["a", "b", "s", "n", "lst"])
            e = self.expr(ty)
            self.scopes[-1].append((name, ty))
            return self.tag(f"set {name} = {e}")
        if k < 0.92:
            if r.random() < 0.5:
                s = self.tag("set ns = namespace(v=" + self.expr("int") + ", t=" + self.expr("str") + ")")
                s += self.tag(f"set ns.v = ns.v + {self.expr('int')}")
                return s + "{{ ns.v }}{{ ns.t }}"
            return self.tag("set blk") + self.block(r.randint(1, 2)) + self.tag("endset") + "[{{ blk }}]"
        if k < 0.96 and self.depth == 0 and not self.loop_depth:
            name = f"mac{len(self.macros)}"
            n = r.randint(0, 2)
            params = ["p0", "p1"][:n]
            defaults = [f"{p}={self.lit_str()}" if r.random() < 0.5 else p for p in params]
            self.scopes.append([(p, "str") for p in params])
            body = self.block(r.randint(1, 3))
            caller = False   # {% call %} is outside the subset kvllm implements
            if caller:
                body += "{{ caller() }}"
            self.scopes.pop()
            s = self.tag(f"macro {name}({', '.join(defaults)})") + body + self.tag("endmacro")
            if caller:
                return s + self.tag(f"call {name}({', '.join(self.lit_str() for _ in params)})") + self.text() + \
                    self.tag("endcall")
            self.macros.append((name, n))
            return s
        if k < 0.98:
            return self.tag(f"if {self.expr('bool')}") + "{{ raise_exception(" + self.lit_str() + ") }}" + \
                self.tag("endif")
        return self.tag("raw") + r.choice(["{{ x }}", "{% if %}", " plain "]) + self.tag("endraw")

    def template(self) -> str:
        pre = self.tag("set m0 = messages[0] if messages else {'role': 'none', 'content': ''}")
        body = "".join(self.stmt() for _ in range(self.r.randint(1, 8)))
        if self.r.random() < 0.5:   # the chat-template shape
            body += self.tag("if add_generation_prompt") + "<|assistant|>\n" + self.tag("endif")
        return pre + body + self.r.choice(["", "\n", " "])


def make_case(seed: int, i: int) -> dict:
    r = random.Random(seed * 1_000_003 + i)
    return {"template": Gen(r).template(), "messages": make_messages(r), "add_generation_prompt": r.random() < 0.5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/kvllm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--save", type=Path, help="write each mismatching case as DIR/<seed>-<i>.json")
    ap.add_argument("--max-report", type=int, default=20)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    bad = ok_render = unsupported = 0
    with tempfile.TemporaryDirectory() as td:
        for i in range(args.start, args.start + args.cases):
            case = make_case(args.seed, i)
            why = compare(args.bin, Path(td), case)
            if render_ref(case["template"], case["messages"], case["add_generation_prompt"])[0]:
                ok_render += 1
            if why is None:
                continue
            if why.startswith("unsupported: "):
                unsupported += 1
                if unsupported <= 3:
                    print(f"case {args.seed}-{i}: {why}", file=sys.stderr)
                continue
            bad += 1
            if bad <= args.max_report:
                print(f"case {args.seed}-{i}: {why}\n  template: {case['template']!r}\n  messages: "
                      f"{json.dumps(case['messages'], ensure_ascii=False)}\n  add_generation_prompt: "
                      f"{case['add_generation_prompt']}", file=sys.stderr)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{args.seed}-{i}.json").write_text(json.dumps(case, ensure_ascii=False, indent=1) + "\n")
    print(json.dumps({"seed": args.seed, "cases": args.cases, "jinja2_rendered": ok_render,
                      "jinja2_raised": args.cases - ok_render, "unsupported": unsupported, "mismatches": bad,
                      "seconds": round(time.monotonic() - t0, 1)}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
