"""gpt-oss (GGUF architecture "gpt-oss", llama.cpp's LLM_ARCH_OPENAI_MOE) against the numpy reference and
llama.cpp's logits (goldens), on random files written by gen_model.py as llama.cpp's
converter writes the released models: Q/K/V/O biases, attention sinks, every other layer (the even ones)
sliding over 128 positions, YaRN rope scaling, post_attention_norm as the FFN's norm, experts with router
and expert biases behind gpt-oss's clamped SwiGLU, and (as released) experts stored MXFP4.

300 tokens cross the window twice; each config is checked at every position with the KV cache (prefill all,
prefill 7 then decode) and without it: max|kvllm - ref| / max|ref| <= 1e-4 per row (test_archs.py's TOL).
The MXFP4 file's reference takes the generator's own codes, decoded in numpy (gguf-py of the test venv does
not know the type).  Each gpt-oss feature is shown to change the reference's logits (test_features_matter),
so a kvllm that ignored one could not pass.  llama.cpp (llama-cpp-python with f32 K/V, tests/golden/gpt-oss) was fed the same ids:
mean KL divergence of the next-token distributions <= 1e-4 and top-1 agreement >= 99 %, for kvllm and the
reference alike (on the MXFP4 file, where llama.cpp multiplies by 8-bit activations, 1e-2 and 90 %: see
KLD_MAX_Q8).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from gen_model import ModelConfig, mxfp4_to_f64, random_tensors, write_model
from ref_llama import FAMILIES, LlamaRef, rel_err
from kvtest import data_dir, eval_logits
from test_archs import Case, check_info, check_logits

N_TOKENS = 300
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "gpt-oss"
KLD_MAX, TOP1_MIN = 1e-4, 0.99
# llama.cpp multiplies MXFP4 weights by 8-bit activations (Q8_0 codes): on the MXFP4 file it sits at mean KLD
# 2.7e-3 and 94 % top-1 from the reference, as kvllm's own KVLLM_ACT=q8 path does (3.3e-3, 93.7 %), while
# kvllm's f32 path stays at 4e-13 and 100 %; the bars for that file are the 8-bit path's
KLD_MAX_Q8, TOP1_MIN_Q8 = 1e-2, 0.90

# head_dim 64 over n_embd 64 with 4 heads (q is 256 wide, as gpt-oss's 64 heads of 64 over 2880); the
# original context 64 with factor 8 puts the YaRN ramp on pairs 0-7 of 32 (rope base 150000, as released)
BASE = ModelConfig(arch="gpt-oss", n_vocab=400, n_embd=64, n_layer=4, n_head=4, n_head_kv=2, key_length=64,
                   n_ff=96, n_ff_exp=64, n_expert=8, n_expert_used=4, n_swa=128, n_ctx=1024, rope_theta=150000.0,
                   rope_yarn=(8.0, 64), name="kvllm-random-gpt-oss")
CONFIGS = {
    "gptoss_f32_8x4": BASE,
    "gptoss_f16_8x2": dataclasses.replace(BASE, dtype="f16", n_expert_used=2),
    "gptoss_mxfp4_experts": dataclasses.replace(BASE, mxfp4_experts=True),
}
MODES_HERE = ("prefill_all", "prefill_7", "no_kv_cache")


def reference(path: Path, cfg: ModelConfig, seed: int) -> LlamaRef:
    """The reference for the file gen_model wrote from cfg and seed; for MXFP4 experts, the weights the
    generator drew (codes decoded here) and the hyper-parameters of the same file with float experts."""
    if not cfg.mxfp4_experts:
        return LlamaRef.from_gguf(path)
    twin = write_model(path.with_name(path.stem + "-twin.gguf"), dataclasses.replace(cfg, mxfp4_experts=False),
                       seed=seed)
    w = {}
    for spec, a in random_tensors(cfg, seed):
        w[spec.name] = mxfp4_to_f64(a, spec.shape) if spec.kind == "mxfp4" else a.astype(np.float64)
    return LlamaRef(LlamaRef.from_gguf(twin).hp, w)


def case_file(d: Path, name: str) -> tuple[Path, list[int]]:
    """Config name's file (written into d) and its token ids: the same bytes and ids on every machine, so
    llama.cpp's goldens (bench/gpt-oss-goldens.py) are about this very file."""
    i = list(CONFIGS).index(name)
    cfg = CONFIGS[name]
    path = write_model(d / f"{name}.gguf", cfg, seed=700 + i)
    tokens = [1] + np.random.default_rng(70 + i).integers(3, cfg.n_vocab, size=N_TOKENS - 1).tolist()
    return path, tokens


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    d = tmp_path_factory.mktemp("gpt_oss")
    out = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        path, tokens = case_file(d, name)
        model = reference(path, cfg, 700 + i)
        out[name] = Case(path, tokens, model.forward(tokens), model)
    return out


