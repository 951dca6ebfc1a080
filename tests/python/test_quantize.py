"""`kvllm quantize` and the K-quant formats, with gguf-py as the independent oracle.

gguf-py decodes Q4_K / Q5_K / Q6_K (gguf.quants.dequantize) but cannot encode them, so blocks written by
kvllm's quantizers are read back through gguf.GGUFReader and decoded by gguf-py:
  * each tensor's decoded values are close to the F32 source (relative RMS error bound per type), and
    equal bit for bit to what kvllm itself decodes from the same bytes (the K-quant round trip in C,
    tests/unit/test_tensor_dtype.c, measures its error on the same kind of data);
  * `kvllm eval` on the quantized model matches the numpy reference ref_llama.py, which dequantizes
    through gguf.quants, within 1e-4: kvllm's K-quant decoding in the forward pass (scalar and AVX2
    kernels) is gguf's;
  * the Q4_K_M / Q5_K_M mixes put each tensor in the type llama-quantize would;
  * row lengths that are not whole blocks fall back as documented, counted in one warning line;
  * an already-quantized input is refused without --allow-requantize (llama-quantize's rule), and an
    output that cannot be created is refused, both before any work and leaving no file;
  * the output is byte-identical for 1, 2 and 3 threads;
  * KVLLM_CPU=scalar and avx2 (KVLLM_ACT=f32) give the same logits within 1e-5.
Model shapes: n_embd 256, n_ff 768, vocab 512 (rows are whole 256-element super-blocks).
"""
from __future__ import annotations

import dataclasses
import os
import re

import gguf
import numpy as np
import pytest

from gen_model import ModelConfig, random_tensors, tensor_specs, write_model
from kvtest import AVX2_FLAGS, assert_no_sanitizer, cpu_lacks, eval_logits, run_cli
from ref_llama import LlamaRef, rel_err, tensor_to_f64

T = gguf.GGMLQuantizationType
TOL = 1e-4
N_TOKENS = 16

# 8 layers so that the mixes' use_more_bits pattern shows: layers 0, 3, 6, 7 of 8 get Q6_K
BASE = ModelConfig(n_vocab=512, n_embd=256, n_layer=8, n_head=4, n_head_kv=2, n_ff=768, n_ctx=128)
TIED = dataclasses.replace(BASE, n_layer=2, tied=True)
# ffn_down rows of 672 (a multiple of 32, not 256) and of 200 (not a multiple of 32)
FB32 = dataclasses.replace(BASE, n_layer=2, n_ff=672)
FB16 = dataclasses.replace(BASE, n_layer=2, n_ff=200)

# relative RMS error of a tensor vs its F32 source, per type (normal data; measured: Q8_0 0.0053,
# Q4_0 0.086, Q4_1 0.078, Q4_K 0.071, Q5_K 0.036, Q6_K 0.018, BF16 0.0016, F16 0.0002)
ERR_BOUND = {T.F32: 0.0, T.F16: 5e-4, T.BF16: 3e-3, T.Q8_0: 7e-3, T.Q4_0: 0.10, T.Q4_1: 0.09,
             T.Q5_0: 0.05, T.Q5_1: 0.045, T.Q4_K: 0.08, T.Q5_K: 0.04, T.Q6_K: 0.02}

PLAIN = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
K_TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q4_K_M", "Q5_K_M"]


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_types(cfg: ModelConfig, qtype: str) -> dict[str, T]:
    """llama-quantize's choice per tensor for a Llama model whose rows are whole super-blocks."""
    out = {}
    base = T[qtype.removesuffix("_M")]
    mix = qtype.endswith("_M")
    for spec in tensor_specs(cfg):
        n = spec.name
        if len(spec.shape) == 1:
            out[n] = T.F32
        elif not mix:
            out[n] = base
        elif n == "output.weight" or (cfg.tied and n == "token_embd.weight"):
            out[n] = T.Q6_K
        elif n.endswith("attn_v.weight") or n.endswith("ffn_down.weight"):
            il = int(n.split(".")[1])
            out[n] = T.Q6_K if use_more_bits(il, cfg.n_layer) else base
        else:
            out[n] = base
    return out


