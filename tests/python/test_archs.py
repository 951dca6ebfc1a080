"""Every architecture against the numpy reference: GPT-2, Qwen2, Mistral (sliding window), Llama 3 rope
scaling (rope_freqs.weight), linear rope scaling, tied and untied heads, as GGUF files written by gen_model.py.
(The newer families are in test_families.py, which uses the helpers here: make_cases, check_logits, ...)

Each config is checked at every position with the KV cache (prefill all / prefill 1 + decode / prefill 7 +
decode) and without it (--no-kv-cache): max|kvllm - ref| / max|ref| <= 1e-4 per row.  The reference
(ref_llama.py) is written from each architecture's math; the checks below also guard that the feature under
test matters (a sliding window changes the logits, Llama 3 factors change the rope, ...), so a kvllm that
ignored it could not pass.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gen_model import ModelConfig, llama3_rope_factors, write_model
from kvtest import eval_logits
from ref_llama import LlamaRef, rel_err

TOL = 1e-4
N_TOKENS = 24

CONFIGS = {
    "gpt2_f32_tied": ModelConfig(arch="gpt2", n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=256,
                                 n_ctx=64, tied=True),
    "gpt2_f16_untied": ModelConfig(arch="gpt2", n_vocab=301, n_embd=48, n_layer=3, n_head=4, n_head_kv=4, n_ff=192,
                                   n_ctx=40, dtype="f16", norm_eps=1e-6),
    "gpt2_q8_0_tied": ModelConfig(arch="gpt2", n_vocab=320, n_embd=64, n_layer=2, n_head=2, n_head_kv=2, n_ff=128,
                                  n_ctx=32, tied=True, dtype="q8_0"),
    "qwen2_f32_tied": ModelConfig(arch="qwen2", n_vocab=400, n_embd=128, n_layer=2, n_head=8, n_head_kv=2, n_ff=320,
                                  tied=True, rope_theta=1e6, norm_eps=1e-6),
    "qwen2_f16_untied": ModelConfig(arch="qwen2", n_vocab=400, n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=160,
                                    dtype="f16", rope_theta=1e6),
    "qwen2_f32_untied_rot8": ModelConfig(arch="qwen2", n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                         n_ff=128, n_rot=8),
    # Mistral as llama.cpp writes it (llama arch + sliding_window), and under its own arch name
    "mistral_llama_swa8": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                      n_ff=160, n_swa=8),
    "mistral_swa5_f16_tied": ModelConfig(arch="mistral", n_vocab=320, n_embd=64, n_layer=3, n_head=4, n_head_kv=1,
                                         n_ff=160, n_swa=5, dtype="f16", tied=True),
    # Llama 3 rope scaling: the original context is small so that the factors are 1, smoothed and 8
    "llama3_rope_freqs": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                     n_ff=160, rope_theta=10000.0, llama3_rope=(8.0, 1.0, 4.0, 64)),
    "llama_rope_linear": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=4,
                                     n_ff=160, rope_scale_linear=4.0, tied=True),
}

MODES = {
    "prefill_all": dict(),
    "prefill_1": dict(prefill=1),
    "prefill_7": dict(prefill=7),
    "no_kv_cache": dict(no_kv_cache=True),
}


class Case:
    def __init__(self, path, tokens, ref, model):
        self.path, self.tokens, self.ref, self.model = path, tokens, ref, model


def make_cases(d, configs: dict[str, ModelConfig], seed: int, token_seed: int, n_tokens: int) -> dict[str, Case]:
    """Per config: a GGUF in d (seed + i), n_tokens tokens (BOS then random ids; token_seed + i) and the
    reference's logits for them."""
    out = {}
    for i, (name, cfg) in enumerate(configs.items()):
        path = write_model(d / f"{name}.gguf", cfg, seed=seed + i)
        rng = np.random.default_rng(token_seed + i)
        tokens = [1] + rng.integers(3, cfg.n_vocab, size=n_tokens - 1).tolist()
        model = LlamaRef.from_gguf(path)
        out[name] = Case(path, tokens, model.forward(tokens), model)
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    return make_cases(tmp_path_factory.mktemp("archs"), CONFIGS, seed=300, token_seed=11, n_tokens=N_TOKENS)


