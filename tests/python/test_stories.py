"""End-to-end on the real trained stories260K model (llama2.c checkpoint + tok512.bin):
greedy output byte-for-byte against llama2.c's published run, `kvllm convert` to GGUF checked
field by field against the checkpoint and the SentencePiece model, and eval logits against
the numpy reference.
"""
from __future__ import annotations

import numpy as np
import pytest
import gguf

from kvtest import AVX2_FLAGS, assert_no_sanitizer, check_info, cpu_lacks, eval_logits, parse_ids, run_cli
from llama2c import read_checkpoint, read_sentencepiece_model, read_tokenizer_bin
from ref_llama import LlamaRef, rel_err

TOL = 1e-4
GREEDY = ["-n", "256", "--temp", "0", "-q"]


@pytest.fixture(scope="module")
def ref_ids(stories) -> list[int]:
    ids = parse_ids(stories["ids"].read_text())
    assert len(ids) == 256
    return ids


@pytest.fixture(scope="module")
def ref_text(stories) -> bytes:
    t = stories["text"].read_bytes()
    assert t.endswith(b"\n") and not t.endswith(b"\n\n")
    return t


@pytest.fixture(scope="module")
def ckpt(stories):
    return read_checkpoint(stories["bin"])


@pytest.fixture(scope="module")
def converted(kvllm, stories, tmp_path_factory):
    out = tmp_path_factory.mktemp("stories") / "stories260K.gguf"
    res = run_cli(kvllm, "convert", stories["bin"], "--tokenizer", stories["tok"], "-o", out)
    assert res.returncode == 0, res.describe()
    assert out.is_file() and out.stat().st_size > 1_000_000, res.describe()
    return out


@pytest.fixture(params=["bin", "gguf"])
def model_args(request, stories):
    if request.param == "bin":
        return ["-m", stories["bin"], "--tokenizer", stories["tok"]]
    return ["-m", request.getfixturevalue("converted")]


# ---- greedy generation vs llama2.c ------------------------------------------

def test_greedy_ids(run, model_args, ref_ids):
    res = run("run", *model_args, *GREEDY, "--ids")
    assert res.returncode == 0, res.describe()
    got = parse_ids(res.out)
    n_same = next((i for i, (a, b) in enumerate(zip(got, ref_ids)) if a != b), min(len(got), len(ref_ids)))
    assert got == ref_ids, (f"{len(got)} ids, first difference at index {n_same} "
                            f"(got {got[n_same:n_same + 5]}, want {ref_ids[n_same:n_same + 5]})")
    assert res.out == " ".join(map(str, ref_ids)) + "\n", "format: ids separated by one space, one newline"


def test_greedy_text(run, model_args, ref_text):
    res = run("run", *model_args, *GREEDY)
    assert res.returncode == 0, res.describe()
    if res.stdout != ref_text:
        i = next((k for k, (a, b) in enumerate(zip(res.stdout, ref_text)) if a != b),
                 min(len(res.stdout), len(ref_text)))
        pytest.fail(f"stdout differs from llama2.c at byte {i} (got {len(res.stdout)} bytes, want {len(ref_text)}): "
                    f"got {res.stdout[max(0, i - 20):i + 20]!r}, want {ref_text[max(0, i - 20):i + 20]!r}")
    assert res.stderr == b"", f"-q: stderr should be empty, got {res.err!r}"


def test_info(run, stories, converted):
    for path in (stories["bin"], converted):
        res = run("info", path)
        assert res.returncode == 0, res.describe()
        check_info(res.out, {"n_embd": 64, "n_layer": 5, "n_head": 8, "n_head_kv": 4, "n_vocab": 512,
                             "n_ff": 172, "n_ctx_train": 512})


def test_long_generation_near_full_context(run, stories, ref_ids):
    """511 tokens after BOS (positions up to 511 of 512): the first 256 are llama2.c's."""
    res = run("run", "-m", stories["bin"], "--tokenizer", stories["tok"], "-n", "511", "--temp", "0",
              "--ids", "--ignore-eos", "-q")
    assert res.returncode == 0, res.describe()
    ids = parse_ids(res.out)
    assert len(ids) == 511 and all(0 <= i < 512 for i in ids)
    assert ids[:256] == ref_ids


# ---- the converted GGUF ------------------------------------------------------

