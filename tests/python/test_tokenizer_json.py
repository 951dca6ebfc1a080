"""Hugging Face tokenizer.json input against the Hugging Face `tokenizers` library.

The tokenizer.json files are built here with `tokenizers` itself, from the shared vocabularies:
GPT-2 (gpt2/encoder.json + vocab.bpe, ByteLevel pre-tokenizer), Llama 3 (llama3-bpe/, its Split
regex + ByteLevel, ignore_merges, <|begin_of_text|>=128000 / <|end_of_text|>=128001, BOS by a
TemplateProcessing post-processor) and two SentencePiece-style ones (Llama 2's 32000 pieces and
stories260K's 512, from their llama2.c tokenizer.bin: normalizer Prepend("▁") + Replace(" ", "▁"),
BPE with byte_fallback, merges made from the piece scores as Transformers' converter makes them).

Shown: kvllm's ids == `tokenizers`' ids on a varied corpus (the shared vector files and .inp cases,
code, whitespace runs, CJK, emoji, accents), also for byte-level pre-tokenizers kvllm has no name
for (their Split regexes compiled by PCRE2 as they are), all cases in one text joined by a special token so that
each is encoded independently by both; decode(encode(x)) == x; the same vocabulary read from
tokenizer.json, from vocab.json + merges.txt or tokenizer.bin gives the same ids; -m on a folder
holding tokenizer.json (+ tokenizer_config.json: bos/eos, add_bos_token) works; malformed
tokenizer.json files are refused with one `kvllm: error:` line naming the file (release and ASan).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import tokenizers  # pinned in tests/requirements.txt: missing is a broken setup, never a skip
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from kvtest import assert_no_sanitizer, parse_ids, run_cli
from llama2c import read_tokenizer_bin

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


def _split(re: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": False}


_BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
CUSTOM_PRE = {
    "custom_gpt4o": {"type": "Sequence", "pretokenizers": [_split(GPT4O_RE), _BL]},
    "custom_digits_then_bytelevel": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, dict(_BL, use_regex=True)]},
    "custom_qwen2_ignore_merges": {"type": "Sequence", "pretokenizers": [_split(QWEN2_RE), _BL]},
    "custom_two_splits": {"type": "Sequence", "pretokenizers": [_split(r"\p{N}{1,3}"), _split(r"[\r\n]"),
                                                                dict(_BL, use_regex=True)]},
}
SEP = {"gpt2": "<|endoftext|>", "llama3": "<|end_of_text|>", "llama2": "</s>", "tok512": "</s>",
       **{k: "<|endoftext|>" for k in CUSTOM_PRE}}

EXTRA = [
    "Hello world", " Hello world", "Hello  world", "  leading and trailing  ", "\t\ttabs\tand\nnewlines\n\n\n",
    "      ", "\n", " \n \n", "a" * 300, "1234567890 123 4567 12345678901234567890", "3.14159, 2,718 and -42%",
    "I'M you'RE they'LL she'S we'VE it'D don't", "e-mail: someone@example.com https://x.org/a?b=c&d#e",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\tif x != 0: print(x ** 2)\n",
    "int main(void) { printf(\"%d\\n\", 1 << 3); return 0; }",
    "日本語のテキスト、中文文本。한국어 텍스트", "你好，世界！", "Ελληνικά Русский текст العربية עברית हिन्दी",
    "🙂🙃😀 👩‍👩‍👧‍👦 🇫🇷 ✨ ❤️", "café naïve façade résumé Ångström Über straße Æsir øre ñandú",
    "x\u00a0y\u2003z\u3000w", "ｆｕｌｌ ｗｉｄｔｈ １２３", "\u200b zero\u200bwidth", "<s> [INST] not special text </s>",
    "MiXeD CaSe WORDS and ALLCAPS", "....!!!???---___===+++", "   \n\n   \t  x  \n",
]


def vector_prompts(shared: Path) -> list[str]:
    out = []
    for name in ["gpt2_encode_vectors.txt", "llama3_encode_vectors.txt", "llama2_spm_encode_vectors.txt"]:
        for line in (shared / "tokenizers" / name).read_text(encoding="utf-8").splitlines():
            if line.startswith("PROMPT "):
                out.append(json.loads(line[7:]))
    for name in ["gpt-2", "llama-bpe", "falcon", "starcoder"]:
        inp = (shared / "tokenizers" / "llamacpp-vocab" / f"ggml-vocab-{name}.gguf.inp").read_bytes()
        out += [t.decode("utf-8") for t in inp.split(b"\n__ggml_vocab_test__\n")[:-1]]
    return out


@pytest.fixture(scope="module")
def corpus(shared) -> list[str]:
    seen, out = set(), []
    for t in vector_prompts(shared) + EXTRA:
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    assert len(out) > 80
    return out


# ---- building tokenizer.json files with `tokenizers` ----

def bpe_files(d: Path) -> tuple[dict, list]:
    vocab = json.loads((d / "encoder.json").read_text(encoding="utf-8"))
    lines = (d / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
    return vocab, merges


def make_gpt2(shared: Path) -> Tokenizer:
    vocab, merges = bpe_files(shared / "tokenizers" / "gpt2")
    t = Tokenizer(models.BPE(vocab, merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return t


def make_llama3(shared: Path) -> Tokenizer:
    vocab, merges = bpe_files(shared / "tokenizers" / "llama3-bpe")
    t = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<|begin_of_text|>", special=True), AddedToken("<|end_of_text|>", special=True)])
    assert t.token_to_id("<|begin_of_text|>") == 128000 and t.token_to_id("<|end_of_text|>") == 128001
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", 128000)])])
    return t


def make_spm(path: Path, n_vocab: int) -> Tokenizer:
    """A llama2.c tokenizer.bin as Transformers' LlamaConverter writes a SentencePiece BPE model."""
    _, pieces, scores = read_tokenizer_bin(path, n_vocab)
    toks = []
    for i, p in enumerate(pieces):
        s = p.decode("utf-8")
        toks.append("<s>" if i == 1 else "</s>" if i == 2 else s.replace(" ", "\u2581"))
    vocab = {s: i for i, s in enumerate(toks)}
    merges = []
    for i, m in enumerate(toks):
        if i < 3 or (len(m) == 6 and m.startswith("<0x")):
            continue
        local = [(m[:k], m[k:], scores[i]) for k in range(1, len(m)) if m[:k] in vocab and m[k:] in vocab]
        merges += sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
    merges.sort(key=lambda v: v[2], reverse=True)
    t = Tokenizer(models.BPE(vocab, [(a, b) for a, b, _ in merges], unk_token="<unk>", byte_fallback=True,
                             fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.add_special_tokens([AddedToken(x, special=True) for x in ["<unk>", "<s>", "</s>"]])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return t


@pytest.fixture(scope="module")
def tj(shared, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tokenizer_json")
    made = {"gpt2": make_gpt2(shared), "llama3": make_llama3(shared),
            "llama2": make_spm(shared / "tokenizers" / "llama2" / "llama2c-tokenizer.bin", 32000),
            "tok512": make_spm(shared / "models" / "stories260K" / "tok512.bin", 512)}
    out = {}
    for name, t in made.items():
        out[name] = d / f"{name}.json"
        t.save(str(out[name]))
    # byte-level pre-tokenizers kvllm has no name for: their regexes are run as they are
    gpt2 = json.loads(out["gpt2"].read_text(encoding="utf-8"))
    for name, pre in CUSTOM_PRE.items():
        j = json.loads(json.dumps(gpt2))
        j["pre_tokenizer"] = pre
        j["model"]["ignore_merges"] = name.endswith("_ignore_merges")
        out[name] = d / f"{name}.json"
        out[name].write_text(json.dumps(j), encoding="utf-8")
    return out


def hf_ids(path: Path, text: str) -> list[int]:
    return Tokenizer.from_file(str(path)).encode(text).ids


# ---- agreement ----

@pytest.mark.parametrize("name", ["gpt2", "llama3", "llama2", "tok512", *CUSTOM_PRE])
def test_ids_match_tokenizers(run, tj, corpus, tmp_path, name):
    sep = SEP[name]
    texts = [t for t in corpus if sep not in t]
    joined = sep.join(texts)
    f = tmp_path / "corpus.txt"
    f.write_bytes(joined.encode("utf-8"))
    got = parse_ids(run("tokenize", "--tokenizer", tj[name], "--parse-special", "--ids", "-f", f).check_ok().out)
    want = hf_ids(tj[name], joined)
    if got != want:  # name the first case that differs
        tok = Tokenizer.from_file(str(tj[name]))
        for t in texts:
            f.write_bytes(t.encode("utf-8"))
            g = parse_ids(run("tokenize", "--tokenizer", tj[name], "--no-bos", "--ids", "-f", f).check_ok().out)
            w = tok.encode(t, add_special_tokens=False).ids
            assert g == w, f"{name}: {t[:60]!r}: kvllm {g[:20]} tokenizers {w[:20]}"
    assert got == want, f"{name}: {len(got)} vs {len(want)} ids"
    print(f"{name}: {len(texts)} cases, {len(want)} ids identical")


@pytest.mark.parametrize("name", ["gpt2", "llama3", "llama2", "tok512"])
def test_single_texts_and_bos(run, tj, name):
    tok = Tokenizer.from_file(str(tj[name]))
    for text in ["Hello world", " a  b\n", "日本 🙂 é", "x"]:
        got = parse_ids(run("tokenize", "--tokenizer", tj[name], "--ids", text).check_ok().out)
        assert got == tok.encode(text).ids, (name, text)
        nob = parse_ids(run("tokenize", "--tokenizer", tj[name], "--no-bos", "--ids", text).check_ok().out)
        assert nob == tok.encode(text, add_special_tokens=False).ids, (name, text)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "llama2", "tok512"])
def test_roundtrip(run, tj, corpus, tmp_path, name):
    text = "\n".join(corpus)
    f = tmp_path / "corpus.txt"
    f.write_bytes(text.encode("utf-8"))
    ids = run("tokenize", "--tokenizer", tj[name], "--no-bos", "--ids", "-f", f).check_ok().out
    f.write_text(ids)
    back = run("tokenize", "--tokenizer", tj[name], "--decode", "-f", f).check_ok()
    assert back.out == text


def test_same_ids_as_other_sources(run, tj, shared, corpus, tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_bytes("\n".join(corpus).encode("utf-8"))
    tk = shared / "tokenizers"
    other = {
        "gpt2": ["--vocab", tk / "gpt2" / "encoder.json", "--merges", tk / "gpt2" / "vocab.bpe"],
        "llama3": ["--vocab", tk / "llama3-bpe" / "encoder.json", "--merges", tk / "llama3-bpe" / "vocab.bpe",
                   "--pre", "llama-bpe", "--special", "<|begin_of_text|>=128000", "--special",
                   "<|end_of_text|>=128001"],
        "llama2": ["--tokenizer", tk / "llama2" / "llama2c-tokenizer.bin"],
        "tok512": ["--tokenizer", shared / "models" / "stories260K" / "tok512.bin"],
    }
    for name, args in other.items():
        a = run("tokenize", "--tokenizer", tj[name], "--ids", "-f", f).check_ok().out
        b = run("tokenize", *args, "--ids", "-f", f).check_ok().out
        assert a == b and len(a.split()) > 500, name
    gg = run("tokenize", "-m", tk / "llamacpp-vocab" / "ggml-vocab-gpt-2.gguf", "--ids", "-f", f).check_ok().out
    assert gg == run("tokenize", "--tokenizer", tj["gpt2"], "--ids", "-f", f).check_ok().out


def test_folder_with_config(run, tj, tmp_path):
    d = tmp_path / "folder"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(tj["llama3"].read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, "add_bos_token": False,
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    res = run("tokenize", "-m", d, "--ids", "Hello world").check_ok()
    assert parse_ids(res.out) == [9906, 1917]  # add_bos_token false overrides the post-processor
    res = run("tokenize", "--tokenizer", d / "tokenizer.json", "--ids", "--parse-special",
              "<|begin_of_text|>hi<|end_of_text|>").check_ok()
    assert parse_ids(res.out) == [128000, 6151, 128001]


# ---- bad input ----

def _bad_files(tj: dict[str, Path], d: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, text the error must contain)."""
    good = json.loads(tj["tok512"].read_text(encoding="utf-8"))
    gpt2 = json.loads(tj["gpt2"].read_text(encoding="utf-8"))

    def variant(base, edit):
        j = json.loads(json.dumps(base))
        edit(j)
        return json.dumps(j).encode()

    raw = tj["tok512"].read_bytes()
    return {
        "truncated": (raw[: len(raw) // 2], "malformed JSON"),
        "empty": (b"", "malformed JSON"),
        "not_object": (b"[1, 2, 3]", "top level is not an object"),
        "no_model": (variant(good, lambda j: j.pop("model")), "model"),
        "model_string": (variant(good, lambda j: j.update(model="BPE")), "model"),
        "unigram": (variant(good, lambda j: j["model"].update(type="Unigram")), "model.type"),
        "vocab_list": (variant(good, lambda j: j["model"].update(vocab=[1, 2])), "model.vocab"),
        "vocab_id_string": (variant(good, lambda j: j["model"]["vocab"].update({"a": "x"})), "model.vocab"),
        "vocab_id_negative": (variant(good, lambda j: j["model"]["vocab"].update({"a": -5})), "model.vocab"),
        "merges_missing": (variant(good, lambda j: j["model"].pop("merges")), "model.merges"),
        "merge_unknown": (variant(good, lambda j: j["model"]["merges"].insert(3, ["zq", "qz"])), "model.merges[3]"),
        "merge_bad_form": (variant(good, lambda j: j["model"]["merges"].insert(0, 17)), "model.merges[0]"),
        "merge_no_space": (variant(gpt2, lambda j: j["model"]["merges"].insert(0, "abc")), "model.merges[0]"),
        "unknown_pretok": (variant(gpt2, lambda j: j.update(pre_tokenizer={"type": "Whitespace"})),
                           "pre_tokenizer.type"),
        "pretok_no_type": (variant(gpt2, lambda j: j.update(pre_tokenizer={"x": 1})), "pre_tokenizer.type"),
        "bad_split_regex": (variant(gpt2, lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            _split("(\\p{L}+"), _BL]})), "does not compile"),
        "split_string_pattern": (variant(gpt2, lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}, _BL]})),
            "pre_tokenizer.pretokenizers[0].pattern"),
        "split_removed": (variant(gpt2, lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            dict(_split("x"), behavior="Removed"), _BL]})), "pre_tokenizer.pretokenizers[0]"),
        "unknown_normalizer": (variant(good, lambda j: j.update(normalizer={"type": "Lowercase"})), "normalizer"),
        "added_no_content": (variant(good, lambda j: j["added_tokens"].append({"id": 5, "special": True})),
                             "added_tokens[3].content"),
        "added_far_id": (variant(good, lambda j: j["added_tokens"].append(
            {"id": 10_000_000, "content": "<x>", "special": True})), "added_tokens[3].id"),
        "post_unknown": (variant(good, lambda j: j.update(post_processor={"type": "BertProcessing"})),
                         "post_processor.type"),
        "deep_nesting": (b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}", "malformed JSON"),
    }


def test_bad_tokenizer_json(binary, tj, tmp_path):
    bad = _bad_files(tj, tmp_path)
    for name, (data, must) in bad.items():
        f = tmp_path / f"{name}.json"
        f.write_bytes(data)
        res = run_cli(binary, "tokenize", "--tokenizer", f, "--ids", "hello", timeout=120)
        assert_no_sanitizer(res)
        assert res.returncode == 1, (name, res.returncode, res.err)
        lines = [l for l in res.err.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("kvllm: error: "), (name, res.err)
        assert str(f) in lines[0] and must in lines[0], (name, lines[0])
        assert res.out == "", name


def test_run_with_tokenizer_json(run, tj, stories):
    """--tokenizer tokenizer.json where the engine takes a tokenizer: stories260K's greedy ids."""
    res = run("run", "-m", stories["bin"], "--tokenizer", tj["tok512"], "-n", "64", "--temp", "0", "--ids", "-q")
    assert parse_ids(res.check_ok().out) == parse_ids(stories["ids"].read_text())[:64]
    res = run("run", "-m", stories["bin"], "--tokenizer", tj["tok512"], "-p", "Once upon a time", "-n", "8",
              "--temp", "0", "-q").check_ok()
    assert res.out.startswith("Once upon a time")