def source_tensors(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    return {spec.name: t for spec, t in random_tensors(cfg, seed=seed)}


class Model:
    def __init__(self, cfg, f32, seed, tokens):
        self.cfg, self.f32, self.seed, self.tokens = cfg, f32, seed, tokens
        self.src = source_tensors(cfg, seed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("quantize")
    out = {}
    for i, (name, cfg) in enumerate({"base": BASE, "tied": TIED, "fb32": FB32, "fb16": FB16}.items()):
        seed = 300 + i
        path = write_model(d / f"{name}-f32.gguf", cfg, seed=seed)
        tokens = [1] + np.random.default_rng(50 + i).integers(3, cfg.n_vocab, size=N_TOKENS - 1).tolist()
        out[name] = Model(cfg, path, seed, tokens)
    return out


@pytest.fixture(scope="module")
def quantized(kvllm, models, tmp_path_factory):
    """quantized(model_name, TYPE) -> (path, stderr), converted once per module."""
    d = tmp_path_factory.mktemp("quantized")
    cache = {}

    def get(name: str, qtype: str):
        if (name, qtype) not in cache:
            path = d / f"{name}-{qtype}.gguf"
            res = run_cli(kvllm, "quantize", models[name].f32, path, qtype, "-t", "2")
            assert_no_sanitizer(res)
            assert res.returncode == 0, res.describe()
            cache[name, qtype] = (path, res.err)
        return cache[name, qtype]
    return get


def read_types(path) -> dict[str, T]:
    return {t.name: T(t.tensor_type) for t in gguf.GGUFReader(path).tensors}


# ---- blocks decoded by gguf-py ----------------------------------------------

@pytest.mark.parametrize("qtype", PLAIN + ["Q4_K_M", "Q5_K_M"])
def test_gguf_decodes_our_blocks(models, quantized, qtype):
    """Every tensor, decoded by gguf.quants, is close to the F32 source, within its type's bound."""
    m = models["base"]
    path, _ = quantized("base", qtype)
    reader = gguf.GGUFReader(path)
    want = expected_types(m.cfg, qtype)
    seen = set()
    for t in reader.tensors:
        tt = T(t.tensor_type)
        assert tt == want[t.name], f"{t.name}: {tt.name}, expected {want[t.name].name}"
        got = tensor_to_f64(t)
        src = m.src[t.name].astype(np.float64)
        assert got.shape == src.shape, t.name
        assert np.isfinite(got).all(), t.name
        err = np.sqrt(((got - src) ** 2).sum() / (src ** 2).sum())
        assert err <= ERR_BOUND[tt], f"{t.name} ({tt.name}): relative RMS error {err:.4f} > {ERR_BOUND[tt]}"
        seen.add(tt)
    assert T[qtype.removesuffix("_M")] in seen


def test_error_levels_are_ordered(models, quantized):
    """More bits, less error: Q4_K < Q4_1 and Q4_0; Q5_K < Q4_K; Q6_K < Q5_K (same tensor, same data)."""
    m = models["base"]
    name = "blk.1.ffn_gate.weight"
    src = m.src[name].astype(np.float64)
    errs = {}
    for q in ("Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        t = next(t for t in gguf.GGUFReader(quantized("base", q)[0]).tensors if t.name == name)
        got = tensor_to_f64(t)
        errs[q] = np.sqrt(((got - src) ** 2).sum() / (src ** 2).sum())
    assert errs["Q4_K"] < errs["Q4_1"] < errs["Q4_0"], errs
    assert errs["Q6_K"] < errs["Q5_K"] < errs["Q4_K"], errs
    assert errs["Q8_0"] < errs["Q6_K"], errs


def test_kvllm_decodes_like_gguf(kvllm, models, quantized, tmp_path):
    """Bit-exact decoding: re-quantizing kvllm's K output to F32 with kvllm equals gguf-py's decode."""
    for qtype in ("Q4_K", "Q5_K", "Q6_K"):
        path, _ = quantized("base", qtype)
        back = tmp_path / f"back-{qtype}.gguf"
        run_cli(kvllm, "quantize", path, back, "F32", "--allow-requantize").check_ok()
        ours = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(back).tensors}
        for t in gguf.GGUFReader(path).tensors:
            if T(t.tensor_type) == T.F32:
                continue
            theirs = gguf.quants.dequantize(np.asarray(t.data), T(t.tensor_type)).reshape(ours[t.name].shape)
            assert np.array_equal(theirs.view(np.uint32), ours[t.name].view(np.uint32)), \
                f"{qtype} {t.name}: kvllm's dequantization differs from gguf-py's"


# ---- forward pass vs the reference -------------------------------------------

@pytest.mark.parametrize("qtype", K_TYPES)
@pytest.mark.parametrize("mode", ["prefill_all", "prefill_3"])
def test_eval_matches_reference(kvllm, models, quantized, tmp_path, qtype, mode):
    m = models["base"]
    path, _ = quantized("base", qtype)
    ref = LlamaRef.from_gguf(path).forward(m.tokens)
    kw = {"prefill_all": {}, "prefill_3": dict(prefill=3)}[mode]
    got = eval_logits(kvllm, path, m.tokens, tmp_path / "logits.bin", **kw)
    err = rel_err(got, ref)
    assert err.max() <= TOL, f"{qtype}/{mode}: rel err {err.max():.3g} at position {int(err.argmax())}"


@pytest.mark.parametrize("name,qtype", [("tied", "Q4_K_M"), ("fb32", "Q4_K_M"), ("fb32", "Q5_K"),
                                        ("fb16", "Q4_K")])
def test_eval_other_shapes(kvllm, models, quantized, tmp_path, name, qtype):
    m = models[name]
    path, _ = quantized(name, qtype)
    ref = LlamaRef.from_gguf(path).forward(m.tokens)
    got = eval_logits(kvllm, path, m.tokens, tmp_path / "logits.bin", prefill=5)
    err = rel_err(got, ref)
    assert err.max() <= TOL, f"{name}/{qtype}: rel err {err.max():.3g}"


AVX512_FLAGS = AVX2_FLAGS + ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")


@pytest.mark.parametrize("name,qtype", [("tied", "Q5_0"), ("tied", "Q5_1"), ("tied", "Q8_0"), ("fb32", "Q4_K_M")])
@pytest.mark.parametrize("kind", ["scalar", "avx2", "avx512", "strict"])
def test_eval_every_kernel_set(kvllm, models, quantized, tmp_path, monkeypatch, name, qtype, kind):
    """The 32-block types a real Q4_K_M file mixes in (Q5_0 where a row is not whole super-blocks, Q8_0 for a
    tied embedding that is both get_rows' table and the logits' matrix) on every kernel set: f32 activations
    within TOL of the reference; the default 8-bit activations (integer kernels, qmm.h) within their
    quantization error (measured 0.020 Q5_0, 0.023 Q8_0, 0.026 Q4_K_M: the activations' rounding, which
    test_kld.py holds to llama.cpp's on real models)."""
    lacks = cpu_lacks(*{"avx2": AVX2_FLAGS, "avx512": AVX512_FLAGS}.get(kind, ()))
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)} (/proc/cpuinfo)")
    if kind == "strict":
        monkeypatch.setenv("KVLLM_BACKEND", "strict")
    else:
        monkeypatch.setenv("KVLLM_CPU", kind)
    m = models[name]
    path, _ = quantized(name, qtype)
    ref = LlamaRef.from_gguf(path).forward(m.tokens)
    for act, tol in (("f32", TOL), ("q8", 0.04)):
        got = eval_logits(kvllm, path, m.tokens, tmp_path / "logits.bin", prefill=5, act=act)
        err = rel_err(got, ref)
        assert err.max() <= tol, f"{name}/{qtype} on {kind}, KVLLM_ACT={act}: rel err {err.max():.3g}"


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q5_K", "Q6_K"])
def test_scalar_and_avx2_agree(kvllm, models, quantized, tmp_path, qtype):
    m = models["base"]
    path, _ = quantized("base", qtype)
    lacks = cpu_lacks(*AVX2_FLAGS)  # only the machine may excuse the avx2 run, never the build
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)} (/proc/cpuinfo)")
    runs = {}
    for kind in ("scalar", "avx2"):
        res = run_cli(kvllm, "eval", "-m", path, "--tokens", " ".join(map(str, m.tokens)), "--prefill", "4",
                      "-o", tmp_path / f"{kind}.bin", env={"KVLLM_CPU": kind, "KVLLM_ACT": "f32"})
        res.check_ok()
        runs[kind] = np.fromfile(tmp_path / f"{kind}.bin", dtype="<f4")
    a, b = runs["scalar"], runs["avx2"]
    err = np.abs(a - b).max() / np.abs(a).max()
    assert err <= 1e-5, f"{qtype}: scalar vs avx2 logits differ by {err:.3g} (relative to max |logit|)"