def check_not_degenerate(cases: dict[str, Case]) -> None:
    """Finite logits of a sane scale that change along the sequence and do not always pick one token."""
    for name, c in cases.items():
        assert np.isfinite(c.ref).all(), name
        scale = np.abs(c.ref).max()
        assert 0.1 < scale < 100, (name, scale)
        assert np.abs(np.diff(c.ref, axis=0)).max() > 1e-2 * scale, name
        assert len(set(c.ref.argmax(axis=1).tolist())) > 1, name


def test_reference_is_not_degenerate(cases):
    check_not_degenerate(cases)


def _ref_with(c: Case, **hp_changes) -> np.ndarray:
    m = LlamaRef(dataclasses.replace(c.model.hp, **hp_changes), dict(c.model.w))
    return m.forward(c.tokens)


def test_features_matter(cases):
    """Each feature changes the reference logits, so kvllm cannot match while ignoring it."""
    for name in ("mistral_llama_swa8", "mistral_swa5_f16_tied"):
        c = cases[name]
        full = _ref_with(c, n_swa=0)
        w = c.model.hp.n_swa
        assert np.abs(full[:w] - c.ref[:w]).max() == 0, name           # within the window: identical
        assert rel_err(full[w:], c.ref[w:]).min() > 1e-3, name         # beyond it: every row differs
    c = cases["llama3_rope_freqs"]
    f = c.model.w["rope_freqs.weight"]
    assert f.min() == 1.0 and f.max() == 8.0 and ((f > 1) & (f < 8)).any(), f
    m = LlamaRef(c.model.hp, {k: v for k, v in c.model.w.items() if k != "rope_freqs.weight"})
    assert rel_err(m.forward(c.tokens)[1:], c.ref[1:]).min() > 1e-4
    c = cases["llama_rope_linear"]
    assert rel_err(_ref_with(c, rope_scale=1.0)[1:], c.ref[1:]).min() > 1e-4
    c = cases["qwen2_f32_tied"]                                       # halves, not adjacent pairs
    assert rel_err(_ref_with(c, arch="llama")[1:], c.ref[1:]).min() > 1e-4


def test_llama3_factors_match_transformers_formula():
    """rope_freqs.weight (llama.cpp's converter) divides the base frequencies into exactly the inverse
    frequencies of transformers' _compute_llama3_parameters (written out here from its source)."""
    cfg = CONFIGS["llama3_rope_freqs"]
    factor, low, high, old = cfg.llama3_rope
    dim, base = cfg.rot, cfg.rope_theta
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * np.pi / inv_freq
    inv_llama = np.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    inv_llama = np.where(medium, smoothed, inv_llama)
    np.testing.assert_allclose(inv_freq / llama3_rope_factors(cfg), inv_llama, rtol=1e-6)


def check_logits(binary, c: Case, out, config: str, mode: str) -> None:
    """kvllm's logits for the case (MODES[mode]; written to out) within TOL of the reference at every row."""
    got = eval_logits(binary, c.path, c.tokens, out, **MODES[mode])
    assert got.shape == c.ref.shape, f"logits shape {got.shape}, expected {c.ref.shape}"
    assert np.isfinite(got).all(), "non-finite logits"
    err = rel_err(got, c.ref)
    assert err.max() <= TOL, (f"{config}/{mode}: max|kvllm-ref|/max|ref| = {err.max():.3g} at position "
                              f"{int(err.argmax())} (tol {TOL}); per-position: {np.array2string(err, precision=2)}")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_match_reference(kvllm, cases, tmp_path, config, mode):
    check_logits(kvllm, cases[config], tmp_path / "logits.bin", config, mode)


@pytest.mark.parametrize("mode", ["prefill_all", "prefill_300"])
def test_sliding_window_across_attention_splits(kvllm, tmp_path, mode):
    """1100 positions with a window of 100: late tokens' first attention split (positions < 1024) lies
    partly or wholly outside the window."""
    cfg = ModelConfig(arch="mistral", n_vocab=300, n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64,
                      n_ctx=2048, n_swa=100)
    path = write_model(tmp_path / "swa.gguf", cfg, seed=5)
    tokens = [1] + np.random.default_rng(3).integers(3, 300, size=1099).tolist()
    ref = LlamaRef.from_gguf(path).forward(tokens)
    kw = {} if mode == "prefill_all" else dict(prefill=300)
    got = eval_logits(kvllm, path, tokens, tmp_path / "logits.bin", **kw)
    err = rel_err(got, ref)
    assert err.max() <= TOL, f"{mode}: rel err {err.max():.3g} at position {int(err.argmax())}"


