#!/usr/bin/env python3
"""Judge strings with llama.cpp's own grammar code, for kvllm's GBNF goldens (goldens.json).

Run with llama-cpp-python 0.3.36 (requirements-llamacpp.txt), e.g.
    /work/cache/llamacpp-venv/bin/python tests/golden/gbnf/make-goldens.py MODEL.gguf
MODEL.gguf: any GGUF with a byte-level BPE vocabulary (only the vocabulary is loaded; SmolLM2-135M-Instruct
was used): it has a token for every single byte, so a string is fed to llama.cpp's grammar sampler one byte
per token, exactly as kvllm's `grammar --check` feeds its matcher.  A string is accepted when no byte is
masked (-inf) and the end-of-generation token is allowed after the last byte; a grammar that
llama_sampler_init_grammar refuses is recorded as not parsing.

The grammars: arithmetic, c, json, list from llama.cpp's grammars/ directory as llama-cpp-python 0.3.36
ships them (llama_cpp/llama_grammar.py), chess.gbnf from llama.cpp's grammars/, and feature grammars written
here (features/*.gbnf).  llama.cpp's grammars are MIT-licensed (see README.md).
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as L

HERE = Path(__file__).resolve().parent

CASES: dict[str, list[str]] = {
    "arithmetic.gbnf": [
        "1+2=3\n", "a=b\n", "(a + b)*c=d\n", "(a+b)*c=x\n", "x=1\ny=2\n", "1+=3\n", "1+2=3", "", "\n",
        "foo_1 = bar\n", "Foo=1\n", "( 1 )=2\n", "1 / 2 - 3 = 4\n", "((1))=((2))\n", "1=(2)\n", "1==2\n",
        "a\t=\tb\n", "a=\n", "9999999=0\n", "a b=c\n",
    ],
    "c.gbnf": [
        "", "int main(){}", "int main(){return 0;}", "int f(int x){return x*2;}",
        "int main(){int a = 1;a = a+2;}", "float g(){while(a<b){a = a+1;}}",
        "int main(){for(int i = 0; i<10; i = i+1){x = x+i;}}", "int main(){if(a==b){return 1;}else{return 2;}}",
        "int main(){// comment\n}", "int main(){/* block * comment */}", "int main(){foo(1, 2);}",
        "char c(){return -x;}", "int main(){return (a+b)*c;}", "int main() {}", "int main(){return 0}",
        "void main(){}", "int main(){int a=1;}", "int main(){}int g(){}", "int 1main(){}", "int main(){/* x */ */}",
    ],
    "json.gbnf": [
        "{}", '{"a": 1}', '{"a":[1, 2.5, -3e10, true, false, null]}', '{"a": {"b": {"c": "d"}}}',
        '{"s": "esc \\" \\\\ \\n \\u00e9"}', '{"s": "caf\u00e9 \u4e2d\u6587"}', "[]", '"x"', "{", '{"a" 1}',
        '{"a": 01}', '{"a": 1.}', '{"a": .5}', '{"a": -0}', '{"a": 1e5}', '{"a": 1E-05}',
        '{"a":\n  1\n}', '{ "a" : 1 }', '{"a": 1,}', '{"a": [1,]}', '{"a": tru}', '{"a": "\\x"}',
        '{"a": "\x01"}', '{"a": 12345678901234567}', '{"a": 1}  ', '{"a": "\\/"}',
    ],
    "list.gbnf": [
        "- a\n", "- item one\n- item two\n", "- caf\u00e9\n", "- \u4e2d\u6587\n", "- a", "-a\n", "", "- \n",
        "- a\r\n", "- tab\there\n", "- a\n-b\n", "- \U0001F600 smile\n", "- x\x0by\n",
    ],
    "chess.gbnf": [
        "1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n", "1. d4 d5\n2. c4 dxc4\n3. e3 b5\n",
        "1. e4 e5\n2. Bc4 Nc6\n3. Qh5 Nf6\n4. Qxf7#\n", "1. e4 e5\n2. O-O O-O-O\n", "1. e8=Q e1=N+\n2. a1 a2\n",
        "1. e4\n", "1. e9 e5\n2. a1 a2\n", "1. e4 e5\n10. Nf3 Nc6\n", "1. e4 e5\n0. Nf3 Nc6\n",
        "1. Pe4 e5\n2. a1 a2\n", "1. e4 e5\n2. Nbd7 R1a3\n", "2. e4 e5\n3. a1 a2\n", "1. exd5 Qxd5+\n2. a1 a2\n",
    ],
    "features/repetition.gbnf": [
        "<ab>xyz", "<a>xyz", "<abcd>xyz", "<abcda>xyz", "<ab>xyzé", "<ab>xyzéé", "<ab>xyz€", "<ab>xyz€€",
        "<ab>xyz\U0001F600", "<ab>xyz\U0001F650", "<ab>x y", "<ab>x<y", "<ab>ééé", "<ab>xyz!", "<ab>xyz!!!!",
    ],
    "features/classes.gbnf": [
        "a", "Z", "5", "_", "-", "é", "中", "\U0001F600", "\t", "]", "[", "\\", '"', "ab", "", "\x7f",
        "ÿ", "\u0100", "x-y", ".", "\x01",
    ],
    "features/escapes.gbnf": [
        "\t\n\r\\\"", "A\u00e9\u4e2d\U0001F600", "AB", "\u00ff", "x", "\t\n\r\\\"A\u00e9\u4e2d\U0001F600",
    ],
    "features/groups.gbnf": [
        "ab", "abab", "abababab", "cd", "cdcd", "abcd", "", "ac", "e", "ee", "eee", "eeee", "xyzxyz", "xyz",
    ],
}

BAD_GRAMMARS = {
    "undefined-rule": 'root ::= foo\n',
    "missing-root": 'foo ::= "a"\n',
    "unclosed-group": 'root ::= ( "a"\n',
    "unknown-escape": 'root ::= "\\q"\n',
    "left-recursion": 'root ::= root "a" | "b"\n',
    "indirect-left-recursion": 'root ::= a\na ::= b "x"\nb ::= a "y" | "z"\n',
    "nullable-left-recursion": 'root ::= a\na ::= b? a "x" | "y"\nb ::= "z"\n',
    "bad-repetition": 'root ::= * "a"\n',
    "unterminated-string": 'root ::= "abc\n',
    "bad-brace": 'root ::= "a"{x}\n',
    "missing-def": 'root := "a"\n',
}


def byte_tokens(vocab) -> dict[int, int]:
    """byte -> id of the token that is exactly that byte."""
    out: dict[int, int] = {}
    buf = ctypes.create_string_buffer(64)
    for tid in range(L.llama_vocab_n_tokens(vocab)):
        n = L.llama_token_to_piece(vocab, tid, buf, 64, 0, False)
        if n == 1:
            out.setdefault(buf.raw[0], tid)
    return out


def allowed(smpl, tid: int) -> bool:
    data = (L.llama_token_data * 1)()
    data[0].id, data[0].logit, data[0].p = tid, 0.0, 0.0
    arr = L.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
    L.llama_sampler_apply(smpl, ctypes.byref(arr))
    return data[0].logit != float("-inf")


def judge(vocab, grammar: str, text: str, toks: dict[int, int], eos: int) -> bool:
    smpl = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not smpl:
        raise ValueError("grammar does not parse")
    try:
        for b in text.encode("utf-8"):
            if b not in toks:
                raise ValueError(f"{text!r}: the vocabulary has no token for byte {b:#x}")
            t = toks[b]
            if not allowed(smpl, t):
                return False
            L.llama_sampler_accept(smpl, t)
        return allowed(smpl, eos)
    finally:
        L.llama_sampler_free(smpl)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
    if not model:
        sys.exit(f"cannot load {sys.argv[1]}")
    vocab = L.llama_model_get_vocab(model)
    toks = byte_tokens(vocab)
    eos = L.llama_vocab_eos(vocab)
    out = {
        "made_by": "tests/golden/gbnf/make-goldens.py with llama-cpp-python " + L.__version__ +
                   " (llama.cpp's grammar sampler), strings fed one byte per token",
        "grammars": {},
        "bad_grammars": {},
    }
    for fname, texts in CASES.items():
        g = (HERE / fname).read_text(encoding="utf-8")
        out["grammars"][fname] = [{"text": t, "accept": judge(vocab, g, t, toks, eos)} for t in texts]
        n_acc = sum(c["accept"] for c in out["grammars"][fname])
        print(f"{fname}: {n_acc} accepted, {len(texts) - n_acc} rejected")
    for name, g in BAD_GRAMMARS.items():
        smpl = L.llama_sampler_init_grammar(vocab, g.encode(), b"root")
        out["bad_grammars"][name] = {"text": g, "parses": bool(smpl)}
        if smpl:
            L.llama_sampler_free(smpl)
    L.llama_model_free(model)
    (HERE / "goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