# ---- the mixes, fallbacks, metadata --------------------------------------------

@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q5_K_M"])
def test_mix_types(models, quantized, qtype):
    path, err = quantized("base", qtype)
    got = read_types(path)
    base = T[qtype.removesuffix("_M")]
    assert got == expected_types(BASE, qtype)
    # spelled out for a few names (8 layers: use_more_bits is true for layers 0, 3, 6, 7)
    assert got["output.weight"] == T.Q6_K
    assert got["token_embd.weight"] == base        # untied: the embedding stays in the base type
    assert got["blk.0.attn_v.weight"] == T.Q6_K and got["blk.1.attn_v.weight"] == base
    assert got["blk.3.ffn_down.weight"] == T.Q6_K and got["blk.4.ffn_down.weight"] == base
    assert got["blk.6.attn_v.weight"] == T.Q6_K and got["blk.7.ffn_down.weight"] == T.Q6_K
    assert got["blk.2.attn_q.weight"] == base and got["blk.5.ffn_up.weight"] == base
    assert got["blk.0.attn_norm.weight"] == T.F32 and got["output_norm.weight"] == T.F32
    ftype = gguf.GGUFReader(path).get_field("general.file_type").contents()
    assert ftype == {"Q4_K_M": 15, "Q5_K_M": 17}[qtype]
    assert "warning" not in err, err


