#!/usr/bin/env python3
"""Golden tokenizer data from llama.cpp (through the PyPI package llama-cpp-python).

Run with the venv that bench/build-llamacpp.sh builds (never in CI):

    /work/cache/llamacpp-venv/bin/python scripts/golden-tok-llamacpp.py [--shared DIR] [--out DIR]

For every vocabulary GGUF that kvllm's tokenizer supports (llama.cpp's vocab-only
test files in <shared>/tokenizers/llamacpp-vocab, plus SmolLM2-135M-Instruct from
models/smollm2, fetched by scripts/fetch-smollm2.sh) it loads the file with
vocab_only=True and tokenizes a fixed corpus: the strings of the shared .inp file
(llama.cpp's own tokenizer test strings) and the extra strings below (code,
whitespace runs, CJK, emoji, accents, numbers, mixed scripts). Tokenization is
llama_tokenize(add_special=True, parse_special=False): BOS/EOS are added exactly as
the vocabulary's own rules (tokenizer.ggml.add_bos_token ...) say.

Output: tests/golden/tok-llamacpp/<vocab-name>.json
  {"vocab": path relative to its root ("shared:..." or "repo:..."),
   "llama_cpp_python": version, "add_special": true, "parse_special": false,
   "made_by": "scripts/golden-tok-llamacpp.py",
   "cases": [{"text": str, "ids": [int, ...]}, ...]}
tests/python/test_tok_llamacpp.py compares `kvllm tokenize` against these files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEP = "\n__ggml_vocab_test__\n"

# vocab-only GGUFs from llama.cpp's test set that kvllm supports, by file stem
LLAMACPP_VOCABS = ["llama-spm", "phi-3", "gpt-2", "falcon", "deepseek-coder", "starcoder"]
SMOLLM2 = "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

EXTRA = [
    # code
    'def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    'for (int i = 0; i < n; ++i) { a[i] += b[i] * 0.5f; }',
    'const x = {"key": [1, 2, 3], "nested": {"ok": true, "v": null}};',
    'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;',
    '<div class="main"><p>Hello &amp; welcome</p></div>',
    '$ ls -la /usr/local/bin && echo "done" | tee log.txt 2>&1',
    'x<<=2; y>>=3; z**=4; w//=5; a!=b; c==d; e<=f; g->h; i::j',
    # whitespace runs, tabs, newlines, CR
    'a  b   c    d     e',
    '\t\tindented with tabs\n\t\t\tand more',
    'line1\nline2\n\nline4\n\n\n',
    'windows\r\nline\r\nendings\r\n',
    '    four spaces then text',
    'trailing spaces    ',
    ' \t \n \t\n',
    '\n\n\n\n\n\n\n\n',
    '          ',
    # CJK, emoji, accents
    '你好，世界！今天天气很好。',
    '日本語のテキストとカタカナ、ひらがな。',
    '한국어 문장입니다.',
    '😀😃😄 emoji 🎉🚀 and flags 🇫🇷🇯🇵',
    '👨‍👩‍👧‍👦 family, 👍🏽 skin tone, ❤️ heart',
    'café naïve façade résumé coöperate jalapeño',
    'Crème brûlée, smörgåsbord, Ærøskøbing, Łódź',
    'e\u0301 (combining) vs \u00e9 (precomposed)',
    'ß ẞ ǅ ﬁ ﬀ Ω Å',
    # numbers
    '3.14159 2.71828 1e-10 -42 +7 0x1F 0b1011 1,000,000',
    '12345678901234567890',
    'Phone: +1 (555) 123-4567, date 2024-03-15, time 12:34:56',
    '١٢٣ ٤٥٦ ० १ २ ३ 一二三',
    # mixed scripts and punctuation
    'Привет мир! Hello world! مرحبا بالعالم! שלום עולם!',
    'Ελληνικά και English και русский μαζί',
    'हिन्दी और English mixed with தமிழ்',
    'ไทย ภาษาไทย ทดสอบ',
    "It's, they're, I'M, we'VE, you'll, he'd",
    '...!!!???---___***###@@@',
    '“Smart quotes” and ‘single’ — em dash – en dash …',
    'URL: https://example.com/path?q=1&r=two#frag',
    'email: someone.name+tag@example.co.uk',
    'MiXeD CaSe WoRdS aNd ALLCAPS and lowercase',
    'a',
    ' ',
    'Once upon a time, there was a little girl named Lily.',
]


def read_inp(shared: Path) -> list[str]:
    t = (shared / "tokenizers" / "llamacpp-vocab" / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    parts = t.split(SEP)
    assert parts[-1] == "", "the .inp file should end with the separator"
    return parts[:-1]


def tokenize(llama_cpp, vocab, data: bytes) -> list[int]:
    """llama_tokenize(add_special=True, parse_special=False), growing the buffer when asked to"""
    cap = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, True, False)
        if n >= 0:
            return [int(buf[i]) for i in range(n)]
        cap = -n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "tok-llamacpp")
    args = ap.parse_args()

    import llama_cpp

    @llama_cpp.llama_log_callback
    def log_cb(level, text, user):  # llama.cpp's errors only
        if level >= 4 and text:
            sys.stderr.write(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(log_cb, None)
    llama_cpp.llama_backend_init()

    shared = args.shared.resolve()
    corpus = read_inp(shared)
    for s in EXTRA:
        if s not in corpus:
            corpus.append(s)

    vocabs = [(f"ggml-vocab-{n}", shared / "tokenizers" / "llamacpp-vocab" / f"ggml-vocab-{n}.gguf",
               f"shared:tokenizers/llamacpp-vocab/ggml-vocab-{n}.gguf") for n in LLAMACPP_VOCABS]
    vocabs.append(("smollm2-135m-instruct", REPO / SMOLLM2, "repo:" + SMOLLM2))

    args.out.mkdir(parents=True, exist_ok=True)
    for name, path, rel in vocabs:
        if not path.is_file():
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        mp = llama_cpp.llama_model_default_params()
        mp.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            print(f"llama.cpp could not load {path}", file=sys.stderr)
            return 1
        vocab = llama_cpp.llama_model_get_vocab(model)
        cases = []
        for text in corpus:
            ids = tokenize(llama_cpp, vocab, text.encode("utf-8"))
            cases.append({"text": text, "ids": ids})
        doc = {"vocab": rel, "llama_cpp_python": llama_cpp.__version__, "add_special": True,
               "parse_special": False, "made_by": "scripts/golden-tok-llamacpp.py", "cases": cases}
        out = args.out / f"{name}.json"
        out.write_text(json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":")).replace(
            '},{"text"', '},\n{"text"') + "\n", encoding="utf-8")
        print(f"{out.relative_to(REPO) if out.is_relative_to(REPO) else out}: {len(cases)} cases, "
              f"{sum(len(c['ids']) for c in cases)} ids")
        llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