def check_info(run, path, arch: str) -> None:
    """`kvllm info` names the file's architecture."""
    r = run("info", "-m", path)
    assert r.returncode == 0, r.describe()
    line = [ln for ln in r.out.splitlines() if ln.startswith("architecture")]
    assert line and line[0].split()[-1] == arch, r.out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_info_names_the_architecture(run, cases, config):
    check_info(run, cases[config].path, CONFIGS[config].arch)


def test_gpt2_positions_past_the_table_are_refused(run, cases, tmp_path):
    """GPT-2 has n_ctx learned positions: a longer input is refused with an error, not read past the table."""
    c = cases["gpt2_f16_untied"]
    n = CONFIGS["gpt2_f16_untied"].n_ctx + 5
    r = run("eval", "-m", c.path, "--tokens", " ".join(["1"] * n), "-o", tmp_path / "l.bin")
    assert r.returncode != 0
    assert r.returncode == 1 and "Sanitizer" not in r.err and "ssert" not in r.err, r.describe()


def test_asan_archs(asan_bin, cases, tmp_path):
    """One case per architecture under AddressSanitizer, with the cache and without."""
    for config in ("gpt2_f16_untied", "qwen2_f32_tied", "mistral_swa5_f16_tied", "llama3_rope_freqs"):
        for mode in ("prefill_7", "no_kv_cache"):
            check_logits(asan_bin, cases[config], tmp_path / "logits.bin", config, mode)


# ---- the same weights as Hugging Face folders ----------------------------------------------------------

HF_LLAMA_LAYER = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
HF_GPT2_LAYER = {
    "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias", "attn_qkv.weight": "attn.c_attn.weight",
    "attn_qkv.bias": "attn.c_attn.bias", "attn_output.weight": "attn.c_proj.weight",
    "attn_output.bias": "attn.c_proj.bias", "ffn_norm.weight": "ln_2.weight", "ffn_norm.bias": "ln_2.bias",
    "ffn_up.weight": "mlp.c_fc.weight", "ffn_up.bias": "mlp.c_fc.bias", "ffn_down.weight": "mlp.c_proj.weight",
    "ffn_down.bias": "mlp.c_proj.bias",
}


def _hf_tensor(name: str, a: np.ndarray, cfg: ModelConfig, prefix: str) -> tuple[str, np.ndarray] | None:
    """GGUF tensor (numpy shape, stored dtype) -> (HF name, HF array): llama Q/K rows back to HF's halves
    order (GGUF llama rotates adjacent pairs; Qwen2 keeps halves), GPT-2 Conv1D matrices transposed."""
    if name == "rope_freqs.weight":
        return None                                         # config.json's rope_scaling says it
    if cfg.arch == "gpt2":
        top = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
               "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias"}
        if name == "output.weight":
            return "lm_head.weight", a
        if name in top:
            return prefix + top[name], a
        _, il, rest = name.split(".", 2)
        return f"{prefix}h.{il}.{HF_GPT2_LAYER[rest]}", (a.T if a.ndim == 2 else a)
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name], a
    _, il, rest = name.split(".", 2)
    if cfg.arch != "qwen2" and rest in ("attn_q.weight", "attn_k.weight"):
        nh = cfg.n_head if rest == "attn_q.weight" else cfg.n_head_kv
        a = a.reshape(nh, cfg.head_dim // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
    return f"model.layers.{il}.{HF_LLAMA_LAYER[rest]}", a


def _safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    import json
    import struct
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": {np.float32: "F32", np.float16: "F16"}[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(blobs)


def write_hf_folder(folder, gguf_path, cfg: ModelConfig, prefix: str = "transformer."):
    import json
    import gguf
    folder.mkdir(parents=True, exist_ok=True)
    r = gguf.GGUFReader(gguf_path)
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = np.asarray(t.data).reshape(shape)
        m = _hf_tensor(t.name, a, cfg, prefix)
        if m:
            tensors[m[0]] = m[1]
    (folder / "model.safetensors").write_bytes(_safetensors(tensors))
    if cfg.arch == "gpt2":
        c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": cfg.n_embd,
             "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.n_ff, "n_positions": cfg.n_ctx,
             "vocab_size": cfg.n_vocab, "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new",
             "tie_word_embeddings": cfg.tied}
    else:
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[cfg.arch]
        c = {"architectures": [arch], "model_type": cfg.arch, "hidden_size": cfg.n_embd,
             "intermediate_size": cfg.n_ff, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
             "num_key_value_heads": cfg.n_head_kv, "max_position_embeddings": cfg.n_ctx,
             "vocab_size": cfg.n_vocab, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
             "tie_word_embeddings": cfg.tied, "hidden_act": "silu"}
        if cfg.arch == "qwen2":
            c.update(use_sliding_window=False, sliding_window=4096, max_window_layers=28)
        elif cfg.n_swa:
            c["sliding_window"] = cfg.n_swa
        if cfg.llama3_rope:
            f, lo, hi, old = cfg.llama3_rope
            c["rope_scaling"] = {"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
                                 "original_max_position_embeddings": old}
        if cfg.rope_scale_linear:
            c["rope_scaling"] = {"type": "linear", "factor": cfg.rope_scale_linear}
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    return folder