def test_mix_tied_embedding(models, quantized):
    """No output.weight: the shared token_embd takes the output's Q6_K, as llama-quantize does."""
    got = read_types(quantized("tied", "Q4_K_M")[0])
    assert got["token_embd.weight"] == T.Q6_K
    assert "output.weight" not in got
    assert got["blk.0.attn_q.weight"] == T.Q4_K


def test_plain_types_and_file_type(models, quantized):
    ftypes = {"F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q4_K": 14, "Q5_K": 16,
              "Q6_K": 18}
    for q, ft in ftypes.items():
        path, _ = quantized("base", q)
        r = gguf.GGUFReader(path)
        assert r.get_field("general.file_type").contents() == ft, q
        types = {T(t.tensor_type) for t in r.tensors}
        assert types == {T.F32, T[q]}, (q, types)


def test_metadata_copied(models, quantized):
    src = gguf.GGUFReader(models["base"].f32)
    dst = gguf.GGUFReader(quantized("base", "Q4_K")[0])
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type":
            continue
        g = dst.get_field(key)
        assert g is not None, f"{key} missing after quantize"
        assert g.contents() == f.contents(), key
    assert [t.name for t in dst.tensors] == [t.name for t in src.tensors]
    assert all(list(a.shape) == list(b.shape) for a, b in zip(dst.tensors, src.tensors))


@pytest.mark.parametrize("qtype,down", [("Q4_K", "Q5_0"), ("Q5_K", "Q5_1"), ("Q6_K", "Q8_0"),
                                        ("Q4_K_M", None), ("Q8_0", "Q8_0")])