def test_converted_metadata(converted, ckpt):
    r = gguf.GGUFReader(converted)
    f = lambda k: r.get_field(k).contents() if r.get_field(k) is not None else None
    assert f("general.architecture") == "llama"
    assert f("llama.embedding_length") == 64
    assert f("llama.block_count") == 5
    assert f("llama.attention.head_count") == 8
    assert f("llama.attention.head_count_kv") == 4
    assert f("llama.context_length") == 512
    assert f("llama.feed_forward_length") == ckpt.hidden_dim == 172
    # optional keys, when present, must carry llama2.c's values
    if f("llama.rope.dimension_count") is not None:
        assert f("llama.rope.dimension_count") == 8
    if f("llama.rope.freq_base") is not None:
        assert f("llama.rope.freq_base") == pytest.approx(10000.0)
    eps = f("llama.attention.layer_norm_rms_epsilon")
    assert eps is not None, "llama.attention.layer_norm_rms_epsilon missing"
    assert eps == pytest.approx(1e-5, rel=1e-3)


def test_converted_tokenizer(converted, stories):
    r = gguf.GGUFReader(converted)
    f = lambda k: r.get_field(k).contents() if r.get_field(k) is not None else None
    assert f("tokenizer.ggml.model") == "llama"
    tokens, scores, types = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.scores"), f("tokenizer.ggml.token_type")
    assert tokens is not None and scores is not None and types is not None, "tokenizer arrays missing"
    assert len(tokens) == len(scores) == len(types) == 512
    assert f("tokenizer.ggml.bos_token_id") == 1
    assert f("tokenizer.ggml.eos_token_id") == 2
    if f("tokenizer.ggml.unknown_token_id") is not None:
        assert f("tokenizer.ggml.unknown_token_id") == 0

    assert tokens[0] == "<unk>" and types[0] == 2
    assert tokens[1] == "<s>" and types[1] == 3
    assert tokens[2] == "</s>" and types[2] == 3
    assert tokens[13] == "<0x0A>" and types[13] == 6
    # the SentencePiece model is the ground truth for pieces (spaces as U+2581) and types
    sp = read_sentencepiece_model(stories["model"])
    assert len(sp) == 512
    bad = [(i, tokens[i], sp[i][0]) for i in range(512) if tokens[i] != sp[i][0]]
    assert not bad, f"{len(bad)} pieces differ from tok512.model, e.g. {bad[:5]}"
    bad = [(i, tokens[i], types[i], sp[i][2]) for i in range(512) if types[i] != sp[i][2]]
    assert not bad, f"{len(bad)} token types differ from tok512.model, e.g. {bad[:5]}"
    assert set(types[3:259]) == {6} and set(types[259:]) == {1}
    # scores are tok512.bin's float32 values, exactly
    _, _, bin_scores = read_tokenizer_bin(stories["tok"], 512)
    assert np.array_equal(np.asarray(scores, dtype=np.float32), np.asarray(bin_scores, dtype=np.float32))


def test_converted_tensors(converted, ckpt):
    r = gguf.GGUFReader(converted)
    want = ckpt.gguf_tensors()
    names = [t.name for t in r.tensors]
    assert len(names) == len(set(names)), "duplicate tensor names"
    extra = set(names) - set(want) - {"output.weight"}
    missing = set(want) - set(names)
    assert not missing and not extra, f"missing {sorted(missing)}, unexpected {sorted(extra)}"
    for t in r.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, f"{t.name}: {t.tensor_type.name}, expected F32"
        ref = want.get(t.name, ckpt.w["token_embedding"])       # output.weight, if written, = the shared embedding
        shape = tuple(reversed(t.shape.tolist()))
        assert shape == ref.shape, f"{t.name}: numpy shape {shape} (ne {t.shape.tolist()}), expected {ref.shape}"
        data = np.asarray(t.data, dtype=np.float32).reshape(ref.shape)
        assert np.array_equal(data, ref), f"{t.name}: data differs from the checkpoint"


# ---- logits ------------------------------------------------------------------

def test_reference_on_converted_predicts_reference_ids(converted, ref_ids):
    """The numpy reference, reading the converted GGUF, predicts BOS + 32 published ids."""
    logits = LlamaRef.from_gguf(converted).forward([1] + ref_ids[:32])
    pred = logits.argmax(axis=1).tolist()
    assert pred == ref_ids[:33]


@pytest.mark.parametrize("which", ["gguf", "bin"])
def test_eval_matches_reference(kvllm, stories, converted, ckpt, ref_ids, tmp_path, which):
    tokens = [1] + ref_ids[:32]
    model = converted if which == "gguf" else stories["bin"]   # eval needs no tokenizer
    ref = ckpt.ref().forward(tokens)
    for mode in (dict(), dict(prefill=5), dict(no_kv_cache=True)):
        got = eval_logits(kvllm, model, tokens, tmp_path / "l.bin", **mode)
        err = rel_err(got, ref)
        assert err.max() <= TOL, f"{which} {mode}: rel err {err.max():.3g} at position {int(err.argmax())}"
        assert got.argmax(axis=1).tolist() == ref_ids[:33], f"{which} {mode}: argmax differs"