# every config HF can express (no partial rotary, no q8_0); "mistral" as HF spells it
HF_CONFIGS = ["gpt2_f32_tied", "gpt2_f16_untied", "qwen2_f32_tied", "qwen2_f16_untied", "mistral_llama_swa8",
              "mistral_swa5_f16_tied", "llama3_rope_freqs", "llama_rope_linear"]


@pytest.mark.parametrize("mode", ["prefill_all", "prefill_1"])
@pytest.mark.parametrize("config", HF_CONFIGS)
def test_hf_folder_matches_gguf(kvllm, cases, tmp_path, config, mode):
    """The same weights as an HF folder give the GGUF's logits (and so the reference's)."""
    cfg, c = CONFIGS[config], cases[config]
    if cfg.arch == "mistral":
        cfg = dataclasses.replace(cfg, arch="mistral")
    folder = write_hf_folder(tmp_path / "hf", c.path, cfg, prefix="transformer." if config != "gpt2_f16_untied" else "")
    got_hf = eval_logits(kvllm, folder, c.tokens, tmp_path / "hf.bin", **MODES[mode])
    got_gguf = eval_logits(kvllm, c.path, c.tokens, tmp_path / "gguf.bin", **MODES[mode])
    assert rel_err(got_hf, c.ref).max() <= TOL, f"HF vs reference: {rel_err(got_hf, c.ref).max():.3g}"
    # llama3: the factors are recomputed from config.json (in double) rather than read; else bit-identical
    exact = config != "llama3_rope_freqs"
    err = rel_err(got_hf, got_gguf).max()
    assert (err == 0) if exact else (err <= 1e-5), f"HF vs GGUF: {err:.3g}"


def test_hf_info_names_the_architecture(run, cases, tmp_path):
    for config in ("gpt2_f32_tied", "qwen2_f32_tied"):
        folder = write_hf_folder(tmp_path / config, cases[config].path, CONFIGS[config])
        r = run("info", "-m", folder)
        assert r.returncode == 0, r.describe()
        assert f"architecture      {CONFIGS[config].arch}" in r.out, r.out


def test_hf_asan(asan_bin, cases, tmp_path):
    for config in ("gpt2_f16_untied", "qwen2_f32_tied", "llama3_rope_freqs"):
        c = cases[config]
        folder = write_hf_folder(tmp_path / config, c.path, CONFIGS[config])
        got = eval_logits(asan_bin, folder, c.tokens, tmp_path / "l.bin", prefill=7)
        assert rel_err(got, c.ref).max() <= TOL, config


BAD_GGUF = {
    # name: (config, write_model kwargs, text the one error line must contain)
    "qwen2_missing_bias": ("qwen2_f32_tied", dict(omit_tensors=["blk.1.attn_k.bias"]), "blk.1.attn_k.bias"),
    "gpt2_missing_positions": ("gpt2_f32_tied", dict(omit_tensors=["position_embd.weight"]), "position_embd.weight"),
    "gpt2_missing_norm_bias": ("gpt2_f32_tied", dict(omit_tensors=["blk.0.ffn_norm.bias"]), "blk.0.ffn_norm.bias"),
    "llama3_zero_factor": ("llama3_rope_freqs", dict(tensors={"rope_freqs.weight": np.zeros(8)}), "rope_freqs"),
}