def test_fallback_row_not_whole_blocks(models, quantized, qtype, down):
    """ffn_down rows of 672 elements: not whole 256-blocks -> the documented 32-block type, with a warning."""
    path, err = quantized("fb32", qtype)
    got = read_types(path)
    if qtype == "Q4_K_M":   # 2 layers: use_more_bits(0, 2) false -> Q4_K -> Q5_0; layer 1 -> Q6_K -> Q8_0
        assert got["blk.0.ffn_down.weight"] == T.Q5_0 and got["blk.1.ffn_down.weight"] == T.Q8_0
    else:
        assert got["blk.0.ffn_down.weight"] == T[down]
    assert got["blk.0.ffn_up.weight"] == T[qtype.removesuffix("_M")]     # rows of n_embd: whole blocks
    warnings = [line for line in err.splitlines() if "warning" in line]
    if down != qtype:   # one line for all of them, naming the first of each kind
        assert len(warnings) == 1, err
        want = {"Q4_K": r"2 Q4_K -> Q5_0", "Q5_K": r"2 Q5_K -> Q5_1", "Q6_K": r"2 Q6_K -> Q8_0",
                "Q4_K_M": r"1 Q4_K -> Q5_0 .*; 1 Q6_K -> Q8_0"}[qtype]
        assert re.search(r"warning: 2 of \d+ tensors have rows that are not a whole number .*" + want, err), err
        assert re.search(r"\(row length 672, block 256: blk\.[01]\.ffn_down\.weight", err), err
    else:
        assert not warnings, err


def test_fallback_to_f16(models, quantized):
    """Rows of 200 elements fit no block type: F16, and the tool says so."""
    for qtype in ("Q4_K", "Q4_0"):
        path, err = quantized("fb16", qtype)
        got = read_types(path)
        assert got["blk.0.ffn_down.weight"] == T.F16 and got["blk.1.ffn_down.weight"] == T.F16
        assert got["blk.0.ffn_gate.weight"] == T[qtype]
        warnings = [line for line in err.splitlines() if "warning" in line]
        assert len(warnings) == 1, err
        assert f"2 {qtype} -> F16 (row length 200, block {256 if qtype == 'Q4_K' else 32}: " \
               "blk.0.ffn_down.weight, ...)" in warnings[0], err