def test_eval_cache_vs_no_cache(kvllm, converted, ref_ids, tmp_path):
    """Longer sequence (128 tokens): decode through the cache agrees with recomputation."""
    tokens = [1] + ref_ids[:127]
    a = eval_logits(kvllm, converted, tokens, tmp_path / "a.bin", prefill=3)
    b = eval_logits(kvllm, converted, tokens, tmp_path / "b.bin", no_kv_cache=True)
    err = rel_err(a, b)
    assert err.max() <= TOL, f"cache vs no cache: rel err {err.max():.3g} at position {int(err.argmax())}"
    assert a.argmax(axis=1).tolist() == ref_ids[:128]


def test_asan_convert_and_run(asan_bin, stories, ref_ids, tmp_path):
    out = tmp_path / "asan.gguf"
    res = run_cli(asan_bin, "convert", stories["bin"], "--tokenizer", stories["tok"], "-o", out)
    assert_no_sanitizer(res)
    assert res.returncode == 0, res.describe()
    for margs in (["-m", out], ["-m", stories["bin"], "--tokenizer", stories["tok"]]):
        res = run_cli(asan_bin, "run", *margs, "-n", "40", "--temp", "0", "--ids", "-q")
        assert_no_sanitizer(res)
        assert res.returncode == 0, res.describe()
        assert parse_ids(res.out) == ref_ids[:40]


@pytest.mark.parametrize("shared_cls", [True, False], ids=["shared", "unshared"])
def test_random_checkpoint(kvllm, stories, tmp_path, shared_cls):
    """A random llama2.c checkpoint (GQA; shared or separate classifier wcls): eval of the .bin and of
    its conversion match the reference; the conversion carries wcls as output.weight."""
    from llama2c import write_checkpoint
    src = write_checkpoint(tmp_path / "rand.bin", dim=64, hidden_dim=160, n_layers=2, n_heads=8, n_kv_heads=2,
                           vocab_size=512, seq_len=64, shared=shared_cls, seed=5)
    ck = read_checkpoint(src)
    assert ck.shared == shared_cls
    tokens = [1] + np.random.default_rng(3).integers(3, 512, size=19).tolist()
    ref = ck.ref().forward(tokens)
    out = tmp_path / "rand.gguf"
    res = run_cli(kvllm, "convert", src, "--tokenizer", stories["tok"], "-o", out)
    assert res.returncode == 0, res.describe()
    names = {t.name: t for t in gguf.GGUFReader(out).tensors}
    if not shared_cls:
        assert "output.weight" in names, "unshared classifier: output.weight missing from the conversion"
        assert np.array_equal(np.asarray(names["output.weight"].data).reshape(512, 64), ck.w["wcls"])
    for model in (src, out):
        for mode in (dict(), dict(prefill=4), dict(no_kv_cache=True)):
            got = eval_logits(kvllm, model, tokens, tmp_path / "l.bin", **mode)
            err = rel_err(got, ref)
            assert err.max() <= TOL, f"{model.name} {mode}: rel err {err.max():.3g} at position {int(err.argmax())}"


# ---- every kernel set this CPU has reproduces the reference ------------------

AVX512_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")  # kvllm's avx512 set
AMX_FLAGS = AVX512_FLAGS + ("amx_tile", "amx_int8")   # kvllm's amx set: avx512's, the integer matmul on tiles


@pytest.mark.parametrize("kind", ["scalar", "avx2", "avx512", "amx"])
@pytest.mark.parametrize("act", ["f32", "q8"])
def test_greedy_ids_per_kernel_set(run, stories, ref_ids, kind, act):
    """KVLLM_CPU forces each kernel set kvllm has.  Skipped only when /proc/cpuinfo lacks the instructions
    (then kvllm must refuse clearly); a build or detection that drops a set the CPU has fails.  F32 weights:
    the SIMD sets differ from the scalar one only by FMA rounding, whatever KVLLM_ACT says (8-bit
    activations are for block-quantized weights)."""
    res = run("run", "-m", stories["bin"], "--tokenizer", stories["tok"], *GREEDY, "--ids",
              env={"KVLLM_CPU": kind, "KVLLM_ACT": act})
    flags = {"avx2": AVX2_FLAGS, "avx512": AVX512_FLAGS, "amx": AMX_FLAGS}.get(kind, ())
    lacks = cpu_lacks(*flags)
    if lacks:
        assert res.returncode == 1 and f"KVLLM_CPU={kind}" in res.err, res.describe()
        pytest.skip(f"this CPU lacks {', '.join(lacks)} (/proc/cpuinfo)")
    assert res.returncode == 0, res.describe()
    assert parse_ids(res.out) == ref_ids, f"KVLLM_CPU={kind}"