@pytest.mark.parametrize("which", ["release", "asan"])
@pytest.mark.parametrize("case", list(BAD_GGUF))
def test_bad_arch_files_are_refused(kvllm, kvllm_asan, tmp_path, case, which):
    from kvtest import run_cli
    binary = kvllm if which == "release" else kvllm_asan
    if binary is None:
        pytest.skip("no ASan build (KVLLM_ASAN_BIN)")
    config, kw, text = BAD_GGUF[case]
    path = write_model(tmp_path / "bad.gguf", CONFIGS[config], seed=1, **kw)
    r = run_cli(binary, "eval", "-m", path, "--tokens", "1 5 7", "-o", tmp_path / "l.bin")
    assert r.returncode == 1, r.describe()
    assert text in r.err and "Sanitizer" not in r.err, r.describe()


# ---- batch invariance through the engine (`kvllm batch`) --------------------------------------------------

BATCH_MODELS = {
    "gpt2": ModelConfig(arch="gpt2", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=256, n_ctx=256),
    "qwen2": ModelConfig(arch="qwen2", n_vocab=320, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=160,
                         n_ctx=256, rope_theta=1e6, tied=True),
    "mistral_swa": ModelConfig(arch="mistral", n_vocab=320, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=160,
                               n_ctx=256, n_swa=12, llama3_rope=(8.0, 1.0, 4.0, 64)),
}
BATCH_SETTINGS = {
    "default": [], "chunk_7": ["--max-batch-tokens", "7"], "block_size_5": ["--block-size", "5"],
    "preempt": ["--kv-tokens", "160"], "threads_1": ["-t", "1"],
}


def _run_batch(kvllm, d, model, prompts, name, *extra, max_tokens=24):
    from kvtest import assert_no_sanitizer, run_cli
    pf = d / f"{name}.txt"
    pf.write_text("".join(" ".join(map(str, p)) + "\n" for p in prompts))
    lf = d / f"{name}.bin"
    res = run_cli(kvllm, "batch", "-m", model, "--prompts", pf, "--max-tokens", max_tokens, "--logits", lf,
                  "--kv-type", "f32", *extra)
    assert_no_sanitizer(res)
    assert res.returncode == 0, res.describe()
    ids = [list(map(int, line.split())) for line in res.out.splitlines()]
    return ids, np.fromfile(lf, dtype="<f4").reshape(len(ids), max_tokens, 320)


@pytest.fixture(scope="module")
def batch_setup(kvllm, tmp_path_factory):
    d = tmp_path_factory.mktemp("archs_batch")
    rng = np.random.default_rng(8)
    prefix = [1] + rng.integers(3, 320, size=30).tolist()
    prompts = [(prefix if i % 2 else [1]) + rng.integers(3, 320, size=int(rng.integers(3, 50))).tolist()
               for i in range(6)]
    out = {}
    for name, cfg in BATCH_MODELS.items():
        model = write_model(d / f"{name}.gguf", cfg, seed=21)
        alone = [_run_batch(kvllm, d, model, [p], f"{name}_alone{i}") for i, p in enumerate(prompts)]
        out[name] = (model, [a[0][0] for a in alone], np.stack([a[1][0] for a in alone]))
    return d, prompts, out


@pytest.mark.parametrize("setting", list(BATCH_SETTINGS))
@pytest.mark.parametrize("arch", list(BATCH_MODELS))
def test_batch_invariance(kvllm, batch_setup, arch, setting):
    """Each prompt's greedy ids and logits are the same run alone or batched with the others, under chunked
    prefill, odd block sizes, preemption and one thread (sliding window and Llama 3 rope included)."""
    d, prompts, out = batch_setup
    model, want_ids, want_logits = out[arch]
    ids, logits = _run_batch(kvllm, d, model, prompts, f"{arch}_{setting}", *BATCH_SETTINGS[setting])
    assert ids == want_ids, f"{arch}/{setting}: greedy ids differ from the prompts run alone"
    diff = np.abs(logits - want_logits).max() / np.abs(want_logits).max()
    assert diff <= 1e-6, f"{arch}/{setting}: max|batched - alone| / max|alone| = {diff:.3g}"