def test_files_carry_what_the_converter_writes(cases):
    """The keys and tensors of llama.cpp's gpt-oss (conversion/gpt_oss.py and llama-arch.cpp's names)."""
    import gguf
    for name, cfg in CONFIGS.items():
        if cfg.mxfp4_experts:
            continue   # gguf-py cannot read it; its layout is the f32 file's but for the experts' type
        r = gguf.GGUFReader(cases[name].path)
        value = lambda k: r.get_field(f"gpt-oss.{k}").contents()
        names = {t.name for t in r.tensors}
        assert value("attention.sliding_window") == 128 and value("expert_feed_forward_length") == cfg.ff_exp
        assert value("rope.scaling.type") == "yarn" and value("rope.scaling.original_context_length") == 64
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            want = {p + t for t in ("attn_sinks.weight", "post_attention_norm.weight", "attn_output.bias",
                                    "attn_q.bias", "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias",
                                    "ffn_down_exps.bias")}
            assert want <= names and p + "ffn_norm.weight" not in names, name
        assert "output.weight" in names


def test_reference_crosses_the_window(cases):
    """Past position 128 the sliding layers' logits differ from full attention's, so the window is tested."""
    c = cases["gptoss_f32_8x4"]
    full = LlamaRef(dataclasses.replace(c.model.hp, n_swa=0), c.model.w).forward(c.tokens)
    err = rel_err(full, c.ref)
    assert err[:128].max() < 1e-12 and err[140:].min() > 1e-3, err


def test_features_matter(cases):
    """Dropping any one gpt-oss feature from the reference moves its logits far past the test's bound."""
    c = cases["gptoss_f32_8x4"]
    fam, hp = FAMILIES["gpt-oss"], c.model.hp
    variants = {
        "sinks": (hp, dataclasses.replace(fam, sinks=False)),
        "yarn": (dataclasses.replace(hp, rope_yarn=False, rope_scale=1.0), fam),
        "swiglu_oai": (hp, dataclasses.replace(fam, ffn="swiglu")),
        "moe biases": (hp, dataclasses.replace(fam, moe_bias=False)),
        "output bias": (hp, dataclasses.replace(fam, o_bias=False)),
        "odd layers slide": (dataclasses.replace(hp, swa_pattern=0), fam),
    }
    for what, (h, f) in variants.items():
        err = rel_err(LlamaRef(h, c.model.w, f).forward(c.tokens), c.ref).max()
        assert err > 100 * 1e-4, f"{what}: the reference hardly changes ({err:.3g})"


@pytest.mark.parametrize("mode", MODES_HERE)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_match_reference(kvllm, cases, tmp_path, config, mode):
    check_logits(kvllm, cases[config], tmp_path / "logits.bin", config, mode)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_info_names_the_architecture(run, cases, config):
    check_info(run, cases[config].path, "gpt-oss")


def test_run_end_to_end(run, cases):
    r = run("run", "-m", cases["gptoss_mxfp4_experts"].path, "-p", "Once upon a time", "-n", "16", "--temp", "0")
    assert r.returncode == 0 and r.out.strip(), r.describe()


def test_chat_renders_harmony(run, cases):
    """`kvllm chat` with gpt-oss's own template (llama.cpp's models/templates copy of the released one, which
    test_chat_template.py renders against Jinja2): the harmony turns reach the model and an answer comes."""
    tmpl = data_dir() / "templates" / "openai-gpt-oss-120b.jinja"
    r = run("chat", "-m", cases["gptoss_f32_8x4"].path, "--chat-template-file", tmpl, "-p", "hi", "-n", "8",
            "--temp", "0", "-v")
    assert r.returncode == 0, r.describe()
    assert "<|start|>user<|message|>hi<|end|><|start|>assistant" in r.err, r.err


# ---- llama.cpp -----------------------------------------------------------------------------------------------

def _kld(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P || Q) per row of two logit arrays (nats)."""
    lsm = lambda x: (x - x.max(-1, keepdims=True)) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    lp = lsm(p_logits.astype(np.float64))
    return (np.exp(lp) * (lp - lsm(q_logits.astype(np.float64)))).sum(-1)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_llamacpp_agrees(kvllm, cases, tmp_path, config):
    """llama.cpp on the same file and ids (its logits are goldens, made by bench/gpt-oss-goldens.py with
    llama-cpp-python and f32 K/V): its next-token distributions are the reference's and kvllm's (mean KLD,
    top-1).  The golden names the file's sha256: a changed generator fails here, not a comparison with
    figures of another file."""
    c = cases[config]
    meta = json.loads((GOLDEN / "llamacpp.json").read_text())[config]
    assert hashlib.sha256(c.path.read_bytes()).hexdigest() == meta["file_sha256"], \
        f"{config}: the file differs from the one llama.cpp's golden was made on: rerun bench/gpt-oss-goldens.py"
    assert meta["tokens"] == c.tokens, config
    lc = np.load(GOLDEN / "llamacpp.npz")[config]
    got = eval_logits(kvllm, c.path, c.tokens, tmp_path / "logits.bin")
    kld_max, top1_min = (KLD_MAX_Q8, TOP1_MIN_Q8) if CONFIGS[config].mxfp4_experts else (KLD_MAX, TOP1_MIN)
    for what, logits in (("kvllm", got), ("reference", c.ref)):
        kld = _kld(lc, logits)
        top1 = np.mean(lc.argmax(-1) == logits.argmax(-1))
        assert kld.mean() <= kld_max and top1 >= top1_min, (
            f"{config}: llama.cpp vs {what}: mean KLD {kld.mean():.3g} (max {kld.max():.3g} at "
            f"{int(kld.argmax())}), top-1 {100 * top1:.2f} %")