def test_summary_and_idempotence(kvllm, models, quantized, tmp_path):
    """stderr carries per-type counts and sizes; quantizing a file to its own type copies the bytes."""
    path, err = quantized("base", "Q4_K_M")
    assert re.search(r"Q6_K\s+\d+ tensors", err) and re.search(r"total\s+\d+ tensors", err), err
    again = tmp_path / "again.gguf"
    run_cli(kvllm, "quantize", path, again, "Q4_K_M").check_ok()
    a = {t.name: bytes(np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(path).tensors}
    b = {t.name: bytes(np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(again).tensors}
    assert a == b


@pytest.mark.parametrize("qtype", ["Q5_K_M", "Q4_0"])
def test_thread_count_does_not_matter(kvllm, models, tmp_path, qtype):
    """Rows go out in chunks to whichever thread is free: the bytes are the same for any thread count
    (the base model's matrices span several chunks each)."""
    outs = []
    for t in ("1", "2", "3"):
        p = tmp_path / f"t{t}.gguf"
        res = run_cli(kvllm, "quantize", models["base"].f32, p, qtype, "-t", t).check_ok()
        assert f"({t} threads)" in res.err, res.err
        outs.append(p.read_bytes())
    assert outs[0] == outs[1] == outs[2]


# ---- refusals before any work ------------------------------------------------

def test_requantize_refused_without_flag(kvllm, models, quantized, tmp_path):
    """An already-quantized file to another type needs --allow-requantize (as llama-quantize); the refusal
    comes before any tensor is converted and leaves no output."""
    q8, _ = quantized("tied", "Q8_0")
    out = tmp_path / "q4.gguf"
    for target in ("Q4_0", "Q4_K_M", "F16"):
        res = run_cli(kvllm, "quantize", q8, out, target)
        assert res.returncode == 1, res.describe()
        assert res.err.count("kvllm: error:") == 1 and "--allow-requantize" in res.err, res.describe()
        assert "already quantized" in res.err and "(Q8_0 -> " in res.err, res.describe()
        assert "[   1/" not in res.err, res.describe()   # no tensor was touched
        assert not out.exists() and not list(tmp_path.glob(".*tmp*"))
    res = run_cli(kvllm, "quantize", q8, out, "Q4_0", "--allow-requantize").check_ok()
    assert read_types(out)["blk.0.attn_q.weight"] == T.Q4_0
    # the same type needs no flag: every tensor is copied
    run_cli(kvllm, "quantize", q8, tmp_path / "same.gguf", "Q8_0").check_ok()
    assert (tmp_path / "same.gguf").read_bytes() == q8.read_bytes()
    # a float input never needs it
    run_cli(kvllm, "quantize", quantized("tied", "F16")[0], tmp_path / "f16-q4.gguf", "Q4_0").check_ok()


def test_output_not_creatable_refused_first(kvllm, models, tmp_path):
    f32 = models["tied"].f32
    for out, why in ((tmp_path / "no-such-dir" / "o.gguf", "cannot create"), (tmp_path, "is a folder")):
        res = run_cli(kvllm, "quantize", f32, out, "Q4_K")
        assert res.returncode == 1 and res.err.count("kvllm: error:") == 1, res.describe()
        assert why in res.err and "[   1/" not in res.err, res.describe()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not os.access(ro, os.W_OK):   # (root writes anyway)
            res = run_cli(kvllm, "quantize", f32, ro / "o.gguf", "Q4_K")
            assert res.returncode == 1 and "[   1/" not in res.err, res.describe()
            assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
    ok = tmp_path / "ok.gguf"
    run_cli(kvllm, "quantize", f32, ok, "Q4_K").check_ok()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["ok.gguf"]   # no stray temporary file


def test_cli_errors(kvllm, models, tmp_path):
    f32 = models["tied"].f32
    res = run_cli(kvllm, "quantize", "--help")
    assert res.returncode == 0 and "Q4_K_M" in res.out
    for args in ([], [f32, tmp_path / "o.gguf"], [f32, tmp_path / "o.gguf", "IQ2_XXS"], [f32, tmp_path / "o.gguf",
                 "Q4_K", "--bogus"]):
        res = run_cli(kvllm, "quantize", *args)
        assert res.returncode == 2, res.describe()
        assert res.err.count("kvllm: error:") == 1, res.describe()
    res = run_cli(kvllm, "quantize", tmp_path / "missing.gguf", tmp_path / "o.gguf", "Q4_K")
    assert res.returncode == 1 and "kvllm: error:" in res.err, res.describe()
    res = run_cli(kvllm, "quantize", f32, f32, "Q4_K")
    assert res.returncode == 1 and "kvllm: error:" in res.err, res.describe()
    assert gguf.GGUFReader(f32).tensors[0].tensor_type == T.F32   # input untouched


def test_gen_model_k_types(kvllm, tmp_path):
    """gen_model writes K-quant models through `kvllm quantize`."""
    cfg = dataclasses.replace(TIED, dtype="q6_k")
    path = write_model(tmp_path / "k.gguf", cfg, seed=1, kvllm_bin=kvllm)
    assert set(read_types(path).values()) == {T.F32, T.Q6_K}
    assert not list(tmp_path.glob("*.tmp"))


def test_asan_quantize_and_eval(asan_bin, models, tmp_path):
    """The quantizer and the K-quant forward pass under AddressSanitizer."""
    m = models["fb32"]
    out = tmp_path / "asan.gguf"
    res = run_cli(asan_bin, "quantize", m.f32, out, "Q4_K_M", "-t", "2")
    assert_no_sanitizer(res)
    assert res.returncode == 0, res.describe()
    ref = LlamaRef.from_gguf(out).forward(m.tokens)
    got = eval_logits(asan_bin, out, m.tokens, tmp_path / "logits.bin", prefill=4)
    assert rel_err(got, ref).max() <= TOL
